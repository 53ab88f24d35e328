"""How one run decides: each level's decider, the evaluation's decision made once for all its forwards, the
guards every decider obeys whatever its rule says, and the count of skips that really happened. One part of
:class:`~.state.LoopState`; a decider's own rule is asked with the whole run, which is why :meth:`Decisions.decide`
takes it."""
from __future__ import annotations

from typing import Callable

import torch

from .base import Decider
from .chain import InterceptorChain
from .kinds import LAST_STEP_COMPUTE, Granularity, Signal
from .records import BranchKey, DecisionRecord, Evaluation


class Decisions:
    """The chain's decider of each engine level (looked up once: the engine asks for them on every forward and
    every block), their start/end windows in sigma, and one :class:`DecisionRecord` per decider.
    ``percent_to_sigma`` maps a schedule percent to the model's sigma (ComfyUI's convention for start/end
    percents); without it, percents are fractions of the schedule's steps. ``group`` (a
    :class:`~.distributed.RankGroup`, None in one process): every decision is agreed by all of its ranks."""

    def __init__(self, chain: InterceptorChain, percent_to_sigma: Callable[[float], float] | None = None,
                 group=None):
        self.chain = chain
        self.guidance_decider = chain.decider(Granularity.GUIDANCE)
        self.model_decider = chain.decider(Granularity.MODEL)
        self.block_decider = chain.decider(Granularity.BLOCKS)
        self.percent_to_sigma = percent_to_sigma
        self.group = group
        self.records: dict[str, DecisionRecord] = {d.id: DecisionRecord() for d in chain.deciders}
        self._windows = {d.id: self._window(d) for d in chain.deciders}

    # -- the schedule window ----------------------------------------------------------------------------
    def _window(self, decider: Decider) -> tuple[float, float] | None:
        if self.percent_to_sigma is None:
            return None
        return float(self.percent_to_sigma(decider.start_percent)), float(self.percent_to_sigma(decider.end_percent))

    def in_window(self, decider: Decider, ev: Evaluation) -> bool:
        window = self._windows.get(decider.id)
        if window is None:
            return decider.start_percent <= ev.progress < decider.end_percent or (
                decider.end_percent >= 1.0 and ev.progress >= 1.0)
        start_sigma, end_sigma = window
        return end_sigma < ev.sigma <= start_sigma * (1 + 1e-6) + 1e-9

    # -- deciding ---------------------------------------------------------------------------------------
    def decide(self, run, decider: Decider, signals: dict[BranchKey, torch.Tensor] | None) -> bool:
        """``run``'s decision for ``decider`` in its current evaluation (see ``LoopState.decide``)."""
        ev = run.evaluation
        if decider.id in ev.decisions:
            if decider.checks_forecast and signals and not ev.decisions[decider.id]:
                self._unchecked(run, decider, ev, signals)
            return ev.decisions[decider.id]
        ev.decided_on[decider.id] = set(signals or ())
        measured = decider.measure(run, ev, signals)
        run.transfer(measured)
        compute = True if self.forced(decider, ev) else bool(decider.decide(run, ev, signals, measured))
        if self.group is not None:  # on every evaluation, forced or not: the ranks stay in step
            compute = self.group.any(compute)
        ev.decisions[decider.id] = compute
        return compute

    @staticmethod
    def _unchecked(run, decider: Decider, ev: Evaluation, signals: dict) -> None:
        """A later model call of an evaluation a forecast-checking decider skipped on the first call's check: the
        branches it brings were skipped with a forecast nobody checked. Said once."""
        unchecked = sorted({k.name for k in signals if k not in ev.decided_on.get(decider.id, ())})
        if unchecked:
            run.note(f"{decider.label} checked its forecast on the first model call of each step only: the CFG "
                     f"branches came in separate calls (area conditioning, prompts of different lengths, or too "
                     f"little memory to batch them), so the forecast of {', '.join(unchecked)} was not checked on "
                     f"the steps it skipped")

    def forced(self, decider: Decider, ev: Evaluation) -> bool:
        """Whether ``decider`` must compute in ``ev`` whatever its rule says: the first evaluation, the last step
        (unless the decider's ``last_step`` setting or its class says it may be forecast), sigma 0, every evaluation
        outside its start/end percent window, and the one after its ``max_consecutive_cached`` skipped evaluations
        in a row. A skip the rule wishes where a branch has nothing cached yet is computed by the engine anyway."""
        limit = decider.max_consecutive_cached
        last = ev.is_last_step and decider.forces_last_step and decider.last_step == LAST_STEP_COMPUTE
        return (ev.index == 0 or last or ev.sigma == 0
                or not self.in_window(decider, ev)
                or 0 <= limit <= self.records[decider.id].consecutive_skips)

    def model_will_run(self, run) -> bool:
        """Whether the model runs at all in ``run``'s evaluation, as far as can be said before any forward: False
        only where a whole-model decider that decides from the schedule alone (``Signal.NONE``) skips it."""
        step = self.model_decider
        return self.decide(run, step, None) if step is not None and step.signal == Signal.NONE else True

    def switch_off_level(self, level: Granularity) -> bool:
        """Leave ``level``'s decider out of the run; whether there was one to leave out."""
        attribute = {Granularity.GUIDANCE: "guidance_decider", Granularity.MODEL: "model_decider",
                     Granularity.BLOCKS: "block_decider"}[level]
        if getattr(self, attribute) is None:
            return False
        setattr(self, attribute, None)
        return True

    # -- counting -----------------------------------------------------------------------------------------
    @staticmethod
    def skipped(decider: Decider, ev: Evaluation) -> None:
        """The engine really skipped ``decider``'s work in ``ev`` (counted when the evaluation ends)."""
        ev.skipped_by.add(decider.id)
        if decider.label not in ev.record.skipped_by:
            ev.record.skipped_by.append(decider.label)

    def count(self, ev: Evaluation) -> None:
        """``ev`` ended: count each decision it made, a skip only where the skip really happened."""
        for decider_id in ev.decisions:
            record = self.records[decider_id]
            if decider_id in ev.skipped_by:
                record.consecutive_skips += 1
                record.skips += 1
            else:
                record.last_compute = ev.index
                record.consecutive_skips = 0

    def of(self, decider: Decider) -> DecisionRecord:
        return self.records[decider.id]

    def since_compute(self, decider: Decider, ev: Evaluation) -> int:
        last = self.records[decider.id].last_compute
        return ev.index - last - 1 if last is not None else 0

    def report_metric(self, decider: Decider, ev: Evaluation, value: float, threshold: float) -> None:
        """Record in ``ev`` the change metric a decider compared against its threshold (shown in stats and plot).
        The plot shows one metric: a secondary decider's (``Decider.metric_secondary``: the Guidance Cache's) only
        where no other decider of the chain reports one."""
        if decider.metric_secondary and any(not d.metric_secondary for d in self.chain.deciders):
            return
        ev.record.metric, ev.record.threshold = float(value), float(threshold)
