"""Block-level caching on the model families ComfyUI added after v0.8.0 (and LTX-2's audio-video model), each
built through ComfyUI's own classes at a tiny size and sampled through ComfyUI's executor: the card offers the
blocks the model really routes through ``patches_replace["dit"]``, threshold 0 is bit-identical to the plain
sampler, caching really skips blocks, and with pass-through blocks in the skipped span a skip changes nothing
(every stream restored from its own residual, every addition between blocks counted once). Families ComfyUI
v0.8.0 lacks are skipped there, by class lookup."""
from __future__ import annotations

import copy

import pytest
import torch

from cached_sampler_dev.support import graphs
from cached_sampler_dev.support import tiny_models
from cached_sampler_dev.support.tiny_nodes import CAPTURED

STEPS = 8

# tiny family -> supported_models config class
BLOCK_FAMILIES = {
    "ltxav": "LTXAV",
    "wan_dancer": "WAN22_WanDancer",
    "wan_animate2": "WAN_Animate2",
    "wan_scail": "WAN21_SCAIL",
    "wan_scail2": "WAN21_SCAIL2",
    "wan_flowrvs": "WAN21_FlowRVS",
    "longcat_image": "LongCatImage",
    "mage_flow": "MageFlow",
    "joyimage": "JoyImage",
    "lens": "Lens",
}


def needs(family):
    import comfy.supported_models
    config = BLOCK_FAMILIES.get(family) or tiny_models._spec(family)[0]
    if not hasattr(comfy.supported_models, config):
        pytest.skip(f"this ComfyUI has no {config} (added after v0.8.0)")


def streams(samples) -> list[torch.Tensor]:
    return list(samples.unbind()) if getattr(samples, "is_nested", False) else [samples]


def run(comfy, prompt, key="out"):
    CAPTURED.pop(key, None)
    _, ui = comfy.run(copy.deepcopy(prompt))
    return streams(CAPTURED[key]), ui


def dbcache(prompt, threshold, front=1, back=0, node_id="db"):
    return graphs.config(prompt, node_id, "CachedSamplerDBCache", Fn=front, Bn=back, threshold=threshold, warmup=0.0,
                         max_cached_steps=-1, max_consecutive_cached=3, start_percent=0.0, end_percent=1.0)


def first_block_cache(prompt, threshold, node_id="fb"):
    return graphs.config(prompt, node_id, "CachedSamplerFirstBlockCache", threshold=threshold, warmup=0.0,
                         max_cached_steps=-1, max_consecutive_cached=3, start_percent=0.0, end_percent=1.0)


def prompt_for(family, identity_from=-1, offset=False, drop=None):
    """The tiny ``family`` (pass-through blocks from ``identity_from`` on; ``offset``: block 1 adds fixed vectors
    to every stream), counted, with its conditioning (``drop``: without that extra)."""
    prompt = graphs.base(family)
    if identity_from >= 0:
        prompt["model"] = {"class_type": "TestTinyModelIdentityBlocks",
                           "inputs": {"family": family, "seed": 0, "identity_from": identity_from}}
    graphs.count_work(prompt, family, node_id="counted")
    if offset:  # after the counter, which it chains to
        prompt["count"] = {"class_type": "TestStreamOffset", "inputs": {"model": ["counted", 0], "group": "double_block",
                                                                       "index": 1, "seed": 17, "scale": 0.05}}
    else:
        prompt["count"] = prompt.pop("counted")
    if drop:
        prompt["cond"] = {"class_type": "TestTinyConditioningWithout", "inputs": {"family": family, "drop": drop}}
    return prompt


def sample(comfy, prompt, chain=None):
    prompt = copy.deepcopy(prompt)
    chain_id = chain(prompt) if chain else None
    graphs.sampler(prompt, "CachedSampler" if chain_id else "KSampler", chain=chain_id, model="count", steps=STEPS)
    out, ui = run(comfy, prompt)
    return out, dict(CAPTURED["work"]), ui


def notes(ui):
    return [n for r in ui["sampler"]["cached_sampler"][0]["runs"] for n in r["notes"]]


def max_diff(a, b):
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


@pytest.mark.parametrize("family", list(BLOCK_FAMILIES))
def test_a_new_family_is_carded_with_the_blocks_it_routes_through_the_slots(comfy, family):
    needs(family)
    adapter, ic = comfy.module("adapter"), comfy.module("interceptors")
    card = adapter.model_card(tiny_models.build(family))
    assert ic.Granularity.BLOCKS in card.levels, card
    assert {g.name: g.count for g in card.groups} == tiny_models.block_groups(family)
    assert card.blocks_off is None


@pytest.mark.parametrize("family", list(BLOCK_FAMILIES))
def test_a_new_family_at_threshold_zero_is_bit_identical_and_skips_blocks_when_caching(comfy, family):
    needs(family)
    total = sum(tiny_models.block_groups(family).values())
    prompt = prompt_for(family)
    exact, plain_work, _ = sample(comfy, prompt)
    assert plain_work["blocks"] == STEPS * total, plain_work  # one batched forward (both branches) per step
    for chain in (lambda p: dbcache(p, 0.0), lambda p: dbcache(p, 0.0, front=1, back=1)):
        ours, work, ui = sample(comfy, prompt, chain)
        assert all(torch.equal(a, b) for a, b in zip(exact, ours)), max_diff(exact, ours)
        assert work["blocks"] == STEPS * total and notes(ui) == []
    cached, work, ui = sample(comfy, prompt, lambda p: dbcache(p, 100.0))
    assert work["forwards"] == STEPS and work["blocks"] < STEPS * total, work  # blocks were really skipped
    assert all(torch.isfinite(s).all() for s in cached) and notes(ui) == []


def test_ltx2_restores_the_video_and_the_audio_stream_each_from_its_own_residual(comfy):
    """LTX-2's blocks take and return (video, audio). Blocks 1-2 pass both through, and block 1 adds fixed
    vectors of its own to each stream: the skipped span's residual is exactly those vectors, on every step. A
    cache that keeps and restores each stream's residual gives the uncached result; one that dropped the audio
    residual, or applied the video's to the audio, would lose or misplace the audio vector on every skipped
    step (and each stream's vector moves that stream's result, checked below)."""
    prompt = prompt_for("ltxav", identity_from=1, offset=True)
    exact, _, _ = sample(comfy, prompt)
    for chain in (lambda p: dbcache(p, 100.0), lambda p: first_block_cache(p, 100.0)):
        cached, work, ui = sample(comfy, prompt, chain)
        assert work["forwards"] == STEPS and work["blocks"] < STEPS * 3, work
        for name, a, b in zip(("video", "audio"), cached, exact):
            assert torch.allclose(a, b, rtol=0, atol=1e-5), (name, float((a - b).abs().max()))
        assert notes(ui) == []
    # each stream's offset matters to that stream: without them both streams end elsewhere
    without, _, _ = sample(comfy, prompt_for("ltxav", identity_from=1))
    for name, a, b in zip(("video", "audio"), exact, without):
        assert float((a - b).abs().max()) > 0.05, name


@pytest.mark.parametrize("method", ["first_block_cache", "dbcache"])
def test_wandancer_music_injected_between_blocks_is_counted_once_on_skipped_steps(comfy, method):
    """WanDancer's music injector adds to the stream after every block (of its inject layers) when the
    conditioning carries music features. With blocks 1-2 passing their input through, a skipped span holds
    nothing but the injections: the cached run equals the uncached one exactly when they are counted once (a
    card without the music input counted them twice: First Block Cache moved the result by 5e-2)."""
    needs("wan_dancer")
    prompt = prompt_for("wan_dancer", identity_from=1)
    exact, _, _ = sample(comfy, prompt)
    make = first_block_cache if method == "first_block_cache" else dbcache
    cached, work, ui = sample(comfy, prompt, lambda p: make(p, 100.0))
    assert work["forwards"] == STEPS and work["blocks"] < STEPS * 3, work
    assert max_diff(cached, exact) < 1e-5, max_diff(cached, exact)
    assert notes(ui) == []
    without, _, _ = sample(comfy, prompt_for("wan_dancer", identity_from=1, drop="audio_embed"))
    assert max_diff(exact, without) > 0.05, "the music changes the result"


@pytest.mark.parametrize("family,config", [("wan_causal", "WAN21_CausalAR_T2V")])
def test_a_family_whose_blocks_bypass_the_slots_is_refused_block_level_with_its_reason(comfy, family, config):
    """Causal Wan runs its blocks itself and never consults the slots: block-level nodes are refused before
    sampling, saying why, and whole-model caching runs."""
    needs(family)
    adapter, ic = comfy.module("adapter"), comfy.module("interceptors")
    card = adapter.model_card(tiny_models.build(family))
    assert card.levels == frozenset({ic.Granularity.MODEL}) and card.blocks_off
    prompt = prompt_for(family)
    graphs.sampler(prompt, "CachedSampler", chain=first_block_cache(prompt, 1.0), model="count", steps=STEPS)
    prompt["sampler"]["inputs"]["allow_distilled"] = True  # it is also distilled: the block level is the point here
    CAPTURED.pop("out", None)
    error = comfy.run(copy.deepcopy(prompt), expect_error=True)[1]["error"]
    assert error is not None and error["node_id"] == "sampler", error
    message = error["exception_message"]
    assert "First Block Cache (node fb)" in message and card.blocks_off in message, message
    assert CAPTURED["work"]["forwards"] == 0
    cadence = graphs.config(prompt, "fc", "CachedSamplerFixedCadence", interval=2, start_percent=0.0,
                            end_percent=1.0)
    prompt["sampler"]["inputs"]["interceptors"] = [cadence, 0]
    out, _ = run(comfy, prompt)
    assert CAPTURED["work"]["forwards"] < STEPS and all(torch.isfinite(s).all() for s in out)
