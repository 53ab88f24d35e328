"""The schedule search (torch only): the DP against brute force, its error table against TaylorSeer's own
forecasts, the front-loaded seeds, and the measured search on a synthetic quality."""
import itertools
import math

import pytest
import torch

from cached_sampler_dev.devkit.pack import load_core

ic = load_core()
from cached_sampler_pack.interceptors.methods import schedule_search as ss  # noqa: E402

N = 9
SIGMAS = [1.0, 0.93, 0.85, 0.74, 0.62, 0.5, 0.37, 0.22, 0.1]


def _outputs(seed=0, n=N):
    g = torch.Generator().manual_seed(seed)
    # smooth in sigma plus noise: forecasts of every order are neither exact nor useless
    base, slope = torch.randn(64, generator=g), torch.randn(64, generator=g)
    return [base + slope * SIGMAS[i] + 0.3 * torch.randn(64, generator=g) * (1 + i % 3) for i in range(n)]


def _brute(table, b, metric):
    return min(ss.additive_error(table, (0,) + rest, metric) for rest in itertools.combinations(range(1, N), b - 1))


@pytest.mark.parametrize("order", ss.ORDERS)
@pytest.mark.parametrize("metric", ["squared", "norm"])
def test_the_dp_finds_the_optimum_of_every_budget(order, metric):
    g = ss.gram(_outputs())
    table = ss.error_table(g, SIGMAS, order)
    plans = ss.dp_plans(g, SIGMAS, order, metric=metric, table=table)
    assert sorted(plans) == list(range(1, N + 1))
    for b, plan in plans.items():
        assert len(plan) == b and len(set(plan)) == b and plan[0] == 0 and plan == tuple(sorted(plan)), plan
        assert all(0 <= i < N for i in plan)
        best = _brute(table, b, metric)
        assert ss.additive_error(table, plan, metric) == pytest.approx(best, rel=1e-9, abs=1e-12), (b, plan)
    assert plans[N] == tuple(range(N))


def test_an_off_by_one_in_the_step_index_is_caught_by_the_brute_force_check():
    """A DP fed a table whose errors sit one evaluation late (each skipped step charged its neighbour's error)
    returns plans that the brute force beats: the check above would fail on that mistake."""
    g = ss.gram(_outputs())
    table = ss.error_table(g, SIGMAS, 1)
    shifted = torch.cat([torch.zeros_like(table[..., :1]), table[..., :-1]], -1)
    shifted = torch.where(torch.isfinite(table), shifted, table)
    broken = ss.dp_plans(None, SIGMAS, 1, table=shifted)
    worse = [b for b in range(2, N) if ss.additive_error(table, broken[b]) > _brute(table, b, "squared") * (1 + 1e-6)]
    assert worse, "the shifted table gave the optimal plans anyway: the check would not tell"


@pytest.mark.parametrize("order", ss.ORDERS)
def test_the_error_table_is_what_taylorseer_would_forecast(order):
    """Each entry: the squared norm of dt * (TaylorSeer's forecast - the true output), by the real estimator."""
    outputs = _outputs(1)
    table = ss.error_table(ss.gram(outputs), SIGMAS, order)
    dts = ss.steps_after(SIGMAS)
    est = ic.TaylorSeer(order=order)
    for state in [(0,) * (order + 1), (0,) * order + (3,), tuple(range(4 - order, 5))]:
        slot = est.Slot()
        for i in dict.fromkeys(state):
            est.observe(slot, outputs[i], SIGMAS[i])
        for j in range(state[-1] + 1, N):
            forecast = est.estimate(slot, SIGMAS[j], torch.device("cpu"))
            want = float((dts[j] * (forecast - outputs[j])).double().pow(2).sum())
            assert float(table[state + (j,)]) == pytest.approx(want, rel=1e-6, abs=1e-9), (state, j)


def test_plan_error_is_the_open_loop_final_error():
    outputs = _outputs(2)
    g = ss.gram(outputs)
    planned = __import__("cached_sampler_pack.interceptors.methods.planned", fromlist=["x"])
    for compute, order in (((0, 3, 6), 1), ((0, 2, 4, 7), 2), ((0,), 0)):
        want = planned._final_error(SIGMAS, outputs, set(compute), order, SIGMAS[1:] + [0.0]).double().pow(2).sum()
        assert ss.plan_error(g, SIGMAS, compute, order) == pytest.approx(float(want), rel=1e-6)


@pytest.mark.parametrize("n,budget", [(28, 4), (28, 11), (50, 9), (50, 11), (10, 10), (5, 1), (8, 7)])
@pytest.mark.parametrize("power", [1.0, 1.5, 2.0, 3.0])
def test_front_loaded_schedules_are_valid(n, budget, power):
    plan = ss.front_loaded(n, budget, power)
    assert len(plan) == budget and len(set(plan)) == budget and plan == tuple(sorted(plan))
    assert plan[0] == 0 and all(0 <= i < n for i in plan)
    gaps = [b - a for a, b in zip(plan, plan[1:])]
    if power > 1.0 and len(gaps) >= 2 and budget < n // 2:
        assert gaps[0] <= gaps[-1], f"not front-loaded: {plan}"


def test_front_loaded_matches_the_shape_of_l2p():
    """L2P's interval-5 schedule of 50 steps (0, 1, 2, 4, 6, 9, 14, 23, 30, 37, 44) is dense at the start; the
    power-2 schedule of 11 is as dense there."""
    plan = ss.front_loaded(50, 11, 2.0)
    assert plan[:3] == (0, 1, 2) and plan[-1] < 49


def _synthetic_measure(outputs, order_penalty=None):
    """A stand-in for a sampling run: PSNR from the open-loop error model of the plan (worse for order 2 than the
    model says, as closed loops are), counting the runs."""
    g = ss.gram(outputs)
    runs = []

    class Q:
        def __init__(self, psnr):
            self.psnr = psnr

    def measure(compute, order):
        runs.append((compute, order))
        err = ss.plan_error(g, SIGMAS, compute, order) * (order_penalty or {}).get(order, 1.0)
        return Q(math.inf if err == 0 else -10 * math.log10(err))

    return measure, runs


def test_the_search_returns_the_least_work_that_meets_the_measured_bound():
    outputs = _outputs(3)
    measure, runs = _synthetic_measure(outputs, {2: 50.0})
    psnrs = {}
    for b in range(1, N + 1):
        for rest in itertools.combinations(range(1, N), b - 1):
            for order in ss.ORDERS:
                psnrs[((0,) + rest, order)] = measure((0,) + rest, order).psnr
    runs.clear()
    target = sorted(psnrs.values())[len(psnrs) // 2]
    least = min(len(c) for (c, _), p in psnrs.items() if p >= target)
    found = ss.search(SIGMAS, outputs, measure, min_psnr=target)
    assert found.quality.psnr >= target and len(found.compute) <= least + 1, (found, least)
    assert found.runs == len(set(runs)) and found.runs < len(psnrs) // 10, "the search measures a few plans, not all"


def test_the_plan_is_the_best_measured_at_the_least_budget_not_the_first_to_meet_the_bound():
    """Closed loops differ from the error model (here by a fixed pseudo-random few dB per plan), so the first
    placement to meet the bound at a budget is often not the best there: the search returns the best it measured."""
    outputs = _outputs(3)
    model, _ = _synthetic_measure(outputs)
    runs = []

    def measure(compute, order):
        runs.append((compute, order))
        return type("Q", (), {"psnr": model(compute, order).psnr + (hash((compute, order)) % 601) / 100 - 3})()

    polished = 0
    for target in (-9.0, -4.0, 1.0):
        runs.clear()
        found = ss.search(SIGMAS, outputs, measure, min_psnr=target)
        values = [measure(c, o).psnr for c, o in dict.fromkeys(r for r in runs if len(r[0]) == len(found.compute))]
        assert found.quality.psnr == max(values) and found.quality.psnr >= target
        polished += next(v for v in values if v >= target) < found.quality.psnr
    assert polished, "no case where the first placement to meet the bound was not the best: nothing was tested"


def _seven_and_more(compute, order):
    """7 computed steps and more meet a 35 dB bound, by a pseudo-random margin per placement; fewer miss it."""
    return type("Q", (), {"psnr": (40.0 if len(compute) >= 7 else 30.0) + hash(compute) % 97 / 100})()


def _budget_measure(meets_at):
    """A stand-in whose PSNR depends on the number of computed evaluations only: 40 dB where ``meets_at`` holds,
    else 30 dB (less the plan's last index, so placements still differ)."""
    runs = []

    def measure(compute, order):
        runs.append((compute, order))
        return type("Q", (), {"psnr": (40.0 if meets_at(len(compute)) else 30.0) - compute[-1] / 100})()

    return measure, runs


def test_fewer_computed_steps_are_tried_below_the_bisections_answer():
    """Where more computed steps can give a worse result (4 of 9 meets the bound, 5 and 6 do not, 7 and more do),
    the bisection alone (its first probe, 5, fails) stops at 7; the scan below it finds 4. On a monotone landscape
    the scan stops once ``PATIENCE`` budgets in a row fail, the one just below included: at most
    ``PATIENCE - 1`` budgets' candidates more (each budget's four and its growing schedule)."""
    measure, _ = _budget_measure(lambda b: b == 4 or b >= 7)
    assert len(ss.search(SIGMAS, _outputs(3), measure, min_psnr=35.0, patience=0).compute) == 7
    found = ss.search(SIGMAS, _outputs(3), measure, min_psnr=35.0)
    assert len(found.compute) == 4 and found.quality.psnr >= 35.0

    monotone, runs = _budget_measure(lambda b: b >= 6)
    assert len(ss.search(SIGMAS, _outputs(3), monotone, min_psnr=35.0, patience=0).compute) == 6
    without = len(set(runs))
    runs.clear()
    assert len(ss.search(SIGMAS, _outputs(3), monotone, min_psnr=35.0).compute) == 6
    budgets_tried = {len(c) for c, _ in runs}
    extra = len(set(runs)) - without
    per_budget = 4 + ss.GROWING_PER_BUDGET  # the candidates, then the growing schedules measured after them
    assert min(budgets_tried) == 6 - ss.PATIENCE and 0 < extra <= (ss.PATIENCE - 1) * per_budget, (budgets_tried, extra)


def test_the_search_descends_from_the_plan_found_by_leaving_one_computed_step_out():
    """Where the only plans of a budget that meet the bound are the best plan of the budget above less one step
    (the digits model at 47.5 dB: 11 of 28 steps read 51.9 dB, the best 10-step candidate less than 46.25 dB, the
    11-step plan without its last step 48.8 dB), neither the candidates nor the local search find them, and the
    descent does, then stops where no plan less one step meets the bound."""
    outputs = _outputs(3)

    # without the growing schedules: the landscape is built around the 7-step plan the other candidates reach, and
    # the descent measures the plans less one step that the error model ranks best, where the best one is
    seven = ss.search(SIGMAS, outputs, _seven_and_more, min_psnr=35.0, growing=0).compute
    assert len(seven) == 7

    def landscape(compute, order):  # as above, and the 6-step subsets of that 7-step plan meet it too
        subset = len(compute) == 6 and set(compute) < set(seven)
        return type("Q", (), {"psnr": 36.0 - compute[-1] / 100 if subset else _seven_and_more(compute, order).psnr})()

    assert len(ss.search(SIGMAS, outputs, landscape, min_psnr=35.0, descend=False, growing=0).compute) == 7, \
        "a candidate or a neighbour is already such a subset: the landscape tests nothing"
    found = ss.search(SIGMAS, outputs, landscape, min_psnr=35.0, growing=0)
    assert len(found.compute) == 6 and set(found.compute) < set(seven) and found.quality.psnr >= 35.0
    best_drop = max(ss.dropped(seven), key=lambda c: landscape(c, found.order).psnr)
    assert found.compute == best_drop, "the best of the plans less one step, not the first to meet the bound"
    assert found.source == "dropped" and found.compute[0] == seven[0]


def test_the_descent_keeps_a_step_less_where_only_a_damped_forecast_meets_the_bound():
    """Where a plan less one step meets the bound only with TaylorSeer damped (the video model: the longer gap it
    leaves overshoots undamped), the descent with ``dampings`` returns that plan and its damped forecast; without
    them it stops at the plan above. Where no damped plan meets it, the damped runs are the only ones added: the
    undamped runs are those of the search without them, in the same order."""
    outputs = _outputs(3)

    first = dict(min_psnr=35.0, growing=0, orders=(1,))  # a forecast with a trend to damp
    seven = ss.search(SIGMAS, outputs, _seven_and_more, **first).compute
    runs = []

    def landscape(compute, order):  # the 6-step subsets of the 7-step plan meet it only damped
        runs.append((compute, order))
        damped = isinstance(order, ss.Forecast) and order.damping > 0
        subset = len(compute) == 6 and set(compute) < set(seven)
        if subset and damped:
            return type("Q", (), {"psnr": 36.0 - compute[-1] / 100})()
        return _seven_and_more(compute, order)

    without = ss.search(SIGMAS, outputs, landscape, **first)
    plain_runs = list(runs)
    assert without.compute == seven and not isinstance(without.order, ss.Forecast)
    runs.clear()
    found = ss.search(SIGMAS, outputs, landscape, **first, dampings=(0.2,))
    assert len(found.compute) == 6 and set(found.compute) < set(seven) and found.quality.psnr >= 35.0
    assert found.order == ss.Forecast(1, 0.2) and found.source == "dropped"
    assert ss.with_damping(found.order, (0.2,)) == [found.order.order, found.order], "undamped first, then damped"

    with_runs = []

    def no_damped_subset(compute, order):
        with_runs.append((compute, order))
        return _seven_and_more(compute, order)

    ss.search(SIGMAS, outputs, no_damped_subset, **first, dampings=(0.2,))
    damped_runs = [r for r in with_runs if isinstance(r[1], ss.Forecast)]
    assert damped_runs and [r for r in with_runs if not isinstance(r[1], ss.Forecast)] == plain_runs
    assert ss.with_damping(0, (0.2,)) == [0], "reuse has no trend to damp"


def test_dropped_never_leaves_out_the_first_evaluation():
    assert ss.dropped((0, 3, 5)) == [(0, 5), (0, 3)]


def test_an_unreachable_target_computes_everything():
    measure, _ = _synthetic_measure(_outputs(4))
    found = ss.search(SIGMAS, _outputs(4), measure, min_psnr=1e9)
    assert found.compute == tuple(range(N)) and found.quality.psnr == math.inf


def test_a_budget_search_spends_exactly_the_budget():
    measure, _ = _synthetic_measure(_outputs(5))
    for b in (2, 4, 6):
        found = ss.search(SIGMAS, _outputs(5), measure, budget=b)
        assert len(found.compute) == b and found.compute[0] == 0


def test_negatives_are_left_out_from_the_last_computed_step_back_while_the_bound_holds():
    tried = []
    # a stand-in for sampling runs: each omission costs its evaluation's index in dB, from 40 dB
    def measure(leave_out):
        tried.append(leave_out)
        return type("Q", (), {"psnr": 40.0 - sum(leave_out)})()

    kept, quality = ss.negatives_to_leave_out((0, 3, 5, 8, 11), 12, measure, min_psnr=28.0)
    # 11 is the run's last evaluation (always computed in full) and 0 the first: neither is tried; 5 on top of 8
    # costs too much (27 dB), 3 on top of 8 does not (29 dB), and the quality is that of the set kept
    assert tried == [(8,), (5, 8), (3, 8)] and kept == (3, 8) and quality.psnr == 29.0
    kept, quality = ss.negatives_to_leave_out((0, 3), 12, measure, min_psnr=38.0)
    assert kept == () and quality is None


def test_a_growing_schedule_is_measured_after_the_other_candidates_and_never_displaces_them():
    outputs = _outputs(3)
    proposals = ss.Proposals(SIGMAS, outputs)
    for b in range(3, N):
        before = []
        for c in proposals.ranked(b):
            if c.compute not in {x.compute for x in before}:
                before.append(c)
        measured, kept = proposals.to_measure(b, 4), before[:4]
        assert measured[:len(kept)] == kept, "the candidates of before come first, unchanged"
        growing = set(ss.growing_schedules(N, b)) - {c.compute for c in kept}
        assert [c.source for c in measured[len(kept):]] == (["growing"] if growing else [])
        assert all(c.compute in growing for c in measured[len(kept):])


def test_without_growing_schedules_the_search_measures_what_it_did_before_them():
    outputs = _outputs(3)
    measure, runs = _synthetic_measure(outputs)
    ss.search(SIGMAS, outputs, measure, min_psnr=-4.0, growing=0)
    assert runs and all(source != "growing" for source in [c.source for b in range(1, N + 1)
                                                           for c in ss.Proposals(SIGMAS, outputs).to_measure(b, 4, 0)])
    proposals = ss.Proposals(SIGMAS, outputs)
    assert all(proposals.to_measure(b, 4, 0) == proposals.to_measure(b, 4)[:len(proposals.to_measure(b, 4, 0))]
               for b in range(1, N + 1))


def test_a_growing_schedule_that_reads_better_is_the_answer():
    """Where the growing schedule is the only plan below every step computed that meets the bound (at the budget
    the bisection tries first), the search finds it."""
    outputs = _outputs(3)
    last = ss.Proposals(SIGMAS, outputs).to_measure((2 + N) // 2, 4)[-1]
    assert last.source == "growing"
    target = last.compute

    def measure(compute, order):
        return type("Q", (), {"psnr": 40.0 if compute == target or len(compute) == N else 30.0})()

    found = ss.search(SIGMAS, outputs, measure, min_psnr=35.0)
    assert found.compute == target and found.source == "growing"


def test_the_descent_tries_each_damping_the_node_gives_it_and_keeps_the_best():
    """The node's descent dampings (``DAMPINGS``) include the stronger 0.4 the video model's grid chose most: where
    a plan less one step meets the bound only damped that far, the descent keeps it with that damping; where two
    dampings meet it, the plan with the higher PSNR, as among any plans of one budget."""
    outputs = _outputs(3)
    assert 0.2 in ss.DAMPINGS and 0.4 in ss.DAMPINGS

    first = dict(min_psnr=35.0, growing=0, orders=(1,))
    seven = ss.search(SIGMAS, outputs, _seven_and_more, **first).compute

    def landscape(strong_only):
        def measure(compute, order):  # the 6-step subsets of the 7-step plan: 0.4 meets the bound, 0.2 only if asked
            damping = order.damping if isinstance(order, ss.Forecast) else 0.0
            if len(compute) == 6 and set(compute) < set(seven) and damping:
                met = damping >= 0.4 or not strong_only
                return type("Q", (), {"psnr": (35.0 + damping * 5 if met else 34.0) - compute[-1] / 100})()
            return _seven_and_more(compute, order)
        return measure

    found = ss.search(SIGMAS, outputs, landscape(strong_only=True), **first, dampings=ss.DAMPINGS)
    assert len(found.compute) == 6 and found.order == ss.Forecast(1, 0.4) and found.quality.psnr >= 35.0
    weak = ss.search(SIGMAS, outputs, landscape(strong_only=True), **first, dampings=(0.2,))
    assert weak.compute == seven, "0.2 alone does not meet the bound on this landscape"
    both = ss.search(SIGMAS, outputs, landscape(strong_only=False), **first, dampings=ss.DAMPINGS)
    assert len(both.compute) == 6 and both.order == ss.Forecast(1, 0.4), "0.4 reads higher here: the better plan"
