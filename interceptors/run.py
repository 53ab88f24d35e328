"""What a caching method may use of the run it works in: the contract between the methods and the run.

:class:`Run` is a Protocol, the narrow view of :class:`~.state.LoopState` that deciders, estimators and observers
are typed against. The run has more (the engine's forward and block bookkeeping, the caches, the transfer
machinery); a method that needs something not listed here is reaching into the run's workings, and the member
belongs here first, with its reason. Reading an evaluation's sigma, step or position never transfers anything
(:class:`~.records.Evaluation`): the run has read them before it asks a method to decide.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol

import torch

from .records import BranchKey, DecisionRecord

if TYPE_CHECKING:  # pragma: no cover
    from .cards import ModelCard
    from .distributed import RankGroup


class Run(Protocol):
    # -- what the run samples -----------------------------------------------------------------------
    card: "ModelCard | None"        # the model it samples (family, blocks, distillation, published curves)
    cfg: float | None               # the guider's cfg, when it has one
    sampler: str                    # what integrates the run (sampler function and options), for plans made on it
    sample_sigmas: list[float]      # this run's schedule, first to last (one more than its steps)
    total_steps: int
    group: "RankGroup | None"       # ranks sharing the sequence: measures are reduced over it (metrics.*_of)

    # -- a method's own typed state (fresh per run, per branch; dropped with the run) ---------------------
    def state_of(self, interceptor) -> Any:
        """The interceptor's ``RunState`` for this run, made on first use."""

    def branch_of(self, interceptor, key: BranchKey) -> Any:
        """The interceptor's ``BranchState`` for one branch, made on first use."""

    def forget_branches(self, interceptor, unused_since: int) -> int:
        """Drop the interceptor's branch states unused since evaluation ``unused_since``; the number dropped."""

    def keep(self, parts: dict | None, copy: bool = True) -> dict:
        """Branch tensors kept across evaluations, detached, on the run's cache device."""

    def to_cache(self, value: torch.Tensor) -> torch.Tensor:
        """``value`` where the run keeps cached tensors."""

    # -- the chain's estimator and its slots (a decider that checks forecasts keeps one of its own) --------
    estimator: Any                  # the chain's Estimator (base.py): ReuseLast when the chain names none

    def store(self, key: BranchKey, name: str, value: torch.Tensor, sigma: float) -> None:
        """Hand a computed value of one branch's quantity ``name`` to the estimator (a new slot on first use)."""

    def slot(self, key: BranchKey, name: str) -> Any:
        """The estimator's slot of that quantity, or None before its first value."""

    # -- host reads, at no sync of their own --------------------------------------------------------------
    def read_later(self, tensors: list[torch.Tensor], then: Callable[[list[list[float]]], None]) -> None:
        """Read ``tensors`` with the run's next transfer and hand their values to ``then``."""

    # -- decisions and what the node shows --------------------------------------------------------------
    def decisions_of(self, decider) -> DecisionRecord:
        """The run's bookkeeping for ``decider``: skips that really happened, its last computed evaluation."""

    def evaluations_since_compute(self, decider) -> int:
        """Evaluations since ``decider`` last computed (0 before its first)."""

    def report_metric(self, decider, value: float, threshold: float) -> None:
        """The change metric ``decider`` compared against its threshold in this evaluation (stats and plot)."""

    def note(self, message: str) -> None:
        """Say once per run, on the node and in the log, that caching was switched off or limited somewhere."""

