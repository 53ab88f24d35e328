"""Limits that hold for every frame under ComfyUI's context windows, for every method of the shared list that has
them (tests/support/methods.py): a skip limit (``max_consecutive_cached``, MagCache's K) and an accumulated error
(TeaCache, MagCache, Adaptive Cache).

The uniform schedules move their windows every step: a window new to the run has nothing cached, so it is
computed even on an evaluation the decider chose to skip, while every other window reuses its cache. What the
decider accumulates over the run (skips, error) must go on there; had it started over, the windows that reused
would go on reusing past the limit. Counted at the model (the blocks each window's forward really ran), against
what the decider reported."""
from __future__ import annotations

import dataclasses

import pytest

from cached_sampler_dev.support import graphs
from cached_sampler_dev.support import methods
from cached_sampler_dev.support import tiny_models
from cached_sampler_dev.devkit.work_nodes import count_work

LIMIT = 2
STEPS = 10
FRAMES = 9
SCHEDULES = ("standard_static", "standard_uniform")


def _chain(ic, name: str):
    """The shared list's chain of ``name`` with every skip limit at LIMIT; TeaCache with the gentler LTXV fit (Wan's
    turns the random tiny Wan's changes into values far above any threshold)."""
    items = []
    for item in methods.skipping(ic)[name]:
        if isinstance(item, ic.Decider) and item.granularity != ic.Granularity.GUIDANCE:
            item = dataclasses.replace(item, max_consecutive_cached=LIMIT)
        if isinstance(item, ic.TeaCache):
            item = dataclasses.replace(item, model_type="ltxv")
        items.append(item)
    return ic.InterceptorChain.of(items)


def _limited(ic, name: str) -> bool:
    return any(d.max_consecutive_cached >= 0 for d in _chain(ic, name).deciders)


def _accumulates(ic, name: str) -> bool:
    return isinstance(methods.skipping(ic)[name][0], (ic.TeaCache, ic.MagCache, ic.AdaptiveCache))


def _sample(comfy, chain, schedule: str):
    """9 frames in windows of 3 (overlap 1) on the tiny Wan 2.1: per evaluation, the frames each forward covered and
    whether it ran every block, and the metric the decider reported."""
    import nodes
    adapter = comfy.module("adapter")
    spec = graphs.context_windows(context_schedule=schedule, context_length=3, context_overlap=1)
    windows = nodes.NODE_CLASS_MAPPINGS["ContextWindowsManual"]
    inputs = dict(spec["inputs"], model=tiny_models.build("wan21"))
    model = windows.execute(**inputs)[0] if hasattr(windows, "execute") else windows().patch(**inputs)[0]
    work: dict = {}
    groups = tiny_models.block_groups("wan21")
    model = count_work(model, work, groups)
    metrics = []
    patched = adapter.install(model, chain, on_evaluation=lambda run, ev: metrics.append(ev.record.metric))
    positive, negative = tiny_models.conditioning("wan21", seed=1)
    latent = tiny_models.latent("wan21", seed=5)
    latent = {"samples": latent["samples"].repeat(FRAMES, *[1] * (latent["samples"].ndim - 1))}
    nodes.common_ksampler(patched, 1, STEPS, 3.0, "euler", "simple", positive, negative, latent)
    blocks = sum(groups.values())
    fresh = [set() for _ in range(work["evaluations"])]  # per evaluation: the frames some window computed in full
    for evaluation, frames, ran in work["forward_log"]:
        assert frames is not None, "every forward covers a window"
        if ran == blocks:
            fresh[evaluation - 1] |= set(frames)
    return fresh, metrics


def _stale_runs(fresh: list[set]) -> list[tuple[int, range]]:
    """(frame, evaluations in a row no window computed it in full), for every such run."""
    runs = []
    for frame in range(FRAMES):
        start = None
        for e, computed in enumerate(fresh + [set(range(FRAMES))]):
            if frame not in computed and start is None:
                start = e
            elif frame in computed and start is not None:
                runs.append((frame, range(start, e)))
                start = None
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("name", methods.NAMES)
def test_every_frame_keeps_the_methods_skip_and_error_limits_under_context_windows(comfy, name):
    ic = comfy.module("interceptors")
    limited, accumulates = _limited(ic, name), _accumulates(ic, name)
    blocks = methods.skipping(ic)[name][0].granularity == ic.Granularity.BLOCKS
    if not (limited or accumulates):
        pytest.skip(f"{name} keeps no skip limit or accumulated error")
    for schedule in SCHEDULES:
        fresh, metrics = _sample(comfy, _chain(ic, name), schedule)
        runs = _stale_runs(fresh)
        if schedule == "standard_static" or blocks:  # a whole-model cache measures the first window's change,
            # which the uniform schedules move: it computes every step there, and a block cache must still reuse
            assert runs, f"{name} reused nothing under {schedule}: the test would prove nothing"
        if limited:
            longest = max(runs, key=lambda fr: len(fr[1]), default=(None, range(0)))
            assert len(longest[1]) <= LIMIT, (schedule, "frame", longest[0], "reused for evaluations",
                                              list(longest[1]), f"beyond the limit of {LIMIT}")
        if accumulates:  # the error a reused cache carries is never started over while it is reused
            for frame, stale in runs:
                seen = [metrics[e] for e in stale if metrics[e] is not None]
                assert seen == sorted(seen), (schedule, "frame", frame, "evaluations", list(stale), seen)
