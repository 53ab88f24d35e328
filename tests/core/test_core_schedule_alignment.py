"""Cache-aware schedule alignment (torch only): the re-spaced schedules, the bounded search that never ends worse
than the plain schedule, and an aligned plan's keying on the run it was made for."""
import dataclasses

import pytest
import torch

from cached_sampler_dev.devkit.pack import load_core

ic = load_core()
from cached_sampler_pack.interceptors.engine import model_forward  # noqa: E402
from cached_sampler_pack.interceptors.methods import schedule_alignment as sa  # noqa: E402

SCHEDULE = (1.0, 0.9, 0.78, 0.65, 0.5, 0.36, 0.22, 0.1, 0.0)  # 8 steps, the last sigma where the run ends
COMPUTE = (0, 2, 5, 7)


@dataclasses.dataclass(frozen=True)
class Measured:
    psnr: float


def _monotone_and_anchored(schedule):
    assert schedule[0] == SCHEDULE[0] and schedule[-1] == SCHEDULE[-1], schedule
    assert all(b < a for a, b in zip(schedule, schedule[1:])), schedule
    assert sa.valid_alignment(SCHEDULE, schedule) is None


def test_respacing_moves_the_anchored_sigmas_and_keeps_the_others_between_them_in_proportion():
    moved = sa.respaced(SCHEDULE, {2: 0.7, 5: 0.4})
    _monotone_and_anchored(moved)
    assert moved[2] == pytest.approx(0.7) and moved[5] == pytest.approx(0.4)
    # step 1 sat at (1 - 0.9) / (1 - 0.78) of the gap 0 -> 2; it keeps that fraction of the new gap
    assert moved[1] == pytest.approx(1.0 + (0.7 - 1.0) * (0.1 / 0.22))
    assert moved[3] == pytest.approx(0.7 + (0.4 - 0.7) * ((0.65 - 0.78) / (0.36 - 0.78)))
    assert moved[7] == pytest.approx(0.4 + (0.0 - 0.4) * ((0.1 - 0.36) / (0.0 - 0.36)))
    assert sa.respaced(SCHEDULE, {}) == SCHEDULE, "no anchor moved: the schedule itself"
    assert sa.respaced(SCHEDULE, {0: 0.5, 8: 0.3}) == SCHEDULE, "the first and last sigma never move"


def test_the_search_climbs_towards_a_better_schedule_within_its_bounded_cost_and_stays_valid():
    target = {2: 0.7, 5: 0.45, 7: 0.15}  # the synthetic quality peaks where the computed steps sit here

    def measure(schedule):
        _monotone_and_anchored(schedule)
        return Measured(40.0 - 100 * sum((schedule[k] - v) ** 2 for k, v in target.items()))

    plain = measure(SCHEDULE)
    found = sa.align(SCHEDULE, COMPUTE, measure, plain)
    assert found.moved and found.quality.psnr > plain.psnr + 0.5
    assert found.quality.psnr == pytest.approx(measure(found.schedule).psnr), "the quality is that of the schedule"
    assert 0 < found.runs <= sa.alignment_runs(len(COMPUTE)) == 2 * 3 * len(sa.ALIGN_FRACTIONS)
    _monotone_and_anchored(found.schedule)


def test_the_search_keeps_the_plain_schedule_where_no_move_helps():
    calls = []

    def measure(schedule):
        calls.append(schedule)
        return Measured(40.0 - 100 * sum((a - b) ** 2 for a, b in zip(schedule, SCHEDULE)))

    plain = measure(SCHEDULE)
    found = sa.align(SCHEDULE, COMPUTE, measure, plain)
    assert not found.moved and found.schedule == SCHEDULE and found.quality is plain
    assert found.runs == len(calls) - 1 == sa.alignment_runs(len(COMPUTE)), "every move tried, each measured once"


def test_invalid_alignments_are_refused():
    assert "decrease" in sa.valid_alignment(SCHEDULE, (1.0, 0.9, 0.95, 0.65, 0.5, 0.36, 0.22, 0.1, 0.0))
    assert "start and end" in sa.valid_alignment(SCHEDULE, (0.99,) + SCHEDULE[1:])
    assert "sigmas" in sa.valid_alignment(SCHEDULE, SCHEDULE[:-1])
    with pytest.raises(ic.InterceptorError, match="decrease"):
        ic.PlannedSchedule(compute=COMPUTE, sigmas=SCHEDULE[:-1], schedule=SCHEDULE,
                           aligned=(1.0, 0.9, 0.95, 0.65, 0.5, 0.36, 0.22, 0.1, 0.0)).validate()


def _aligned_plan(sampler="euler"):
    aligned = sa.respaced(SCHEDULE, {2: 0.7, 5: 0.4})
    return ic.PlannedSchedule(compute=COMPUTE, sigmas=aligned[:-1], schedule=SCHEDULE, aligned=aligned,
                              sampler=sampler), aligned


def test_an_aligned_plan_swaps_its_sigmas_in_only_for_the_run_it_was_made_for():
    plan, aligned = _aligned_plan()
    assert plan.sampling_sigmas(list(SCHEDULE), "euler") == aligned
    assert plan.sampling_sigmas(list(SCHEDULE), "dpmpp_2m") is None, "another sampler: its own sigmas"
    assert plan.sampling_sigmas([1.0, 0.7, 0.4, 0.0], "euler") is None, "another step count: its own sigmas"
    assert ic.PlannedSchedule(compute=COMPUTE, sigmas=SCHEDULE[:-1], schedule=SCHEDULE,
                              sampler="euler").sampling_sigmas(list(SCHEDULE), "euler") is None, "unaligned: its own"


def _drive(plan, sigmas, sampler="euler"):
    """A plain loop over ``sigmas`` with ``plan`` and TaylorSeer; (the sigmas the model was called with, the run)."""
    run = ic.LoopState(ic.InterceptorChain.of([plan, ic.TaylorSeer(order=1)]), list(sigmas), sampler=sampler)
    seen, x = [], torch.ones(1, 3)
    for sigma in sigmas[:-1]:
        run.begin_evaluation(sigma)
        s = torch.full((1,), sigma)
        fwd = run.begin_forward(sigma, 1, (3,), x.dtype, [0], ["c"])
        run.end_forward(fwd, model_forward(run, fwd, x, s, lambda: seen.append(float(s)) or x * (1 - s)))
        run.end_evaluation()
    return seen, run


def test_a_run_through_the_aligned_sigmas_follows_the_plan_and_any_other_computes_every_step_and_says_so():
    plan, aligned = _aligned_plan()
    seen, run = _drive(plan, aligned)
    assert seen == pytest.approx([aligned[k] for k in COMPUTE]), "the model ran at the computed steps' aligned sigmas"
    assert not run.notes
    seen, run = _drive(plan, SCHEDULE)  # the sigmas were not swapped in (another sampler node's run, say)
    assert seen == pytest.approx(SCHEDULE[:-1]), "a run on other sigmas computes every step"
    assert any("not the plan's aligned ones" in n for n in run.notes), run.notes
