"""Spectrum forecasting: a global Chebyshev fit over the computed steps, blended with the local polynomial.

Han et al., "Spectrum" (CVPR 2026, arXiv 2603.01623; reference code hanjq17/Spectrum) view a denoiser's
features as functions of time, fit Chebyshev polynomials T_0..T_m to the features of the computed steps by ridge
regression (regularisation lambda), and forecast skipped steps from that fit, blended convexly with a local
forecast: ``(1 - w) * local + w * chebyshev``. The authors' defaults: m = 4, lambda = 0.1, local = the linear
forecast through the last two computed steps; ``w`` = 1 recovers the pure Chebyshev predictor, and they
recommend 0.5-1.0 (0.5 in their scripts), larger for more aggressive skipping.

Here, as with TaylorSeer in this pack, time is sigma: ComfyUI's schedules are non-uniform, so step indices are a
poor clock. The Chebyshev variable maps the run's own schedule onto [-1, 1] (its first sigma to -1, its last to
+1), as the reference maps its 50 steps onto [-1, 1]; the estimator learns that range when the run makes its slot
(:meth:`Spectrum.new_slot`). A slot made without a schedule maps the range of its points and the forecast's sigma
instead. With lambda 0 the forecast does not depend on the map (polynomials of degree m stay polynomials of degree
m under an affine change of variable); with lambda > 0 it does, since the penalty acts on the coefficients.

The design matrix depends only on sigmas, so the fit is one small (m + 1) x (m + 1) system, solved in Python
floats (float64) on the host, with no tensor read back; the forecast is then a fixed linear combination of the
kept tensors (``g = X (X^T X + lambda I)^-1 x*``), formed in float32 like TaylorSeer's, without a per-element
solve. A slot keeps at most ``window`` tensors (the reference keeps every computed step; a window bounds memory).
While fewer than ``degree + 2`` points exist (the reference's ``K >= M + 2`` for a stable fit) the forecast is the
local polynomial alone. As in the reference,
the penalty covers every coefficient, T_0 included, so with lambda > 0 the Chebyshev part shrinks towards zero (a
constant is forecast slightly below itself); lambda 0 is an unbiased least-squares fit.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from ..base import Estimator
from ..kinds import InterceptorError, check_whole
from ..spec import Input, MethodSpec, Prose
from .taylorseer import lagrange_weights, same_sigma


@dataclasses.dataclass(frozen=True)
class Spectrum(Estimator):
    declaration = Estimator.declaration.but(kind="spectrum", display_name="Spectrum", alters_output=True)

    window: int = 10     # computed points kept (and fitted)
    degree: int = 4      # Chebyshev T_0..T_degree (the paper's m)
    ridge: float = 0.1   # the paper's lambda
    blend: float = 0.5   # the paper's w: weight of the Chebyshev forecast, 1 - w that of the local one
    order: int = 1       # the local polynomial: TaylorSeer's order through the last order + 1 points

    def validate(self) -> None:
        check_whole(self.label, "degree", self.degree, 1, 8)
        check_whole(self.label, "window", self.window, self.degree + 2, 100, low_text=f"degree + 2 ({self.degree + 2})")
        if not 0.0 <= self.ridge:
            raise InterceptorError(f"{self.label}: 'ridge' must be 0 or more, got {self.ridge}.")
        if not 0.0 <= self.blend <= 1.0:
            raise InterceptorError(f"{self.label}: 'blend' must be from 0 to 1, got {self.blend}.")
        check_whole(self.label, "order", self.order, 0, 2)

    @dataclasses.dataclass
    class Slot:
        points: list[tuple[float, torch.Tensor]] = dataclasses.field(default_factory=list)  # (sigma, value)
        span: tuple[float, float] | None = None  # the run's (first, last) sigma: mapped to -1 and +1

    def new_slot(self, schedule: Sequence[float]) -> Slot:
        span = (float(schedule[0]), float(schedule[-1])) if len(schedule) >= 2 else None
        if span is not None and same_sigma(*span):
            span = None
        return self.Slot(span=span)

    def observe(self, slot: Slot, value: torch.Tensor, sigma: float) -> None:
        # as TaylorSeer: a repeated sigma (second-order samplers) replaces the older point
        points = [p for p in slot.points if not same_sigma(p[0], sigma)]
        points.append((sigma, value))
        slot.points = points[-self.window:]

    def ready(self, slot: Slot) -> bool:
        return bool(slot.points)

    def weights(self, slot: Slot, sigma: float) -> list[float]:
        """The forecast at ``sigma`` as weights on the kept points (oldest first)."""
        sigmas = [s for s, _ in slot.points]
        local = [0.0] * len(sigmas)
        tail = sigmas[-(self.order + 1):]
        for i, w in enumerate(lagrange_weights(tail, sigma), start=len(sigmas) - len(tail)):
            local[i] = w
        if len(sigmas) < self.degree + 2 or self.blend == 0.0:
            return local
        span = slot.span or (max(*sigmas, sigma), min(*sigmas, sigma))
        g = chebyshev_weights(sigmas, sigma, span, self.degree, self.ridge)
        return [(1.0 - self.blend) * lw + self.blend * gw for lw, gw in zip(local, g)]

    def estimate(self, slot: Slot, sigma: float, device: torch.device) -> torch.Tensor:
        weights = self.weights(slot, sigma)
        first = slot.points[0][1]
        out = first.to(device=device, dtype=torch.promote_types(first.dtype, torch.float32)) * weights[0]
        for (_, value), w in zip(slot.points[1:], weights[1:]):
            if w != 0.0:
                out.add_(value.to(device), alpha=w)
        return out

    def terms(self, slot: Slot, sigma: float) -> list[tuple[float, torch.Tensor]]:
        return list(zip(self.weights(slot, sigma), [v for _, v in slot.points]))


def chebyshev_taus(sigmas: Sequence[float], span: tuple[float, float]) -> list[float]:
    """``sigmas`` mapped affinely onto [-1, 1]: ``span[0]`` (the run's first sigma) to -1, ``span[1]`` to +1."""
    first, last = span
    return [2.0 * (s - first) / (last - first) - 1.0 for s in sigmas]


def chebyshev_design(taus: Sequence[float], degree: int) -> list[list[float]]:
    """Rows [T_0(tau), ..., T_degree(tau)] by the recurrence T_k = 2 tau T_(k-1) - T_(k-2)."""
    rows = []
    for t in taus:
        row = [1.0, t]
        for _ in range(2, degree + 1):
            row.append(2.0 * t * row[-1] - row[-2])
        rows.append(row[:degree + 1])
    return rows


def chebyshev_weights(sigmas: Sequence[float], at: float, span: tuple[float, float], degree: int,
                      ridge: float) -> list[float]:
    """Weights g with ``sum g_i f(sigmas_i)`` = the ridge Chebyshev fit of f at ``at``: g = X (X^T X + ridge I)^-1 x*.
    One (degree + 1) system for every element of the fitted tensors, in Python floats (float64): it depends only on
    sigmas, and reading a tensor back would wait for the device."""
    *x, x_star = chebyshev_design(chebyshev_taus([*sigmas, at], span), degree)
    p = degree + 1
    gram = [[sum(r[i] * r[j] for r in x) + (ridge if i == j else 0.0) for j in range(p)] for i in range(p)]
    z = solve(gram, x_star)
    return [sum(r[i] * z[i] for i in range(p)) for r in x]


def solve(a: list[list[float]], b: list[float]) -> list[float]:
    """``a^-1 b`` by Gaussian elimination with partial pivoting (``a`` small and symmetric positive definite)."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[pivot] = m[pivot], m[col]
        if m[col][col] == 0.0:
            raise InterceptorError("Spectrum: the Chebyshev fit is singular (too few distinct sigmas).")
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            if f:
                for c in range(col, n + 1):
                    m[r][c] -= f * m[col][c]
    out = [0.0] * n
    for r in range(n - 1, -1, -1):
        out[r] = (m[r][n] - sum(m[r][c] * out[c] for c in range(r + 1, n))) / m[r][r]
    return out


SPECS = (MethodSpec(
    "Spectrum", "Spectrum Forecast",
    "Forecasts skipped work from a global fit instead of reusing it stale (Spectrum, arXiv 2603.01623): Chebyshev "
    "polynomials in sigma fitted by ridge regression to the last computed steps, blended with TaylorSeer's local "
    "line. Keeps up to 'window' computed values per cached quantity and CFG branch (TaylorSeer keeps order + 1). "
    "Chain it with a caching node (Fixed Cadence, Adaptive Cache, DBCache, First Block Cache); it decides nothing "
    "by itself.",
    (Input("window", "int", default=10, min=3, max=100, tooltip=(
        "Computed steps kept and fitted, at most (each one a cached tensor: memory grows with it). At least "
        "degree + 2; until that many steps are computed the local forecast is used alone.")),
     Input("degree", "int", default=4, min=1, max=8, tooltip=(
         "Highest Chebyshev polynomial of the fit (the paper's m, default 4). Lower is smoother and needs fewer "
         "computed steps before it is used.")),
     Input("ridge", "float", default=0.1, min=0.0, max=10.0, step=0.01, tooltip=(
         "Ridge regularisation of the fit (the paper's lambda, default 0.1); 0 is a plain least-squares fit.")),
     Input("blend", "float", default=0.5, min=0.0, max=1.0, step=0.05, tooltip=(
         "Weight of the Chebyshev forecast against the local one (the paper's w): 1 is Chebyshev alone, 0 is "
         "TaylorSeer alone. The authors recommend 0.5-1.0, higher when more steps are skipped.")),
     Input("order", "int", default=1, min=0, max=2, tooltip=(
         "Order of the local forecast (TaylorSeer's): 1, a line through the last two computed steps, as the "
         "paper."))),
    lambda window, degree, ridge, blend, order: Spectrum(
        window=window, degree=degree, ridge=ridge, blend=blend, order=order),
    Spectrum,
    Prose(when=(
        "An alternative to TaylorSeer Forecast after any caching node: skipped work is forecast from Chebyshev "
        "polynomials in sigma fitted by ridge regression to the last `window` computed steps (the run's first "
        "and last sigma span the fit), blended with TaylorSeer's local line by `blend`. The paper aims it at "
        "long gaps between computed steps. It keeps up to `window` computed values per cached quantity and "
        "CFG branch, where TaylorSeer keeps order + 1. Alone it decides nothing and is refused.",
        "On the bundled digits model TaylorSeer order 1 measured better: at 50 steps with Fixed Cadence 3-6 "
        "the defaults reached 42-47 dB where TaylorSeer order 1 reached 47-56 dB (at 28 steps, 37-43 dB "
        "against 37-45 dB).",
    ), families=(
        ("Any model", "the paper's settings: window 10, degree 4, ridge 0.1, blend 0.5 (0.5-1.0, higher for "
                      "longer gaps)"),
        ("Bundled digits model, 50 steps (measured)", "Fixed Cadence 3: 46.5 dB with the defaults, 52.9 dB with "
                                                      "degree 2, window 6, ridge 0; TaylorSeer order 1: 56.4 dB"),
    )),
    summary=(
        "Forecasts skipped work from a ridge Chebyshev fit in sigma blended with TaylorSeer's line; keeps up to "
        "`window` values. Needs a decider in the chain."),
),)
