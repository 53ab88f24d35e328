"""Read-only observers that run with every chain."""
from __future__ import annotations

import dataclasses

import torch

from .base import Observer
from .kinds import NonFiniteOutputError


def _skipper(run, forward) -> str | None:
    """The decider whose skip made (part of) this forward's output: the step cache for a whole forward or for its
    blocks at the feature level, else the block cache. Another decider's skips in the same evaluation (the Guidance
    Cache's) are not this one's."""
    if forward.computed:
        return None
    decider = run.model_decider if forward.model_skipped or forward.features else run.block_decider
    return decider.label if decider is not None else None


class NaNWatch(Observer):
    """Stops sampling at the first non-finite model output, naming the step, branch and who was in charge.

    A skipped (substituted) output blames the decider that skipped it and the estimator that made the
    substitute, if one is chained; a computed one blames the model (often fp16 overflow), so users know
    whether turning caching off would help. Each forward leaves its rows' finiteness on the device, read with
    the run's next transfer to the host (the next decision's, or the run's last: ``LoopState.read_later``), so
    the watch adds no device sync.
    """

    def on_forward(self, run, forward, output: torch.Tensor) -> None:
        # What the message needs, not the forward, whose tensors must not outlive the evaluation. The flags (one
        # bool per row) stay on the compute device even with cache_on_cpu: moving them would be a blocking copy
        # per forward.
        finite = rows_finite(output)
        where = (forward.evaluation, forward.keys, forward.rows, forward.computed, _skipper(run, forward))
        run.read_later([finite], lambda host: self._check(run, where, host[0]))

    def _check(self, run, where, finite: list) -> None:
        if not all(finite):
            self._stop(run, *where, finite)

    def _stop(self, run, ev, keys, rows: int, computed: bool, skipper: str | None, finite: list) -> None:
        bad = [k.name for i, k in enumerate(keys) if not all(finite[i * rows:(i + 1) * rows])]
        branches = bad if len(finite) == rows * len(keys) and bad else [k.name for k in keys]
        if computed and not ev.decisions:
            who = "no interceptor (the model itself produced it; caching was not involved)"
        elif computed:
            who = "no interceptor skipped this step (the model itself produced it)"
        else:
            who = skipper or "the cache"
            estimator = run.chain.estimator
            if any(ic is estimator for ic in run.chain):  # a chained estimator made the substitute
                who = f"{who} skipped this step's model work and {estimator.label} estimated it"
            culprit = out_of_range(run, keys, ev.sigma)
            if culprit:
                who = f"{who}; {culprit}"
            who += " (try a lower threshold, or remove the caching node to check)"
        raise NonFiniteOutputError(
            f"NaN/Inf in the model output at step {ev.step + 1}/{ev.total_steps} (sigma {ev.sigma:.4g}), "
            f"branch {', '.join(branches)}; in charge: {who}.")


def rows_finite(output: torch.Tensor) -> torch.Tensor:
    """One bool per row of ``output``: every value of the row is finite. For float16/bfloat16/float32 it is
    whether the row's float64 sum is finite, a single pass (isfinite then all takes several on the CPU): a NaN or
    an Inf makes the sum NaN or Inf (Inf - Inf is NaN), and finite values cannot overflow float64, whose range
    exceeds float32's by a factor of 1e269. float64 rows could overflow, and are checked value by value."""
    rows = output.reshape(len(output), -1)
    if output.dtype == torch.float64:
        return torch.isfinite(rows).all(dim=1)
    return rows.sum(dim=1, dtype=torch.float64).isfinite()


def out_of_range(run, keys, sigma: float) -> str | None:
    """Which substituted value was not finite in the dtype it was used in, e.g. a float16 forecast beyond
    float16's range (65504), which becomes Inf when cast back into the model's stream. Only called once a
    non-finite output has been found, so it may take its time."""
    estimator = run.chain.estimator
    for key in keys:
        cache = run.caches.branches.get(key)
        for name, slot in (cache.slots.items() if cache is not None else ()):
            if not estimator.ready(slot):
                continue
            stored = _first_tensor(slot)
            value = estimator.estimate(slot, sigma, _slot_device(slot))
            what = f"the {_quantity(name)} of branch {key.name}"
            if not bool(torch.isfinite(value).all()):
                return f"{estimator.display_name}'s value for {what} was NaN/Inf"
            if stored is None or not stored.is_floating_point():
                continue
            limit, peak = torch.finfo(stored.dtype).max, float(value.abs().max())
            if peak > limit:
                dtype = str(stored.dtype).removeprefix("torch.")
                return (f"{estimator.display_name}'s value for {what} reached {peak:.4g}, beyond {dtype}'s range "
                        f"({limit:.6g}), and overflowed to Inf in the model's {dtype} stream")
    return None


def _quantity(name: str) -> str:
    if name == "output":
        return "model output"
    segment, _, stream = name.partition(".")
    return f"residual of block segment {segment} ({stream} stream)"


def _first_tensor(obj) -> torch.Tensor | None:
    """A tensor the slot holds: what the estimator was handed, in the dtype the model produced it."""
    if isinstance(obj, torch.Tensor):
        return obj
    if dataclasses.is_dataclass(obj):
        obj = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
    return next((t for t in map(_first_tensor, items) if t is not None), None)


def _slot_device(slot) -> torch.device:
    stored = _first_tensor(slot)
    return stored.device if stored is not None else torch.device("cpu")
