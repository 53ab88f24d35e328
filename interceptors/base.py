"""Contracts shared by every interceptor: what it is, what it may touch, and how it is told apart.

An interceptor is an immutable description of one caching behaviour (a frozen dataclass made by a
config node). Everything it learns while sampling lives in the run (:class:`~.run.Run`, the part of
:class:`~.state.LoopState` a method may use), never on the interceptor itself, so one config can feed any
number of samplers and prompts.
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Sequence

import torch

from .cards import ModelCard
from .kinds import (LAST_STEP_CHOICES, LAST_STEP_COMPUTE, LEVEL_CHOICES, LEVEL_FEATURES, LEVEL_MODEL, Granularity,
                    InterceptorError, Role, Signal, check_range)
from .memory import Footprint, at_features
from .metrics import Measure, combined_each
from .records import Evaluation, Forward
from .run import Run


@dataclasses.dataclass(frozen=True)
class Declaration:
    """What a method class is, declared once per class as ``declaration`` (read ``type(x).declaration.<field>``,
    or ``x.<field>`` on the class or an instance). The defaults below hold for every class that does not say
    otherwise; the decider fields mean nothing to an estimator."""

    kind: str = "interceptor"            # the id of its decisions and state in a run; unique within a chain
    display_name: str = "Interceptor"    # how messages and the summary name it
    role: Role = Role.DECIDER
    granularity: Granularity | None = None  # the level it decides at; None: whatever the decider uses
    alters_output: bool = True           # False: it only watches (a calibration's recording)
    # False: refuse to run on a model compiled by TorchCompileModel. Block-level interceptors are refused there
    # whatever they declare: they run inside the compiled graph (see InterceptorChain.compile_problems).
    compile_safe: bool = True
    # True: the RunState is the run's result (a calibration's recordings) and outlives the run's caches.
    keeps_results: bool = False
    # -- deciders --
    signal: Signal = Signal.NONE         # what the engine hands to Decider.decide
    # False: the decider estimates what it skips itself (the Guidance Cache's own forecast), so a chained
    # estimator has nothing to estimate for it
    uses_estimator: bool = True
    # True: some setting counts steps of the model's schedule (a warm-up, a ratio curve), so the run must know
    # where its steps sit in that schedule (Evaluation.position).
    counts_steps: bool = False
    # True: on a computed whole-model forward the engine also forecasts the output (what a skip would have used)
    # and hands it over in ``forward.forecasts`` before the estimator sees the computed one.
    verifies_forecast: bool = False
    # True: its skip is a forecast checked against the signals it measured (the verified methods). The evaluation's
    # decision is taken on the first model call; where the CFG branches come in separate calls, the run says that
    # the branches of the later ones were skipped unchecked.
    checks_forecast: bool = False
    # the last step is computed whatever the rule says; a plan whose quality was measured with it forecast says False
    forces_last_step: bool = True
    # What the metric it reports (``run.report_metric``) measures: the tuning plot's y axis and the live text's
    # wording. None: no name of its own (shown as "change metric").
    metric_name: str | None = None
    # True: its metric is named only where no other decider of the chain reports one (a decider beside a step or
    # block cache, whose metric the plot and the live text then show).
    metric_secondary: bool = False
    # What it keeps between steps per CFG branch, for interceptors/memory.py's arithmetic; None: not counted there.
    footprint: Footprint | None = None
    # True: what it measures can be taken by each device's thread of native multi-GPU on its own rows and joined
    # (``Decider.gathered``) into what one device measures on all of them, so the threads decide once, as one
    # device (threads.py); what it measures after a computed step is pooled over them the same way.
    gathers_over_threads: bool = False

    def but(self, **changes) -> "Declaration":
        """This declaration with ``changes``: a subclass's, from its parent's."""
        return dataclasses.replace(self, **changes)


DECLARED = tuple(f.name for f in dataclasses.fields(Declaration))


class _Declared:
    """One field of the class's declaration, read on the class or on an instance."""

    def __init__(self, name: str):
        self.name = name

    def __get__(self, obj, owner):
        return getattr(owner.declaration, self.name)


@dataclasses.dataclass(frozen=True)
class Interceptor:
    """Base of every interceptor.

    Subclasses state what they are in ``declaration`` (:class:`Declaration`, usually their parent's ``.but(...)``)
    and add their parameters as dataclass fields. ``node`` names the config node that made it so that every error
    can point the user at the right place in the graph.
    """

    declaration: ClassVar[Declaration] = Declaration()
    # What the interceptor learns during one run, as a dataclass with named fields: the run makes a fresh
    # one (LoopState.state_of) and drops it with the run. BranchState is the same, one per CFG branch
    # (LoopState.branch_of), for what must never leak from one branch's cache into another's.
    RunState: ClassVar[type | None] = None
    BranchState: ClassVar[type | None] = None

    node: str = dataclasses.field(default="", compare=False)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # one place per class: a loose flag would disagree with type(x).declaration. A property may compute a field
        # from the instance's settings (the Guidance Cache's footprint, from its mode).
        loose = [name for name in DECLARED if name in vars(cls) and not isinstance(vars(cls)[name], property)]
        if loose:
            raise TypeError(f"{cls.__qualname__}: declare {', '.join(loose)} in its declaration "
                            f"(declaration = {cls.__mro__[1].__name__}.declaration.but(...))")

    @property
    def id(self) -> str:
        return self.kind

    @property
    def label(self) -> str:
        """How messages refer to this interceptor: its node if known, else its display name."""
        return f"'{self.node}'" if self.node else f"'{self.display_name}'"

    def validate(self) -> None:
        """Raise :class:`InterceptorError` for impossible parameters. Called when the chain is built."""

    def check_model(self, card: ModelCard) -> list[str]:
        """Problems running on this model (empty when fine). Called before sampling starts."""
        return []

    def with_node(self, node: str) -> "Interceptor":
        return dataclasses.replace(self, node=node)

    def describe(self) -> str:
        fields = [f for f in dataclasses.fields(self) if f.name != "node"]
        params = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields)
        return f"{self.display_name}({params})"


for _name in DECLARED:  # x.kind, type(x).footprint, ...: its declaration's
    setattr(Interceptor, _name, _Declared(_name))


@dataclasses.dataclass(frozen=True)
class Decider(Interceptor):
    """Chooses, once per sampler evaluation, whether the model work it covers is computed or skipped.

    ``signal`` (:class:`~.kinds.Signal`) says what the engine must hand to :meth:`decide`; the probe residual and
    the modulated input are tensors the engine made for the decider, which nothing modifies afterwards
    (``run.keep(signals, copy=False)`` may keep them as they are).

    The settings every decider has, enforced by the run before its rule is asked (``LoopState.forced``): the
    ``start_percent``/``end_percent`` window, and ``max_consecutive_cached``, the most evaluations in a row whose
    work it may skip (-1: no limit). The first evaluation, sigma 0 and (unless ``forces_last_step`` is False or
    ``last_step`` is "forecast") the last step are computed too.

    Block vocabulary, used throughout the core: the *front* blocks (the papers' Fn, DBCache's "first n") always
    run and their residual is the *probe*; the *back* blocks (Bn, "last n") always run too; the blocks between
    them form one skippable *segment* per block group.
    """

    start_percent: float = 0.0
    end_percent: float = 1.0
    max_consecutive_cached: int = -1
    last_step: str = LAST_STEP_COMPUTE  # "forecast": the rule decides the last step too (kinds.LAST_STEP_CHOICES)
    # "features": a whole-model decider's skip runs the forward with every transformer block passed through and each
    # block group's residual forecast (kinds.LEVEL_CHOICES; engine.model_forward)
    level: str = LEVEL_MODEL

    def validate(self) -> None:
        if self.last_step not in LAST_STEP_CHOICES:
            raise InterceptorError(f"{self.label}: 'last_step' must be one of {', '.join(LAST_STEP_CHOICES)}, "
                                   f"got {self.last_step!r}.")
        if self.level not in LEVEL_CHOICES:
            raise InterceptorError(f"{self.label}: 'level' must be one of {', '.join(LEVEL_CHOICES)}, "
                                   f"got {self.level!r}.")
        if self.level == LEVEL_FEATURES and (self.granularity != Granularity.MODEL or self.verifies_forecast):
            raise InterceptorError(f"{self.label}: 'level' {LEVEL_FEATURES} is for the whole-model methods that "
                                   f"forecast what they skip unchecked (Fixed Cadence, Adaptive Cache, Auto "
                                   f"Calibrate's plans); set it to {LEVEL_MODEL}.")
        check_range(self.label, "start_percent", self.start_percent, 0.0, 1.0)
        check_range(self.label, "end_percent", self.end_percent, 0.0, 1.0)
        check_range(self.label, "max_consecutive_cached", self.max_consecutive_cached, -1)
        if self.start_percent >= self.end_percent:
            raise InterceptorError(
                f"{self.label}: 'start_percent' ({self.start_percent}) must be below 'end_percent' "
                f"({self.end_percent}); nothing would ever be cached.")

    def blocks(self) -> tuple[int, int]:
        """(front, back): how many blocks always run before and after the skippable segments."""
        return 0, 0

    @property
    def threshold_rule(self) -> str:
        """What its threshold means, as the tuning plot's legend and the live text say it."""
        return "skip below"

    def refreshes_back(self, run: Run, ev: Evaluation) -> bool:
        """On an evaluation this decider skips, whether the back blocks run anyway (the middle tier of a plan made
        with ``back_tier``); asked once per forward, after :meth:`decide`."""
        return False

    def measure(self, run: Run, ev: Evaluation, signals: dict[Any, torch.Tensor] | None) -> list[Measure]:
        """The change measures :meth:`decide` will read (``metrics.*_of``: sums still on the device). The run
        brings them to the host in one transfer with the evaluation's sigma, so a decision costs one device sync.
        Called before the window and first/last-step guards: change no state here, and read nothing of the
        evaluation's schedule place (``ev.sigma``, ``ev.step``, ``ev.progress``): the sampler's sigma may still be on
        the device, and reading it then raises :class:`~.records.PlaceNotRead`."""
        return []

    def gathered(self, parts: list[list[Measure]]) -> list[Measure] | None:
        """What :meth:`measure` would have returned over the rows of every device thread of an evaluation, from
        each thread's own measures (``parts``, transferred, in the order of the rows' branches), for a decider
        that ``gathers_over_threads``: by default each measure's sums added before its ratio
        (:func:`~.metrics.combined`). None where they cannot be joined: the evaluation is computed."""
        joined = combined_each(parts)  # None: the threads measured differently (one had no anchor yet)
        return None if joined is None or any(m is None for m in joined) else joined

    def sampling_sigmas(self, sigmas: Sequence[float], sampler: str) -> Sequence[float] | None:
        """The sigmas a run asking for ``sigmas`` with ``sampler`` (``LoopState.sampler``) steps through instead,
        swapped in by the adapter before the run starts; None (every decider but an aligned plan): its own."""
        return None

    def decide(self, run: Run, ev: Evaluation, signals: dict[Any, torch.Tensor] | None,
               measured: list[Measure]) -> bool:
        """Return True to compute, False to skip. Window and first/last-step guards are applied before.
        ``measured``: what :meth:`measure` returned, transferred (``m.value()``). A skip is a wish: where a branch
        has no cache yet the engine computes, calls :meth:`computed`, and the run's bookkeeping
        (``run.decisions_of``) counts a computed evaluation. Keep what you learn in ``RunState`` /
        ``BranchState``, and tensors through ``run.keep`` (detached, on the run's cache device)."""
        raise NotImplementedError

    def computed(self, run: Run, ev: Evaluation, forward: Forward,
                 signals: dict[Any, torch.Tensor] | None, outputs: dict[Any, torch.Tensor] | None = None) -> None:
        """Told after each computed forward, with that forward's signals (to move anchors) and, at whole-model
        level, its outputs in epsilon space. A forward also computes on an evaluation :meth:`decided_to_compute`
        says was to be skipped, where its branch had nothing cached yet (a context window new to the run): what
        is kept per branch moves then, but what accumulates over the run must not start over (see there)."""

    def decided_to_compute(self, ev: Evaluation) -> bool:
        """Whether ``ev``'s decision was to compute (forced or by the rule). Only such an evaluation computes every
        branch it can: on one decided to skip, the branches that had something cached reused it, so an error or a
        skip count accumulated over the run goes on from where it was; started over there, the branches that
        reused would exceed the decider's limits (the moving context windows of ComfyUI's uniform schedules bring
        a new window, computed, on every step)."""
        return ev.decisions.get(self.id, True)


class _FootprintAtLevel(_Declared):
    """A decider's footprint: its declaration's, or at the feature level what the block stack's forecast keeps."""

    def __get__(self, obj, owner):
        declared = super().__get__(obj, owner)
        if obj is not None and declared is not None and obj.level == LEVEL_FEATURES:
            return at_features(declared)
        return declared


Decider.footprint = _FootprintAtLevel("footprint")


@dataclasses.dataclass(frozen=True)
class GuidanceDecider(Decider):
    """A decider of the guidance level (``Granularity.GUIDANCE``): on the evaluations its rule picks, the negative
    entries of the guider's standard ``[positive, negative]`` call are left out and the negative prediction is
    estimated from the positive one. The engine (``engine.guided_batch``) keeps one history per call shape (a
    context window), hands it to :meth:`decide` as the signal and tells the decider, in epsilon space, what each
    evaluation computed or left out; what the history holds is the decider's."""

    declaration = Declaration(granularity=Granularity.GUIDANCE, signal=Signal.GUIDANCE,
                              uses_estimator=False)  # it forecasts the negative branch itself

    @property
    def never_skips(self) -> bool:
        """True where its settings compute both branches on every evaluation (bit-identical)."""
        raise NotImplementedError

    def history(self, run: Run, ev: Evaluation, key, conditioning: tuple) -> Any:
        """The negative branch's history for call shape ``key``, started over where the active ``conditioning``
        entries changed. It has a ``slot`` whose ``points`` say whether anything was learned yet."""
        raise NotImplementedError

    def learned(self, run: Run, state, eps_positive: torch.Tensor, eps_negative: torch.Tensor, now: float, *,
                denoised: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Both branches were computed at sigma ``now``: learn from them."""
        raise NotImplementedError

    def left_out(self, state, model_ran: bool) -> None:
        """The negative branch was left out of an evaluation; ``model_ran``: the positive one really computed."""
        raise NotImplementedError

    def estimated(self, state, eps_positive: torch.Tensor, now: float) -> torch.Tensor:
        """The negative prediction at ``now``, from the positive one just computed."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class RecordingDecider(Decider):
    """Computes everything and only watches: the calibration passes, whose output must equal the plain run."""

    declaration = Declaration(alters_output=False, keeps_results=True)

    def decide(self, run: Run, ev: Evaluation, signals, measured) -> bool:
        return True


@dataclasses.dataclass(frozen=True)
class Estimator(Interceptor):
    """Supplies the value used in place of a skipped computation, from what was observed before.

    ``Slot`` is the dataclass of what it keeps per branch and cached quantity; the LoopState makes one per
    slot and drops them with the run. Observed values arrive on the run's cache device; ``estimate`` does
    its arithmetic on ``device``, the device of the tensor it stands in for.
    """

    declaration = Declaration(role=Role.ESTIMATOR)
    Slot: ClassVar[type]

    def new_slot(self, schedule: Sequence[float]):
        """A fresh slot for a run sampling ``schedule`` (its sigmas, first to last). Most estimators need only
        the sigmas they observe; one that normalises time by the run's range (Spectrum) takes it from here."""
        return self.Slot()

    def observe(self, slot, value: torch.Tensor, sigma: float) -> None:
        raise NotImplementedError

    def ready(self, slot) -> bool:
        raise NotImplementedError

    def estimate(self, slot, sigma: float, device: torch.device) -> torch.Tensor:
        raise NotImplementedError

    def terms(self, slot, sigma: float) -> list[tuple[float, torch.Tensor]] | None:
        """The forecast at ``sigma`` as ``(weight, kept tensor)`` pairs, for an estimator whose forecast is such a
        linear combination (None otherwise): what lets a decider know a forecast's error from sums alone."""
        return None


class Observer:
    """Read-only hooks. Observers see every evaluation and forward but never change a tensor."""

    def on_forward(self, run: Run, forward: Forward, output: torch.Tensor) -> None:
        pass

    def on_evaluation_end(self, run: Run, ev: Evaluation) -> None:
        pass
