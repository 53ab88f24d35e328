"""Apply Interceptors (Raylight): the chain reaches the model inside every Ray actor, replaces the one before, and
rank 0 says what runs there.

Runs Raylight's real ``ray_patch`` / ``ray_patch_with_return`` (from a Raylight checkout named by
``RAYLIGHT_PATH``) against local Ray actors on CPU. Raylight's own actor (``RayWorker``) needs CUDA, NCCL and
xDiT, so the actors here are a stand-in with its interface (``model_function_runner`` replaces the actor's model
with ``fn(model, ...)``, ``model_function_runner_get_values`` returns ``fn(model, ...)``) holding ComfyUI's tiny
Wan; the pack is not importable in them, as in Raylight's. Skipped, loudly, without ray or Raylight.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from cached_sampler_dev.support import tiny_models
from cached_sampler_dev.devkit.comfy_harness import find_comfyui, import_headless

RAYLIGHT = Path(os.environ.get("RAYLIGHT_PATH", "")).expanduser()
STEPS = 6


class Actor:
    """Raylight's actor interface on CPU: a model that lives on across prompts, patched by functions sent to it."""

    def __init__(self, comfy_path: str):
        torch.set_num_threads(1)
        import_headless(Path(comfy_path))  # ahead of the working directory, where the pack's own nodes/ would shadow it
        self.counts = counts = {"blocks": 0}
        self.model = tiny_models.build("wan21")

        def counting(args, extra):  # someone else's block replacement, which the pack must chain to and put back
            counts["blocks"] += 1
            return extra["original_block"](args)
        for index in range(3):
            self.model.set_model_patch_replace(counting, "dit", "double_block", index)

    def model_function_runner(self, fn, *args, **kwargs):
        self.model = fn(self.model, *args, **kwargs)

    def model_function_runner_get_values(self, fn, *args, **kwargs):
        return fn(self.model, *args, **kwargs)

    def pack_importable(self, package: str) -> bool:
        return package in sys.modules

    def sample(self):
        import nodes
        self.counts["blocks"] = 0
        positive, negative = tiny_models.conditioning("wan21", seed=1)
        out = nodes.common_ksampler(self.model, 1, STEPS, 4.0, "euler", "simple", positive, negative,
                                    tiny_models.latent("wan21", seed=2, size=8))[0]["samples"]
        wrappers = {kind: list(by_key) for kind, by_key in self.model.wrappers.items()}
        return out, self.counts["blocks"], wrappers


@pytest.fixture(scope="module")
def ray():
    ray = pytest.importorskip("ray", reason="!!! ray is not installed (pip install ray): the Raylight test is SKIPPED !!!")
    if not (RAYLIGHT / "src" / "raylight" / "comfy_extra_dist" / "ray_patch_decorator.py").is_file():
        pytest.skip("!!! RAYLIGHT_PATH does not name a komikndr/raylight checkout: the Raylight test is SKIPPED !!!")
    return ray


@pytest.fixture(scope="module")
def actors(ray):
    comfy_path = str(find_comfyui())
    sys.path.insert(0, str(RAYLIGHT / "src"))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": {"PYTHONPATH": comfy_path,  # the development wing comes from its install
                                       "OMP_NUM_THREADS": "1"}})
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # this test module is not importable there
    workers = [ray.remote(num_cpus=1)(Actor).remote(comfy_path) for _ in range(2)]
    yield {"workers": workers}
    ray.shutdown()


def test_install_reaches_every_actor_and_replaces_the_previous_chain(comfy, ray, actors):
    raylight, ic = comfy.module("adapter.raylight"), comfy.module("interceptors")
    package = comfy.pack.__name__
    workers = actors["workers"]
    assert not any(ray.get([w.pack_importable.remote(package) for w in workers]))

    plain = ray.get([w.sample.remote() for w in workers])
    cadence = ic.InterceptorChain.of([ic.FixedCadence(interval=2)])
    text = raylight.install_on_actors(actors, cadence)
    assert "Fixed Cadence" in text and "No xDiT parallelism" in text
    assert all(ray.get([w.pack_importable.remote(package) for w in workers])), "the pack was not imported there"
    first = ray.get([w.sample.remote() for w in workers])
    dbcache = ic.InterceptorChain.of([ic.DBCache(front=1, back=0, threshold=100.0, warmup=0.0,
                                                 max_consecutive_cached=1)])
    text = raylight.install_on_actors(actors, dbcache)  # a second install replaces, it does not fail
    assert "DBCache" in text and "Fixed Cadence" not in text
    second = ray.get([w.sample.remote() for w in workers])

    full = 3 * STEPS  # every block of every step, one batched forward per step
    assert [blocks for _, blocks, _ in plain] == [full, full]
    for chain, results in ((cadence, first), (dbcache, second)):  # as the same chain, installed once, in one process
        out, blocks = local_run(comfy, chain)
        assert blocks < full
        for actor_out, actor_blocks, wrappers in results:
            assert actor_blocks == blocks, f"{chain.describe()}: {actor_blocks} blocks on the actor, {blocks} here"
            torch.testing.assert_close(actor_out, out)
            assert all(keys.count("cached_sampler") <= 1 for keys in wrappers.values()), wrappers


def local_run(comfy, chain):
    import nodes
    adapter = comfy.module("adapter")
    counts = {"blocks": 0}

    def counting(args, extra):
        counts["blocks"] += 1
        return extra["original_block"](args)
    model = tiny_models.build("wan21")
    for index in range(3):
        model.set_model_patch_replace(counting, "dit", "double_block", index)
    positive, negative = tiny_models.conditioning("wan21", seed=1)
    out = nodes.common_ksampler(adapter.install(model, chain), 1, STEPS, 4.0, "euler", "simple", positive, negative,
                                tiny_models.latent("wan21", seed=2, size=8))[0]["samples"]
    return out, counts["blocks"]


def test_uninstall_puts_back_what_was_there(comfy):
    adapter, ic = comfy.module("adapter"), comfy.module("interceptors")
    model = tiny_models.build("wan21")
    mine = lambda args, extra: extra["original_block"](args)  # noqa: E731
    model.set_model_patch_replace(mine, "dit", "double_block", 1)
    patched = adapter.install(model, ic.InterceptorChain.of([ic.DBCache(front=1, back=0)]))
    clean = adapter.uninstall(patched)
    assert adapter.installed_chain(clean) is None
    dit = clean.model_options["transformer_options"]["patches_replace"]["dit"]
    assert dit == {("double_block", 1): mine}
    assert not any("cached_sampler" in by_key for by_key in clean.wrappers.values())
    assert adapter.uninstall(model) is model


def test_raylights_own_teacache_on_the_same_model_is_refused(comfy):
    adapter, ic = comfy.module("adapter"), comfy.module("interceptors")
    model = tiny_models.build("wan21").clone()
    model.add_wrapper_with_key("outer_sample", "teacache", lambda executor, *args, **kwargs: executor(*args, **kwargs))
    with pytest.raises(ic.ChainError, match="Raylight's TeaCache"):
        adapter.install(model, ic.InterceptorChain.of([ic.FixedCadence(interval=2)]))
