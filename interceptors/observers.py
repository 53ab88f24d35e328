"""Read-only observers that run with every chain."""
from __future__ import annotations

import torch

from .base import NonFiniteOutputError, Observer


class NaNWatch(Observer):
    """Stops sampling at the first non-finite model output, naming the step, branch and who was in charge.

    A skipped (substituted) output blames the decider that skipped it and the estimator that made the
    substitute, if one is chained; a computed one blames the model (often fp16 overflow), so users know
    whether turning caching off would help. Each forward leaves its rows' finiteness on the device; the flags
    of all of an evaluation's forwards come over in one transfer when it ends, before the next model call, so
    the watch costs one device sync per evaluation, not one per forward.
    """

    def on_forward(self, run, forward, output: torch.Tensor) -> None:
        forward.evaluation.finite_rows.append((forward, torch.isfinite(output).reshape(len(output), -1).all(dim=1)))

    def on_evaluation_end(self, run, ev) -> None:
        checks, ev.finite_rows = ev.finite_rows, []
        if not checks:
            return
        finite = torch.cat([rows for _, rows in checks]).tolist()
        at = 0
        for forward, rows in checks:
            flags, at = finite[at:at + len(rows)], at + len(rows)
            if not all(flags):
                self._stop(run, forward, flags)

    def _stop(self, run, forward, finite: list[bool]) -> None:
        ev = forward.evaluation
        n = forward.rows
        bad = [k.name for i, k in enumerate(forward.keys) if not all(finite[i * n:(i + 1) * n])]
        branches = bad if len(finite) == n * len(forward.keys) and bad else [k.name for k in forward.keys]
        if forward.computed and not ev.decisions:
            who = "no interceptor (the model itself produced it; caching was not involved)"
        elif forward.computed:
            who = "no interceptor skipped this step (the model itself produced it)"
        else:
            who = ev.record.decided_by or "the cache"
            estimator = run.chain.estimator
            if any(ic is estimator for ic in run.chain):  # a chained estimator made the substitute
                who = f"{who} skipped this step's model work and {estimator.label} estimated it"
            who += " (try a lower threshold, or remove the caching node to check)"
        raise NonFiniteOutputError(
            f"NaN/Inf in the model output at step {ev.step + 1}/{ev.total_steps} (sigma {ev.sigma:.4g}), "
            f"branch {', '.join(branches)}; in charge: {who}.")
