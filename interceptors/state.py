"""Per-run state: created fresh by every sampling run, dropped when it ends.

Nothing here is ever stored in a module global, on a config node's output or on the shared model
object. A :class:`LoopState` belongs to exactly one sampling run (one ``CFGGuider.sample`` call); an
:class:`Evaluation` to one sampler model evaluation (all CFG branches of one step, or of one
sub-step of a second-order sampler); a :class:`Forward` to one batched model forward inside it.
"""
from __future__ import annotations

import logging
import math
import threading
from typing import Any, Callable, Hashable, Sequence

import torch

from .base import Decider
from .caches import Caches
from .chain import InterceptorChain
from .decisions import Decisions
from .kinds import Granularity, Signal
from .lifecycle import Lifecycle
from .metrics import Measure
from .records import BranchKey, DecisionRecord, Evaluation, EvaluationRecord, Forward
from .threads import DeviceThreads

log = logging.getLogger("cached_sampler")


class LoopState:
    """Everything one sampling run learns, in three parts: where it is (``lifecycle``: evaluations, forwards,
    places, transfers), how it decides (``decisions``: decide, forced, counts) and what it keeps (``caches``:
    store, estimate, forget, bytes). It implements :class:`~.run.Run`, the part methods may use, by handing each
    call to its part; the rest is the engine's and the adapter's.

    ``card`` is the model the run samples (given when the run is made). ``percent_to_sigma`` maps a schedule
    percent to the model's sigma (:class:`~.decisions.Decisions`); ``first_step`` and ``schedule_steps`` place
    this run's steps in the model's whole schedule (:class:`~.lifecycle.Lifecycle`); ``cache_device`` is where
    every tensor kept across evaluations lives (:class:`~.caches.Caches`). ``group`` (a
    :class:`~.distributed.RankGroup`, None in one process) is set when ranks share the sequence: metrics are
    reduced over it and every decision is agreed by all of its ranks.
    """

    def __init__(self, chain: InterceptorChain, sample_sigmas: Sequence[float],
                 percent_to_sigma: Callable[[float], float] | None = None,
                 cache_device: torch.device | str | None = None, observers: Sequence[Any] = (),
                 first_step: int = 0, schedule_steps: int | None = None, group=None, sampler: str = "",
                 cfg: float | None = None, card=None):
        self.chain = chain
        self.card = card        # the model's card (cards.ModelCard), where the run was made for a known model
        self.sampler = sampler  # what integrates the run (sampler function and its options), for plans made on it
        self.cfg = cfg          # the guider's cfg, when it has one
        self.estimator = chain.estimator
        self.sample_sigmas = [float(s) for s in sample_sigmas]
        self.total_steps = max(len(self.sample_sigmas) - 1, 0)
        self.observers = list(observers)
        self.group = group
        self.notes: list[str] = []  # what the run switched off or could not do, said once each
        self.off = False  # caching switched off for the whole run (switch_off): every forward computed in full
        self._off_lock = threading.Lock()
        # Several threads may run forwards of one evaluation at once (ComfyUI's native multi-GPU path: one per
        # device): each has its own current forward, and what they share changes under this lock.
        self._lock = threading.RLock()
        self._thread = threading.local()
        # Set for runs whose forwards run on several devices' threads at once, which share each decision: the
        # schedule's are made before the forwards (decide_ahead), the measured ones by the threads together
        # (``threads``, a :class:`~.threads.DeviceThreads`, where the chain has such a decider).
        self.decided_ahead = False
        self.threads: DeviceThreads | None = None
        # The block stack's plan (engine.BlockPlan, one segment per block group) where the adapter installed block
        # slots for a whole-model decider at the feature level (Decider.level); None: that decider works on the
        # model output, as at its default level.
        self.feature_plan = None
        self.lifecycle = Lifecycle(self.sample_sigmas, first_step, schedule_steps)
        self.decisions = Decisions(chain, percent_to_sigma, group)
        self.caches = Caches(self.estimator, self.sample_sigmas, cache_device)

    # -- what the engine and the reports read of the parts ------------------------------------------------
    @property
    def evaluation(self) -> Evaluation | None:
        return self.lifecycle.evaluation

    @evaluation.setter
    def evaluation(self, ev: Evaluation | None) -> None:
        self.lifecycle.evaluation = ev

    @property
    def current_forward(self) -> Forward | None:
        """The forward this thread is running (each device's thread has its own)."""
        return getattr(self._thread, "current", None)

    @property
    def records(self) -> list[EvaluationRecord]:
        return self.lifecycle.records

    @property
    def guidance_decider(self) -> Decider | None:
        return self.decisions.guidance_decider

    @property
    def model_decider(self) -> Decider | None:
        return self.decisions.model_decider

    @property
    def block_decider(self) -> Decider | None:
        return self.decisions.block_decider

    @property
    def cache_bytes(self) -> dict[str, int]:
        return self.caches.bytes

    @property
    def cache_peak_bytes(self) -> dict[str, int]:
        return self.caches.peak_bytes

    # -- evaluations and forwards ----------------------------------------------------------------
    def step_of(self, sigma: float) -> int:
        return self.lifecycle.step_of(sigma)

    def in_window(self, decider: Decider, ev: Evaluation) -> bool:
        return self.decisions.in_window(decider, ev)

    def begin_evaluation(self, sigma: float | torch.Tensor) -> Evaluation:
        return self.lifecycle.begin_evaluation(sigma)

    def time_evaluations(self) -> None:
        self.lifecycle.time_evaluations()

    def end_evaluation(self) -> None:
        """End the current evaluation: read its place if nothing did (an evaluation that needed nothing from the
        host still records where it was), count its decisions, drop the windows gone, measure the caches and tell
        the observers."""
        ev = self.evaluation
        if ev is not None:
            self.read_place()
            self.decisions.count(ev)
            self.caches.forget_windows(ev.index)
            self.caches.measure()
            for obs in self.observers:
                obs.on_evaluation_end(self, ev)
        self.evaluation = None

    def ensure_evaluation(self, sigma: float | None) -> Evaluation:
        """The evaluation a forward at ``sigma`` belongs to. None: the sampler's current one (its hook began it).
        A number: forwards outside a sampler evaluation (a custom sampler calling the model directly)."""
        ev = self.evaluation
        if sigma is None:
            return ev
        self.read_place()
        if ev is None or not math.isclose(ev.sigma, sigma, rel_tol=1e-6, abs_tol=1e-9):
            self.end_evaluation()
            ev = self.begin_evaluation(sigma)
        return ev

    def begin_forward(self, sigma: float | None, batch: int, row_shape: tuple[int, ...], dtype: torch.dtype,
                      cond_or_uncond: Sequence[int] | None, uuids: Sequence[Hashable] | None,
                      frames: tuple[int, ...] | None = None) -> Forward:
        """A forward of ``batch`` rows, one group per conditioning branch; ``frames``: the context window's
        frame indices, when the forward covers one."""
        with self._lock:
            ev = self.ensure_evaluation(sigma)
            forward = self.lifecycle.begin_forward(ev, batch, row_shape, dtype, cond_or_uncond, uuids, frames)
            if not forward.cacheable:
                self.note(f"a batch of {batch} rows could not be split into its {len(forward.keys)} conditioning "
                          f"branches, so such forwards were computed in full, never cached")
            if frames is not None:
                for key in forward.keys:
                    self.caches.window_used(key, ev.index)
        self._thread.current = forward
        return forward

    def end_forward(self, forward: Forward, output: torch.Tensor | None) -> None:
        with self._lock:
            self.lifecycle.count_forward(forward)
        if output is not None:
            for obs in self.observers:
                obs.on_forward(self, forward, output)
        self._thread.current = None

    # -- transfers to the host -----------------------------------------------------------------------
    def read_later(self, tensors: list[torch.Tensor], then: Callable[[list[list[float]]], None]) -> None:
        with self._lock:
            self.lifecycle.read_later(tensors, then)

    def read_place(self) -> Evaluation | None:
        return self.lifecycle.read_place()

    def transfer(self, measures: Sequence[Measure] = ()) -> None:
        with self._lock:
            self.lifecycle.transfer(measures)

    # -- decisions --------------------------------------------------------------------------------
    def decide(self, decider: Decider, signals: dict[BranchKey, torch.Tensor] | None) -> bool:
        """The evaluation's decision for ``decider`` (True = compute), made once and shared by every
        forward of the evaluation, so every CFG branch follows the same schedule. The decider's measures, the
        sigma and whatever else is due come over in one transfer. A decision to skip is only a wish: the engine
        skips where the cache allows and reports it with :meth:`skipped`."""
        with self._lock:
            if self.threads is not None and decider.signal not in (Signal.NONE, Signal.GUIDANCE):
                return self.threads.decide(self, decider, signals)
            return self.decisions.decide(self, decider, signals)

    def computed(self, decider: Decider, forward: Forward, signals: dict[BranchKey, torch.Tensor] | None,
                 outputs: dict[BranchKey, torch.Tensor] | None = None) -> None:
        """Tell ``decider`` that ``forward`` was computed (``Decider.computed``), under the lock: the devices'
        threads of native multi-GPU finish the forwards of one evaluation at once, and what the decider keeps
        for the whole run they share."""
        with self._lock:
            decider.computed(self, forward.evaluation, forward, signals, outputs)

    def gather_device_threads(self) -> None:
        """The forwards of each evaluation run on several devices' threads at once: measured decisions are taken
        by them together (:class:`~.threads.DeviceThreads`), told how many there are (``threads.expect``)."""
        self.threads = DeviceThreads(self._lock)

    def decide_ahead(self) -> None:
        """Make the evaluation's decisions now, before its forwards, for deciders that decide from the schedule
        alone (``Signal.NONE``): the forwards that several devices' threads run at once then share them, as the
        branches of one batched forward do."""
        self.read_place()
        for decider in (self.model_decider, self.block_decider):
            if decider is not None and decider.signal == Signal.NONE:
                self.decide(decider, None)

    def forced(self, decider: Decider, ev: Evaluation) -> bool:
        return self.decisions.forced(decider, ev)

    def model_will_run(self) -> bool:
        return self.decisions.model_will_run(self)

    def skipped(self, decider: Decider) -> None:
        with self._lock:
            self.decisions.skipped(decider, self.evaluation)

    def left_out(self, branch: int, rows: int) -> None:
        self.lifecycle.left_out(branch, rows)

    def decisions_of(self, decider: Decider) -> DecisionRecord:
        return self.decisions.of(decider)

    def evaluations_since_compute(self, decider: Decider) -> int:
        return self.decisions.since_compute(decider, self.evaluation)

    def report_metric(self, decider: Decider, value: float, threshold: float) -> None:
        self.decisions.report_metric(decider, self.evaluation, value, threshold)

    def note(self, message: str) -> None:
        """Say once per run that caching was switched off or limited somewhere: one log line, and a line in the
        run's summary on the node. Never silent, never repeated every step."""
        if message not in self.notes:
            self.notes.append(message)
            log.warning("Cached Sampler: %s", message)

    def switch_off_level(self, level: Granularity, message: str) -> None:
        """Leave ``level``'s decider out of this run (the others keep working) and say why, once: a guider whose
        conds the guidance level cannot tell apart. The engine then hands that level's work to the model."""
        if self.decisions.switch_off_level(level):
            self.note(message)

    def switch_off(self, message: str) -> None:
        """Switch caching off for the rest of the run and say why, once (``message`` goes to the notes). From then
        on the adapter hands every forward, block and conds list straight to the model and keeps nothing of them.
        Safe to call from several threads at once: one of them notes it, every one of them sees ``off``."""
        with self._off_lock:
            if not self.off:
                self.note(message)
                self.off = True

    # -- what the run keeps ---------------------------------------------------------------------------
    def state_of(self, interceptor) -> Any:
        return self.caches.state_of(interceptor)

    def branch_of(self, interceptor, key: BranchKey) -> Any:
        return self.caches.branch_of(interceptor, key, self.lifecycle.now())

    def forget_branches(self, interceptor, unused_since: int) -> int:
        return self.caches.forget_branches(interceptor, unused_since)

    def keep(self, parts: dict | None, copy: bool = True) -> dict:
        return self.caches.keep(parts, copy)

    def to_cache(self, value: torch.Tensor) -> torch.Tensor:
        return self.caches.to_cache(value)

    def store(self, key: BranchKey, name: str, value: torch.Tensor, sigma: float) -> None:
        self.caches.store(key, name, value, sigma)

    def slot(self, key: BranchKey, name: str):
        return self.caches.slot(key, name)

    def has(self, key: BranchKey, name: str) -> bool:
        return self.caches.has(key, name)

    def estimate(self, key: BranchKey, name: str, sigma: float, like: torch.Tensor) -> torch.Tensor:
        return self.caches.estimate(key, name, sigma, like)

    def release_caches(self) -> None:
        """Drop everything the run kept of its tensors once it is over: estimator slots, block residuals and every
        interceptor's state. A run's state can outlive its run (a report that plots it, an exception's
        traceback); its tensors need not. ``records`` and ``notes`` stay, and so does the run state of recording
        deciders (``keeps_results``), whose recordings are the run's result."""
        self.caches.release(self.chain)
        self.lifecycle.release()


def schedule_of(steps: int, denoise: float = 1.0, start_step: int = 0) -> tuple[int, int]:
    """(first step, steps in the whole schedule) of a KSampler run, as ComfyUI's ``KSampler.set_steps`` and
    ``sample`` slice the schedule: denoise < 1 samples the last ``steps`` of ``int(steps / denoise)``, and
    KSampler (Advanced) starts at ``start_step`` of ``steps``."""
    if denoise is not None and 0.0 < denoise <= 0.9999:
        total = int(steps / denoise)
        return total - steps, total
    return min(start_step, steps), steps
