"""One decision per evaluation across the ranks that sample one prompt together (sequence parallelism).

Under sequence parallelism (xDiT USP as Raylight runs it: tokens padded to a multiple of the ranks and
split between them, attention exchanging them by all-to-all) every rank's blocks see only its shard of
the tokens. A change metric measured on a shard differs from rank to rank, and ranks that decide
differently run different block stacks, whose collectives then hang or pair up wrongly. So, when a run
has a :class:`RankGroup`:

* every change metric is reduced exactly: the sums behind it (numerator and denominator) are summed over
  the group, padding tokens excluded, before the ratio is taken; all ranks get the same value;
* every decision is agreed (compute if any rank must compute), on every evaluation, forced ones included,
  so every rank issues the same collectives in the same order.

A replicated tensor (the latent at the whole-model level, a timestep embedding) reduces to the same ratio
it had, since both sums grow by the same factor. Caches stay per rank: the residual of a shard is the
shard of the residual. Plain torch.distributed; a run without a group (one process) issues nothing.

A rank that fails mid-run (an error in its model, an out-of-memory) never reaches the next agreement, and the
others would wait there as long as the process group lets them (half an hour under gloo by default). So every
agreement waits at most ``timeout_s`` (:data:`TIMEOUT_ENV` in the environment, else
:data:`DEFAULT_TIMEOUT_S`) and then fails with :class:`AgreementError`, which says what probably happened. The
wait is ``Work.wait(timeout)`` on an asynchronous all_reduce: torch 2.11's gloo raises when it runs out, and its
NCCL blocks the waiting thread until the reduction is done or the time is up, then raises.
"""
from __future__ import annotations

import math
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

# The longest one rank waits for the others at an agreement. Ranks that share a sequence run in step (their
# attention exchanges tokens in every block), so what one waits there is how far the others lag behind it: a
# slow step on every rank costs nothing of it; a run's first agreement also waits for the slowest rank to load
# the model. Generous: a rank that lags this far behind has failed.
DEFAULT_TIMEOUT_S = 600.0
TIMEOUT_ENV = "CACHED_SAMPLER_AGREEMENT_TIMEOUT"


class AgreementError(RuntimeError):
    """The ranks of a group did not reach an agreement: another rank probably failed."""


def agreement_timeout(timeout_s: float | None = None) -> float:
    """Seconds an agreement waits: ``timeout_s``, else :data:`TIMEOUT_ENV` from the environment, else
    :data:`DEFAULT_TIMEOUT_S`."""
    if timeout_s is None:
        text = os.environ.get(TIMEOUT_ENV, "").strip()
        if not text:
            return DEFAULT_TIMEOUT_S
        try:
            timeout_s = float(text)
        except ValueError:
            raise ValueError(f"{TIMEOUT_ENV} must be a number of seconds, got {text!r}.") from None
    if not (timeout_s > 0 and math.isfinite(timeout_s)):
        raise ValueError(f"The agreement timeout ({TIMEOUT_ENV}) must be a positive number of seconds, "
                         f"got {timeout_s!r}.")
    return float(timeout_s)


def collective_device(backend: str) -> torch.device:
    """Where a group's collectives take their tensors: NCCL (every multi-GPU run, Raylight's included) reduces
    CUDA tensors only, on the process's current device; gloo, or a group that also has a CPU backend
    (``"cpu:gloo,cuda:nccl"``), reduces them on the CPU, where the values already are."""
    return torch.device("cuda") if str(backend).lower() == "nccl" else torch.device("cpu")


class RankGroup:
    """The ranks whose blocks share one sequence (a torch.distributed process group) for one run.

    ``padding`` is the number of padding tokens at the end of this rank's shard in the current forward
    (``shard_tokens`` long), set by :meth:`observe_shard`; tensors shaped ``[rows, shard_tokens, ...]`` are
    trimmed of them before they are summed. ``timeout_s``: how long an agreement waits for the other ranks
    (:func:`agreement_timeout`).
    """

    def __init__(self, group=None, timeout_s: float | None = None):
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.device = collective_device(dist.get_backend(group))
        self.timeout_s = agreement_timeout(timeout_s)
        self.shard_tokens = 0
        self.padding = 0

    def observe_shard(self, shard_tokens: int, grid_sizes=None) -> None:
        """The token count of this rank's shard, and of the whole sequence when the model says it
        (``grid_sizes``: tokens per axis, as Raylight's Wan forward records them): what is padding here."""
        self.shard_tokens = shard_tokens
        total = math.prod(int(n) for n in grid_sizes) if grid_sizes else None
        if total is None or total <= shard_tokens:  # unknown, or not sharded at all
            self.padding = 0
            return
        self.padding = min(max((self.rank + 1) * shard_tokens - total, 0), shard_tokens)

    def local(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` without this rank's padding tokens (unchanged when it is not a token shard)."""
        if self.padding and tensor.ndim >= 3 and tensor.shape[1] == self.shard_tokens:
            return tensor[:, :self.shard_tokens - self.padding]
        return tensor

    def sum(self, values: list[float]) -> list[float]:
        """Elementwise sums of ``values`` over the group; every rank gets the same numbers."""
        buffer = torch.tensor(values, dtype=torch.float64, device=self.device)
        self._all_reduce(buffer, dist.ReduceOp.SUM, "a change metric's sums")
        return buffer.tolist()

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is True on any rank."""
        buffer = torch.tensor([1 if flag else 0], dtype=torch.int32, device=self.device)
        self._all_reduce(buffer, dist.ReduceOp.MAX, "a decision")
        return bool(buffer.item())

    def _all_reduce(self, buffer: torch.Tensor, op, what: str) -> None:
        """All-reduce ``buffer`` in place, waiting at most ``timeout_s`` for the other ranks."""
        started = time.monotonic()
        try:
            work = dist.all_reduce(buffer, op=op, group=self.group, async_op=True)
            work.wait(timeout=timedelta(seconds=self.timeout_s))
        except Exception as e:  # the backend's timeout, or a peer whose connection is gone
            waited = time.monotonic() - started
            if waited >= self.timeout_s * 0.99:
                happened = f"the other ranks did not reach the agreement within {self.timeout_s:g} s"
            else:
                happened = f"the agreement failed after {waited:.1f} s ({str(e).strip().splitlines()[0][:200]})"
            raise AgreementError(
                f"Cached Sampler, rank {self.rank} of {self.size}, agreeing on {what}: {happened}; another rank "
                f"probably failed: see its log. The group's collectives may be out of step now: restart the ranks "
                f"(Raylight: its actors) before sampling again. (The bound: {TIMEOUT_ENV} in the environment, in "
                f"seconds; default {DEFAULT_TIMEOUT_S:g}.)") from e


def group_of(process_group=None, timeout_s: float | None = None) -> RankGroup | None:
    """A :class:`RankGroup` over ``process_group`` (the default group when None), or None when the process
    is not part of a torch.distributed group of more than one rank. ``timeout_s``: how long an agreement waits
    for the other ranks (:func:`agreement_timeout`)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(process_group) < 2:
        return None
    return RankGroup(process_group, timeout_s)
