"""DBCache (Dual Block Cache) and its First Block Cache preset.

The first ``Fn`` blocks always run and act as the probe; the last ``Bn`` always run and refine the
approximated state; the blocks in between are skipped while the relative L1 change of the probe's
residual since the last fully computed step stays under the threshold. In the core, Fn is ``front`` and
Bn is ``back`` (the node inputs keep the papers' names). ``warmup`` is a fraction of the model's whole
schedule, so a second stage or a partial denoise does not warm up again. From vipshop/cache-dit
(``docs/user_guide/DBCACHE_DESIGN.md``); Fn=1, Bn=0 is First Block Cache (chengzeyi/ParaAttention,
Comfy-WaveSpeed).
"""
from __future__ import annotations

import dataclasses

import torch

from ..base import Decider
from ..cards import ModelCard
from ..kinds import LAST_STEP_COMPUTE, Anchor, Cached, Granularity, InterceptorError, Signal, check_range
from ..memory import Footprint
from ..metrics import relative_l1_of
from ..spec import (Example, Input, MemoryRow, MethodSpec, Prose, Sweep, WINDOW, last_step_input,
                    max_consecutive_input, percent_inputs, threshold_input)



def check_probe(label: str, front: int, back: int, why: str = "the first block is the probe") -> None:
    """Reject a block split with no front block (``front`` < 1; ``why`` it needs one) or a negative number of back
    blocks."""
    if front < 1:
        raise InterceptorError(f"{label}: 'Fn' must be at least 1: {why}.")
    if back < 0:
        raise InterceptorError(f"{label}: 'Bn' must be 0 or more, got {back}.")


def split_problems(label: str, front: int, back: int, card: ModelCard, what: str) -> list[str]:
    """The model-check of a block split: ``front`` + ``back`` must leave blocks between them to ``what``."""
    if Granularity.BLOCKS in card.levels and front + back >= card.total_blocks:
        return [f"{label}: Fn ({front}) + Bn ({back}) must leave blocks to {what}, but {card.name} has "
                f"{card.total_blocks} blocks. Lower Fn or Bn."]
    return []


@dataclasses.dataclass(frozen=True)
class DBCache(Decider):
    declaration = Decider.declaration.but(
        kind="dbcache",
        display_name="DBCache",
        metric_name="residual change (relative L1)",
        footprint=Footprint(Cached.BLOCK_STREAMS, anchor=Anchor.PROBE_RESIDUAL),
        granularity=Granularity.BLOCKS,
        signal=Signal.PROBE_RESIDUAL,
        counts_steps=True,
        gathers_over_threads=True,
    )

    front: int = 1
    back: int = 0
    threshold: float = 0.12
    warmup: float = 0.1
    max_cached_steps: int = -1
    max_consecutive_cached: int = 3  # the shared limit (Decider), on by default here

    def validate(self) -> None:
        super().validate()
        check_probe(self.label, self.front, self.back)
        check_range(self.label, "threshold", self.threshold, 0.0)
        check_range(self.label, "warmup", self.warmup, 0.0, 1.0)
        check_range(self.label, "max_cached_steps", self.max_cached_steps, -1)

    def blocks(self) -> tuple[int, int]:
        return self.front, self.back

    def check_model(self, card: ModelCard) -> list[str]:
        return split_problems(self.label, self.front, self.back, card, "cache")

    @dataclasses.dataclass
    class BranchState:
        anchor: torch.Tensor | None = None  # probe residual at the last computed evaluation

    def measure(self, run, ev, signals) -> list:
        if self.threshold <= 0 or not signals:
            return []
        anchors = {k: run.branch_of(self, k).anchor for k in signals}
        return [relative_l1_of(signals, {k: v for k, v in anchors.items() if v is not None}, run.group)]

    def decide(self, run, ev, signals, measured) -> bool:
        if not measured or ev.progress < self.warmup:
            return True
        if 0 <= self.max_cached_steps <= run.decisions_of(self).skips:
            return True
        diff = measured[0].value()
        if diff is None or diff != diff:  # no anchor yet, or a NaN probe: compute
            return True
        run.report_metric(self, diff, self.threshold)
        return diff >= self.threshold

    def computed(self, run, ev, forward, signals, outputs=None) -> None:
        for key, residual in run.keep(signals, copy=False).items():  # the engine's probe residual
            run.branch_of(self, key).anchor = residual


@dataclasses.dataclass(frozen=True)
class FirstBlockCache(DBCache):
    """First Block Cache: DBCache with Fn=1, Bn=0 (its own kind, since users look for it by name)."""

    declaration = DBCache.declaration.but(kind="fbcache", display_name="First Block Cache")

    def blocks(self) -> tuple[int, int]:
        return 1, 0


# -- the nodes ----------------------------------------------------------------------------------------------------

_THRESHOLD = ("Relative L1 change of the probe blocks' residual since the last computed step under which "
              "the middle blocks are skipped. 0 disables caching (bit-identical output). Flux: 0.08-0.2; "
              "Wan/HunyuanVideo: 0.05-0.15.")
_SKIP_LIMITS = (
    Input("warmup", "float", default=0.1, min=0.0, max=1.0, step=0.01, tooltip=(
        "Fraction of the steps at the start that are always computed (the image layout is decided there).")),
    Input("max_cached_steps", "int", default=-1, min=-1, max=10000, tooltip=(
        "At most this many steps skipped in the whole run (-1: no limit).")),
    max_consecutive_input(3), *percent_inputs(), last_step_input())
# Where to start, the same for both nodes (First Block Cache adds the bundled model's measurement)
_FAMILIES = (
    ("Flux.1 dev, 28 steps", "0.08 (lossless) to 0.2 (2.9x wall time, slight degradation)"),
    ("HunyuanVideo, LTXV; a start for HunyuanVideo 1.5 and LTX-2", "0.1"),
    ("SD3.5", "0.12"),
    ("Wan 2.1 / 2.2", "0.05-0.15"),
    ("Other block-hooked families (Qwen-Image, Flux 2, LongCat-Image, ...)", "no published value: start at 0.05 and raise it while reading the tuning plot"),
)
_THRESHOLD_SWEEP = (0.0, 0.1, 0.15, 0.2, 0.3, 0.4)

SPECS = (
    MethodSpec(
        "DBCache", "DBCache",
        "Dual Block Cache (vipshop/cache-dit): the first Fn blocks always run and probe how much the step changes; "
        "the last Bn blocks always run and refine; the blocks in between are skipped while the probe's residual "
        "barely changes. Needs a model with transformer-block hooks (Flux, Wan, HunyuanVideo, Qwen-Image, SD3, ...).",
        (Input("Fn", "int", default=1, min=1, max=200, tooltip="Front blocks that always run; they are the probe."),
         Input("Bn", "int", default=0, min=0, max=200, tooltip="Back blocks that always run after the cached middle."),
         threshold_input(0.12, _THRESHOLD, step=0.005), *_SKIP_LIMITS),
        lambda Fn, Bn, threshold, warmup, max_cached_steps, max_consecutive_cached, start_percent, end_percent,
        last_step=LAST_STEP_COMPUTE:
        DBCache(front=Fn, back=Bn, threshold=threshold, warmup=warmup, max_cached_steps=max_cached_steps,
                max_consecutive_cached=max_consecutive_cached, start_percent=start_percent, end_percent=end_percent,
                last_step=last_step),
        DBCache,
        Prose(when=(
            "A block-level cache for transformer models: the first `Fn` blocks always run and probe how much the "
            "step changes, the last `Bn` always run and refine, and the blocks between are skipped while the "
            "probe's residual barely changes. More `Fn`/`Bn` is safer and saves less; Fn 1, Bn 0 is First Block "
            "Cache. Models without block hooks are refused with a pointer to the Adaptive Cache.",
        ), families=_FAMILIES),
        sweep=Sweep("dbcache", _THRESHOLD_SWEEP, quick=(0.0, 0.15, 0.3)),
        examples=(
            Example("dbcache", (("DBCache", dict(Fn=1, Bn=0, threshold=1.0, warmup=0.0, max_consecutive_cached=3,
                                                 max_cached_steps=-1, **WINDOW),
                                 dict(Fn=1, Bn=0, threshold=0.0, warmup=0.0, max_consecutive_cached=3,
                                      max_cached_steps=-1, **WINDOW)),)),
            Example("dbcache + taylorseer", (
                ("DBCache", dict(Fn=1, Bn=1, threshold=50.0, warmup=0.0, max_consecutive_cached=2, max_cached_steps=-1,
                                 **WINDOW),
                 dict(Fn=1, Bn=1, threshold=0.0, warmup=0.0, max_consecutive_cached=2, max_cached_steps=-1, **WINDOW)),
                ("TaylorSeer", dict(order=2), dict(order=2)))),
        ),
        memory=(MemoryRow("DBCache, First Block Cache"),),
        summary="Probe-driven block cache. Block-hooked models.",
    ),
    MethodSpec(
        "FirstBlockCache", "First Block Cache",
        "First Block Cache (ParaAttention / WaveSpeed FBCache): block 1 always runs and probes the change; all later "
        "blocks are skipped while its residual barely changes. DBCache with Fn=1, Bn=0.",
        (threshold_input(0.12, _THRESHOLD, step=0.005), *_SKIP_LIMITS),
        lambda threshold, warmup, max_cached_steps, max_consecutive_cached, start_percent, end_percent,
        last_step=LAST_STEP_COMPUTE:
        FirstBlockCache(threshold=threshold, warmup=warmup, max_cached_steps=max_cached_steps,
                        max_consecutive_cached=max_consecutive_cached, start_percent=start_percent,
                        end_percent=end_percent, last_step=last_step),
        FirstBlockCache,
        Prose(when=(
            "The block-level cache to try first on a transformer model: block 1 runs every step and probes the "
            "change, the other blocks are skipped while its residual barely changes (DBCache with Fn 1, Bn 0). "
            "Chain TaylorSeer Forecast to afford a higher threshold at the same quality.",
        ), families=(
            *_FAMILIES,
            ("Bundled digits model, 20 steps (measured, + TaylorSeer)", "0.25: 38% less work at 46 dB; past 0.3 quality drops fast"),
        )),
        examples=(
            Example("fbcache", (("FirstBlockCache", dict(threshold=50.0, warmup=0.0, max_consecutive_cached=3,
                                                         max_cached_steps=-1, **WINDOW),
                                 dict(threshold=0.0, warmup=0.0, max_consecutive_cached=3, max_cached_steps=-1,
                                      **WINDOW)),)),
        ),
        sweep=Sweep("fbcache", _THRESHOLD_SWEEP, quick=(0.0, 0.15, 0.3)),
        summary="DBCache with Fn=1, Bn=0.",
    ),
)
