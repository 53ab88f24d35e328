"""TaylorSeer forecasting: extrapolate a skipped computation from the last computed ones.

Liu et al., "From Reusing to Forecasting: Accelerating Diffusion Models with TaylorSeers" (ICCV 2025,
arXiv 2503.06923) expand features in a Taylor series built from finite differences between computed
steps. Step counts are a poor clock in ComfyUI, whose schedules are non-uniform (shift, Karras, beta),
so the differences here are divided differences in sigma, and the forecast is the polynomial through
the last ``order + 1`` computed points evaluated at the current sigma (Newton/Lagrange form). It keeps
``order + 1`` tensors per cached quantity, not one per module as the original does.

``damping`` shrinks the polynomial's Newton terms, taken from the newest point back: the k-th is multiplied by
``(1 - damping) ** k`` (the scaling HiCache, Feng et al., arXiv 2508.16984, applies to TaylorSeer's terms), so a
forecast over a long gap follows the last trend less far. 0 is TaylorSeer as published; 1 reuses the last point.
On the bundled video model 0.2 read 1-3 dB higher over the growing cadence's long gaps, ahead of Spectrum's port at
every floor from 31 to 45 dB; on the digits model it read lower (bench/damped_forecast.md).

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
from ..kinds import check_range, check_whole
from ..spec import Input, MethodSpec, Prose


@dataclasses.dataclass(frozen=True)
class TaylorSeer(Estimator):
    declaration = Estimator.declaration.but(kind="taylorseer", display_name="TaylorSeer", alters_output=True)

    order: int = 1
    damping: float = 0.0

    def validate(self) -> None:
        check_whole(self.label, "order", self.order, 0, 2)
        check_range(self.label, "damping", self.damping, 0.0, 1.0)

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
        weights = forecast_weights([s for s, _ in points], sigma, self.damping)
        first = points[0][1]
        out = first.to(device=device, dtype=torch.promote_types(first.dtype, torch.float32)) * weights[0]
        for (_, value), w in zip(points[1:], weights[1:]):
            out.add_(value.to(device), alpha=w)  # accumulates in ``out``'s dtype: float32 (float64 for a float64 model)
        return out

    def terms(self, slot: Slot, sigma: float) -> list[tuple[float, torch.Tensor]]:
        return list(zip(forecast_weights([s for s, _ in slot.points], sigma, self.damping),
                        [v for _, v in slot.points]))


def same_sigma(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(abs(a), abs(b), 1e-6)


@dataclasses.dataclass(frozen=True, order=True)
class Forecast:
    """A TaylorSeer setting as the plan search names one (``order``, ``damping``); a bare order is undamped."""
    order: int
    damping: float = 0.0

    @classmethod
    def of(cls, forecast: "int | Forecast") -> "Forecast":
        return forecast if isinstance(forecast, Forecast) else cls(int(forecast))

    def __str__(self) -> str:
        if self.order == 0:
            return "reused"
        return f"forecast by TaylorSeer order {self.order}" + (f", damping {self.damping:g}" if self.damping else "")


def forecast_weights(nodes: list[float], at: float, damping: float = 0.0) -> list[float]:
    """TaylorSeer's weights on the values at ``nodes`` (oldest first) for the forecast at ``at``: the interpolating
    polynomial written in Newton form from the newest node back, its k-th term scaled by ``(1 - damping) ** k``.
    Term k is the polynomial through the newest k + 1 nodes minus the one through the newest k."""
    if not damping:
        return lagrange_weights(nodes, at)
    n = len(nodes)
    weights = [0.0] * (n - 1) + [1.0]
    lower = [1.0]  # the polynomial through the newest node alone: that value
    for k in range(1, n):
        upper = lagrange_weights(nodes[n - k - 1:], at)
        scale = (1.0 - damping) ** k
        for i, (u, v) in enumerate(zip(upper, [0.0] + lower)):
            weights[n - k - 1 + i] += scale * (u - v)
        lower = upper
    return weights


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
        "0 reuses the last value; 1 extrapolates linearly (recommended); 2 adds curvature (more aggressive).")),
     Input("damping", "float", default=0.0, min=0.0, max=1.0, step=0.05, optional=True, tooltip=(
         "How much less of the trend to follow over a gap: the linear term is scaled by 1 - damping, the curvature "
         "term by its square (HiCache's scaling, arXiv 2508.16984). 0: TaylorSeer as published; 1: reuse. On the "
         "bundled video model 0.2 read 1-3 dB higher over a growing cadence's long gaps and 0.3-0.4 saved the "
         "most work; on the digits and photos models the published forecast read best. Compare on your model."))),
    lambda order, damping=0.0: TaylorSeer(order=order, damping=damping),
    TaylorSeer,
    Prose(when=(
        "Chain it after any caching node (Fixed Cadence, First Block Cache, DBCache, Adaptive Cache, TeaCache, "
        "MagCache): skipped work is then forecast by a polynomial in sigma through the last computed steps "
        "instead of reused stale, which allows a higher threshold or interval at the same quality. Alone it "
        "decides nothing and is refused.",
    ), families=(
        ("Any model", "order 1; order 2 overshoots on long gaps, order 0 is plain reuse"),
        ("Long gaps: a growing cadence, interval 3 and more (measured on the bundled video model)",
         "damping 0.2: ahead of Spectrum's ComfyUI port at every PSNR floor from 31 to 45 dB; on the digits model "
         "damping 0 read best"),
    )),
    summary="Forecasts skipped work in sigma instead of reusing it. Needs a decider in the chain.",
),)
