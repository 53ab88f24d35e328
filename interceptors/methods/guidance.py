"""Guidance Cache: compute the unconditional (negative) CFG branch only on some steps, estimate it on the others.

With classifier-free guidance every step runs the model on the positive and the negative conditioning.
The negative branch's prediction changes slowly, and so does the guidance difference between the two:

* FasterCache (Lv et al., arXiv 2410.19355), "CFG-Cache": on skipped steps the unconditional output is the
  conditional one plus the cond-uncond difference from the last full step (they add a frequency-aware
  correction; here the difference can instead be extrapolated in sigma, TaylorSeer-style);
* Adaptive Guidance (Castillo et al., arXiv 2312.12487): the unconditional branch stops mattering once the two
  branches agree, measured by the cosine similarity of their epsilons, gamma = cos(eps_cond, eps_uncond); past a
  threshold the paper drops the unconditional pass for the remaining steps. The ``agreement`` mode follows it,
  with three changes: the threshold is the disagreement ``1 - gamma`` (so 0 never skips, as in every other mode);
  the branch is re-checked every ``interval`` evaluations instead of being dropped for good, since a schedule can
  bring disagreement back (a prompt switch, a late detail pass); and the cosine is taken of the two *denoised*
  predictions, not of the epsilons. An epsilon is ``(x - denoised) / sigma``: at high noise both branches' are
  mostly the input ``x`` they share, so they look agreed exactly where the branches still point at different
  images (on the bundled video model 1 - gamma of the epsilons is 0.016 at the first step, smaller than at the
  fifth, and of the denoised predictions 0.49, falling steadily to 0.0001 at the last);
* the ``adaptive`` mode measures how fast the guidance difference changes between computed steps and skips while
  the predicted change stays small;
* the ``planned`` mode leaves the negative branch out exactly on the evaluations a calibration chose
  (``leave_out``, keyed on the evaluations' sigmas like a planned step schedule): Auto Calibrate measures, one
  computed step at a time, which omissions its target survives.

With a step cache in the chain the two never forecast the same thing: on an evaluation whose negative branch is
left out, the step cache sees (and forecasts, where it skips) the positive rows only, the negative prediction is
this file's estimate, and what either learns comes only from branches the model really computed.

It works one level above the model, at the engine's guidance meeting point (:func:`.engine.guided_batch`, from
ComfyUI's ``CALC_COND_BATCH`` hook: the guider's conds list, ``[positive, negative]`` for the standard CFG guider).
On a step the rule picks, the engine leaves the negative entries out, so the model runs only the positive rows
(half the work at one positive conditioning), and the negative prediction is estimated here from what was really
computed. All consumers of the two predictions (``sampler_cfg_function``, pre/post-CFG functions) then see the
real positive and the estimated negative. This file holds the rule and what it learns; both live in epsilon space,
``(x - denoised) / sigma``, which the engine converts to and from, as for the whole-model caches.
"""
from __future__ import annotations

import dataclasses

import torch

from ..base import GuidanceDecider
from ..kinds import LAST_STEP_COMPUTE, Cached, InterceptorError, check_range, check_whole
from ..memory import Footprint
from ..records import Evaluation
from ..run import Run
from ..spec import Example, Input, MemoryRow, MethodSpec, Prose, WINDOW, last_step_input, percent_inputs
from .planned import fits_plan
from .taylorseer import TaylorSeer

MODES = ("cadence", "adaptive", "agreement")  # the node's choices
PLANNED = "planned"  # a calibration's plan (Auto Calibrate makes it; no node input selects it)
# What stands in for the negative prediction on a step that skips it; measured on the digits model (docs/methods.md).
ESTIMATES = ("difference forecast", "difference", "negative forecast", "negative reuse")
# A branch's history (one per context window) is dropped once the evaluations this many before the current one
# went without it: ComfyUI's uniform context schedules move their windows every step, and the histories of
# windows gone would otherwise be held, tensors and all, until the run ends. Windows that stay (the static
# schedule, no context windows) are used on every evaluation and never dropped.
KEPT_EVALUATIONS = 2


@dataclasses.dataclass(frozen=True)
class GuidanceCache(GuidanceDecider):
    declaration = GuidanceDecider.declaration.but(
        kind="guidance_cache",
        display_name="Guidance Cache",
        metric_name="guidance: steps / predicted change / disagreement",
        metric_secondary=True,  # beside a step or block cache, that cache's metric is the one shown
    )

    interval: int = 2
    mode: str = "cadence"
    threshold: float = 0.0
    estimate: str = "difference forecast"
    leave_out: tuple[int, ...] = ()   # planned mode: the evaluations whose negative branch is estimated
    sigmas: tuple[float, ...] = ()    # planned mode: the sigma of every evaluation of the run planned for
    schedule: tuple[float, ...] = ()  # planned mode: that run's sigmas, and its sampler (planned.fits_plan)
    sampler: str = ""

    @dataclasses.dataclass
    class RunState:
        tidied: int | None = None  # the evaluation whose unused histories were last dropped
        mismatch: bool = False     # planned mode: this run is not the one planned for

    @dataclasses.dataclass
    class BranchState:
        """One per conds-list call shape (context windows, resized latents): what the negative branch was."""
        slot: TaylorSeer.Slot = dataclasses.field(default_factory=TaylorSeer.Slot)  # the estimated quantity
        since: int = 0                  # evaluations the model ran since the negative branch was last computed
        last_sigma: float | None = None
        difference: torch.Tensor | None = None  # adaptive mode: the last computed eps(negative) - eps(positive)
        rate: float | None = None       # relative change of that difference per unit sigma (adaptive mode)
        disagreement: float | None = None  # agreement mode: 1 - cos(denoised positive, negative), worst row
        conditioning: tuple = ()        # the conditioning entries active when this history was learned

        def start_over(self, conditioning: tuple) -> None:
            """A new history: the conditioning changed (a timestep-ranged prompt switched)."""
            self.slot, self.since, self.last_sigma = TaylorSeer.Slot(), 0, None
            self.difference, self.rate, self.conditioning = None, None, conditioning
            self.disagreement = None

    def validate(self) -> None:
        super().validate()
        check_whole(self.label, "interval", self.interval, 1)
        check_range(self.label, "threshold", self.threshold, 0.0)
        if self.mode not in MODES and not (self.mode == PLANNED and self.sigmas):
            raise InterceptorError(f"{self.label}: 'mode' must be one of {', '.join(MODES)}, got {self.mode!r}.")
        if any(not 0 < i < len(self.sigmas) for i in self.leave_out):
            raise InterceptorError(f"{self.label}: the plan leaves out evaluations outside 1..{len(self.sigmas) - 1}.")
        if self.estimate not in ESTIMATES:
            raise InterceptorError(
                f"{self.label}: 'estimate' must be one of {', '.join(ESTIMATES)}, got {self.estimate!r}.")

    @property
    def footprint(self) -> Footprint:
        """Its history (interceptors/memory.py): the forecast's points, and the last difference in adaptive mode."""
        return Footprint(Cached.NEGATIVE_BRANCH, points=self._forecaster.order + 1 + (self.mode == "adaptive"))

    @property
    def never_skips(self) -> bool:
        """Interval 1, or threshold 0 in the adaptive and agreement modes: every step computes both branches
        (bit-identical)."""
        if self.mode == PLANNED:
            return not self.leave_out
        return self.interval <= 1 or (self.mode != "cadence" and self.threshold <= 0)

    @property
    def _forecaster(self) -> TaylorSeer:
        return TaylorSeer(order=1 if self.estimate.endswith("forecast") else 0)

    @property
    def _tracks_difference(self) -> bool:
        return self.estimate.startswith("difference")

    # -- the rule ----------------------------------------------------------------------------------
    def decide(self, run: Run, ev: Evaluation, signals, measured) -> bool:
        """True: compute the negative branch on this evaluation. The clock counts evaluations on which the
        model really ran, so a step cache's skipped steps do not use up the interval."""
        state = next(iter(signals.values()))
        if not state.slot.points:
            return True
        if self.mode == PLANNED:
            return not self._planned_skip(run, ev)
        if self.mode == "cadence":
            run.report_metric(self, float(state.since + 1), float(self.interval))
            return state.since + 1 >= self.interval
        if self.mode == "agreement":  # Adaptive Guidance, re-checked every `interval` evaluations
            if state.disagreement is None:
                return True
            run.report_metric(self, state.disagreement, self.threshold)
            return state.disagreement >= self.threshold or state.since + 1 >= self.interval
        if state.rate is None:
            return True
        predicted = state.rate * abs(state.last_sigma - ev.sigma)
        run.report_metric(self, predicted, self.threshold)
        return predicted >= self.threshold or state.since + 1 >= self.interval

    def _planned_skip(self, run: Run, ev: Evaluation) -> bool:
        """Whether the plan leaves this evaluation's negative branch out; on a run it was not made for (another
        schedule or sampler), never, and the node says so once."""
        state = run.state_of(self)
        if not state.mismatch and not fits_plan(run, ev, self.sigmas, self.schedule, self.sampler):
            state.mismatch = True
            run.note(f"{self.label}: the plan for the negative branch was calibrated for another schedule or sampler, "
                     f"so both branches are computed. Calibrate again with this sampler's settings.")
        return not state.mismatch and ev.index in self.leave_out

    # -- the history of one call shape ------------------------------------------------------------------
    def history(self, run: Run, ev: Evaluation, key, conditioning: tuple) -> "GuidanceCache.BranchState":
        """The negative branch's history for ``key`` (one per context window), started over when the active
        conditioning entries changed: a forecast through two prompts is meaningless. Histories of windows gone
        are dropped once per evaluation, before any of its windows is asked for."""
        run_state = run.state_of(self)
        if run_state.tidied != ev.index:
            run_state.tidied = ev.index
            run.forget_branches(self, unused_since=ev.index - KEPT_EVALUATIONS)
        state = run.branch_of(self, key)
        if state.conditioning != conditioning:
            state.start_over(conditioning)
        return state

    # -- learning and estimating (epsilon space) ------------------------------------------------------
    def learned(self, run: Run, state: "GuidanceCache.BranchState", eps_positive: torch.Tensor,
                eps_negative: torch.Tensor, now: float, *, denoised: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Told the two predictions of an evaluation that really computed both, as epsilons and as the denoised
        images (positive, negative) they were made from; ``now`` is its sigma."""
        difference = eps_negative - eps_positive
        if self.mode == "adaptive":
            if state.difference is not None and state.last_sigma != now:
                previous = state.difference.to(difference)
                change = (difference - previous).abs().mean() / previous.abs().mean().clamp_min(1e-12)
                gap = abs(state.last_sigma - now)
                # read with the next transfer (before the next decision): a computed step costs no sync of its own
                run.read_later([change], lambda host: setattr(state, "rate", host[0][0] / gap))
            state.difference = run.to_cache(difference.detach().clone())
        if self.mode == "agreement":
            cosine = _row_cosines(*denoised)
            run.read_later([cosine], lambda host: setattr(state, "disagreement", 1.0 - min(host[0])))
        value = difference if self._tracks_difference else eps_negative
        self._forecaster.observe(state.slot, run.to_cache(value.detach().clone()), now)
        state.last_sigma, state.since = now, 0

    def left_out(self, state: "GuidanceCache.BranchState", model_ran: bool) -> None:
        """The negative branch was estimated on an evaluation; ``model_ran``: the positive one really computed."""
        if model_ran:
            state.since += 1

    def estimated(self, state: "GuidanceCache.BranchState", eps_positive: torch.Tensor, now: float) -> torch.Tensor:
        """The negative prediction for this evaluation, from the positive one just computed."""
        value = self._forecaster.estimate(state.slot, now, eps_positive.device).to(dtype=eps_positive.dtype)
        return eps_positive + value if self._tracks_difference else value


def _row_cosines(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The cosine similarity of each batch row of ``a`` and ``b`` (flattened), in float32 at least."""
    a = a.reshape(len(a), -1).float()
    b = b.reshape(len(b), -1).float()
    return (a * b).sum(dim=1) / (a.norm(dim=1) * b.norm(dim=1)).clamp_min(1e-12)


SPECS = (MethodSpec(
    "GuidanceCache", "Guidance Cache",
    "Computes the negative (unconditional) CFG branch only on some steps and estimates it on the others from "
    "the positive one, so those steps cost half (FasterCache's CFG-Cache, arXiv 2410.19355; Adaptive Guidance, "
    "arXiv 2312.12487). Works on every model; chain it with one step or block cache and TaylorSeer Forecast. "
    "At cfg 1 there is no negative branch: it does nothing and says so. Guiders with their own layout (DualCFG, "
    "PerpNeg) are left alone, with a note.",
    (Input("interval", "int", default=2, min=1, max=100, tooltip=(
        "Compute the negative branch on every N-th step the model runs (steps a chained step cache skips do not "
        "count); 1 always computes it (bit-identical to no Guidance Cache). In adaptive mode: the longest gap; in "
        "agreement mode: how often the agreement is checked again.")),
     Input("mode", "choice", choices=MODES, tooltip=(
         "cadence: every N-th step. adaptive: skip while the predicted change of the guidance difference "
         "(negative minus positive prediction) since it was last computed stays under the threshold. agreement "
         "(Adaptive Guidance): skip once the two predictions point at the same image (1 - the cosine similarity of "
         "the denoised predictions under the threshold), checking again every N-th step.")),
     Input("threshold", "float", default=0.0, min=0.0, max=10.0, step=0.005, tooltip=(
         "Adaptive mode: predicted relative change of the guidance difference under which the negative branch is "
         "skipped. Agreement mode: 1 - cosine similarity of the positive and negative denoised predictions under "
         "which it is skipped (the paper's 0.99 similarity is 0.01). 0 never skips (bit-identical).")),
     Input("estimate", "choice", choices=ESTIMATES, tooltip=(
         "What stands in for a skipped negative prediction: difference forecast = this step's positive "
         "prediction plus the guidance difference extrapolated in sigma from the last two computed steps "
         "(recommended); difference = plus the last computed difference; negative forecast / reuse = the "
         "negative prediction itself, extrapolated or reused.")),
     *percent_inputs(), last_step_input()),
    lambda interval, mode, threshold, estimate, start_percent, end_percent, last_step=LAST_STEP_COMPUTE: GuidanceCache(
        interval=interval, mode=mode, threshold=threshold, estimate=estimate, start_percent=start_percent,
        end_percent=end_percent, last_step=last_step),
    GuidanceCache,
    Prose(when=(
        "With cfg above 1 every step runs the model on the positive and the negative prompt. This node "
        "computes the negative branch only on some steps and estimates it from the positive one on the others, "
        "so those steps cost half. Use it alone, or chained with a step cache only late in the schedule "
        "(`start_percent` about 0.7): over the whole schedule, chained, it cost more quality than it saved on "
        "the pack's measurements. At cfg 1 it does nothing and says so.",
    ), families=(
        ("Any model with cfg above 1", "interval 2-3, mode cadence, estimate difference forecast"),
        ("Bundled digits model, 28 steps, cfg 3 (measured)", "interval 2: 1.30x less work at 60 dB; 3: 1.47x at 48 dB; 4: 1.56x at 43 dB"),
    ), after=(
        "This node shows nothing itself. The Cached Sampler's summary counts the negative branch separately "
        "(`uncond 15/28`) and names this node under `acted:`; its tuning plot adds an `uncond` strip, green "
        "where the negative branch was computed and orange where it was estimated.",
    )),
    examples=(
        Example("guidance cache", (("GuidanceCache", dict(interval=2, mode="cadence", threshold=0.0,
                                                          estimate="difference forecast", **WINDOW),
                                    dict(interval=1, mode="cadence", threshold=0.0, estimate="difference forecast",
                                         **WINDOW)),), negative_branch_only=True),
        Example("guidance cache + fixed cadence", (
            ("FixedCadence", dict(interval=2, **WINDOW), dict(interval=1, **WINDOW)),
            ("GuidanceCache", dict(interval=3, mode="cadence", threshold=0.0, estimate="difference forecast", **WINDOW),
             dict(interval=1, mode="cadence", threshold=0.0, estimate="difference forecast", **WINDOW)))),
        # threshold 1.5: 1 - cos < 1.5 for every pair of predictions but opposite ones, so it skips here
        Example("guidance agreement", (("GuidanceCache", dict(interval=3, mode="agreement", threshold=1.5,
                                                              estimate="difference forecast", **WINDOW),
                                        dict(interval=3, mode="agreement", threshold=0.0,
                                             estimate="difference forecast", **WINDOW)),), negative_branch_only=True),
    ),
    # its own history of the negative branch, whatever estimator the chain has
    memory=(MemoryRow("Guidance Cache (difference forecast)", settings={}),
            MemoryRow("Guidance Cache, adaptive", settings={"mode": "adaptive"})),
    summary=(
        "Computes the negative CFG branch only on some steps and estimates it from the positive one. Any model; "
        "composes with a step/block cache and TaylorSeer."),
),)
