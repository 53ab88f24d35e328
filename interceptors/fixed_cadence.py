"""Fixed-cadence skipping: compute every N-th evaluation, reuse (or forecast) in between.

The reference interceptor, and the schedule of FORA (arXiv 2407.01425) and of TaylorSeer's
"activated steps" (Liu et al., ICCV 2025, arXiv 2503.06923). It works at whole-model level on every
model ComfyUI can sample.
"""
from __future__ import annotations

import dataclasses

from .base import Decider
from .kinds import Granularity, InterceptorError
from .records import Evaluation
from .run import Run
from .memory import Footprint



@dataclasses.dataclass(frozen=True)
class FixedCadence(Decider):
    kind = "fixed_cadence"
    display_name = "Fixed Cadence"
    metric_name = "evaluations since last compute"
    footprint = Footprint("model_outputs")
    granularity = Granularity.MODEL

    interval: int = 2

    def validate(self) -> None:
        super().validate()
        if int(self.interval) != self.interval or self.interval < 1:
            raise InterceptorError(f"{self.label}: 'interval' must be a whole number >= 1, got {self.interval}.")

    def decide(self, run: Run, ev: Evaluation, signals, measured) -> bool:
        since = run.evaluations_since_compute(self)
        run.report_metric(self, float(since + 1), float(self.interval))
        return since + 1 >= self.interval
