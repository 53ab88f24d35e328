"""Planned schedules: compute exactly the evaluations a plan names, forecast the rest.

The plan comes from :func:`calibrate`, which works on one uncached pass of the user's own prompt,
model and step count (recorded by :class:`Recorder`). Like LeMiCa (arXiv 2511.00090) and MeanCache
(arXiv 2601.19961) it places the computed steps globally and non-uniformly under a budget, but instead
of an offline graph over many prompts it scores a candidate plan by the error its forecasts would add
to the final latent of this very trajectory: for a first-order step ``x += (sigma_next - sigma) * eps``
a forecast error ``e`` on a skipped evaluation moves the result by ``(sigma_next - sigma) * e``. Greedy
forward selection then adds, one at a time, the evaluation whose computation removes the most error.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from ..base import Decider, RecordingDecider
from ..kinds import Granularity, InterceptorError
from ..quality import Quality
from ..records import counted_in
from .schedule_alignment import valid_alignment
from .taylorseer import Forecast, lagrange_weights, same_sigma


def fits_plan(run, ev, sigmas: Sequence[float], schedule: Sequence[float], sampler: str) -> bool:
    """Whether evaluation ``ev`` of ``run`` is the one a plan names: made for the run's ``schedule`` (its sigmas:
    steps, scheduler and denoise) and ``sampler`` (empty: any), at the evaluation's sigma. Every
    one-evaluation-per-step sampler evaluates at the same sigmas, but their trajectories differ, so a plan measured
    on one says nothing of another. Every level a plan drives asks this, so all of them leave it together."""
    return (ev.index < len(sigmas) and same_sigma(sigmas[ev.index], ev.sigma)
            and (not sampler or run.sampler == sampler)
            and (not schedule or (len(run.sample_sigmas) == len(schedule)
                                  and all(same_sigma(a, b) for a, b in zip(run.sample_sigmas, schedule)))))


@dataclasses.dataclass(frozen=True)
class PlannedSchedule(Decider):
    """Computes the evaluations ``compute`` names. The plan is keyed on the run it was made for:
    ``schedule`` (the run's sigmas: steps, scheduler and denoise), ``sigmas`` (the sigma of every evaluation)
    and ``sampler`` (every one-evaluation-per-step sampler evaluates at the same sigmas, but their trajectories
    differ). On any other run it computes every step and says so once (log and node). ``cfg`` is the guidance
    scale its quality was measured at: at another cfg the plan is followed and the node says that its quality
    was measured at another one. ``aligned``: the sigmas a run of ``schedule`` steps through instead (cache-aware
    schedule alignment, schedule_alignment.py; ``sigmas`` are then its evaluations'); the adapter swaps them in
    through :meth:`sampling_sigmas`, only for the run ``schedule`` and ``sampler`` name."""

    declaration = Decider.declaration.but(
        kind="planned",
        display_name="Calibrated Schedule",
        granularity=Granularity.MODEL,
        forces_last_step=False,  # the plan names every evaluation it computes; its quality was measured so
    )

    compute: tuple[int, ...] = ()
    sigmas: tuple[float, ...] = ()
    schedule: tuple[float, ...] = ()
    quality: Quality | None = None  # what the calibration measured for this plan on the prompt it was calibrated on
    sampler: str = ""               # the run's sampler identity (LoopState.sampler); "" matches any
    cfg: float | None = None
    aligned: tuple[float, ...] = ()

    @dataclasses.dataclass
    class RunState:
        mismatch: bool = False

    @property
    def evaluations(self) -> int:
        return len(self.sigmas)

    def validate(self) -> None:
        super().validate()
        if self.evaluations < 1 or not self.compute:
            raise InterceptorError(f"{self.label}: the plan is empty; run the calibration first.")
        if any(not 0 <= i < self.evaluations for i in self.compute):
            raise InterceptorError(f"{self.label}: the plan names evaluations outside 0..{self.evaluations - 1}.")
        if self.aligned:
            why = valid_alignment(self.schedule, self.aligned)
            if why is not None:
                raise InterceptorError(f"{self.label}: {why}.")

    def sampling_sigmas(self, sigmas: Sequence[float], sampler: str) -> tuple[float, ...] | None:
        """The aligned sigmas for a run that asks for exactly the plan's ``schedule`` with its sampler; None for
        any other run, which then does not fit the plan (:meth:`decide` computes every step and says so)."""
        if (self.aligned and (not self.sampler or sampler == self.sampler) and len(sigmas) == len(self.schedule)
                and all(same_sigma(a, b) for a, b in zip(sigmas, self.schedule))):
            return self.aligned
        return None

    def decide(self, run, ev, signals, measured) -> bool:
        state = run.state_of(self)
        if not state.mismatch and not fits_plan(run, ev, self.sigmas, self.aligned or self.schedule, self.sampler):
            state.mismatch = True
            run.note(f"{self.label}: the plan was calibrated for another schedule or sampler (steps, sampler, scheduler or "
                     f"denoise), so every step is computed"
                     + (" on the run's own sigmas, not the plan's aligned ones" if self.aligned else "")
                     + ". Calibrate again with this sampler's settings.")
        if (not state.mismatch and self.quality is not None and self.cfg is not None and run.cfg is not None
                and abs(run.cfg - self.cfg) > 1e-6):
            run.note(f"{self.label}: the plan's quality ({self.quality.space} PSNR {self.quality.psnr:.1f} dB) was measured at cfg "
                     f"{self.cfg:g}; this run uses cfg {run.cfg:g}, where it can be lower. Calibrate again at "
                     f"this cfg to know.")
        return state.mismatch or ev.index in self.compute


@dataclasses.dataclass(frozen=True)
class Recorder(RecordingDecider):
    """Keeps each evaluation's output (epsilon space, on the CPU) for calibration."""

    declaration = RecordingDecider.declaration.but(
        kind="recorder",
        display_name="Calibration recorder",
        granularity=Granularity.MODEL,
    )

    @dataclasses.dataclass
    class RunState:
        sigmas: dict[int, float] = dataclasses.field(default_factory=dict)               # evaluation -> sigma
        outputs: dict[int, dict] = dataclasses.field(default_factory=dict)               # evaluation -> branch -> eps

    def computed(self, run, ev, forward, signals, outputs=None) -> None:
        state = run.state_of(self)
        state.sigmas[ev.index] = ev.sigma
        parts = state.outputs.setdefault(ev.index, {})
        for key, value in (outputs or {}).items():
            parts[key] = value.detach().to("cpu", torch.float32)


def recorded_trajectory(run) -> tuple[list[float], list[torch.Tensor]]:
    """(sigma per evaluation, output per evaluation with all branches stacked) from a Recorder run."""
    recorder = next(ic for ic in run.chain if isinstance(ic, Recorder))
    state = run.state_of(recorder)
    sigmas, outputs = [], []
    for index in sorted(state.outputs):
        parts = state.outputs[index]
        sigmas.append(state.sigmas[index])
        outputs.append(torch.cat([parts[k] for k in sorted(parts, key=lambda k: (str(k.branch), k.occurrence))]))
    return sigmas, outputs


@dataclasses.dataclass(frozen=True)
class Plan:
    compute: tuple[int, ...]
    evaluations: int
    quality: Quality
    order: int | None = None   # the forecast the plan was measured with, when a search chose it
    runs: int | None = None    # how many plans the search measured (sampling runs per seed)
    negative_left_out: tuple[int, ...] = ()  # computed evaluations whose negative CFG branch is estimated
    steps: tuple[int, ...] = ()  # the step (of the run, from 0) each evaluation belongs to; () one per step
    aligned: tuple[float, ...] = ()  # the sigmas the plan steps through, where alignment moved them
    plain_psnr: float | None = None  # with alignment tried: the plan's PSNR on the run's own sigmas
    align_runs: int = 0              # the aligned schedules measured
    damping: float = 0.0             # TaylorSeer's damping of that forecast (the search's descent may choose one)

    @property
    def forecast(self) -> int | Forecast | None:
        """What the plan is sampled with: its order, or that order with its damping."""
        return Forecast(self.order, self.damping) if self.order is not None and self.damping else self.order

    @property
    def alignment_text(self) -> str:
        if self.plain_psnr is None:
            return ""
        if self.aligned:
            return (f"; the computed steps' sigmas aligned to the plan raised it from {self.plain_psnr:.2f} dB "
                    f"({self.align_runs} schedules measured)")
        return (f"; none of the {self.align_runs} aligned schedules measured beat the run's own sigmas, which the "
                f"plan keeps")

    @property
    def psnr(self) -> float:
        return self.quality.psnr

    def _named(self, evaluations: Sequence[int]) -> str:
        """'steps 1, 3' where each evaluation is a step, else 'evaluations 1, 3' (counted from 1 in the run's
        order: a second-order sampler's evaluations of one step are not that step's number)."""
        word = "step" if not self.steps or len(set(self.steps)) == self.evaluations else "evaluation"
        return f"{word}{'s' if len(evaluations) > 1 else ''} " + ", ".join(str(i + 1) for i in evaluations)

    def describe(self) -> str:
        unit = counted_in(self.evaluations, len(set(self.steps)) if self.steps else self.evaluations)
        text = f"compute {len(self.compute)}/{self.evaluations} {unit} ({self._named(self.compute)})"
        if self.order is not None:
            text += f", the rest {Forecast(self.order, self.damping)}"
        if self.negative_left_out:
            text += (f", and at {self._named(self.negative_left_out)} only the positive CFG branch (the negative "
                     f"estimated from it)")
        text += f"; {self.quality.describe()}"
        if self.runs is not None:
            text += f"; chosen from {self.runs} plans measured"
        return text + self.alignment_text


def _final_error(sigmas: Sequence[float], outputs: Sequence[torch.Tensor], compute: set[int], order: int,
                 next_sigmas: Sequence[float]) -> torch.Tensor:
    """Change of the final latent if only ``compute`` is computed and the rest forecast (first order)."""
    error = torch.zeros_like(outputs[0])
    history: list[int] = []
    for j, sigma in enumerate(sigmas):
        if j in compute:  # as TaylorSeer keeps them: a repeated sigma replaces the older point
            history = [i for i in history if not same_sigma(sigmas[i], sigma)] + [j]
            continue
        points = history[-(order + 1):]
        weights = lagrange_weights([sigmas[i] for i in points], sigma)
        forecast = sum(outputs[i] * w for i, w in zip(points, weights))
        error += (next_sigmas[j] - sigma) * (forecast - outputs[j])
    return error


def uniform_plan(n: int, budget: int, warmup: int = 1) -> tuple[int, ...]:
    """The first ``warmup`` evaluations, the last one, and the rest spread evenly in between."""
    fixed = set(range(min(warmup, n))) | {n - 1}
    free = max(budget - len(fixed), 0)
    lo, hi = min(warmup, n), n - 1
    picks = {lo + round((hi - lo) * (k + 1) / (free + 1)) - 1 for k in range(free)} if hi > lo else set()
    plan = fixed | {p for p in picks if lo <= p < hi}
    candidates = iter(i for i in range(lo, hi) if i not in plan)
    while len(plan) < min(budget, n):
        plan.add(next(candidates))
    return tuple(sorted(plan))


def greedy_plans(sigmas: Sequence[float], outputs: Sequence[torch.Tensor], *, order: int = 1,
                 warmup: int = 1, up_to: int | None = None, sample_size: int = 32768) -> list[tuple[int, ...]]:
    """Nested plans, one per budget up to ``up_to``, by greedy forward selection on the open-loop forecast
    error (scored on a fixed subsample of the latent, so large video latents stay cheap)."""
    n = len(sigmas)
    flat = [o.flatten() for o in outputs]
    if flat and flat[0].numel() > sample_size:
        index = torch.linspace(0, flat[0].numel() - 1, sample_size).long()
        flat = [f[index] for f in flat]
    outputs = flat
    next_sigmas = list(sigmas[1:]) + [0.0]
    compute = set(range(min(warmup, n))) | {n - 1}
    plans = [tuple(sorted(compute))]

    def error(candidate: set[int]) -> float:
        return float(_final_error(sigmas, outputs, candidate, order, next_sigmas).pow(2).mean())

    while len(compute) < min(n, up_to or n):
        best = min((j for j in range(n) if j not in compute), key=lambda j: error(compute | {j}))
        compute.add(best)
        plans.append(tuple(sorted(compute)))
    return plans


def calibrate(sigmas: Sequence[float], outputs: Sequence[torch.Tensor], measure, *, order: int = 1,
              budget: int | None = None, min_psnr: float | None = None, warmup: int = 1) -> Plan:
    """Pick the plan that meets the target, checking candidates with real cached runs.

    ``measure(compute) -> Quality`` runs the sampler with that plan and measures its result against the
    uncached pass (PSNR decides). The open-loop error above ranks placements cheaply but misses how errors
    grow along the trajectory, so every candidate is confirmed by ``measure``. ``budget``: exactly that
    many computed evaluations, the best placement of the candidates (greedy and even spacing).
    ``min_psnr``: the smallest budget whose best placement reaches the bound (bisection over budgets).
    """
    n = len(sigmas)
    if n == 0:
        raise InterceptorError("Calibration recorded no model evaluations.")
    if (budget is None) == (min_psnr is None):
        raise InterceptorError("Give exactly one target: a budget of computed steps or a minimum PSNR.")
    floor = min(warmup, n) + (1 if n > warmup else 0)
    greedy = greedy_plans(sigmas, outputs, order=order, warmup=warmup, up_to=budget)
    measured: dict[tuple[int, ...], Quality] = {}

    def best_for(b: int) -> Plan:
        candidates = {greedy[min(b - floor, len(greedy) - 1)], uniform_plan(n, b, warmup)}
        for plan in candidates:
            if plan not in measured:
                measured[plan] = measure(plan)
        plan = max(candidates, key=lambda p: measured[p].psnr)
        return Plan(plan, n, measured[plan])

    if budget is not None:
        if budget < floor:
            raise InterceptorError(f"A budget of {budget} computed steps is below the {floor} that are always "
                                   f"computed (the first {min(warmup, n)} and the last).")
        return best_for(min(budget, n))
    lo, hi = floor, n
    best = None
    while lo <= hi:
        mid = (lo + hi) // 2
        plan = best_for(mid)
        if plan.psnr >= min_psnr:
            best, hi = plan, mid - 1
        else:
            lo = mid + 1
    return best or best_for(n)  # nothing met the bound: every evaluation computed (measured last, cached)
