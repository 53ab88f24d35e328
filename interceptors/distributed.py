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
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist


def collective_device(backend: str) -> torch.device:
    """Where a group's collectives take their tensors: NCCL (every multi-GPU run, Raylight's included) reduces
    CUDA tensors only, on the process's current device; gloo, or a group that also has a CPU backend
    (``"cpu:gloo,cuda:nccl"``), reduces them on the CPU, where the values already are."""
    return torch.device("cuda") if str(backend).lower() == "nccl" else torch.device("cpu")


class RankGroup:
    """The ranks whose blocks share one sequence (a torch.distributed process group) for one run.

    ``padding`` is the number of padding tokens at the end of this rank's shard in the current forward
    (``shard_tokens`` long), set by :meth:`observe_shard`; tensors shaped ``[rows, shard_tokens, ...]`` are
    trimmed of them before they are summed.
    """

    def __init__(self, group=None):
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.device = collective_device(dist.get_backend(group))
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
        dist.all_reduce(buffer, op=dist.ReduceOp.SUM, group=self.group)
        return buffer.tolist()

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is True on any rank."""
        buffer = torch.tensor([1 if flag else 0], dtype=torch.int32, device=self.device)
        dist.all_reduce(buffer, op=dist.ReduceOp.MAX, group=self.group)
        return bool(buffer.item())


def group_of(process_group=None) -> RankGroup | None:
    """A :class:`RankGroup` over ``process_group`` (the default group when None), or None when the process
    is not part of a torch.distributed group of more than one rank."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(process_group) < 2:
        return None
    return RankGroup(process_group)
