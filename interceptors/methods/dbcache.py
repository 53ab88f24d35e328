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
from ..kinds import Granularity, InterceptorError, Signal, check_range
from ..memory import Footprint
from ..metrics import relative_l1_of



def check_probe(label: str, front: int, back: int) -> None:
    """Reject a block split with no probe (``front`` < 1) or a negative number of back blocks."""
    if front < 1:
        raise InterceptorError(f"{label}: 'Fn' must be at least 1: the first block is the probe.")
    if back < 0:
        raise InterceptorError(f"{label}: 'Bn' must be 0 or more, got {back}.")


@dataclasses.dataclass(frozen=True)
class DBCache(Decider):
    kind = "dbcache"
    display_name = "DBCache"
    metric_name = "residual change (relative L1)"
    footprint = Footprint("block_streams", anchor="probe_residual")
    granularity = Granularity.BLOCKS
    signal = Signal.PROBE_RESIDUAL
    counts_steps = True

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
        total = card.total_blocks
        if Granularity.BLOCKS in card.levels and self.front + self.back >= total:
            return [f"{self.label}: Fn ({self.front}) + Bn ({self.back}) must leave blocks to cache, but "
                    f"{card.name} has {total} blocks. Lower Fn or Bn."]
        return []

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

    kind = "fbcache"
    display_name = "First Block Cache"

    def blocks(self) -> tuple[int, int]:
        return 1, 0
