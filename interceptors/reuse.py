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
    kind = "reuse"
    display_name = "Reuse last"
    alters_output = True

    def observe(self, slot: dict, value: torch.Tensor, sigma: float) -> None:
        slot["value"] = value

    def ready(self, slot: dict) -> bool:
        return "value" in slot

    def estimate(self, slot: dict, sigma: float) -> torch.Tensor:
        return slot["value"]
