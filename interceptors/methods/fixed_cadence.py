"""Fixed-cadence skipping: compute every N-th evaluation, reuse (or forecast) in between.

The reference interceptor, and the schedule of FORA (arXiv 2407.01425) and of TaylorSeer's
"activated steps" (Liu et al., ICCV 2025, arXiv 2503.06923). It works at whole-model level on every
model ComfyUI can sample.

With ``growth`` it is Spectrum's growing schedule (Han et al., CVPR 2026, arXiv 2603.01623; the reference
code's ``window_size`` and ``flex_window``): the gap starts at ``interval`` and grows by ``growth`` after each
evaluation the cadence computes, the gap used being its whole part, so the computed evaluations thin out
as the image settles. Evaluations computed for another reason (the first, the last step, outside the
start/end window, a branch without a cache yet) do not grow it, as the reference's warm-up steps do not.
``growth_ratio`` makes the gap grow geometrically instead (or as well): after each computed evaluation the gap
becomes ``gap * growth_ratio + growth``.

``warmup_steps`` computes the first N steps of the model's schedule, as Spectrum's reference computes its first
three before the cadence starts; like the other forced computes they do not grow the gap. Spectrum's own schedule,
steps 0, 1, 2, 4, 7, 11, 16, 22 of 28 with the last step forecast, is ``warmup_steps`` 3, ``interval`` 2,
``growth`` 1 and ``last_step`` "forecast" (the setting every decider has).
"""
from __future__ import annotations

import dataclasses

from ..base import Decider
from ..kinds import LAST_STEP_COMPUTE, LEVEL_MODEL, Cached, Granularity, InterceptorError, check_whole
from ..records import Evaluation
from ..run import Run
from ..memory import Footprint
from ..spec import (Example, Input, MemoryRow, MethodSpec, Prose, Sweep, WINDOW, last_step_input, level_input,
                    percent_inputs)

MAX_GROWTH = 16.0  # the largest growth of the interval per computed step
MAX_GROWTH_RATIO = 4.0  # the largest factor of the interval per computed step
MAX_WARMUP_STEPS = 10000


@dataclasses.dataclass(frozen=True)
class FixedCadence(Decider):
    declaration = Decider.declaration.but(
        kind="fixed_cadence",
        display_name="Fixed Cadence",
        metric_name="evaluations since last compute",
        footprint=Footprint(Cached.MODEL_OUTPUTS),
        granularity=Granularity.MODEL,
    )

    interval: int = 2
    growth: float = 0.0
    warmup_steps: int = 0
    growth_ratio: float = 1.0

    @dataclasses.dataclass
    class RunState:
        gap: float | None = None  # the current gap of the growing schedule (None: still ``interval``)

    def validate(self) -> None:
        super().validate()
        check_whole(self.label, "interval", self.interval, 1)
        if not 0.0 <= self.growth <= MAX_GROWTH:
            raise InterceptorError(f"{self.label}: 'growth' must be between 0 and {MAX_GROWTH:g}, got {self.growth}.")
        if not 1.0 <= self.growth_ratio <= MAX_GROWTH_RATIO:
            raise InterceptorError(f"{self.label}: 'growth_ratio' must be between 1 and {MAX_GROWTH_RATIO:g}, "
                                   f"got {self.growth_ratio}.")
        check_whole(self.label, "warmup_steps", self.warmup_steps, 0, MAX_WARMUP_STEPS)

    def decide(self, run: Run, ev: Evaluation, signals, measured) -> bool:
        state = run.state_of(self)
        gap = float(self.interval) if state.gap is None else state.gap
        since = run.evaluations_since_compute(self)
        run.report_metric(self, float(since + 1), float(int(gap)))
        if self.warmup_steps and ev.position < self.warmup_steps:
            return True  # computed for the warm-up: the gap does not grow, as for the other forced computes
        compute = since + 1 >= int(gap)
        if compute and (self.growth or self.growth_ratio != 1.0):
            state.gap = self._grown(gap)
        return compute

    def _grown(self, gap: float) -> float:
        return gap * self.growth_ratio + self.growth

    def computed_steps(self, steps: int) -> tuple[int, ...]:
        """The steps it computes over a run of ``steps`` steps of one evaluation each, its window the whole run: the
        run's forced computes and :meth:`decide` together, without sampling (schedule_search's candidates)."""
        computed: list[int] = []
        gap = float(self.interval)
        for step in range(steps):
            since = step - computed[-1] - 1 if computed else 0
            last = step == steps - 1 and self.last_step == LAST_STEP_COMPUTE
            forced = step == 0 or step < self.warmup_steps or last or 0 <= self.max_consecutive_cached <= since
            if not forced and since + 1 >= int(gap):
                forced, gap = True, self._grown(gap)
            if forced:
                computed.append(step)
        return tuple(computed)



SPECS = (MethodSpec(
    "FixedCadence", "Fixed Cadence",
    "Computes the model every N-th step and reuses the last computed result in between (or a TaylorSeer "
    "forecast, if one is chained). Works on every model. The FORA / TaylorSeer schedule (arXiv 2407.01425, "
    "2503.06923); with 'growth', Spectrum's growing one (arXiv 2603.01623).",
    (Input("interval", "int", default=2, min=1, max=100, tooltip=(
        "Compute every N-th step; 1 computes every step (no caching), 2 halves the model work.")),
     *percent_inputs(),
     Input("growth", "float", default=0.0, min=0.0, max=MAX_GROWTH, step=0.05, optional=True, tooltip=(
         "Spectrum's growing schedule (its flex_window): after each step the cadence computes, the interval grows "
         "by this much (its whole part is used), so computed steps thin out as the image settles. 0: a fixed "
         "interval.")),
     Input("warmup_steps", "int", default=0, min=0, max=MAX_WARMUP_STEPS, optional=True, tooltip=(
         "The first N steps of the schedule are always computed before the cadence starts (Spectrum computes 3); "
         "they do not grow the interval. 0: only the first step.")),
     Input("growth_ratio", "float", default=1.0, min=1.0, max=MAX_GROWTH_RATIO, step=0.05, optional=True, tooltip=(
         "After each step the cadence computes, the interval is multiplied by this (then 'growth' is added), so the "
         "gaps grow geometrically. 1: no geometric growth. Spectrum's schedule, steps 0, 1, 2, 4, 7, 11, 16, 22 of "
         "28 (counted from 0) with the last forecast, is warmup_steps 3, interval 2, growth 1, last_step forecast.")),
     last_step_input(), level_input()),
    lambda interval, start_percent, end_percent, growth=0.0, warmup_steps=0, growth_ratio=1.0,
    last_step=LAST_STEP_COMPUTE, level=LEVEL_MODEL: FixedCadence(
        interval=interval, start_percent=start_percent, end_percent=end_percent, growth=growth,
        warmup_steps=warmup_steps, growth_ratio=growth_ratio, last_step=last_step, level=level),
    FixedCadence,
    Prose(when=(
        "The simplest cache and, chained with TaylorSeer Forecast, the strongest the pack measured: it computes "
        "every `interval`-th step and reuses (or forecasts) the ones between. It works on every model, "
        "whole-model level, including UNets (SD1.5, SDXL) and families without block hooks.",
    ), families=(
        ("Any model, 28-30 steps", "interval 3-5 + TaylorSeer Forecast order 1"),
        ("Any model, 50 steps", "interval 5-8 + TaylorSeer Forecast order 1"),
        ("Bundled digits model, 28 steps (measured)", "interval 5 + TaylorSeer: 4.0x less model work at 40.5 dB; interval 6: 4.7x at 37 dB"),
    )),
    sweep=Sweep("fixed_cadence", (1, 2, 3, 4, 5, 6), quick=(1, 2, 4)),
    examples=(
        Example("fixed cadence", (("FixedCadence", dict(interval=2, **WINDOW), dict(interval=1, **WINDOW)),)),
        Example("fixed cadence at features + taylorseer", (
            ("FixedCadence", dict(interval=2, level="features", **WINDOW),
             dict(interval=1, level="features", **WINDOW)),
            ("TaylorSeer", dict(order=1), dict(order=1)))),
        Example("fixed cadence + taylorseer", (
            ("FixedCadence", dict(interval=3, **WINDOW), dict(interval=1, **WINDOW)),
            ("TaylorSeer", dict(order=2), dict(order=2)))),
        # window 4, degree 2: the Chebyshev fit takes part from the 4th computed step (step 6 of 8) on
        Example("fixed cadence + spectrum", (
            ("FixedCadence", dict(interval=2, **WINDOW), dict(interval=1, **WINDOW)),
            ("Spectrum", dict(window=4, degree=2, ridge=0.1, blend=0.5, order=1),
             dict(window=4, degree=2, ridge=0.1, blend=0.5, order=1)))),
        # Spectrum's growing schedule: 8 steps computed at 0, 1, 3, 6 and the last (gaps 1, 2, 3)
        Example("growing cadence + spectrum", (
            ("FixedCadence", dict(interval=1, growth=1.0, **WINDOW), dict(interval=1, growth=0.0, **WINDOW)),
            ("Spectrum", dict(window=4, degree=1, ridge=0.1, blend=0.5, order=1),
             dict(window=4, degree=1, ridge=0.1, blend=0.5, order=1)))),
    ),
    memory=(MemoryRow("Fixed Cadence"), MemoryRow("Fixed Cadence, level features", dict(level="features"),
                                                  orders=True)),
    summary=(
        "Compute every N-th step after the first `warmup_steps`; `growth` (added) and `growth_ratio` "
        "(multiplied) widen the interval after each computed step, and with `last_step` forecast they give "
        "Spectrum's schedule. Any model."),
),)
