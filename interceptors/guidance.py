"""Guidance Cache: compute the unconditional (negative) CFG branch only on some steps, estimate it on the others.

With classifier-free guidance every step runs the model on the positive and the negative conditioning.
The negative branch's prediction changes slowly, and so does the guidance difference between the two:

* FasterCache (Lv et al., arXiv 2410.19355), "CFG-Cache": on skipped steps the unconditional output is the
  conditional one plus the cond-uncond difference from the last full step (they add a frequency-aware
  correction; here the difference can instead be extrapolated in sigma, TaylorSeer-style);
* Adaptive Guidance (Castillo et al., arXiv 2312.12487): the unconditional branch stops mattering once the two
  branches agree, which it measures by their cosine similarity; here the adaptive rule measures how fast the
  guidance difference changes between computed steps and skips while the predicted change stays small.

It works one level above the model: ComfyUI's ``CALC_COND_BATCH`` hook gets the guider's conds list
(``[positive, negative]`` for the standard CFG guider). On a step the rule picks, the negative entries are
left out, so the model runs only the positive rows (half the work at one positive conditioning), and the
negative prediction is estimated from what was really computed. All consumers of the two predictions
(``sampler_cfg_function``, pre/post-CFG functions) then see the real positive and the estimated negative.
Estimates live in epsilon space, ``(x - denoised) / sigma``, like the whole-model caches.
"""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Callable, ClassVar

import torch

from .base import Decider, Granularity, InterceptorError, check_range
from .state import BranchKey
from .taylorseer import TaylorSeer

if TYPE_CHECKING:  # pragma: no cover
    from .state import Evaluation, LoopState

MODES = ("cadence", "adaptive")
# What stands in for the negative prediction on a step that skips it; measured on the digits model (README).
ESTIMATES = ("difference forecast", "difference", "negative forecast", "negative reuse")
POSITIVE, NEGATIVE = 0, 1
# A branch's history (one per context window) is dropped once the evaluations this many before the current one
# went without it: ComfyUI's uniform context schedules move their windows every step, and the histories of
# windows gone would otherwise be held, tensors and all, until the run ends. Windows that stay (the static
# schedule, no context windows) are used on every evaluation and never dropped.
KEPT_EVALUATIONS = 2


def _rows(sigma: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return sigma.reshape((sigma.shape[0],) + (1,) * (like.ndim - 1)).to(like)


@dataclasses.dataclass(frozen=True)
class GuidanceCache(Decider):
    kind = "guidance_cache"
    display_name = "Guidance Cache"
    metric_name = "guidance: steps / predicted change"
    metric_secondary = True  # beside a step or block cache, that cache's metric is the one shown
    granularity = Granularity.GUIDANCE
    signal: ClassVar[str] = "guidance"  # decide() is handed {key: that calc's BranchState}

    interval: int = 2
    mode: str = "cadence"
    threshold: float = 0.0
    estimate: str = "difference forecast"

    @dataclasses.dataclass
    class RunState:
        active: bool = True        # False: the guider's layout or cfg 1 leaves nothing to do (said in a note)
        tidied: int | None = None  # the evaluation whose unused histories were last dropped

    @dataclasses.dataclass
    class BranchState:
        """One per conds-list call shape (context windows, resized latents): what the negative branch was."""
        slot: TaylorSeer.Slot = dataclasses.field(default_factory=TaylorSeer.Slot)  # the estimated quantity
        since: int = 0                  # evaluations the model ran since the negative branch was last computed
        last_sigma: float | None = None
        difference: torch.Tensor | None = None  # adaptive mode: the last computed eps(negative) - eps(positive)
        rate: float | None = None       # relative change of that difference per unit sigma (adaptive mode)
        conditioning: tuple = ()        # the conditioning entries active when this history was learned

        def start_over(self, conditioning: tuple) -> None:
            """A new history: the conditioning changed (a timestep-ranged prompt switched)."""
            self.slot, self.since, self.last_sigma = TaylorSeer.Slot(), 0, None
            self.difference, self.rate, self.conditioning = None, None, conditioning

    def validate(self) -> None:
        super().validate()
        if int(self.interval) != self.interval or self.interval < 1:
            raise InterceptorError(f"{self.label}: 'interval' must be a whole number >= 1, got {self.interval}.")
        check_range(self.label, "threshold", self.threshold, 0.0)
        if self.mode not in MODES:
            raise InterceptorError(f"{self.label}: 'mode' must be one of {', '.join(MODES)}, got {self.mode!r}.")
        if self.estimate not in ESTIMATES:
            raise InterceptorError(
                f"{self.label}: 'estimate' must be one of {', '.join(ESTIMATES)}, got {self.estimate!r}.")

    @property
    def never_skips(self) -> bool:
        """Interval 1, or threshold 0 in adaptive mode: every step computes both branches (bit-identical)."""
        return self.interval <= 1 or (self.mode == "adaptive" and self.threshold <= 0)

    @property
    def _forecaster(self) -> TaylorSeer:
        return TaylorSeer(order=1 if self.estimate.endswith("forecast") else 0)

    @property
    def _tracks_difference(self) -> bool:
        return self.estimate.startswith("difference")

    # -- the rule ----------------------------------------------------------------------------------
    def decide(self, run: "LoopState", ev: "Evaluation", signals, measured) -> bool:
        """True: compute the negative branch on this evaluation. The clock counts evaluations on which the
        model really ran, so a step cache's skipped steps do not use up the interval."""
        state = next(iter(signals.values()))
        if not state.slot.points:
            return True
        # The tuning plot shows one metric: a step or block cache's, if the chain has one.
        shown = run.model_decider is None and run.block_decider is None
        if self.mode == "cadence":
            if shown:
                run.report_metric(self, float(state.since + 1), float(self.interval))
            return state.since + 1 >= self.interval
        if state.rate is None:
            return True
        predicted = state.rate * abs(state.last_sigma - ev.sigma)
        if shown:
            run.report_metric(self, predicted, self.threshold)
        return predicted >= self.threshold or state.since + 1 >= self.interval

    # -- learning and estimating (epsilon space) ------------------------------------------------------
    def learned(self, run: "LoopState", state: "GuidanceCache.BranchState", positive: torch.Tensor,
                negative: torch.Tensor, x: torch.Tensor, sigma: torch.Tensor, now: float) -> None:
        """Told the two predictions (denoised) of an evaluation that really computed both; ``now`` is its sigma as
        the run read it (``sigma`` the sampler's tensor, one per row)."""
        s = _rows(sigma, x)
        eps_pos, eps_neg = (x - positive) / s, (x - negative) / s
        difference = eps_neg - eps_pos
        if self.mode == "adaptive":
            if state.difference is not None and state.last_sigma != now:
                previous = state.difference.to(difference)
                change = (difference - previous).abs().mean() / previous.abs().mean().clamp_min(1e-12)
                gap = abs(state.last_sigma - now)
                # read with the next transfer (before the next decision): a computed step costs no sync of its own
                run.read_later([change], lambda host: setattr(state, "rate", host[0][0] / gap))
            state.difference = run.to_cache(difference.detach().clone())
        value = difference if self._tracks_difference else eps_neg
        self._forecaster.observe(state.slot, run.to_cache(value.detach().clone()), now)
        state.last_sigma, state.since = now, 0

    def estimated(self, state: "GuidanceCache.BranchState", positive: torch.Tensor, x: torch.Tensor,
                  sigma: torch.Tensor, now: float) -> torch.Tensor:
        """The negative prediction (denoised) for this evaluation, from the positive one just computed."""
        s = _rows(sigma, x)
        value = self._forecaster.estimate(state.slot, now, x.device).to(dtype=x.dtype)
        eps_neg = (x - positive) / s + value if self._tracks_difference else value
        return x - eps_neg * s


def _active_entries(entries: list, sigma: float, dtype: torch.dtype) -> list:
    """The conditioning entries ComfyUI's batching uses at ``sigma``: those whose timestep range holds it
    (``timestep_start`` >= sigma >= ``timestep_end``, set by ConditioningSetTimestepRange). ComfyUI compares
    the sampler's sigma tensor with the bounds, so the bounds are rounded to its dtype first (a range that
    ends on a step's sigma holds it)."""
    def bound(entry, name, default):
        value = entry.get(name)
        return default if value is None else float(torch.tensor(value, dtype=dtype))
    return [e for e in entries if bound(e, "timestep_end", -math.inf) <= sigma <= bound(e, "timestep_start", math.inf)]


def _identities(active: tuple[list, list]) -> tuple:
    return tuple(tuple(e.get("uuid", id(e)) for e in entries) for entries in active)


def guided_batch(run: "LoopState", gc: GuidanceCache, conds: list, x: torch.Tensor, sigma: torch.Tensor,
                 compute: Callable[[list], list], window=None) -> list:
    """One ``calc_cond_batch`` call: ``compute(conds)`` runs ComfyUI's batching over the given conds list and
    returns one prediction per entry. Anything but the standard ``[positive, negative]`` call (an extra
    guidance pass, cfg 1, a guider with another layout) is passed through untouched."""
    if gc.never_skips or not run.state_of(gc).active:
        return compute(conds)
    if len(conds) == 2 and conds[POSITIVE] is not None and conds[NEGATIVE] is None and run.cfg == 1:
        run.note(f"{gc.label} did nothing: at cfg 1 ComfyUI computes no negative branch to skip.")
    elif len(conds) == 2 and (conds[POSITIVE] is None) != (conds[NEGATIVE] is None):
        run.note(f"{gc.label} computed every step in full where the positive and the negative branch came in "
                 f"separate calls (a guidance add-on such as Skip Layer Guidance (Simple) does that).")
    if len(conds) != 2 or conds[POSITIVE] is None or conds[NEGATIVE] is None or sigma.numel() != x.shape[0]:
        return compute(conds)
    ev = run.evaluation
    if ev is None or not ev.from_sampler:
        ev = run.ensure_evaluation(float(sigma.flatten()[0]))
    record = ev.record
    run_state = run.state_of(gc)
    if run_state.tidied != ev.index:  # once per evaluation, before any of its windows is asked for
        run_state.tidied = ev.index
        run.forget_branches(gc, unused_since=ev.index - KEPT_EVALUATIONS)
    key = BranchKey(NEGATIVE, window, 0, tuple(x.shape), str(x.dtype))  # one history per context window
    state = run.branch_of(gc, key)
    step = run.model_decider
    # A step cache that decides from the schedule alone says now whether the model runs at all; on its skipped
    # steps the negative branch is estimated here too, from its own (not the step cache's) history, but only
    # where the Guidance Cache may act: outside its own window (and on its first and last steps) the step
    # cache stays in charge of both branches, exactly as in the chain without it.
    model_runs = run.decide(step, None) if step is not None and step.signal == "none" else True
    if not model_runs and run.forced(gc, ev):
        return compute(conds)
    # The entries of each branch active at this sigma (timestep ranges switch prompts part way): a forecast
    # through two prompts is meaningless, so a change starts a new history.
    active = tuple(_active_entries(conds[b], ev.sigma, sigma.dtype) for b in (POSITIVE, NEGATIVE))
    if state.conditioning != _identities(active):
        state.start_over(_identities(active))
    # sigma 0 (read here after the decisions, which read it with their transfer): no epsilon to learn or estimate
    if not state.slot.points or (model_runs and run.decide(gc, {key: state})) or ev.sigma == 0:
        out = compute(conds)
        both = record.branches.get("cond") and record.branches.get("uncond")  # really computed, not estimated
        if both and ev.sigma != 0:
            gc.learned(run, state, out[POSITIVE], out[NEGATIVE], x, sigma, ev.sigma)
        return out
    out = compute([conds[POSITIVE], None])
    run.skipped(gc)
    if record.branches.get("cond"):
        state.since += 1
    record.branches.setdefault("uncond", False)
    record.chunks_total += len(active[NEGATIVE])  # the rows left out (only entries active now) count as saved
    return [out[POSITIVE], gc.estimated(state, out[POSITIVE], x, sigma, ev.sigma)]
