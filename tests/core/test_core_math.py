"""The core's math and schedule helpers, with torch only: each against a value known exactly."""
import dataclasses
import math

import pytest
import torch

from cached_sampler_dev.devkit.pack import load_core

ic = load_core()
from cached_sampler_pack.interceptors import metrics  # noqa: E402
from cached_sampler_pack.interceptors.methods import magcache, planned, taylorseer, teacache  # noqa: E402

SIGMAS = [1.0, 0.9, 0.75, 0.6, 0.45, 0.3, 0.2, 0.1, 0.0]


# -- forecasting ----------------------------------------------------------------------------------
def test_lagrange_weights_reproduce_a_quadratic_and_sum_to_one():
    nodes, at = [1.0, 0.7, 0.3], 0.1
    weights = taylorseer.lagrange_weights(nodes, at)
    f = lambda s: 2 * s * s - 3 * s + 0.5  # noqa: E731
    assert math.isclose(sum(w * f(s) for w, s in zip(weights, nodes)), f(at), abs_tol=1e-12)
    assert math.isclose(sum(weights), 1.0, abs_tol=1e-12)


def test_taylorseer_order_2_forecasts_a_quadratic_in_sigma_exactly():
    seer = ic.TaylorSeer(order=2)
    slot = seer.Slot()
    f = lambda s: torch.tensor([s * s, 1 - s])  # noqa: E731
    for s in (1.0, 0.8, 0.5, 0.4):
        seer.observe(slot, f(s), s)
    assert [s for s, _ in slot.points] == [0.8, 0.5, 0.4]  # order + 1 newest points
    assert torch.allclose(seer.estimate(slot, 0.25, torch.device("cpu")), f(0.25), atol=1e-6)


def test_damping_scales_each_newton_term_from_the_newest_point_back():
    """HiCache's scaling: the k-th Newton term (taken from the newest node back) times (1 - damping)^k. Against the
    terms written out: f[s2] + f[s2,s1](x - s2) + f[s2,s1,s0](x - s2)(x - s1) for a quadratic, and for a line the
    newest value plus the scaled step. A broken variant that scales the Lagrange weights, or counts terms from the
    oldest node, misses these values."""
    f = lambda s: 2 * s * s - 3 * s + 0.5  # noqa: E731
    s0, s1, s2, x, keep = 1.0, 0.7, 0.3, 0.1, 0.75
    d1 = (f(s2) - f(s1)) / (s2 - s1)
    d2 = (d1 - (f(s1) - f(s0)) / (s1 - s0)) / (s2 - s0)
    expected = f(s2) + keep * d1 * (x - s2) + keep ** 2 * d2 * (x - s2) * (x - s1)
    weights = taylorseer.forecast_weights([s0, s1, s2], x, damping=1 - keep)
    assert math.isclose(sum(w * f(s) for w, s in zip(weights, (s0, s1, s2))), expected, abs_tol=1e-12)
    assert math.isclose(sum(weights), 1.0, abs_tol=1e-12)  # a constant stays that constant
    line = taylorseer.forecast_weights([s1, s2], x, damping=0.2)
    assert math.isclose(line[0] * f(s1) + line[1] * f(s2), f(s2) + 0.8 * d1 * (x - s2) * 1.0, abs_tol=1e-12)
    assert taylorseer.forecast_weights([s0, s1, s2], x, damping=0.0) == taylorseer.lagrange_weights([s0, s1, s2], x)
    assert taylorseer.forecast_weights([s0, s1, s2], x, damping=1.0) == [0.0, 0.0, 1.0]  # reuse


def test_taylorseer_damping_forecasts_through_the_weights_and_is_checked():
    seer = ic.TaylorSeer(order=1, damping=0.5)
    slot = seer.Slot()
    for s, v in ((1.0, 3.0), (0.5, 2.0)):
        seer.observe(slot, torch.tensor([v]), s)
    # the line through (1, 3) and (0.5, 2) reads 1.5 at 0.25; half its step from 2.0 is 1.75
    assert torch.allclose(seer.estimate(slot, 0.25, torch.device("cpu")), torch.tensor([1.75]))
    assert [w for w, _ in seer.terms(slot, 0.25)] == pytest.approx([-0.25, 1.25])
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ic.InterceptorError, match="damping"):
            ic.TaylorSeer(order=1, damping=bad).validate()


def test_taylorseer_order_2_with_a_repeated_sigma_in_a_non_monotone_schedule():
    """A custom schedule that returns to a sigma it visited (1.0 -> 0.5 -> 1.0) used to put two nodes at one
    sigma and divide by zero."""
    seer = ic.TaylorSeer(order=2)
    slot = seer.Slot()
    for s, v in ((1.0, 1.0), (0.5, 2.0), (1.0, 3.0)):
        seer.observe(slot, torch.tensor([v]), s)
    assert [s for s, _ in slot.points] == [0.5, 1.0]  # the newer 1.0 replaced the older one
    estimate = seer.estimate(slot, 0.25, torch.device("cpu"))
    assert torch.isfinite(estimate).all()
    assert torch.allclose(estimate, torch.tensor([1.5]))  # the line through (0.5, 2) and (1.0, 3)


def test_plan_error_with_repeated_sigmas_is_finite():
    """Heun evaluates each sigma twice; the plan search forecasts like TaylorSeer and must not divide by zero."""
    sigmas = [1.0, 0.5, 0.5, 0.25, 0.25, 0.1]
    outputs = [torch.full((1, 2), s) for s in sigmas]
    error = planned._final_error(sigmas, outputs, {0, 1, 2}, 2, sigmas[1:] + [0.0])
    assert torch.isfinite(error).all()


# -- change measures and calibrations -------------------------------------------------------------
def test_relative_l1_pools_branches_and_ignores_what_cannot_be_compared():
    a, b, c = ic.BranchKey(0, "c", 0, (2,), "f"), ic.BranchKey(1, "u", 0, (2,), "f"), ic.BranchKey(0, "x", 0, (2,), "f")
    current = {a: torch.tensor([2.0, 2.0]), b: torch.tensor([1.0, 1.0]), c: torch.tensor([5.0, 5.0])}
    anchor = {a: torch.tensor([1.0, 1.0]), b: torch.tensor([1.0, 1.0]), c: torch.tensor([1.0])}
    assert metrics.relative_l1(current, anchor) == pytest.approx(2.0 / 4.0)
    assert metrics.relative_l1(current, {a: torch.zeros(2)}) is None
    assert metrics.mean_abs_diff(current, {}) is None


def test_teacache_rescale_is_numpys_poly1d():
    assert teacache.rescale((2.0, -3.0, 4.0), 0.5) == pytest.approx(2 * 0.25 - 1.5 + 4)
    assert teacache.rescale((7.0,), 123.0) == 7.0


def test_magcache_resampling_is_the_authors_nearest_interp():
    curve = (1.0, 0.9, 0.8, 0.7, 0.6)
    assert magcache.resample(curve, 5) == list(curve)
    assert magcache.resample(curve, 3) == [1.0, 0.8, 0.6]
    # indices 0, .5, 1, 1.5, ... rounded half to even, as numpy.round does
    assert magcache.resample(curve, 9) == [1.0, 1.0, 0.9, 0.8, 0.8, 0.8, 0.7, 0.6, 0.6]
    assert magcache.resample(curve, 1) == [0.6]
    assert magcache.resample(curve, 0) == []


def _decider_run(decider, sigmas=SIGMAS, **kw):
    run = ic.LoopState(ic.InterceptorChain.of([decider]), sigmas, **kw)
    return run


def test_magcache_retains_int_r_times_n_steps():
    """The authors compute the first int(retention * N) steps: with N = 8 and r = 0.3, steps 0 and 1 (2.4 -> 2).
    Step 2 is the first one MagCache may skip."""
    cache = ic.MagCache(threshold=1.0, max_consecutive_cached=5, retention=0.3, model_type="custom", ratios=(1.0, 1.0),
                        start_percent=0.0, end_percent=1.0)
    run = _decider_run(cache)
    decisions = []
    for sigma in SIGMAS[:-1]:
        ev = run.begin_evaluation(sigma)
        decisions.append(run.decide(cache, None))
        if decisions[-1]:
            cache.computed(run, ev, None, None)
        run.end_evaluation()
    assert decisions[:3] == [True, True, False]
    assert cache.retained(8) == 2


def test_magcache_custom_ratios_with_another_model_type_are_refused():
    with pytest.raises(ic.InterceptorError, match="custom_ratios"):
        ic.InterceptorChain.of([ic.MagCache(model_type="flux", ratios=(1.0, 0.9))])


def test_greedy_plan_search_computes_where_the_trajectory_changes():
    """Outputs jump from 0 to 1 at evaluation 4. Reusing (order 0) is exact everywhere once 4 is computed, so the
    first evaluation the search adds is 4, and its error is then zero."""
    sigmas = [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3]
    outputs = [torch.full((1, 4), float(j >= 4)) for j in range(len(sigmas))]
    plans = planned.greedy_plans(sigmas, outputs, order=0, warmup=2)
    assert plans[0] == (0, 1, 7)
    assert set(plans[1]) - set(plans[0]) == {4}
    next_sigmas = sigmas[1:] + [0.0]
    assert planned._final_error(sigmas, outputs, set(plans[1]), 0, next_sigmas).abs().max() == 0
    assert planned._final_error(sigmas, outputs, set(plans[0]), 0, next_sigmas).abs().max() > 0
    assert planned.uniform_plan(8, 4, warmup=1) == (0, 2, 4, 7)  # first and last, two spread evenly between


# -- schedule: steps, positions, windows ----------------------------------------------------------
def test_step_mapping_under_two_evaluations_per_step():
    """dpm_2 evaluates at sigma_i and at a midpoint below it: both belong to step i. Heun's second evaluation
    is at sigma_{i+1}, which is the next step's sigma."""
    run = ic.LoopState(ic.InterceptorChain(), SIGMAS)
    midpoint = math.sqrt(0.9 * 0.75)
    assert [run.step_of(s) for s in (1.0, math.sqrt(1.0 * 0.9), 0.9, midpoint, 0.1, 0.05)] == [0, 0, 1, 1, 7, 7]


def test_position_counts_in_the_whole_schedule():
    """The second stage of a 8-step schedule split at 4 (KSamplerAdvanced) sits at positions 4..7."""
    second = ic.LoopState(ic.InterceptorChain(), SIGMAS[4:], first_step=4, schedule_steps=8)
    ev = second.begin_evaluation(SIGMAS[5])
    assert (ev.step, ev.position, ev.schedule_steps, ev.progress) == (1, 5, 8, 5 / 8)
    assert not ev.is_last_step and second.begin_evaluation(SIGMAS[7]).is_last_step
    whole = ic.LoopState(ic.InterceptorChain(), SIGMAS)
    assert whole.begin_evaluation(SIGMAS[5]).progress == 5 / 8


def test_window_by_percent_uses_the_whole_schedule_without_a_model():
    decider = ic.FixedCadence(interval=2, start_percent=0.5, end_percent=1.0)
    second = ic.LoopState(ic.InterceptorChain.of([decider]), SIGMAS[4:], first_step=4, schedule_steps=8)
    assert second.in_window(decider, second.begin_evaluation(SIGMAS[4]))
    first = ic.LoopState(ic.InterceptorChain.of([decider]), SIGMAS[:5], schedule_steps=8)
    assert not first.in_window(decider, first.begin_evaluation(SIGMAS[3]))


def test_window_by_sigma_follows_the_model():
    decider = ic.FixedCadence(interval=2, start_percent=0.2, end_percent=0.6)
    run = ic.LoopState(ic.InterceptorChain.of([decider]), SIGMAS, percent_to_sigma=lambda p: 1.0 - p)
    inside = [run.in_window(decider, run.begin_evaluation(s)) for s in SIGMAS[:-1]]
    assert inside == [False, False, True, True, True, False, False, False]  # 0.8 >= sigma > 0.4


def test_schedule_of_matches_comfyuis_slicing():
    schedule_of = ic.schedule_of
    assert schedule_of(20) == (0, 20)
    assert schedule_of(10, denoise=0.5) == (10, 20)
    assert schedule_of(10, denoise=0.3) == (23, 33)  # int(10 / 0.3) = 33, the last 10 steps of it
    assert schedule_of(20, start_step=12) == (12, 20)
    assert schedule_of(20, denoise=1.0, start_step=30) == (20, 20)


@dataclasses.dataclass(frozen=True)
class _SkipOdd(ic.Decider):
    declaration = ic.Decider.declaration.but(kind="skip_odd", display_name="Skip odd", granularity=ic.Granularity.MODEL)

    def decide(self, run, ev, signals, measured):
        return ev.step % 2 == 0


def test_one_decision_covers_both_evaluations_of_a_dpm2_step_by_position():
    """Two evaluations per step (dpm_2): the decider sees the same step and position for both."""
    decider = _SkipOdd(start_percent=0.0, end_percent=1.0)
    run = _decider_run(decider)
    seen = []
    for i, sigma in enumerate(SIGMAS[:-2]):
        for s in (sigma, math.sqrt(sigma * SIGMAS[i + 1])):
            ev = run.begin_evaluation(s)
            seen.append((ev.step, ev.position, run.decide(decider, None)))
            run.end_evaluation()
    assert [p for _, p, _ in seen] == [i // 2 for i in range(len(seen))]
    assert [d for _, _, d in seen][2:] == [step % 2 == 0 for step, _, _ in seen][2:]


def test_teacache_compares_with_the_previous_evaluation_after_forced_steps():
    """Steps 0-3 are outside the window and computed. At step 4, the first inside, the change is measured
    against step 3's modulated input (the authors refresh it every step), not against step 0's."""
    cache = ic.TeaCache(threshold=1e9, model_type="flux", start_percent=0.5, end_percent=1.0)
    run = _decider_run(cache)
    key = ic.BranchKey(0, "c", 0, (2,), "float32")
    for i, sigma in enumerate(SIGMAS[:5]):
        ev = run.begin_evaluation(sigma)
        signals = {key: torch.full((2,), float(i + 1))}
        if run.decide(cache, signals):
            cache.computed(run, ev, None, signals)
        run.end_evaluation()
    expected = abs(teacache.rescale(teacache.COEFFICIENTS["flux"], 1.0 / 4.0))  # |5 - 4| / |4|
    assert run.records[4].metric == pytest.approx(expected)
