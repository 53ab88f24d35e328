"""Apply Interceptors (Raylight) without Ray: the functions it ships to Raylight's actors, called the way
Raylight's ``ray_patch`` calls them (``patch_func(node, model, *args)``, the actor's model replaced by the result),
on ComfyUI's tiny Wan; and the node itself through ComfyUI's executor, with Raylight's two decorators stood in for
by local ones of the same contract. An actor keeps its model across prompts, so a chain installed there stays
until the node installs another, or none: with nothing connected it removes the chain, and the actor's model
samples exactly as the plain model. (tests/distributed/test_distributed_raylight.py runs Raylight's real decorators against
Ray actors, where Ray and a Raylight checkout are installed.)"""
from __future__ import annotations

import pickle

import pytest
import torch

from cached_sampler_dev.support import graphs
from cached_sampler_dev.support import tiny_models
from cached_sampler_dev.support.tiny_nodes import CAPTURED

STEPS = 6
FULL = 3 * STEPS  # tiny Wan's 3 blocks on every step, both branches in one batched forward


class Actor:
    """What Raylight's actor keeps between prompts: its model (here with someone else's block replacement, which
    the pack must chain to and put back), and what the model's blocks ran."""

    def __init__(self):
        self.counts = counts = {"blocks": 0}
        self.model = tiny_models.build("wan21")

        def counting(args, extra):
            counts["blocks"] += 1
            return extra["original_block"](args)
        for index in range(3):
            self.model.set_model_patch_replace(counting, "dit", "double_block", index)

    def sample(self):
        import nodes
        self.counts["blocks"] = 0
        positive, negative = tiny_models.conditioning("wan21", seed=1)
        out = nodes.common_ksampler(self.model, 1, STEPS, 4.0, "euler", "simple", positive, negative,
                                    tiny_models.latent("wan21", seed=2, size=8))[0]["samples"]
        return out, self.counts["blocks"]


def ray_patch(patch_func):
    """Raylight's ``ray_patch``, on local actors: every actor's model becomes ``patch_func(node, model, *args)``."""
    def wrapper(node, ray_actors, *args, **kwargs):
        for actor in ray_actors["workers"]:
            actor.model = patch_func(node, actor.model, *args, **kwargs)
        return (ray_actors,)
    return wrapper


def ray_patch_with_return(patch_func):
    """Raylight's ``ray_patch_with_return``, on local actors: what ``patch_func`` returns on rank 0's model."""
    def wrapper(node, ray_actors, *args, **kwargs):
        return patch_func(node, ray_actors["workers"][0].model, *args, **kwargs)
    return wrapper


def test_installing_no_chain_removes_the_chain_installed_before(comfy):
    actor_side, adapter, ic = (comfy.module(m) for m in ("adapter.raylight", "adapter", "interceptors"))
    args = (comfy.pack_path, comfy.pack.__name__)
    options = {"allow_distilled": False, "cache_on_cpu": False}
    actor = Actor()
    plain, plain_blocks = actor.sample()
    assert plain_blocks == FULL

    cadence = ic.InterceptorChain.of([ic.FixedCadence(interval=2)])
    actor.model = actor_side.install(None, actor.model, *args, pickle.dumps((cadence, options)))
    assert adapter.installed_chain(actor.model) == cadence
    assert "Fixed Cadence" in actor_side.summary(None, actor.model, *args)
    cached, cached_blocks = actor.sample()
    assert cached_blocks < FULL and not torch.equal(cached, plain), "the chain did not run: the test proves nothing"

    actor.model = actor_side.install(None, actor.model, *args, pickle.dumps((ic.InterceptorChain(), options)))
    assert adapter.installed_chain(actor.model) is None
    assert not any("cached_sampler" in by_key for by_key in actor.model.wrappers.values())
    assert "Installed on" in actor_side.summary(None, actor.model, *args)
    assert "(nothing)" in actor_side.summary(None, actor.model, *args)
    after, after_blocks = actor.sample()
    assert after_blocks == FULL, "the other node's block replacement was not put back"
    assert torch.equal(after, plain), "the model still runs something of the removed chain"


def test_the_node_with_nothing_connected_removes_the_chain(comfy, monkeypatch):
    """Through the executor: a prompt installs a chain on the actors, the next one, with the node's 'interceptors'
    left unconnected (the input is optional), removes it; the node says so and the actors sample as before."""
    monkeypatch.setattr(comfy.module("adapter.raylight"), "raylight_patchers", lambda: (ray_patch, ray_patch_with_return))
    actors = CAPTURED["ray_actors"] = {"workers": [Actor(), Actor()]}
    plain = [actor.sample() for actor in actors["workers"]]

    def prompt(chain: bool) -> dict:  # Raylight's loader -> Apply Interceptors (Raylight) -> Raylight's sampler
        p = {"actors": {"class_type": "TestRayActors", "inputs": {"key": "ray_actors"}},
             "apply": {"class_type": "CachedSamplerApplyInterceptorsRaylight",
                       "inputs": {"ray_actors": ["actors", 0], "allow_distilled": False, "cache_on_cpu": False}},
             "sample": {"class_type": "TestRayActorsSample", "inputs": {"ray_actors": ["apply", 0],
                                                                        "key": "ray_samples"}}}
        if chain:
            graphs.config(p, "fc", "CachedSamplerFixedCadence", interval=2, start_percent=0.0, end_percent=1.0)
            p["apply"]["inputs"]["interceptors"] = ["fc", 0]
        return p

    _, ui = comfy.run(prompt(chain=True))
    assert "Fixed Cadence" in ui["apply"]["text"][0]
    assert all(blocks < FULL for _, blocks in CAPTURED["ray_samples"]), "the chain did not run on the actors"

    _, ui = comfy.run(prompt(chain=False))
    text = ui["apply"]["text"][0]
    assert "(nothing)" in text and "Fixed Cadence" not in text, text
    adapter = comfy.module("adapter")
    for actor, (out, blocks), (after, after_blocks) in zip(actors["workers"], plain, CAPTURED["ray_samples"]):
        assert adapter.installed_chain(actor.model) is None
        assert after_blocks == blocks == FULL
        assert torch.equal(after, out)
