"""Small change measures shared by the deciders.

Each is a ratio of sums, so under sequence parallelism (``group``, a :class:`~.distributed.RankGroup`) the
sums are reduced over the ranks before the ratio is taken: every rank gets the value one process would have
measured on the whole sequence. A call issues exactly one reduction whatever this rank holds, so the ranks
stay in step.
"""
from __future__ import annotations


def _sums(group, *values: float) -> list[float]:
    return group.sum(list(values)) if group is not None else list(values)


def _local(group, tensor):
    return group.local(tensor) if group is not None else tensor


def relative_l1(current: dict, anchor: dict, group=None) -> float | None:
    """sum|current - anchor| / sum|anchor| over the branches present in both (None if none is).

    The relative L1 of FBCache/DBCache (ParaAttention, cache-dit), pooled over CFG branches so that one
    decision covers the whole step.
    """
    num = den = 0.0
    for key, value in current.items():
        ref = anchor.get(key)
        if ref is None or ref.shape != value.shape:
            continue
        # anchors may sit on the cache device: compare where the model runs
        value, ref = _local(group, value), _local(group, ref.to(value.device))
        num += float((value - ref).abs().sum())
        den += float(ref.abs().sum())
    num, den = _sums(group, num, den)
    if den == 0.0:
        return None
    return num / den


def mean_abs(tensors, group=None) -> float:
    total, count = _sums(group, *_abs_sum_and_count([_local(group, t) for t in tensors]))
    return total / max(count, 1)


def mean_abs_diff(a: dict, b: dict, group=None) -> float | None:
    pairs = [(a[k], b[k]) for k in a if k in b and a[k].shape == b[k].shape]
    total, count = _sums(group, *_abs_sum_and_count([_local(group, x) - _local(group, y.to(x.device)) for x, y in pairs]))
    if count == 0:
        return None
    return total / count


def _abs_sum_and_count(tensors) -> tuple[float, float]:
    return sum(float(t.abs().sum()) for t in tensors), float(sum(t.numel() for t in tensors))
