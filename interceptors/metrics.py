"""Small change measures shared by the deciders, measured without stalling the device.

Each is a ratio of sums. A :class:`Measure` holds its per-branch sums as 0-d tensors where the model runs;
:func:`to_host` brings the sums of any number of measures over in one transfer (one device-to-host sync), and
the ratio is taken on the host, in the same order of additions as one float at a time would give.

Under sequence parallelism (``group``, a :class:`~.distributed.RankGroup`) the sums are reduced over the ranks
before the ratio is taken: every rank gets the value one process would have measured on the whole sequence. A
measure issues exactly one reduction whatever this rank holds, so the ranks stay in step.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch


@dataclasses.dataclass
class Measure:
    terms: list[torch.Tensor]                       # 0-d sums, still on the device
    finish: Callable[[list[float]], float | None]   # the ratio, from the terms' values on the host


def to_host(tensors: list[torch.Tensor]) -> list[float]:
    """The values of 0-d tensors in one transfer (float64 holds every float32/16 sum exactly)."""
    if not tensors:
        return []
    device = next((t.device for t in tensors if t.device.type != "cpu"), torch.device("cpu"))
    return torch.stack([t.detach().to(device, torch.float64) for t in tensors]).tolist()


def values(*measures: Measure) -> list[float | None]:
    """Every measure's value, all of their sums brought over in one transfer."""
    host = to_host([t for m in measures for t in m.terms])
    out, at = [], 0
    for m in measures:
        out.append(m.finish(host[at:at + len(m.terms)]))
        at += len(m.terms)
    return out


def _sums(group, *values: float) -> list[float]:
    return group.sum(list(values)) if group is not None else list(values)


def _local(group, tensor):
    return group.local(tensor) if group is not None else tensor


def relative_l1_of(current: dict, anchor: dict, group=None) -> Measure:
    """sum|current - anchor| / sum|anchor| over the branches present in both (None if none is).

    The relative L1 of FBCache/DBCache (ParaAttention, cache-dit), pooled over CFG branches so that one
    decision covers the whole step.
    """
    terms = []
    for key, value in current.items():
        ref = anchor.get(key)
        if ref is None or ref.shape != value.shape:
            continue
        # anchors may sit on the cache device: compare where the model runs
        value, ref = _local(group, value), _local(group, ref.to(value.device))
        terms += [(value - ref).abs().sum(), ref.abs().sum()]

    def finish(host):
        num, den = _sums(group, sum(host[0::2], 0.0), sum(host[1::2], 0.0))
        return None if den == 0.0 else num / den
    return Measure(terms, finish)


def relative_l1(current: dict, anchor: dict, group=None) -> float | None:
    return values(relative_l1_of(current, anchor, group))[0]


def mean_abs_of(tensors, group=None) -> Measure:
    return _mean_abs([_local(group, t) for t in tensors], group, empty=0.0)


def mean_abs_diff_of(a: dict, b: dict, group=None) -> Measure:
    """mean|a - b| over the branches present in both with the same shape (None if none is)."""
    pairs = [(a[k], b[k]) for k in a if k in b and a[k].shape == b[k].shape]
    return _mean_abs([_local(group, x) - _local(group, y.to(x.device)) for x, y in pairs], group, empty=None)


def mean_abs_diff(a: dict, b: dict, group=None) -> float | None:
    return values(mean_abs_diff_of(a, b, group))[0]


def _mean_abs(tensors, group, empty) -> Measure:
    count = float(sum(t.numel() for t in tensors))

    def finish(host):
        total, n = _sums(group, sum(host, 0), count)
        if n == 0:
            return empty
        return total / max(n, 1)
    return Measure([t.abs().sum() for t in tensors], finish)
