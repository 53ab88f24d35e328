"""Spectrum's forecast with torch only: exact on polynomials, the run's sigma range as its clock, the blend with the
local polynomial, the fallback while few points exist, repeated sigmas and validation."""
import math

import numpy as np
import pytest
import torch

from cached_sampler_dev.devkit.pack import load_core

ic = load_core()
from cached_sampler_pack.interceptors.methods import spectrum, taylorseer  # noqa: E402

CPU = torch.device("cpu")
SCHEDULE = [1.0, 0.92, 0.81, 0.7, 0.58, 0.46, 0.35, 0.24, 0.14, 0.06, 0.0]  # non-uniform, first to last


def observed(est, f, sigmas, schedule=SCHEDULE):
    slot = est.new_slot(schedule)
    for s in sigmas:
        est.observe(slot, f(s), s)
    return slot


def poly(coefs):
    """Two elements, each a polynomial in sigma (coefficients from the constant term up)."""
    def f(s):
        return torch.tensor([sum(c * s ** k for k, c in enumerate(coefs)),
                             sum((k + 1) * c * s ** k for k, c in enumerate(coefs))], dtype=torch.float64)
    return f


@pytest.mark.parametrize("degree", [2, 3, 4])
def test_a_polynomial_of_the_fits_degree_is_forecast_to_rounding_with_ridge_0(degree):
    f = poly([0.3, -1.2, 2.0, 0.7, -1.5][:degree + 1])
    est = ic.Spectrum(window=degree + 3, degree=degree, ridge=0.0, blend=1.0)
    slot = observed(est, f, SCHEDULE[:degree + 4])
    assert len(slot.points) == degree + 3  # the window's newest points
    for at in (SCHEDULE[degree + 4], 0.0):
        assert torch.allclose(est.estimate(slot, at, CPU), f(at), rtol=0, atol=1e-10)
    # the pure Chebyshev fit is not the local polynomial: a line through the last two misses the curvature
    local = ic.Spectrum(window=degree + 3, degree=degree, ridge=0.0, blend=0.0)
    assert not torch.allclose(local.estimate(slot, 0.0, CPU), f(0.0), atol=1e-3)


def reference_forecast(sigmas, values, at, first, last, degree, ridge):
    """numpy's Chebyshev Vandermonde matrix and a ridge solve, the run's first sigma at -1 and its last at +1."""
    tau = lambda s: -1.0 + 2.0 * (np.asarray(s) - first) / (last - first)  # noqa: E731
    x = np.polynomial.chebyshev.chebvander(tau(sigmas), degree)
    coef = np.linalg.solve(x.T @ x + ridge * np.eye(degree + 1), x.T @ np.asarray(values))
    return (np.polynomial.chebyshev.chebvander(tau([at]), degree) @ coef).item()


def test_the_ridge_fit_maps_the_runs_own_schedule_onto_minus_1_to_1():
    """With ridge > 0 the forecast depends on the map from sigma to the Chebyshev variable; it must be the run's
    first sigma to -1 and its last to +1 (not a fixed range, not the window's). A flipped sign of the whole map is
    a symmetry (T_k(-x) = (-1)^k T_k(x), the penalty sees only |c_k|); a wrong offset or scale is not."""
    schedule = [14.6, 9.7, 6.3, 4.0, 2.5, 1.5, 0.9, 0.5, 0.25, 0.1, 0.03]  # a Karras-like SDXL schedule
    sigmas = schedule[:7]
    f = lambda s: torch.tensor([math.sin(s / 3.0) + 0.1 * s], dtype=torch.float64)  # noqa: E731
    est = ic.Spectrum(window=7, degree=4, ridge=0.1, blend=1.0)
    slot = observed(est, f, sigmas, schedule)
    assert slot.span == (14.6, 0.03)
    assert spectrum.chebyshev_taus([14.6, 0.03, 7.315], slot.span) == pytest.approx([-1.0, 1.0, 0.0])
    got = float(est.estimate(slot, schedule[7], CPU))
    values = [float(f(s)) for s in sigmas]
    want = float(reference_forecast(sigmas, values, schedule[7], 14.6, 0.03, 4, 0.1))
    assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
    flipped = float(reference_forecast(sigmas, values, schedule[7], 0.03, 14.6, 4, 0.1))
    assert flipped == pytest.approx(want, rel=1e-9)
    for first, last in ((14.6 + 1.0, 0.03 + 1.0), (14.6, 0.03 - 3.0), (sigmas[0], sigmas[-1]), (50.0, 0.0)):
        wrong = float(reference_forecast(sigmas, values, schedule[7], first, last, 4, 0.1))
        assert abs(wrong - want) > 1e-4, (first, last)  # each such map gives a different forecast
    # without a schedule (a slot made directly) the points and the forecast's sigma give the range
    bare = est.Slot()
    for s in sigmas:
        est.observe(bare, f(s), s)
    own = float(reference_forecast(sigmas, values, schedule[7], sigmas[0], schedule[7], 4, 0.1))
    assert float(est.estimate(bare, schedule[7], CPU)) == pytest.approx(own, rel=1e-9)


def test_the_blend_is_convex_between_the_chebyshev_and_the_local_forecast():
    f = lambda s: torch.tensor([math.exp(-2.0 * s), math.cos(3.0 * s)], dtype=torch.float64)  # noqa: E731
    sigmas, at = SCHEDULE[:8], SCHEDULE[8]
    kw = dict(window=8, degree=4, ridge=0.1)
    slot = observed(ic.Spectrum(**kw, blend=1.0), f, sigmas)
    cheb = ic.Spectrum(**kw, blend=1.0).estimate(slot, at, CPU)
    local = ic.Spectrum(**kw, blend=0.0).estimate(slot, at, CPU)
    seer = ic.TaylorSeer(order=1)
    seer_slot = seer.Slot()
    for s in sigmas:
        seer.observe(seer_slot, f(s), s)
    assert torch.equal(local, seer.estimate(seer_slot, at, CPU))  # the local forecast is TaylorSeer's
    assert not torch.allclose(cheb, local, atol=1e-4)
    for w in (0.25, 0.5, 0.8):
        blended = ic.Spectrum(**kw, blend=w).estimate(slot, at, CPU)
        assert torch.allclose(blended, (1 - w) * local + w * cheb, rtol=0, atol=1e-12)
    # with ridge 0 constants are reproduced; the paper's penalty covers T_0 too, so ridge > 0 shrinks towards 0
    assert sum(ic.Spectrum(window=8, degree=4, ridge=0.0, blend=0.5).weights(slot, at)) == pytest.approx(1.0, abs=1e-9)
    assert 0.5 < sum(ic.Spectrum(**kw, blend=0.5).weights(slot, at)) < 1.0


def test_too_few_points_fall_back_to_the_local_polynomial():
    f = lambda s: torch.tensor([math.exp(s)], dtype=torch.float64)  # noqa: E731
    est = ic.Spectrum(window=10, degree=4, ridge=0.1, blend=0.5, order=2)
    seer = ic.TaylorSeer(order=2)
    slot, seer_slot = est.new_slot(SCHEDULE), seer.Slot()
    for n, s in enumerate(SCHEDULE[:7], start=1):
        est.observe(slot, f(s), s)
        seer.observe(seer_slot, f(s), s)
        same = torch.equal(est.estimate(slot, 0.1, CPU), seer.estimate(seer_slot, 0.1, CPU))
        assert same == (n < 6), n  # Chebyshev from degree + 2 = 6 points on
    one = est.new_slot(SCHEDULE)
    est.observe(one, torch.tensor([2.0]), 1.0)
    assert est.ready(one) and torch.equal(est.estimate(one, 0.5, CPU), torch.tensor([2.0]))


def test_repeated_sigmas_replace_the_older_point_like_taylorseer():
    """Second-order samplers evaluate a sigma twice; the newer value replaces the older one, and the fit stays
    finite and exact."""
    f = poly([1.0, -0.5, 0.25])
    est = ic.Spectrum(window=6, degree=2, ridge=0.0, blend=1.0)
    slot = est.new_slot(SCHEDULE)
    for s, garbage in ((1.0, 0), (0.92, 100.0), (0.92, 0), (0.81, -50.0), (0.81, 0), (0.7, 0)):
        est.observe(slot, f(s) + garbage, s)  # the first value at a repeated sigma is replaced
    assert [s for s, _ in slot.points] == [1.0, 0.92, 0.81, 0.7]
    got = est.estimate(slot, 0.5, CPU)
    assert torch.isfinite(got).all() and torch.allclose(got, f(0.5), atol=1e-10)


def test_forecasts_are_formed_in_float32_from_half_precision_points():
    est = ic.Spectrum(window=6, degree=2, ridge=0.1)
    slot = observed(est, lambda s: torch.full((3,), 1000.0 + s, dtype=torch.bfloat16), SCHEDULE[:6])
    out = est.estimate(slot, 0.35, CPU)
    assert out.dtype == torch.float32 and slot.points[0][1].dtype == torch.bfloat16


@pytest.mark.parametrize("bad", [dict(degree=0), dict(degree=4, window=5), dict(ridge=-0.1), dict(blend=1.5),
                                 dict(order=3), dict(window=2.5)])
def test_invalid_settings_are_refused_naming_the_input(bad):
    with pytest.raises(ic.InterceptorError, match=next(iter(bad))):
        ic.Spectrum(**bad).validate()


def test_taylorseers_slots_are_made_as_before():
    assert ic.TaylorSeer(order=1).new_slot(SCHEDULE) == taylorseer.TaylorSeer.Slot()
