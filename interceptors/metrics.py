"""Small change measures shared by the deciders."""
from __future__ import annotations


def relative_l1(current: dict, anchor: dict) -> float | None:
    """sum|current - anchor| / sum|anchor| over the branches present in both (None if none is).

    The relative L1 of FBCache/DBCache (ParaAttention, cache-dit), pooled over CFG branches so that one
    decision covers the whole step.
    """
    num = den = 0.0
    for key, value in current.items():
        ref = anchor.get(key)
        if ref is None or ref.shape != value.shape:
            continue
        ref = ref.to(value.device)  # anchors may sit on the cache device; compare where the model runs
        num += float((value - ref).abs().sum())
        den += float(ref.abs().sum())
    if den == 0.0:
        return None
    return num / den


def mean_abs(tensors) -> float:
    total = count = 0
    for t in tensors:
        total += float(t.abs().sum())
        count += t.numel()
    return total / max(count, 1)


def mean_abs_diff(a: dict, b: dict) -> float | None:
    pairs = [(a[k], b[k]) for k in a if k in b and a[k].shape == b[k].shape]
    if not pairs:
        return None
    return mean_abs(x - y.to(x.device) for x, y in pairs)


