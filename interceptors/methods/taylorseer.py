"""TaylorSeer forecasting: extrapolate a skipped computation from the last computed ones.

Liu et al., "From Reusing to Forecasting: Accelerating Diffusion Models with TaylorSeers" (ICCV 2025,
arXiv 2503.06923) expand features in a Taylor series built from finite differences between computed
steps. Step counts are a poor clock in ComfyUI, whose schedules are non-uniform (shift, Karras, beta),
so the differences here are divided differences in sigma, and the forecast is the polynomial through
the last ``order + 1`` computed points evaluated at the current sigma (Newton/Lagrange form). It keeps
``order + 1`` tensors per cached quantity, not one per module as the original does.

Points are kept in the dtype they arrive in (the model's compute dtype for block residuals: half the memory
of float32 in bf16/fp16, and measured to give the same images, see docs/memory.md), but the combination is
formed in float32 (or wider): extrapolation weights exceed 1 and have mixed signs, so in half precision each product
would be rounded at its own, larger magnitude before nearly equal terms cancel. The caller casts the result
to the dtype it needs.
"""
from __future__ import annotations

import dataclasses

import torch

from ..base import Estimator
from ..kinds import InterceptorError
from ..spec import Input, MethodSpec, Prose


@dataclasses.dataclass(frozen=True)
class TaylorSeer(Estimator):
    declaration = Estimator.declaration.but(kind="taylorseer", display_name="TaylorSeer", alters_output=True)

    order: int = 1

    def validate(self) -> None:
        if int(self.order) != self.order or not 0 <= self.order <= 2:
            raise InterceptorError(f"{self.label}: 'order' must be 0, 1 or 2, got {self.order}.")

    @dataclasses.dataclass
    class Slot:
        points: list[tuple[float, torch.Tensor]] = dataclasses.field(default_factory=list)  # (sigma, value)

    def observe(self, slot: Slot, value: torch.Tensor, sigma: float) -> None:
        # A sigma seen before (second-order samplers repeat one; a non-monotone custom schedule may return to
        # one) replaces the older point: two nodes at one sigma have no interpolating polynomial.
        points = [p for p in slot.points if not same_sigma(p[0], sigma)]
        points.append((sigma, value))
        slot.points = points[-(self.order + 1):]

    def ready(self, slot: Slot) -> bool:
        return bool(slot.points)

    def estimate(self, slot: Slot, sigma: float, device: torch.device) -> torch.Tensor:
        points = slot.points
        weights = lagrange_weights([s for s, _ in points], sigma)
        first = points[0][1]
        out = first.to(device=device, dtype=torch.promote_types(first.dtype, torch.float32)) * weights[0]
        for (_, value), w in zip(points[1:], weights[1:]):
            out.add_(value.to(device), alpha=w)  # accumulates in ``out``'s dtype: float32 (float64 for a float64 model)
        return out

    def terms(self, slot: Slot, sigma: float) -> list[tuple[float, torch.Tensor]]:
        return list(zip(lagrange_weights([s for s, _ in slot.points], sigma), [v for _, v in slot.points]))


def same_sigma(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(abs(a), abs(b), 1e-6)


def lagrange_weights(nodes: list[float], at: float) -> list[float]:
    """Weights w_i with p(at) = sum w_i f(nodes_i) for the interpolating polynomial through ``nodes``
    (distinct nodes)."""
    weights = []
    for i, si in enumerate(nodes):
        w = 1.0
        for j, sj in enumerate(nodes):
            if i != j:
                w *= (at - sj) / (si - sj)
        weights.append(w)
    return weights


SPECS = (MethodSpec(
    "TaylorSeer", "TaylorSeer Forecast",
    "Forecasts skipped work instead of reusing it stale (TaylorSeer, arXiv 2503.06923): a polynomial in sigma "
    "through the last computed steps. Chain it with a caching node (DBCache, First Block Cache, Fixed Cadence, "
    "Adaptive Cache); it decides nothing by itself.",
    (Input("order", "int", default=1, min=0, max=2, tooltip=(
        "0 reuses the last value; 1 extrapolates linearly (recommended); 2 adds curvature (more aggressive).")),),
    lambda order: TaylorSeer(order=order),
    TaylorSeer,
    Prose(when=(
        "Chain it after any caching node (Fixed Cadence, First Block Cache, DBCache, Adaptive Cache, TeaCache, "
        "MagCache): skipped work is then forecast by a polynomial in sigma through the last computed steps "
        "instead of reused stale, which allows a higher threshold or interval at the same quality. Alone it "
        "decides nothing and is refused.",
    ), families=(
        ("Any model", "order 1; order 2 overshoots on long gaps, order 0 is plain reuse"),
    )),
    summary="Forecasts skipped work in sigma instead of reusing it. Needs a decider in the chain.",
),)
