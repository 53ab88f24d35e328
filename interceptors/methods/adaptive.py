"""Adaptive output cache: EasyCache's runtime transformation rate, at whole-model level, for every model.

Zhou et al., "Less is Enough: Training-Free Video Diffusion Acceleration via Runtime-Adaptive Caching"
(arXiv 2507.02860; H-EmbodVis/EasyCache). On computed steps the transformation rate
``k = mean|v_t - v_c| / mean|x_t - x_c|`` relates output change to input change; on later steps the
output change is predicted as ``k * mean|x_t - x_{t-1}| / mean|v_c|`` and accumulated since the last
computed step; the model is skipped while the accumulation stays under the threshold. Unlike ComfyUI's
core EasyCache, the input change is per step (the paper's rule), nothing is kept that the model was
handed, and the decision is shared by every CFG branch while each branch keeps its own cache. The
rate is measured once per computed evaluation (by its first forward), whatever the branches are, so
a conditioning that changes mid-run (prompt switching, cond/uncond batched differently) costs one
computed step and caching goes on. Under ComfyUI's native multi-GPU path each device's thread measures its own
branches and the sums are added (``threads.py``): the same rate and decisions as one device batching them.
"""
from __future__ import annotations

import dataclasses

from ..base import Decider
from ..kinds import LAST_STEP_COMPUTE, LEVEL_MODEL, Anchor, Cached, Granularity, Signal, check_range
from ..memory import Footprint
from ..metrics import mean_abs_diff_of, mean_abs_of
from ..threads import AfterComputed
from ..spec import (Example, MemoryRow, MethodSpec, Prose, Sweep, WINDOW, last_step_input, level_input,
                    max_consecutive_input, percent_inputs, threshold_input)


@dataclasses.dataclass(frozen=True)
class AdaptiveCache(Decider):
    declaration = Decider.declaration.but(
        kind="adaptive",
        display_name="Adaptive Cache",
        metric_name="accumulated predicted change",
        footprint=Footprint(Cached.MODEL_OUTPUTS, anchor=Anchor.MODEL_ANCHORS),
        granularity=Granularity.MODEL,
        signal=Signal.MODEL_INPUT,
        gathers_over_threads=True,
    )

    threshold: float = 0.1
    start_percent: float = 0.15
    end_percent: float = 0.95

    def validate(self) -> None:
        super().validate()
        check_range(self.label, "threshold", self.threshold, 0.0)

    @dataclasses.dataclass
    class RunState:
        x_last: dict = dataclasses.field(default_factory=dict)    # model input at the previous evaluation
        x_anchor: dict = dataclasses.field(default_factory=dict)  # input and output (eps) at the last computed one
        v_anchor: dict = dataclasses.field(default_factory=dict)
        # the anchors before them, which the later devices' threads of the evaluation that moved them measure against
        previous: tuple = ({}, {})
        rate: float | None = None                                 # k, from the last two computed evaluations
        accumulated: float = 0.0
        changes: AfterComputed = dataclasses.field(default_factory=AfterComputed)  # from which the rate is taken

    def measure(self, run, ev, signals) -> list:
        state = run.state_of(self)
        if self.threshold <= 0 or not state.x_last or not state.v_anchor:
            return []
        outputs = [v for k, v in state.v_anchor.items() if k in (signals or {})]  # this call's branches' only
        return [mean_abs_diff_of(signals, state.x_last, run.group), mean_abs_of(outputs, run.group)]

    def decide(self, run, ev, signals, measured) -> bool:
        state = run.state_of(self)
        state.x_last, state.previous = run.keep(signals), ({}, {})  # every forward of the last evaluation is over
        if not measured or state.rate is None:
            return True
        step_change, out_scale = (m.value() for m in measured)
        if step_change is None or out_scale == 0:
            return True  # e.g. the conditioning changed (prompt switch): no common branch to compare
        state.accumulated += state.rate * step_change / out_scale
        run.report_metric(self, state.accumulated, self.threshold)
        return state.accumulated >= self.threshold

    def computed(self, run, ev, forward, signals, outputs=None) -> None:
        state = run.state_of(self)
        # another forward of this evaluation (split CFG, area conds): the first one (of each device's thread) drives
        # the rate; or a window new to the run on a skipped evaluation, which must not restart the others'
        # accumulation
        if not self.decided_to_compute(ev):
            return
        first = state.changes.index != ev.index
        if not state.changes.admit(run, ev.index):
            return
        if first:
            x_before, v_before = state.x_anchor, state.v_anchor
            state.previous = (x_before, v_before) if run.threads is not None else ({}, {})
            state.x_anchor, state.v_anchor, state.accumulated = {}, {}, 0.0
            state.x_last = state.x_anchor
        else:
            x_before, v_before = state.previous
        if self.threshold > 0 and x_before and v_before:  # the rate is only read by a decision
            # read with the next transfer (before the next decision), so a computed step costs no sync of its own
            changes = [mean_abs_diff_of(signals or {}, x_before, run.group),
                       mean_abs_diff_of(outputs or {}, v_before, run.group)]
            state.changes.add(run, changes, lambda values: self._take_rate(state, values))
        state.x_anchor.update(run.keep(signals))
        state.v_anchor.update(run.keep(outputs))

    @staticmethod
    def _take_rate(state, values) -> None:
        dx, dv = values
        if dx and dv is not None:
            state.rate = dv / dx


SPECS = (MethodSpec(
    "AdaptiveCache", "Adaptive Cache",
    "EasyCache-style runtime-adaptive cache (arXiv 2507.02860) at whole-model level: predicts how much the "
    "output would change from how much the input changed and skips the model while the accumulated prediction "
    "stays under the threshold. Works on every model ComfyUI can sample, without calibration.",
    (threshold_input(0.1, "Accumulated predicted output change under which steps are skipped. 0 disables "
                     "caching (bit-identical). 0.05 is cautious, 0.1 balanced, 0.2 fast."),
     max_consecutive_input(-1), *percent_inputs(0.15, 0.95), last_step_input(), level_input()),
    lambda threshold, max_consecutive_cached, start_percent, end_percent, last_step=LAST_STEP_COMPUTE,
    level=LEVEL_MODEL: AdaptiveCache(
        threshold=threshold, max_consecutive_cached=max_consecutive_cached, start_percent=start_percent,
        end_percent=end_percent, last_step=last_step, level=level),
    AdaptiveCache,
    Prose(when=(
        "The cache for any model without calibration, UNets and families without block hooks included: it "
        "predicts the output's change from the input's change (EasyCache's rule) and skips whole model steps "
        "while the accumulated prediction stays under the threshold. Unlike ComfyUI's EasyCache it keeps no "
        "tensor the model may change in place.",
    ), families=(
        ("Any model", "0.05 cautious, 0.1 balanced, 0.2 fast"),
        ("HunyuanVideo, Wan (published)", "0.1: about 2x, 0.2: about 3x"),
        ("SDXL, 30 steps", "0.1 with max_consecutive_cached 2"),
    )),
    sweep=Sweep("adaptive", (0.0, 0.02, 0.04, 0.07, 0.1, 0.15, 0.2, 0.3), quick=(0.0, 0.04, 0.15)),
    # the core-level tests' tiny Flux skips from a lower threshold than the tiny models of the prompts
    examples=(Example("adaptive", (("AdaptiveCache", dict(threshold=2.0, max_consecutive_cached=-1, **WINDOW),
                                    dict(threshold=0.0, max_consecutive_cached=-1, **WINDOW)),),
                      core=dict(threshold=0.6)),
              Example("adaptive at features", (
                  ("AdaptiveCache", dict(threshold=2.0, max_consecutive_cached=-1, level="features", **WINDOW),
                   dict(threshold=0.0, max_consecutive_cached=-1, level="features", **WINDOW)),),
                  core=dict(threshold=0.6))),
    memory=(MemoryRow("Adaptive Cache"), MemoryRow("Adaptive Cache, level features", dict(level="features"),
                                                   orders=True)),
    summary="EasyCache-style runtime-adaptive whole-model cache. Any model.",
),)
