"""Per-run state: created fresh by every sampling run, dropped when it ends.

Nothing here is ever stored in a module global, on a config node's output or on the shared model
object. A :class:`LoopState` belongs to exactly one sampling run (one ``CFGGuider.sample`` call); an
:class:`Evaluation` to one sampler model evaluation (all CFG branches of one step, or of one
sub-step of a second-order sampler); a :class:`Forward` to one batched model forward inside it.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from collections import Counter, defaultdict
from typing import Any, Callable, Hashable, Sequence

import torch

from .base import Decider, Granularity
from .chain import InterceptorChain

BRANCH_NAMES = {0: "cond", 1: "uncond"}
log = logging.getLogger("cached_sampler")


@dataclasses.dataclass(frozen=True)
class BranchKey:
    """Identifies whose cache a group of batch rows may read.

    ``branch`` is the guider's cond index (0 positive, 1 negative for CFG), ``uuid`` the conditioning
    entry, ``occurrence`` counts repeats of the same entry within one evaluation (context windows,
    Skip Layer Guidance's extra pass), and ``shape``/``dtype`` keep area conds and resized latents
    apart.
    """

    branch: int | None
    uuid: Hashable
    occurrence: int
    shape: tuple[int, ...]
    dtype: str
    window: Hashable = None

    @property
    def name(self) -> str:
        base = BRANCH_NAMES.get(self.branch, f"branch{self.branch}") if self.branch is not None else "model"
        return base if self.occurrence == 0 else f"{base}#{self.occurrence}"


@dataclasses.dataclass
class EvaluationRecord:
    """What one evaluation did; the profiler's row, and the data behind the stats and the plot."""

    index: int
    step: int
    sigma: float
    forwards_computed: int = 0
    forwards_skipped: int = 0
    blocks_run: int = 0
    blocks_total: int = 0
    metric: float | None = None
    threshold: float | None = None
    decided_by: str | None = None
    seconds: float = 0.0
    branches: dict[str, bool] = dataclasses.field(default_factory=dict)  # branch name -> computed

    @property
    def skipped(self) -> bool:
        return self.forwards_skipped > 0 or (self.blocks_total > 0 and self.blocks_run < self.blocks_total)


@dataclasses.dataclass
class Evaluation:
    index: int
    sigma: float
    step: int
    total_steps: int
    record: EvaluationRecord
    decisions: dict[str, bool] = dataclasses.field(default_factory=dict)
    occurrences: Counter = dataclasses.field(default_factory=Counter)

    @property
    def is_last_step(self) -> bool:
        return self.step >= self.total_steps - 1

    @property
    def progress(self) -> float:
        return self.step / max(self.total_steps, 1)


class Forward:
    """One batched model call: which branch owns which rows, and the block bookkeeping for it."""

    def __init__(self, evaluation: Evaluation, keys: list[BranchKey], rows: int, cacheable: bool = True):
        self.evaluation = evaluation
        self.keys = keys
        self.rows = rows
        self.cacheable = cacheable
        self.computed = True             # False when any of its model work was skipped
        self.model_skipped = False       # the whole forward was replaced (whole-model level)
        self.skip_blocks: bool | None = None  # None until the block-level decision is made
        self.segment_inputs: dict[int, dict[str, torch.Tensor]] = {}
        self.probe_input: torch.Tensor | None = None
        self.signals: dict[str, dict[BranchKey, torch.Tensor]] = {}
        self.residuals: dict[str, dict[BranchKey, torch.Tensor]] = {}  # block residuals stored this forward
        self.track_external = False      # the model adds things between blocks (ControlNet, VACE): measure them
        self.previous_outputs: dict[int, dict[str, torch.Tensor]] = {}
        self.external: dict[int, dict[str, torch.Tensor]] = {}

    def split(self, tensor: torch.Tensor) -> dict[BranchKey, torch.Tensor] | None:
        """Rows of ``tensor`` per branch key, or None if its batch does not match this forward."""
        if tensor is None or tensor.shape[0] != self.rows * len(self.keys):
            return None
        return {k: tensor[i * self.rows:(i + 1) * self.rows] for i, k in enumerate(self.keys)}

    def join(self, parts: dict[BranchKey, torch.Tensor]) -> torch.Tensor:
        tensors = [parts[k] for k in self.keys]
        return tensors[0] if len(tensors) == 1 else torch.cat(tensors)


class LoopState:
    """Everything one sampling run learns: step position, decisions, caches and the profile.

    ``plugin_state[interceptor_id][branch_key]`` holds per-branch state (dicts), ``shared[interceptor_id]``
    run-level state. ``percent_to_sigma`` maps a schedule percent to the model's sigma (ComfyUI's
    convention for start/end percents); without it, percents are fractions of the steps.
    """

    def __init__(self, chain: InterceptorChain, sample_sigmas: Sequence[float],
                 percent_to_sigma: Callable[[float], float] | None = None,
                 cache_device: torch.device | str | None = None, observers: Sequence[Any] = ()):
        self.chain = chain
        self.estimator = chain.estimator
        # looked up once: the engine asks for them on every forward and every block
        self.model_decider = chain.decider(Granularity.MODEL)
        self.block_decider = chain.decider(Granularity.BLOCKS)
        self.sample_sigmas = [float(s) for s in sample_sigmas]
        self.total_steps = max(len(self.sample_sigmas) - 1, 0)
        self.percent_to_sigma = percent_to_sigma
        self.cache_device = torch.device(cache_device) if cache_device is not None else None
        self.observers = list(observers)
        self.plugin_state: dict[str, dict[Any, dict]] = defaultdict(lambda: defaultdict(dict))
        self.run_states: dict[str, Any] = {}
        self.branch_states: dict[str, dict[BranchKey, Any]] = {}
        self.shared: dict[str, dict] = defaultdict(dict)
        self.records: list[EvaluationRecord] = []
        self.notes: list[str] = []  # what the run switched off or could not do, said once each
        self.evaluation: Evaluation | None = None
        self.current_forward: Forward | None = None
        self.card = None
        self.cache_bytes: dict[str, int] = {}       # device -> bytes of tensors the run holds now
        self.cache_peak_bytes: dict[str, int] = {}  # the same when the run held the most
        self._windows = {d.id: self._window(d) for d in chain.deciders}

    # -- schedule ---------------------------------------------------------------------------------
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

    def step_of(self, sigma: float) -> int:
        """Index of the schedule step an evaluation at ``sigma`` belongs to (midpoints map down)."""
        step = 0
        for i, s in enumerate(self.sample_sigmas[:-1]):
            if s >= sigma * (1 - 1e-5) - 1e-9:
                step = i
        return step

    # -- evaluations and forwards ----------------------------------------------------------------
    def begin_evaluation(self, sigma: float) -> Evaluation:
        index = len(self.records)
        step = self.step_of(sigma)
        record = EvaluationRecord(index=index, step=step, sigma=sigma)
        self.records.append(record)
        self.evaluation = Evaluation(index, sigma, step, self.total_steps, record)
        return self.evaluation

    def end_evaluation(self) -> None:
        ev = self.evaluation
        if ev is not None:
            self.measure_cache()
            for obs in self.observers:
                obs.on_evaluation_end(self, ev)
        self.evaluation = None

    def ensure_evaluation(self, sigma: float) -> Evaluation:
        """Forwards outside a sampler evaluation (a custom sampler calling the model directly)."""
        ev = self.evaluation
        if ev is None or not math.isclose(ev.sigma, sigma, rel_tol=1e-6, abs_tol=1e-9):
            self.end_evaluation()
            ev = self.begin_evaluation(sigma)
        return ev

    def begin_forward(self, sigma: float, batch: int, row_shape: tuple[int, ...], dtype: torch.dtype,
                      cond_or_uncond: Sequence[int] | None, uuids: Sequence[Hashable] | None,
                      window: Hashable = None) -> Forward:
        ev = self.ensure_evaluation(sigma)
        branches = list(cond_or_uncond) if cond_or_uncond else [None]
        ids = list(uuids) if uuids and len(uuids) == len(branches) else [None] * len(branches)
        cacheable = batch % len(branches) == 0
        keys = []
        for branch, uuid in zip(branches, ids):
            ident = (branch, uuid, tuple(row_shape), str(dtype), window)
            occurrence = ev.occurrences[ident]
            ev.occurrences[ident] += 1
            keys.append(BranchKey(branch, uuid, occurrence, tuple(row_shape), str(dtype), window))
        self.current_forward = Forward(ev, keys, batch // len(branches) if cacheable else batch, cacheable)
        return self.current_forward

    def end_forward(self, forward: Forward, output: torch.Tensor | None) -> None:
        record = forward.evaluation.record
        if forward.model_skipped:
            record.forwards_skipped += 1
        else:
            record.forwards_computed += 1
        for key in forward.keys:
            record.branches[key.name] = record.branches.get(key.name, False) or forward.computed
        if output is not None:
            for obs in self.observers:
                obs.on_forward(self, forward, output)
        self.current_forward = None

    # -- decisions --------------------------------------------------------------------------------
    def decide(self, decider: Decider, signals: dict[BranchKey, torch.Tensor] | None) -> bool:
        """The evaluation's decision for ``decider`` (True = compute), made once and shared by every
        forward of the evaluation, so every CFG branch follows the same schedule."""
        ev = self.evaluation
        if decider.id in ev.decisions:
            return ev.decisions[decider.id]
        forced = ev.index == 0 or ev.is_last_step or not self.in_window(decider, ev)
        compute = True if forced else bool(decider.decide(self, ev, signals))
        ev.decisions[decider.id] = compute
        if compute:
            self.shared[decider.id]["last_compute"] = ev.index
            self.shared[decider.id]["last_compute_sigma"] = ev.sigma
            self.shared[decider.id]["consecutive_skips"] = 0
        else:
            self.shared[decider.id]["consecutive_skips"] = self.shared[decider.id].get("consecutive_skips", 0) + 1
            self.shared[decider.id]["skips"] = self.shared[decider.id].get("skips", 0) + 1
            ev.record.decided_by = decider.label
        return compute

    def evaluations_since_compute(self, decider: Decider) -> int:
        last = self.shared[decider.id].get("last_compute")
        return self.evaluation.index - last - 1 if last is not None else 0

    def report_metric(self, decider: Decider, value: float, threshold: float) -> None:
        """Record the change metric a decider compared against its threshold (shown in stats and plot)."""
        record = self.evaluation.record
        record.metric, record.threshold = float(value), float(threshold)

    def note(self, message: str) -> None:
        """Say once per run that caching was switched off or limited somewhere: one log line, and a line in the
        run's summary on the node. Never silent, never repeated every step."""
        if message not in self.notes:
            self.notes.append(message)
            log.warning("Cached Sampler: %s", message)

    # -- typed interceptor state ---------------------------------------------------------------------
    def state_of(self, interceptor) -> Any:
        """``interceptor``'s run state: an instance of its ``RunState`` dataclass, made on first use."""
        state = self.run_states.get(interceptor.id)
        if state is None:
            state = self.run_states[interceptor.id] = _new_state(interceptor, "RunState")
        return state

    def branch_of(self, interceptor, key: BranchKey) -> Any:
        """``interceptor``'s state for one branch: an instance of its ``BranchState``, made on first use."""
        states = self.branch_states.setdefault(interceptor.id, {})
        state = states.get(key)
        if state is None:
            state = states[key] = _new_state(interceptor, "BranchState")
        return state

    # -- caches -----------------------------------------------------------------------------------
    def branch_state(self, interceptor_id: str, key: BranchKey) -> dict:
        return self.plugin_state[interceptor_id][key]

    def store(self, key: BranchKey, name: str, value: torch.Tensor, sigma: float) -> None:
        """Hand a freshly computed value to the estimator. Always a tensor the model no longer touches."""
        if self.cache_device is not None and value.device != self.cache_device:
            # A blocking copy: a non-blocking one into pageable host memory may still be in flight when the
            # value is read back, and the reader would see garbage.
            value = value.to(self.cache_device)
        slots = self.branch_state(self.estimator.id, key)
        self.estimator.observe(slots.setdefault(name, {}), value, sigma)

    def has(self, key: BranchKey, name: str) -> bool:
        slot = self.plugin_state[self.estimator.id].get(key, {}).get(name)
        return slot is not None and self.estimator.ready(slot)

    def measure_cache(self) -> None:
        """Count the bytes of every tensor the run keeps between evaluations (estimator slots, decider anchors,
        recordings), per device, and keep the peak. Views of one tensor count once, with their whole storage:
        that is what stays allocated."""
        held = held_bytes((self.plugin_state, self.run_states, self.branch_states, self.shared))
        self.cache_bytes = held
        if sum(held.values()) > sum(self.cache_peak_bytes.values()):
            self.cache_peak_bytes = held

    def release_caches(self) -> None:
        """Drop the per-branch caches once the run is over. A run's state can outlive its run (a report that
        plots it, an exception's traceback); its cached tensors need not. ``records`` and ``shared`` (run-level
        results such as a calibration's recordings) stay."""
        self.plugin_state.clear()
        self.evaluation = None
        self.current_forward = None

    def estimate(self, key: BranchKey, name: str, sigma: float, like: torch.Tensor) -> torch.Tensor:
        value = self.estimator.estimate(self.plugin_state[self.estimator.id][key][name], sigma)
        return value.to(device=like.device, dtype=like.dtype)


def held_bytes(root) -> dict[str, int]:
    """Bytes of the distinct tensor storages reachable from ``root`` through dicts, lists, tuples and
    dataclasses, per device (``{"cuda:0": 123}``). Reads only metadata: no device work, no host sync; about
    0.1 ms of CPU per evaluation for a TaylorSeer order 2 block cache."""
    storages, visited, per_device, stack = set(), set(), {}, [root]
    while stack:
        obj = stack.pop()
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            ident = (storage.data_ptr(), obj.device)
            if ident not in storages:
                storages.add(ident)
                per_device[obj.device] = per_device.get(obj.device, 0) + storage.nbytes()
        elif isinstance(obj, _SCALARS) or id(obj) in visited:
            continue
        elif isinstance(obj, dict):
            visited.add(id(obj))
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            visited.add(id(obj))
            stack.extend(obj)
        elif hasattr(type(obj), "__dataclass_fields__"):
            visited.add(id(obj))
            stack.extend(getattr(obj, name, None) for name in type(obj).__dataclass_fields__)
    return {str(device): n for device, n in per_device.items()}


_SCALARS = (str, int, float, bool, type(None))


def _new_state(interceptor, kind: str):
    factory = getattr(interceptor, kind, None)
    if factory is None:
        raise TypeError(f"{type(interceptor).__name__} keeps run state but declares no {kind} dataclass.")
    return factory()
