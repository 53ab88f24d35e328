"""Partial Last Step: the run's last steps run only their front (and back) transformer blocks.

A step cache computes the last step whole by default (``last_step``), a whole step of work; forecast whole, it cost
2.7 dB at the median seed on the bench's photos model. In between, on the last ``last_steps`` steps only the first
``Fn`` and the last ``Bn`` blocks run and the blocks between are forecast by the chain's estimator from the steps
computed before (TaylorSeer Forecast, or the last computed residual), as DBCache forecasts its middle. The last
step is where that is cheap: nothing forecast later builds on it. On the bench's photos model a growing cadence +
TaylorSeer whose last step runs 1 of its 6 blocks saves 74% of the work at 35.3 dB (the median of 8 seeds), the
same cadence with its last step computed 71% at 37.2 dB (``tools/studies/last_step_blocks.py``,
``bench/last_step_blocks.md``).

It decides from the schedule alone and sits at the block level, so it chains after any whole-model decider (Fixed
Cadence, Adaptive Cache), which still decides whether the model runs at all. Auto Calibrate's quality was measured
without it: chained after a plan, the plan's PSNR is no longer what the node measured.
"""
from __future__ import annotations

import dataclasses

from ..base import Decider
from ..cards import ModelCard
from ..kinds import Cached, Granularity, check_whole
from ..memory import Footprint
from ..spec import Example, Input, MemoryRow, MethodSpec, Prose, WINDOW
from .dbcache import check_probe, split_problems


@dataclasses.dataclass(frozen=True)
class PartialLastStep(Decider):
    declaration = Decider.declaration.but(
        kind="partial_last_step",
        display_name="Partial Last Step",
        footprint=Footprint(Cached.BLOCK_STREAMS),
        granularity=Granularity.BLOCKS,
        forces_last_step=False,  # the last step is the one it skips blocks of
    )

    last_steps: int = 1
    front: int = 1
    back: int = 0

    def validate(self) -> None:
        super().validate()
        check_whole(self.label, "last_steps", self.last_steps, 0)
        check_probe(self.label, self.front, self.back, "the forecast middle is added to what the front blocks "
                                                       "compute from the step's real input")

    def blocks(self) -> tuple[int, int]:
        return self.front, self.back

    def check_model(self, card: ModelCard) -> list[str]:
        return split_problems(self.label, self.front, self.back, card, "forecast")

    def decide(self, run, ev, signals, measured) -> bool:
        return ev.step < ev.total_steps - self.last_steps


# -- the node -----------------------------------------------------------------------------------------------------

SPECS = (MethodSpec(
    "PartialLastStep", "Partial Last Step",
    "On the run's last step only the first Fn (and last Bn) transformer blocks run; the blocks between are forecast "
    "from the steps computed before (chain TaylorSeer Forecast). Chain it after a step cache such as Fixed Cadence, "
    "whose last step then costs a fraction of a step. Needs a model with transformer-block hooks.",
    (Input("last_steps", "int", default=1, min=0, max=10000, tooltip=(
        "How many steps at the end of the run compute only their front and back blocks. 1: the last step, the one no "
        "later forecast builds on. 0: off (bit-identical output).")),
     Input("Fn", "int", default=1, min=1, max=200, tooltip=(
         "Front blocks that run on those steps. More is safer and saves less: on the bench's 6-block photos model "
         "Fn 1 saved 5/6 of the last step.")),
     Input("Bn", "int", default=0, min=0, max=200, tooltip=(
         "Back blocks that run on those steps after the forecast middle."))),
    lambda last_steps, Fn, Bn: PartialLastStep(last_steps=last_steps, front=Fn, back=Bn),
    PartialLastStep,
    Prose(when=(
        "To take most of the last step's work off a step cache that computes it (Fixed Cadence, Adaptive Cache): "
        "chain it after that node and before TaylorSeer Forecast. On the last step only "
        "the first `Fn` and the last `Bn` blocks run, and the chain's estimator forecasts the blocks between from "
        "the steps computed before. Computing that step whole keeps the most quality, forecasting it whole "
        "(`last_step` forecast) saves the most work; this sits between, and pays where the last blocks change "
        "little at the end (measure it against the last step computed). Models without block hooks are refused "
        "with a pointer to the whole-model methods.",
    ), families=(
        ("Bundled photos model (6 blocks), 28 steps (measured, 8 seeds)",
         "Fn 1 after Fixed Cadence interval 3, growth 0.5 + TaylorSeer order 1: 74% less work at 35.3 dB (median "
         "seed; the last step computed: 71% at 37.2 dB)"),
        ("Bundled video model (4 blocks), 28 steps (measured, 8 seeds)",
         "Fn 2 after Fixed Cadence interval 3, growth 1 + TaylorSeer order 1: 77% less work at 35.4 dB (median "
         "seed; the last step computed: 75% at 35.5 dB)"),
        ("Flux, Wan and other block-hooked families", "no measurement yet: start with a third of the blocks as Fn "
                                                      "and compare with the last step computed"),
    )),
    examples=(
        Example("fixed cadence + partial last step + taylorseer", (
            ("FixedCadence", dict(interval=2, **WINDOW), dict(interval=1, **WINDOW)),
            ("PartialLastStep", dict(last_steps=1, Fn=1, Bn=0), dict(last_steps=0, Fn=1, Bn=0)),
            ("TaylorSeer", dict(order=1), dict(order=1)))),
    ),
    memory=(MemoryRow("Partial Last Step"),),
    summary="Runs only the front blocks of the last step. Block-hooked models.",
),)
