"""Adaptive output cache: EasyCache's runtime transformation rate, at whole-model level, for every model.

Zhou et al., "Less is Enough: Training-Free Video Diffusion Acceleration via Runtime-Adaptive Caching"
(arXiv 2507.02860; H-EmbodVis/EasyCache). On computed steps the transformation rate
``k = mean|v_t - v_c| / mean|x_t - x_c|`` relates output change to input change; on later steps the
output change is predicted as ``k * mean|x_t - x_{t-1}| / mean|v_c|`` and accumulated since the last
computed step; the model is skipped while the accumulation stays under the threshold. Unlike ComfyUI's
core EasyCache, the input change is per step (the paper's rule), nothing is kept that the model was
handed, and the decision is shared by every CFG branch while each branch keeps its own cache.
"""
from __future__ import annotations

import dataclasses

from .base import Decider, Granularity, check_range
from .metrics import detach, mean_abs, mean_abs_diff


@dataclasses.dataclass(frozen=True)
class AdaptiveCache(Decider):
    kind = "adaptive"
    display_name = "Adaptive Cache"
    granularity = Granularity.MODEL
    signal = "model_input"

    threshold: float = 0.1
    start_percent: float = 0.15
    end_percent: float = 0.95
    max_consecutive_cached: int = -1

    def validate(self) -> None:
        super().validate()
        check_range(self.label, "threshold", self.threshold, 0.0)
        check_range(self.label, "max_consecutive_cached", self.max_consecutive_cached, -1)

    def decide(self, run, ev, signals) -> bool:
        shared = run.shared[self.id]
        previous = shared.get("x_last")
        shared["x_last"] = detach(signals)
        rate, anchor_out = shared.get("rate"), shared.get("v_anchor")
        if self.threshold <= 0 or rate is None or not previous or not anchor_out:
            return True
        if 0 <= self.max_consecutive_cached <= shared.get("consecutive_skips", 0):
            return True
        step_change = mean_abs_diff(signals, previous, run.group)
        out_scale = mean_abs(anchor_out.values(), run.group)
        if step_change is None or out_scale == 0:
            return True
        shared["accumulated"] = shared.get("accumulated", 0.0) + rate * step_change / out_scale
        run.report_metric(self, shared["accumulated"], self.threshold)
        return shared["accumulated"] >= self.threshold

    def computed(self, run, ev, forward, signals, outputs=None) -> None:
        shared = run.shared[self.id]
        if forward.keys != shared.get("keys", forward.keys):
            return  # another forward of this evaluation (split CFG): the first one drives the rate
        shared["keys"] = forward.keys
        x, v = detach(signals), detach(outputs)
        x_anchor, v_anchor = shared.get("x_anchor"), shared.get("v_anchor")
        if x_anchor and v_anchor:
            dx, dv = mean_abs_diff(x, x_anchor, run.group), mean_abs_diff(v, v_anchor, run.group)
            if dx and dv is not None:
                shared["rate"] = dv / dx
        shared.update(x_anchor=x, v_anchor=v, x_last=x, accumulated=0.0)
