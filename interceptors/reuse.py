"""Plain reuse: a skipped computation takes the value observed at the last computed step.

This is what FORA (Selvaraju et al. 2024, arXiv 2407.01425), FBCache and DBCache do by default, and
what the engine uses when the chain holds no estimator. It keeps one tensor per slot.
"""
from __future__ import annotations

import dataclasses

import torch

from .base import Estimator


@dataclasses.dataclass(frozen=True)
class ReuseLast(Estimator):
    declaration = Estimator.declaration.but(kind="reuse", display_name="Reuse last", alters_output=True)

    @dataclasses.dataclass
    class Slot:
        value: torch.Tensor | None = None

    def observe(self, slot: Slot, value: torch.Tensor, sigma: float) -> None:
        slot.value = value

    def ready(self, slot: Slot) -> bool:
        return slot.value is not None

    def estimate(self, slot: Slot, sigma: float, device: torch.device) -> torch.Tensor:
        return slot.value.to(device)

    def terms(self, slot: Slot, sigma: float) -> list[tuple[float, torch.Tensor]]:
        return [(1.0, slot.value)]
