"""Where one run is: its evaluations and the forwards in them, each evaluation's place in the schedule, and the
transfers that bring device values to the host. One part of :class:`~.state.LoopState`, which ends evaluations
(the other parts count and forget then) and tells the observers."""
from __future__ import annotations

import math
import time
from typing import Callable, Hashable, Sequence

import torch

from .kinds import BRANCH_NAMES
from .metrics import Measure, deliver, terms_of, to_host
from .records import BranchKey, Evaluation, EvaluationRecord, Forward


class Lifecycle:
    """``sample_sigmas`` is the run's schedule; ``first_step`` and ``schedule_steps`` place its steps in the
    model's whole schedule (a second stage starts at ``first_step``; denoise < 1 starts part way); by default the
    run is the whole schedule. ``records`` keeps one :class:`EvaluationRecord` per evaluation."""

    def __init__(self, sample_sigmas: list[float], first_step: int = 0, schedule_steps: int | None = None):
        self.sample_sigmas = sample_sigmas
        self.total_steps = max(len(sample_sigmas) - 1, 0)
        self.first_step = first_step
        self.schedule_steps = max(schedule_steps or 0, first_step + self.total_steps)
        self.records: list[EvaluationRecord] = []
        self.evaluation: Evaluation | None = None
        self.deferred: list = []  # (tensors, then): device values to read with the next transfer (read_later)
        self._placed: tuple[EvaluationRecord, float] | None = None  # the last evaluation placed, and when

    # -- places in the schedule ----------------------------------------------------------------------
    def step_of(self, sigma: float) -> int:
        """Index of the schedule step an evaluation at ``sigma`` belongs to (midpoints map down)."""
        step = 0
        for i, s in enumerate(self.sample_sigmas[:-1]):
            if s >= sigma * (1 - 1e-5) - 1e-9:
                step = i
        return step

    def begin_evaluation(self, sigma: float | torch.Tensor) -> Evaluation:
        """A new evaluation at ``sigma``: a number, or the sampler's tensor, then read with the evaluation's first
        transfer (:meth:`transfer`)."""
        index = len(self.records)
        record = EvaluationRecord(index=index, step=0, sigma=math.nan)
        self.records.append(record)
        ev = Evaluation(index, self.total_steps, record, self.schedule_steps)
        if isinstance(sigma, torch.Tensor):
            ev.pending_sigma = sigma.detach().reshape(-1)[:1]
        else:
            self._place(ev, float(sigma))
        self.evaluation = ev
        return ev

    def _place(self, ev: Evaluation, sigma: float) -> None:
        step = self.step_of(sigma)
        ev.place(sigma, step, self.first_step + step)
        self.time_evaluations()
        self._placed = (ev.record, time.perf_counter())

    def time_evaluations(self) -> None:
        """The last evaluation placed took until now (``EvaluationRecord.seconds``): called as the next one is
        placed, and as the run ends."""
        if self._placed is not None:
            record, started = self._placed
            record.seconds = time.perf_counter() - started

    def now(self) -> int:
        """The current evaluation's index; between evaluations, the next one's."""
        return self.evaluation.index if self.evaluation is not None else len(self.records)

    # -- forwards ----------------------------------------------------------------------------------------
    def begin_forward(self, ev: Evaluation, batch: int, row_shape: tuple[int, ...], dtype: torch.dtype,
                      cond_or_uncond: Sequence[int] | None, uuids: Sequence[Hashable] | None,
                      frames: tuple[int, ...] | None = None) -> Forward:
        """A forward of ``batch`` rows in ``ev``, one branch key per conditioning branch (a key counts the
        repeats of its entry within the evaluation)."""
        branches = list(cond_or_uncond) if cond_or_uncond else [None]
        ids = list(uuids) if uuids and len(uuids) == len(branches) else [None] * len(branches)
        cacheable = batch % len(branches) == 0
        keys = []
        for branch, uuid in zip(branches, ids):
            ident = (branch, uuid, tuple(row_shape), str(dtype), frames)
            occurrence = ev.occurrences[ident]
            ev.occurrences[ident] += 1
            keys.append(BranchKey(branch, uuid, occurrence, tuple(row_shape), str(dtype), frames))
        return Forward(ev, keys, batch // len(branches) if cacheable else batch, cacheable)

    @staticmethod
    def count_forward(forward: Forward) -> None:
        """What ``forward`` did, into its evaluation's record."""
        record = forward.evaluation.record
        record.rows_total += forward.batch_rows
        record.blocks_run += forward.blocks_run
        record.blocks_total += forward.blocks_total
        if forward.model_skipped:
            record.forwards_skipped += 1
        else:
            record.forwards_computed += 1
            record.work_done += forward.batch_rows * forward.block_share()
        for key in forward.keys:
            record.branches[key.name] = record.branches.get(key.name, False) or forward.computed
            record.ran[key.branch] = record.ran.get(key.branch, False) or forward.computed

    def left_out(self, branch: int, rows: int) -> None:
        """The guidance level left ``branch``'s conditioning entries, ``rows`` batch rows, out of this evaluation's
        model call: work the plain sampler would have done, and a branch the model did not compute."""
        record = self.evaluation.record
        record.rows_total += rows
        record.ran.setdefault(branch, False)
        record.branches.setdefault(BRANCH_NAMES.get(branch, f"branch{branch}"), False)

    # -- transfers to the host -----------------------------------------------------------------------
    def read_later(self, tensors: list[torch.Tensor], then: Callable[[list[list[float]]], None]) -> None:
        """Read ``tensors`` with the run's next transfer and hand their values (one flat list per tensor) to
        ``then``: what is not needed at once (the NaN watch's flags, a rate for a later decision, a calibration's
        recording) costs no device sync of its own."""
        self.deferred.append((tensors, then))

    def read_place(self) -> Evaluation | None:
        """Make sure the current evaluation knows its sigma, step and position: if the sampler's sigma is still on
        the device, this is the evaluation's transfer (with everything due, whose readers run now, and may raise,
        as the NaN watch does). Engine code calls it where it needs the place before any decision has read it."""
        ev = self.evaluation
        if ev is not None and not ev.placed:
            self.transfer()
        return ev

    def transfer(self, measures: Sequence[Measure] = ()) -> None:
        """Bring to the host, in one transfer (one device sync), the sums of ``measures``, the current
        evaluation's sigma if it is not read yet, and every deferred read (whose ``then`` runs here, in order).
        Nothing due (measures without terms included): no transfer."""
        ev = self.evaluation
        sigma = [ev.pending_sigma] if ev is not None and ev.pending_sigma is not None else []
        deferred, self.deferred = self.deferred, []
        tensors = sigma + [t for pending, _ in deferred for t in pending] + terms_of(measures)
        host = to_host(tensors) if tensors else []
        if sigma:
            ev.pending_sigma = None
            self._place(ev, host[0][0])
        at = len(sigma)
        for pending, then in deferred:
            then(host[at:at + len(pending)])
            at += len(pending)
        deliver(measures, host[at:])

    def release(self) -> None:
        """Drop the pending reads and the current evaluation; ``records`` stay."""
        self.deferred.clear()
        self.evaluation = None
