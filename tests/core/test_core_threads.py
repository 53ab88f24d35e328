"""The devices' threads of one evaluation (ComfyUI's native multi-GPU path) take one decision from the sums of all
their rows, as one device measures them; a thread that never comes, or a count that is not known, switches the run
off after a bounded wait. Plain threads here; tests/distributed/test_native_multigpu.py runs ComfyUI's own path."""
import threading
import time

import pytest
import torch

from cached_sampler_dev.devkit.pack import load_core

load_core()
from cached_sampler_pack import interceptors as ic  # noqa: E402
from cached_sampler_pack.interceptors import metrics, threads  # noqa: E402

SIGMAS = [1.0, 0.75, 0.5, 0.25, 0.0]
# branch 0 changed by a tenth of its anchor, branch 1 by nine tenths: 0.1 and 0.9 apart, 0.5 together
ANCHORS = {0: torch.ones(4), 1: torch.ones(4)}
CURRENT = {0: torch.full((4,), 1.1), 1: torch.full((4,), 1.9)}


def _split(current: dict, parts: list[list[int]]):
    keys = {b: ic.BranchKey(b, f"u{b}", 0, (4,), "f") for b in current}
    anchor = {keys[b]: ANCHORS[b] for b in current}
    measures = [metrics.relative_l1_of({keys[b]: current[b] for b in part}, anchor) for part in parts]
    metrics.values(*measures)
    return measures


def test_gathered_sums_give_the_measure_of_all_rows():
    (whole,) = _split(CURRENT, [[0, 1]])
    parts = _split(CURRENT, [[1], [0]])
    assert [m.value() for m in parts] == [pytest.approx(0.9), pytest.approx(0.1)]
    assert metrics.combined(parts).value() == whole.value() == pytest.approx(0.5)
    means = [metrics.mean_abs_of([t]) for t in (torch.ones(2), torch.full((6,), 3.0))]
    metrics.values(*means)
    assert metrics.combined(means).value() == pytest.approx((2 + 18) / 8)  # over 8 values, not a mean of means
    opaque = metrics.Measure([], lambda host: 1.0, host=[])
    assert metrics.combined([parts[0], opaque]) is None


def _run(wait_s=None, monkeypatch=None, threshold=0.3):
    if wait_s is not None:
        monkeypatch.setenv(threads.WAIT_ENV, str(wait_s))
    decider = ic.DBCache(threshold=threshold, warmup=0.0, max_consecutive_cached=-1)
    run = ic.LoopState(ic.InterceptorChain.of([decider]), SIGMAS)
    run.begin_evaluation(SIGMAS[0])
    run.end_evaluation()
    run.begin_evaluation(SIGMAS[1])  # neither the first evaluation nor the last step: the rule decides
    return run, run.chain.deciders[0]


def _forward(run, decider, branches):
    forward = run.begin_forward(None, len(branches), (4,), torch.float32, branches, [f"u{b}" for b in branches])
    for key in forward.keys:
        run.branch_of(decider, key).anchor = ANCHORS[key.branch]
    return {key: CURRENT[key.branch] for key in forward.keys}


def _on_threads(run, decider, expected, branches_per_thread):
    run.gather_device_threads()
    run.threads.expect(run.evaluation.index, expected)
    decided = {}

    def device(branches):
        signals = _forward(run, decider, branches)
        decided[tuple(branches)] = run.decide(decider, signals)
    workers = [threading.Thread(target=device, args=(b,)) for b in branches_per_thread]
    started = time.monotonic()
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=30)
    assert not any(w.is_alive() for w in workers), "a device's thread hangs"
    return decided, time.monotonic() - started


def test_the_threads_of_an_evaluation_decide_once_on_all_their_rows_as_one_device_does():
    single, decider = _run()
    one_device = single.decide(decider, _forward(single, decider, [1, 0]))
    run, decider = _run()
    decided, _ = _on_threads(run, decider, 2, [[0], [1]])
    # 0.5 over both branches: compute, on every thread (branch 0 alone, 0.1, would have skipped)
    assert one_device is True and decided == {(0,): True, (1,): True}
    assert run.records[1].metric == single.records[1].metric == pytest.approx(0.5)
    assert not run.off and not run.notes
    # and where all rows agree on skipping, every thread skips
    run, decider = _run(threshold=0.7)
    decided, _ = _on_threads(run, decider, 2, [[1], [0]])
    assert decided == {(0,): False, (1,): False} and run.records[1].metric == pytest.approx(0.5)


@pytest.mark.parametrize("expected", [3, None])
def test_a_thread_that_never_comes_or_an_unknown_count_computes_in_full_with_a_note(monkeypatch, expected):
    run, decider = _run(wait_s=0.3, monkeypatch=monkeypatch, threshold=0.7)
    decided, seconds = _on_threads(run, decider, expected, [[0], [1]])
    assert decided == {(0,): True, (1,): True} and run.off and seconds < 10
    assert len(run.notes) == 1 and "native multi-GPU" in run.notes[0]
    assert ("2 of the step's 3" in run.notes[0]) if expected else ("could not be told" in run.notes[0])


def test_the_wait_comes_from_the_environment_or_the_default(monkeypatch):
    monkeypatch.delenv(threads.WAIT_ENV, raising=False)
    assert threads.thread_wait() == threads.DEFAULT_WAIT_S
    monkeypatch.setenv(threads.WAIT_ENV, "2.5")
    assert threads.thread_wait() == 2.5
    for bad in ("soon", "0", "-1", "inf"):
        monkeypatch.setenv(threads.WAIT_ENV, bad)
        with pytest.raises(ValueError, match=threads.WAIT_ENV):
            threads.thread_wait()


def test_every_measuring_decider_of_the_pack_is_gathered():
    measuring = [d() for d in (ic.DBCache, ic.FirstBlockCache, ic.TeaCache, ic.AdaptiveCache, ic.VerifiedForecast,
                               ic.VerifiedBlockCache)]
    assert all(d.signal not in (ic.Signal.NONE, ic.Signal.GUIDANCE) and threads.gathers(d) for d in measuring)
