"""The plain records of one run: whose cache a batch row may read (:class:`BranchKey`), one sampler evaluation
(:class:`Evaluation`) and one batched model call in it (:class:`Forward`), what an evaluation did
(:class:`EvaluationRecord`), and the run's bookkeeping per decider and per branch. Data only: the rules that fill
them live in the run's parts (:mod:`.lifecycle`, :mod:`.decisions`, :mod:`.caches`) and :mod:`.engine`."""
from __future__ import annotations

import dataclasses
import math
from collections import Counter
from typing import Any, Hashable

import torch

from .kinds import BRANCH_NAMES


@dataclasses.dataclass(frozen=True)
class BranchKey:
    """Identifies whose cache a group of batch rows may read.

    ``branch`` is the guider's cond index (0 positive, 1 negative for CFG), ``uuid`` the conditioning
    entry, ``occurrence`` counts repeats of the same entry within one evaluation (context windows,
    Skip Layer Guidance's extra pass), and ``shape``/``dtype`` keep area conds and resized latents
    apart. ``frames`` is the context window's frame indices when ComfyUI's context windows split the latent:
    the uniform schedules move their windows every step and change their number, so what is cached for a
    window belongs to its frames, never to its place in the step.
    """

    branch: int | None
    uuid: Hashable
    occurrence: int
    shape: tuple[int, ...]
    dtype: str
    frames: tuple[int, ...] | None = None

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
    skipped_by: list[str] = dataclasses.field(default_factory=list)  # labels of the deciders whose skip happened
    # wall-clock seconds from this evaluation's placement (its first transfer to the host, where the device has
    # finished everything queued before it) to the next one's: the device time of its model work, and the host's
    seconds: float = 0.0
    branches: dict[str, bool] = dataclasses.field(default_factory=dict)  # branch name -> computed (for reports)
    # branch kind (kinds.POSITIVE, NEGATIVE; None for a model call without CFG branches) -> the model really
    # computed it in this evaluation (False: every one of its forwards was skipped, or it was left out)
    ran: dict[int | None, bool] = dataclasses.field(default_factory=dict)
    # Work by batch rows (a forward of only the positive rows of a CFG step is half of one with both): the rows of
    # every forward the plain sampler runs, and the work the model really did, in rows: each computed forward's
    # rows times the share of its own blocks that ran (a forward without block slots counts whole). Counted per
    # forward because the forwards of one evaluation differ (context windows: a window new to the run runs every
    # block while the others skip theirs, and windows can differ in rows).
    rows_total: int = 0
    work_done: float = 0.0

    @property
    def skipped(self) -> bool:
        return self.forwards_skipped > 0 or (self.blocks_total > 0 and self.blocks_run < self.blocks_total)

    @property
    def decided_by(self) -> str | None:
        """Who skipped work in this evaluation, each decider credited with its own skip ("A and B")."""
        return " and ".join(self.skipped_by) or None


def counted_in(evaluations: int, steps: int) -> str:
    """What a run's evaluations are called to people: "steps" where the sampler evaluates the model once per step,
    else "model evaluations (N steps)" (heun, dpm_2, ... evaluate it twice in most steps). The summary, the tuning
    plot and a plan's text all count in it."""
    return "steps" if evaluations == steps else f"model evaluations ({steps} steps)"


class PlaceNotRead(RuntimeError):
    """An evaluation's sigma (or step) was asked for before the run read it from the device: a bug in the caller,
    which must read it first (``LoopState.read_place``, or a decision, which reads it with its sums)."""


@dataclasses.dataclass
class Evaluation:
    """One sampler evaluation. ``step`` counts this run's steps; ``position`` is the same step in the model's
    whole schedule (they differ when the run is the second stage of a split, or denoise < 1).

    The sampler hands the sigma over as a tensor on the device. Reading it is a device sync, so it waits in
    ``pending_sigma`` until the run's next transfer to the host (``LoopState.transfer``: a decision's sums, an
    explicit ``LoopState.read_place``, or the end of the evaluation), which reads it with everything else due and
    places the evaluation. Reading ``sigma``, ``step`` or ``position`` never transfers anything: before the place
    is read it raises :class:`PlaceNotRead`, so that no property read runs someone else's deferred work."""

    index: int
    total_steps: int
    record: EvaluationRecord
    schedule_steps: int = 0
    decisions: dict[str, bool] = dataclasses.field(default_factory=dict)
    decided_on: dict[str, set] = dataclasses.field(default_factory=dict)  # decider -> the branch keys it measured
    skipped_by: set[str] = dataclasses.field(default_factory=set)  # deciders whose skip really happened
    occurrences: Counter = dataclasses.field(default_factory=Counter)
    from_sampler: bool = False  # begun by the sampler's evaluation hook: ``sigma`` holds for every forward in it
    pending_sigma: torch.Tensor | None = None  # the sampler's sigma, not read yet
    _sigma: float = math.nan
    _step: int = 0
    _position: int = 0

    def place(self, sigma: float, step: int, position: int) -> None:
        self._sigma, self._step, self._position = sigma, step, position
        self.record.sigma, self.record.step = sigma, step

    @property
    def placed(self) -> bool:
        """Whether the sigma has been read (always, for an evaluation begun at a number)."""
        return self.pending_sigma is None

    def _require_place(self, what: str) -> None:
        if self.pending_sigma is not None:
            raise PlaceNotRead(f"evaluation {self.index}'s {what} is still on the device: read it first "
                               f"(LoopState.read_place)")

    @property
    def sigma(self) -> float:
        self._require_place("sigma")
        return self._sigma

    @property
    def step(self) -> int:
        self._require_place("step")
        return self._step

    @property
    def position(self) -> int:
        self._require_place("position")
        return self._position

    @property
    def is_last_step(self) -> bool:
        return self.step >= self.total_steps - 1

    @property
    def progress(self) -> float:
        """Where this evaluation sits in the model's whole schedule, from 0 (first step) towards 1."""
        return self.position / max(self.schedule_steps, 1)


@dataclasses.dataclass
class DecisionRecord:
    """The run's bookkeeping for one decider, counting only skips that really happened (a skip the engine
    could not make, for want of a cache, is a computed evaluation)."""

    last_compute: int | None = None  # index of the last evaluation it computed
    consecutive_skips: int = 0
    skips: int = 0


@dataclasses.dataclass
class BranchCache:
    """One branch's cached values: the estimator's slot per cached quantity (``"output"`` for the whole model,
    ``"<segment>.<stream>"`` for block residuals), and per block segment the streams it stored."""

    slots: dict[str, Any] = dataclasses.field(default_factory=dict)
    segment_streams: dict[int, set[str]] = dataclasses.field(default_factory=dict)


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
        self.features = False            # a whole-model decider's skip is carried out in the blocks (Decider.level)
        self.refresh_back = False        # a skip's middle tier: the back segments run (BlockPlan.back_segments)
        self.forecasts: dict[BranchKey, torch.Tensor] | None = None  # computed forward: what a skip would have used
        self.signals: dict[str, dict[BranchKey, torch.Tensor]] = {}
        self.residuals: dict[str, dict[BranchKey, torch.Tensor]] = {}  # block residuals stored this forward
        self.track_external = False      # the model adds things between blocks (ControlNet, VACE): measure them
        self.scratch: Any = None         # the block engine's working values for this forward (engine.BlockScratch)
        self.blocks_run = 0     # of its blocks that went through the pack's slots: those that ran, and all
        self.blocks_total = 0

    @property
    def batch_rows(self) -> int:
        return self.rows * len(self.keys) if self.cacheable else self.rows

    def block_share(self) -> float:
        """The share of its blocks this forward ran (1 where none went through the block slots)."""
        return self.blocks_run / self.blocks_total if self.blocks_total else 1.0

    def split(self, tensor: torch.Tensor) -> dict[BranchKey, torch.Tensor] | None:
        """Rows of ``tensor`` per branch key, or None if its batch does not match this forward."""
        if tensor is None or tensor.shape[0] != self.rows * len(self.keys):
            return None
        return {k: tensor[i * self.rows:(i + 1) * self.rows] for i, k in enumerate(self.keys)}

    def join(self, parts: dict[BranchKey, torch.Tensor]) -> torch.Tensor:
        tensors = [parts[k] for k in self.keys]
        return tensors[0] if len(tensors) == 1 else torch.cat(tensors)
