"""Read-only observers that run with every chain."""
from __future__ import annotations

import torch

from .base import NonFiniteOutputError, Observer


class NaNWatch(Observer):
    """Stops sampling at the first non-finite model output, naming the step, branch and who was in charge.

    A skipped (substituted) output blames the decider that skipped it and the estimator that made the
    substitute, if one is chained; a computed one blames the model (often fp16 overflow), so users know
    whether turning caching off would help. Each forward leaves its rows' finiteness on the device; the flags
    come over in the transfer that reads the sigma of the sampler's next evaluation (:meth:`read_sigma`, before
    that evaluation calls the model), or when the run ends (:meth:`check`), so the watch adds no device sync.
    """

    def on_forward(self, run, forward, output: torch.Tensor) -> None:
        # what the message needs, not the forward, whose tensors must not outlive the evaluation
        finite = run.to_cache(torch.isfinite(output).reshape(len(output), -1).all(dim=1))
        run.finite_rows.append(((forward.evaluation, forward.keys, forward.rows, forward.computed), finite))

    def read_sigma(self, run, timestep: torch.Tensor) -> float:
        """The sigma of the evaluation the sampler begins, read in one transfer with the flags not yet checked."""
        checks, run.finite_rows = run.finite_rows, []
        host = torch.cat([timestep.flatten()[:1].to(torch.float64)]
                         + [rows.to(timestep.device, torch.float64) for _, rows in checks]).tolist()
        self._check(run, checks, host[1:])
        return host[0]

    def check(self, run) -> None:
        """Read the flags not yet checked (at the end of the run)."""
        checks, run.finite_rows = run.finite_rows, []
        if checks:
            self._check(run, checks, torch.cat([rows for _, rows in checks]).tolist())

    def _check(self, run, checks: list, finite: list) -> None:
        at = 0
        for where, rows in checks:
            flags, at = finite[at:at + len(rows)], at + len(rows)
            if not all(flags):
                self._stop(run, *where, flags)

    def _stop(self, run, ev, keys, rows: int, computed: bool, finite: list) -> None:
        bad = [k.name for i, k in enumerate(keys) if not all(finite[i * rows:(i + 1) * rows])]
        branches = bad if len(finite) == rows * len(keys) and bad else [k.name for k in keys]
        if computed and not ev.decisions:
            who = "no interceptor (the model itself produced it; caching was not involved)"
        elif computed:
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
