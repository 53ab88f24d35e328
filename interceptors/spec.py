"""What a caching method's node is, as plain data: one :class:`MethodSpec` per config node, kept next to the
method's rule in ``methods/`` and listed in order by ``methods.SPECS``.

The node classes (``nodes/configs.py``), the node pages, the memory table, the bench's sweeps and the tests'
method list are all made from these records, so a method is described in one place. Nothing here imports
ComfyUI: an input is a plain record that the nodes translate into ComfyUI's inputs.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from .base import Interceptor
from .kinds import LAST_STEP_CHOICES, LAST_STEP_COMPUTE, LEVEL_CHOICES, LEVEL_MODEL

INPUT_TYPES = ("int", "float", "bool", "choice", "text")


@dataclasses.dataclass(frozen=True)
class Input:
    """One widget of a config node. Saved workflows store widget values by position: new inputs go last."""

    name: str
    type: str                            # one of INPUT_TYPES
    default: Any = None                  # None: the widget's own (a choice's first option)
    min: float | None = None
    max: float | None = None
    step: float | None = None
    tooltip: str = ""
    optional: bool = False
    choices: tuple = ()                  # for "choice"
    multiline: bool = False              # for "text"

    def __post_init__(self):
        if self.type not in INPUT_TYPES:
            raise ValueError(f"input {self.name}: type {self.type!r} is not one of {INPUT_TYPES}")


@dataclasses.dataclass(frozen=True)
class Prose:
    """The node page's own texts (the rest of the page comes from the node's definition); their Chinese is in
    tools/generate/node_docs_zh.json. ``after`` None: the text every chained caching node shares."""

    when: tuple[str, ...]
    families: tuple[tuple[str, str], ...] = ()
    after: tuple[str, ...] | None = None


@dataclasses.dataclass(frozen=True)
class Sweep:
    """The bench's curve for the node: its key in the results and the values of its threshold or interval
    (the first turns caching off and anchors the curve); ``quick`` for the bench's quick mode."""

    key: str
    values: tuple
    quick: tuple = ()


@dataclasses.dataclass(frozen=True)
class MemoryRow:
    """A row of docs/memory.md's table: ``settings`` None counts the method's class with each estimator order;
    otherwise an instance with these settings, on its own (or with each order, ``orders``). ``not_for``: model
    families the node refuses."""

    label: str
    settings: dict | None = None
    not_for: tuple[str, ...] = ()
    orders: bool = False  # an instance with ``settings``, with each estimator order as the class rows are


WINDOW = {"start_percent": 0.0, "end_percent": 1.0}  # caching allowed over the whole schedule


@dataclasses.dataclass(frozen=True)
class Example:
    """A chain the shared guarantees (tests/support/methods.py) run on the tests' tiny models (8 steps of euler at
    cfg 3): ``chain`` lists (config node name, widget values that skip work there, widget values that never skip),
    the deciding node first, widgets given in full as a saved workflow has them. ``core`` replaces widget values of
    the first node where the core-level tests (tiny Flux only) want others than the prompts."""

    name: str
    chain: tuple[tuple[str, dict, dict], ...]
    core: dict = dataclasses.field(default_factory=dict)
    negative_branch_only: bool = False   # acts on the negative CFG branch only: at cfg 1 it has nothing to skip


@dataclasses.dataclass(frozen=True)
class MethodSpec:
    """A config node: its id is the pack's prefix + ``name``; ``make(**widget values)`` builds its interceptor."""

    name: str
    display_name: str
    description: str
    inputs: tuple[Input, ...]
    make: Callable[..., Interceptor]
    interceptor: type                    # the class ``make`` builds (memory arithmetic, docs)
    prose: Prose
    sweep: Sweep | None = None           # None: the bench does not sweep it on its own (an estimator)
    memory: tuple[MemoryRow, ...] = ()
    examples: tuple[Example, ...] = ()   # what the shared guarantees run it in
    summary: str = dataclasses.field(kw_only=True)  # required: the README's one-line "What it does" of the node

    def defaults(self) -> dict:
        """Every widget at its default, as a fresh node has them."""
        return {i.name: i.default if i.default is not None or i.type != "choice" else i.choices[0]
                for i in self.inputs}


# -- inputs several methods share ---------------------------------------------------------------------------------

def percent_inputs(start: float = 0.0, end: float = 1.0) -> tuple[Input, Input]:
    return (
        Input("start_percent", "float", default=start, min=0.0, max=1.0, step=0.01, tooltip=(
            "Where in the schedule caching may begin (0 = the first step). Percent of the model's noise "
            "schedule, as in ComfyUI's other start/end percent inputs; earlier steps are always computed.")),
        Input("end_percent", "float", default=end, min=0.0, max=1.0, step=0.01, tooltip=(
            "Where caching stops (1 = the end). Later steps are always computed, and the last step unless 'last_step' "
            "is forecast.")),
    )


def last_step_input() -> Input:
    """The setting every decider has: whether the run's last step is always computed. Appended last and optional:
    a workflow saved without it keeps computing the last step."""
    return Input("last_step", "choice", default=LAST_STEP_COMPUTE, choices=LAST_STEP_CHOICES, optional=True, tooltip=(
        "compute: the last step is always computed, whatever the method decides. forecast: the method decides the "
        "last step as any other, so it may be skipped and forecast from the steps computed before it (a step with "
        "nothing cached yet is still computed). On Spectrum's schedule, forecasting the last step instead of "
        "computing it read 2.5 dB higher on the bundled digits model and 10 dB on the video model; which schedule "
        "is best depends on the model (bench/schedules.md)."))


def level_input() -> Input:
    """The setting of the whole-model deciders that forecast what they skip unchecked: where a skip is forecast.
    Appended last and optional: a workflow saved without it keeps forecasting the model output."""
    return Input("level", "choice", default=LEVEL_MODEL, choices=LEVEL_CHOICES, optional=True, tooltip=(
        "model: a skipped step does not run the model, and its output is forecast. features: the embeddings and the "
        "final layer run, every transformer block is passed by and each block group's output is forecast (per "
        "stream), on models whose transformer blocks the pack knows (elsewhere it works at model, with a note); it "
        "keeps block-stream residuals instead of model outputs. On the bundled models it mostly read below model at "
        "equal work (28 steps, TaylorSeer or Spectrum Forecast, mean over seeds: photos -2.7 to +0.1 dB, digits -5.4 "
        "to -0.2 dB, video -4.1 to +0.6 dB; bench/feature_level.md): compare both on your model."))


def threshold_input(default: float, tooltip: str, maximum: float = 100.0, step: float = 0.01) -> Input:
    return Input("threshold", "float", default=default, min=0.0, max=maximum, step=step, tooltip=tooltip)


def max_consecutive_input(default: int) -> Input:
    return Input("max_consecutive_cached", "int", default=default, min=-1, max=100, tooltip=(
        "Never skip more than this many steps in a row (-1: no limit). Low values bound the error of long "
        "reuse runs."))
