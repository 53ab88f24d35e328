"""Cache memory: what a run holds is counted, stays within (order + 2) block-stream tensors per branch and cached
quantity, equals what interceptors/memory.py predicts, and the table in docs/memory.md is that arithmetic."""
from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch

from cached_sampler_dev.support import methods
from cached_sampler_dev.support import tiny_models
from cached_sampler_dev.devkit.pack import load_core


ic = load_core()
caches = importlib.import_module(f"{ic.__name__}.caches")
memory = importlib.import_module(f"{ic.__name__}.memory")
STEPS = 12


def test_held_bytes_counts_each_storage_once_per_device_through_dicts_lists_and_dataclasses():
    """Views of one tensor count once, with their whole storage (what stays allocated)."""
    @dataclasses.dataclass
    class Anchor:
        residual: torch.Tensor

    both = torch.zeros(2, 10)                      # 80 bytes, seen through two row views and itself
    other = torch.zeros(3, dtype=torch.bfloat16)   # 6 bytes
    root = {"a": {0: both[:1], 1: both[1:]}, "b": [both, (other,)], "c": Anchor(other), "n": 1.5}
    root["self"] = root                            # a cycle is walked once
    assert caches.held_bytes(root) == {"cpu": 86}


def test_the_summary_says_what_the_cache_held():
    summary = ic.RunSummary(steps=1, evaluations=1, evaluations_skipped=0, forwards_computed=1, forwards_skipped=0,
                            blocks_run=0, blocks_total=0, branches={}, interceptors=(), acted=(), seconds=0.0,
                            cache_bytes={"cuda:0": 1_200_000_000}, cache_peak_bytes={"cuda:0": 1_300_000_000})
    assert "cache 1.2 GB on cuda:0 (peak 1.3 GB)" in summary.text()
    offloaded = dataclasses.replace(summary, cache_bytes={"cpu": 5_000, "cuda:0": 10},
                                    cache_peak_bytes={"cpu": 6_000, "cuda:0": 10})
    assert offloaded.cache_text == "cache peak 6 KB on cpu + 10 B on cuda:0; 5.01 KB at the end"


def test_the_memory_table_in_docs_is_current():
    from cached_sampler_dev.generate import make_memory_table
    assert make_memory_table.section() in make_memory_table.DOC.read_text(), (
        "docs/memory.md's cache-memory table is out of date: run python3 -m cached_sampler_dev.generate.make_memory_table")


# The tiny Flux of the integration tests as interceptors/memory.py sees it: 16x16 latent, patch 2 -> 64 image
# tokens, 4 text tokens, hidden 64, float32 blocks, cond and uncond.
TINY_FLUX = memory.StreamShape("tiny Flux", "flux", "joint", image_tokens=64, text_tokens=4, hidden=64,
                               latent_elements=16 * 16 * 16, branches=2, stream_bytes=4)
# The shared list's methods (tests/support/methods.py) that are one decider declaring a cache footprint, with their settings
# that skip on the tiny Flux.
COUNTED = [name for name, chain in methods.skipping(ic).items()
           if len(chain) == 1 and chain[0].footprint is not None and chain[0].footprint.cached != "negative_branch"]
# The verified methods come with their estimator in the shared list (their check is of its forecast).
VERIFIED = [name for name in methods.NAMES if name.startswith("verified")]


# TaylorSeer of order 2 holds its 3 points only after 3 computed steps: TeaCache's shared setting skips nearly every
# step of the tiny Flux, so it computes more here.
SETTINGS = {"teacache": dict(threshold=1.0)}


def skipping(core, name):
    """Method ``name``'s decider, from the interceptors package ComfyUI loaded."""
    return dataclasses.replace(methods.skipping(core)[name][0], **SETTINGS.get(name, {}))


@pytest.fixture(scope="module")
def sample_tiny_flux(comfy):
    import nodes
    adapter = comfy.module("adapter")
    core = comfy.module("interceptors")
    model = tiny_models.build("flux")
    pos, neg = tiny_models.conditioning("flux", seed=1)

    def sample(chain, cache_on_cpu=False):
        runs = []
        patched = adapter.install(model, core.InterceptorChain.of(chain), cache_on_cpu=cache_on_cpu, on_run_end=lambda r, s: runs.append(r))
        nodes.common_ksampler(patched, 42, STEPS, 3.0, "euler", "simple", pos, neg, tiny_models.latent("flux"))
        return runs[0]
    return sample


@pytest.mark.parametrize("order", [None, 1, 2])
@pytest.mark.parametrize("method", COUNTED)
def test_a_run_holds_what_the_memory_table_predicts_and_at_most_order_plus_2_streams(comfy, sample_tiny_flux,
                                                                                    method, order):
    core = comfy.module("interceptors")
    chain = [skipping(core, method)] + ([] if order is None else [core.TaylorSeer(order=order)])
    run = sample_tiny_flux(chain)
    assert sum(r.skipped for r in run.records) >= 2, "the run must really skip for its caches to fill"
    held = sum(run.cache_peak_bytes.values())
    assert held == memory.cache_memory(TINY_FLUX, chain[0], order).total
    assert run.cache_bytes and set(run.cache_peak_bytes) == {"cpu"}
    points = 1 if order is None else order + 1
    footprint = chain[0].footprint
    # the Adaptive Cache's 3 latent-sized float32 anchors, at either level
    anchors = (3 if footprint.anchor == "model_anchors" else 0) * TINY_FLUX.latent_elements * 4 * TINY_FLUX.branches
    if footprint.cached == "model_outputs":   # model outputs, float32
        bound = points * TINY_FLUX.latent_elements * 4 * TINY_FLUX.branches + anchors
    else:   # (order + 2) block-stream tensors per branch and cached quantity (a feature level's: and its anchors)
        bound = (points + 1) * TINY_FLUX.segment_streams * TINY_FLUX.branches + anchors
    assert held <= bound


@pytest.mark.parametrize("method, window", [("fixed cadence", 4), ("fixed cadence", 10), ("dbcache", 3)])
def test_spectrum_holds_one_point_per_computed_step_up_to_its_window(comfy, sample_tiny_flux, method, window):
    core = comfy.module("interceptors")
    decider = skipping(core, method)
    run = sample_tiny_flux([decider, core.Spectrum(window=window, degree=1)])
    computed = sum(not r.skipped for r in run.records)
    assert sum(r.skipped for r in run.records) >= 2 and computed > 3, "the run must really skip and compute"
    held = sum(run.cache_peak_bytes.values())
    assert held == memory.cache_memory(TINY_FLUX, decider, points=min(window, computed)).total


def test_cache_on_cpu_holds_the_same_bytes(comfy, sample_tiny_flux):
    core = comfy.module("interceptors")
    chain = [core.DBCache(threshold=1.0, warmup=0.0), core.TaylorSeer(order=1)]
    run = sample_tiny_flux(chain, cache_on_cpu=True)
    assert sum(run.cache_peak_bytes.values()) == memory.cache_memory(TINY_FLUX, chain[0], 1, cache_on_cpu=True).total


def test_real_shapes_are_those_of_the_model_cards():
    """The memory table (docs/memory.md) rests on these shapes: each one's image tokens are its 16-channel latent patchified 2x2
    (1x2x2 for video), and the FLUX.1-dev and Wan 2.1 14B widths and Flux's text tokens are those the GPU bench
    builds through ComfyUI's own classes (tools/bench/bench_gpu.py)."""
    from cached_sampler_dev.bench import bench_gpu
    for shape in memory.REAL_SHAPES:
        assert shape.latent_elements == 16 * 4 * shape.image_tokens, shape.name
    flux, wan480, wan720, hunyuan, qwen = memory.REAL_SHAPES
    flux_gpu, _, flux_text, *_ = bench_gpu.SIZES["flux"]["full"]
    assert (flux.hidden, flux.text_tokens) == (flux_gpu["hidden_size"], flux_text)
    assert wan480.hidden == wan720.hidden == bench_gpu.SIZES["wan"]["full"][0]["dim"]
    assert bench_gpu.wan_latent(81) == (16, 21, 60, 104) and wan480.latent_elements == 16 * 21 * 60 * 104
    assert (flux.image_tokens, flux.hidden) == (4096, 3072)
    assert (wan480.image_tokens, wan720.image_tokens, wan480.hidden) == (21 * 30 * 52, 21 * 45 * 80, 5120)
    assert (hunyuan.image_tokens, hunyuan.hidden) == (33 * 45 * 80, 3072)
    assert (qwen.image_tokens, qwen.hidden) == (83 * 83, 3072)
    # one bf16 Wan 720p image stream: 75600 tokens x 5120 x 2 bytes
    assert wan720.image_stream == 774_144_000


@pytest.mark.parametrize("method", ["dbcache", "teacache", "magcache"])
def test_a_wan_run_holds_what_the_memory_table_predicts(comfy, method):
    """Wan's layout: one image stream, text by cross-attention, TeaCache's anchor the small timestep embedding."""
    import nodes
    adapter, core = comfy.module("adapter"), comfy.module("interceptors")
    runs = []
    # TeaCache's Wan polynomial rescales the tiny random model's changes to tens of thousands per step
    decider = core.TeaCache(threshold=3e5) if method == "teacache" else skipping(core, method)
    chain = core.InterceptorChain.of([decider, core.TaylorSeer(order=1)])
    pos, neg = tiny_models.conditioning("wan21", seed=1)
    nodes.common_ksampler(adapter.install(tiny_models.build("wan21"), chain, on_run_end=lambda r, s: runs.append(r)),
                          42, STEPS, 5.0, "euler", "simple", pos, neg, tiny_models.latent("wan21"))
    assert sum(r.skipped for r in runs[0].records) >= 2
    # 2 latent frames of 16x16, patch 1x2x2 -> 128 tokens; hidden 64; float32 blocks; cond and uncond
    tiny_wan = memory.StreamShape("tiny Wan", "wan", "image", image_tokens=128, text_tokens=0, hidden=64,
                                  latent_elements=16 * 2 * 16 * 16, branches=2, stream_bytes=4)
    assert sum(runs[0].cache_peak_bytes.values()) == memory.cache_memory(tiny_wan, decider, 1).total


@pytest.mark.parametrize("name", VERIFIED)
def test_a_verified_method_holds_what_the_memory_table_predicts(comfy, sample_tiny_flux, name):
    """With the estimator it checks (the shared list's chain): the model outputs and the input anchor (Verified
    Forecast), or the segment residuals and the probe's own points (Verified Block Cache)."""
    core = comfy.module("interceptors")
    chain = methods.skipping(core)[name]
    run = sample_tiny_flux(chain)
    assert sum(r.skipped for r in run.records) >= 2, "the run must really skip for its caches to fill"
    computed = sum(not r.skipped for r in run.records)
    points = min(chain[1].order + 1, computed)  # TaylorSeer keeps one point per computed step up to order + 1
    assert sum(run.cache_peak_bytes.values()) == memory.cache_memory(TINY_FLUX, chain[0], points=points).total


@pytest.mark.parametrize("settings, points", [(dict(), 2), (dict(estimate="negative reuse"), 1),
                                              (dict(mode="adaptive", threshold=10.0, interval=3), 3)])
def test_the_guidance_cache_holds_its_history_of_the_negative_branch_only(comfy, sample_tiny_flux, settings, points):
    """The forecast's points of one latent-sized tensor for the negative branch (the positive one is never kept),
    one more in adaptive mode for the last difference; nothing at all at cfg 1 (one branch)."""
    core = comfy.module("interceptors")
    gc = core.GuidanceCache(**{"interval": 2, "start_percent": 0.0, "end_percent": 1.0, **settings})
    run = sample_tiny_flux([gc])
    assert any(r.branches.get("uncond") is False for r in run.records), "the negative branch must be left out"
    held = sum(run.cache_peak_bytes.values())
    assert held == memory.cache_memory(TINY_FLUX, gc).total == points * TINY_FLUX.latent_elements * 4
    assert memory.cache_memory(dataclasses.replace(TINY_FLUX, branches=1), gc).total == 0

