"""The ordered, immutable chain of interceptors that config nodes build and samplers run.

A chain is validated when it is built (duplicates, two deciders at one granularity, an estimator
with nothing to estimate for) and again against the model before sampling starts (hook levels,
distillation). It never fails half way through a run.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable

from .base import Decider, Estimator, Interceptor
from .kinds import ChainError, Granularity
from .cards import ModelCard
from .reuse import ReuseLast


@dataclasses.dataclass(frozen=True)
class InterceptorChain:
    interceptors: tuple[Interceptor, ...] = ()

    def __post_init__(self) -> None:
        self.validate()

    @classmethod
    def of(cls, items: Iterable[Interceptor]) -> "InterceptorChain":
        return cls(tuple(items))

    def then(self, interceptor: Interceptor) -> "InterceptorChain":
        """A new chain with ``interceptor`` appended; the receiver is left untouched."""
        return InterceptorChain(self.interceptors + (interceptor,))

    def __len__(self) -> int:
        return len(self.interceptors)

    def __iter__(self):
        return iter(self.interceptors)

    @property
    def empty(self) -> bool:
        return not self.interceptors

    def decider(self, granularity: Granularity) -> Decider | None:
        for ic in self.interceptors:
            if isinstance(ic, Decider) and ic.granularity == granularity:
                return ic
        return None

    @property
    def deciders(self) -> list[Decider]:
        return [ic for ic in self.interceptors if isinstance(ic, Decider)]

    @property
    def estimator(self) -> Estimator:
        for ic in self.interceptors:
            if isinstance(ic, Estimator):
                return ic
        return ReuseLast()

    @property
    def alters_output(self) -> bool:
        return any(ic.alters_output for ic in self.interceptors)

    def validate(self) -> None:
        """Check the chain on its own. Messages name both nodes involved and what to change."""
        for ic in self.interceptors:
            if not isinstance(ic, Interceptor):
                raise ChainError(f"The interceptor chain holds {type(ic).__name__!r}, which is not an interceptor.")
            ic.validate()
        seen: dict[str, Interceptor] = {}
        for ic in self.interceptors:
            if ic.id in seen:
                raise ChainError(
                    f"{seen[ic.id].label} and {ic.label} are both {ic.display_name}: a chain may hold each "
                    f"method once. Remove one of them.")
            seen[ic.id] = ic
        by_level: dict[Granularity, Decider] = {}
        for ic in self.deciders:
            other = by_level.get(ic.granularity)
            if other is not None:
                raise ChainError(
                    f"{other.label} ({other.display_name}) and {ic.label} ({ic.display_name}) both decide which "
                    f"{_level_words(ic.granularity)} to skip. Keep one of them in this chain.")
            by_level[ic.granularity] = ic
        estimators = [ic for ic in self.interceptors if isinstance(ic, Estimator)]
        if len(estimators) > 1:
            raise ChainError(
                f"{estimators[0].label} and {estimators[1].label} both estimate skipped work. Keep one of them.")
        if estimators and not any(d.uses_estimator for d in self.deciders):
            raise ChainError(
                f"{estimators[0].label} forecasts skipped work but nothing in the chain skips any: add a caching "
                f"node (Fixed Cadence, DBCache, First Block Cache, ...) before or after it.")

    def problems_for(self, card: ModelCard) -> list[str]:
        """Everything that prevents this chain from running on the model the card describes."""
        problems = []
        for ic in self.interceptors:
            if ic.granularity is not None and not card.offers(ic.granularity):
                hint = ("Use the Adaptive Cache or Fixed Cadence node instead, which work on every model."
                        if ic.granularity == Granularity.BLOCKS else "")
                why = f" ({card.blocks_off})" if ic.granularity == Granularity.BLOCKS and card.blocks_off else ""
                problems.append(
                    f"{ic.label} ({ic.display_name}) works on {_level_words(ic.granularity)}, which "
                    f"{card.name} does not expose to caching{why}. {hint}".strip())
            problems.extend(ic.check_model(card))
        return problems

    def validate_for(self, card: ModelCard, allow_distilled: bool = False) -> None:
        problems = self.problems_for(card)
        if card.distilled and self.alters_output and not allow_distilled:
            names = ", ".join(ic.label for ic in self.interceptors if ic.alters_output)
            problems.append(
                f"{card.name} is step-distilled ({card.distilled}): with so few steps every step matters, and "
                f"{names} would skip or forecast model work and degrade the image. Remove the caching nodes, "
                f"or set 'allow_distilled' on the sampler to override.")
        if problems:
            raise ChainError("\n".join(problems))

    def compile_problems(self, compiler: str, blocks_apart: bool = False) -> list[str]:
        """Why this chain cannot run on a model that ``compiler`` compiled (empty when it can).

        Whole-model interceptors run around the compiled diffusion model and are unaffected. Interceptors
        that work inside the transformer blocks (and any that declare ``compile_safe = False``) would run
        inside a whole compiled graph, where ComfyUI's compile wrapper does not re-check the per-step state they
        keep: the compiled blocks would silently ignore or freeze their decisions. With ``blocks_apart`` each
        block is a graph of its own and the decisions run between them, so block-level interceptors run too.
        """
        unsafe = [ic for ic in self.interceptors if not ic.compile_safe
                  or (ic.granularity == Granularity.BLOCKS and not blocks_apart)]
        if not unsafe:
            return []
        names = ", ".join(f"{ic.label} ({ic.display_name})" for ic in unsafe)
        return [f"{names} works inside the transformer blocks, which {compiler} compiled: the compiled model would "
                f"not follow its per-step decisions and the result would be silently wrong. Use a whole-model "
                f"method (Fixed Cadence or Adaptive Cache) with the compiled model, or remove the {compiler} node."]

    def describe(self) -> str:
        return " -> ".join(ic.describe() for ic in self.interceptors) or "(empty)"


def _level_words(granularity: Granularity) -> str:
    return {Granularity.BLOCKS: "transformer blocks", Granularity.GUIDANCE: "CFG branches"}.get(
        granularity, "whole model steps")
