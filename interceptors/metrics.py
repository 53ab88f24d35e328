"""Small change measures shared by the deciders, measured without stalling the device.

Each is a ratio of sums. A :class:`Measure` holds its per-branch sums as 0-d tensors where the model runs; the
run brings the sums of every measure an evaluation needs over in one transfer (:func:`to_host`, one
device-to-host sync, together with the evaluation's sigma: ``LoopState.transfer``), and the ratio is taken on
the host, in the same order of additions as one float at a time would give.

Under sequence parallelism (``group``, a :class:`~.distributed.RankGroup`) the sums are reduced over the ranks
before the ratio is taken: every rank gets the value one process would have measured on the whole sequence. A
measure issues exactly one reduction, when its value is first read, whatever this rank holds, so ranks that
read the same measures stay in step.

Under ComfyUI's native multi-GPU path the rows of one evaluation are measured on several devices' threads, one
measure each; :func:`combined` adds their partial sums (``partial``) before the ratio (``ratio``), as the ranks'
reduction does, so the value is the one a single measure over all rows would give.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

_UNREAD = object()


@dataclasses.dataclass
class Measure:
    terms: list[torch.Tensor]                       # 0-d sums, still on the device
    finish: Callable[[list[float]], float | None]   # the ratio, from the terms' values on the host
    host: list[float] | None = None                 # the terms' values, once transferred
    # finish split in two, where the ratio is one of sums that add over rows (None: it cannot be split so):
    # ``partial`` the sums of this holder's rows, ``ratio`` the value from the sums over every holder's rows
    partial: Callable[[list[float]], list[float]] | None = None
    ratio: Callable[[list[float]], float | None] | None = None
    _value: Any = dataclasses.field(default=_UNREAD, repr=False)

    def value(self) -> float | None:
        """The measured ratio (the terms must have been transferred). Taken when first asked for: under a rank
        group that is when the reduction happens, so a rule that stops before reading it issues none."""
        if self.host is None:
            raise RuntimeError("the measure's sums were never transferred to the host")
        if self._value is _UNREAD:
            self._value = self.finish(self.host)
        return self._value


def combined(parts: list[Measure]) -> Measure | None:
    """One measure over the rows of every measure in ``parts`` (each transferred, each holding some of the rows,
    all made by the same function): their partial sums added in the order given, then the ratio. None where a
    part's ratio cannot be split into sums."""
    if not parts or any(m.partial is None or m.host is None for m in parts):
        return None
    sums = None
    for m in parts:
        mine = m.partial(m.host)
        sums = mine if sums is None else [a + b for a, b in zip(sums, mine)]
    out = Measure([], parts[0].finish, host=[], partial=parts[0].partial, ratio=parts[0].ratio)
    out._value = parts[0].ratio(sums)
    return out


def combined_each(parts: list[list[Measure]]) -> list[Measure | None] | None:
    """Each holder's list of measures joined position by position (:func:`combined`); None where the holders
    measured a different number of them."""
    if len({len(measures) for measures in parts}) != 1:
        return None
    return [combined([measures[i] for measures in parts]) for i in range(len(parts[0]))]


def to_host(tensors: list[torch.Tensor]) -> list[list[float]]:
    """The values of ``tensors`` (any shapes, any devices), flattened, one list per tensor: the tensors of each
    device are concatenated there and brought over at once, so one device costs one sync (float64 holds every
    float32/16 sum, and booleans, exactly). CPU tensors cost none."""
    flat = [t.detach().reshape(-1).to(torch.float64) for t in tensors]
    by_device: dict[torch.device, list[int]] = {}
    for i, t in enumerate(flat):
        by_device.setdefault(t.device, []).append(i)
    out: list[list[float]] = [[] for _ in flat]
    for device, indices in by_device.items():
        joined = torch.cat([flat[i] for i in indices])
        values = (joined if device.type == "cpu" else joined.cpu()).tolist()
        at = 0
        for i in indices:
            n = flat[i].numel()
            out[i], at = values[at:at + n], at + n
    return out


def terms_of(measures) -> list[torch.Tensor]:
    return [t for m in measures for t in m.terms]


def deliver(measures, host: list[list[float]]) -> None:
    """Hand each measure its terms' values: ``host`` holds one single-value list per term of ``terms_of``."""
    at = 0
    for m in measures:
        m.host, at = [v[0] for v in host[at:at + len(m.terms)]], at + len(m.terms)


def values(*measures: Measure) -> list[float | None]:
    """Every measure's value, all of their sums brought over in one transfer (outside a run; a run's deciders
    get theirs with the evaluation's transfer, ``LoopState.transfer``)."""
    deliver(measures, to_host(terms_of(measures)))
    return [m.value() for m in measures]


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
        terms += [(value - ref).abs_().sum(), ref.abs().sum()]  # abs_: the difference is ours

    def partial(host):
        return [sum(host[0::2], 0.0), sum(host[1::2], 0.0)]

    def ratio(sums):
        num, den = sums
        return None if den == 0.0 else num / den
    return Measure(terms, lambda host: ratio(_sums(group, *partial(host))), partial=partial, ratio=ratio)


def relative_l1(current: dict, anchor: dict, group=None) -> float | None:
    return values(relative_l1_of(current, anchor, group))[0]


def mean_abs_of(tensors, group=None) -> Measure:
    return _mean_abs([_local(group, t) for t in tensors], group, empty=0.0)


def mean_abs_diff_of(a: dict, b: dict, group=None) -> Measure:
    """mean|a - b| over the branches present in both with the same shape (None if none is)."""
    pairs = [(a[k], b[k]) for k in a if k in b and a[k].shape == b[k].shape]
    return _mean_abs([_local(group, x) - _local(group, y.to(x.device)) for x, y in pairs], group, empty=None,
                     owned=True)


def mean_abs_diff(a: dict, b: dict, group=None) -> float | None:
    return values(mean_abs_diff_of(a, b, group))[0]


def _mean_abs(tensors, group, empty, owned: bool = False) -> Measure:
    """mean|t| over ``tensors``; ``owned``: they are temporaries of the measure, so abs is taken in place."""
    count = float(sum(t.numel() for t in tensors))

    def partial(host):
        return [sum(host, 0), count]

    def ratio(sums):
        total, n = sums
        if n == 0:
            return empty
        return total / max(n, 1)
    return Measure([(t.abs_() if owned else t.abs()).sum() for t in tensors],
                   lambda host: ratio(_sums(group, *partial(host))), partial=partial, ratio=ratio)
