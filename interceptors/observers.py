"""Read-only observers that run with every chain."""
from __future__ import annotations

import torch

from .base import NonFiniteOutputError, Observer


class NaNWatch(Observer):
    """Stops sampling at the first non-finite model output, naming the step, branch and who was in charge.

    A skipped (substituted) output blames the decider that skipped it and the estimator that made the
    substitute, if one is chained; a computed one blames the model (often fp16 overflow), so users know
    whether turning caching off would help.
    """

    def on_forward(self, run, forward, output: torch.Tensor) -> None:
        if torch.isfinite(output).all():
            return
        bad = forward.split(~torch.isfinite(output).flatten(1).all(dim=1, keepdim=True).flatten())
        branches = [k.name for k, rows in (bad or {}).items() if bool(rows.any())] or [k.name for k in forward.keys]
        ev = forward.evaluation
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
