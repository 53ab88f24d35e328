"""Searching which evaluations to compute, and with which forecast, from one recorded trajectory.

The error model. A skipped evaluation ``j`` is forecast from the last computed ones as a fixed linear combination
``sum_i w_i out_i`` (the weights depend only on sigmas: reuse, TaylorSeer's polynomial in sigma of order 1 or 2);
for a first-order step ``x += (sigma_next - sigma) * eps`` its error moves the result by ``dt_j * (forecast - out_j)``.
Every such error is a linear combination of the recorded outputs, so its squared norm is a quadratic form in their
Gram matrix ``G = O O^T`` (n x n, one pass over the outputs in float64): the whole error table costs nothing per
entry, however large the latent.

The search. As in CEM (Fu et al., arXiv 2512.23258), a dynamic program over steps picks, for every budget of
computed evaluations at once, the placement that minimises an additive error model: here the error of each
skipped evaluation forecast from the computed ones before it, exactly as the estimator would forecast it (the
DP's state is the last ``order + 1`` computed evaluations, which is what the forecast depends on). Two additive
models are used, the squared errors (independent errors) and their norms (the triangle bound). The DP optima are
pooled with front-loaded schedules in the manner of L2P (arXiv 2604.26365: dense first steps, e.g. 0, 1, 2, 4,
9, 17, ... of 50), even spacing and greedy selection, and every candidate is ranked by the non-additive error of
the final latent (the signed sum of all forecast errors, again a quadratic form). The ranking only orders the
candidates: the caller confirms them with real sampling runs.

Beside them, at every budget, the best-ranked of Fixed Cadence's growing schedules with a warm-up and the last step
forecast (Spectrum's, arXiv 2603.01623: 0, 1, 2, 4, 7, 11, 16, 22 of 28) is measured too, after the others: on a
natural-image model that schedule read 1.7 dB above the same steps with the last computed, and over 5 dB above the
growing cadence with the last computed, while the open-loop error model need not rank it first. Measured after the
others, it changes a search's answer only where it meets a bound they miss or reads a higher PSNR.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import torch

from .fixed_cadence import FixedCadence
from ..kinds import LAST_STEP_FORECAST
from .taylorseer import Forecast, forecast_weights as taylorseer_weights, same_sigma

ORDERS = (0, 1, 2)  # the forecasts searched: reuse, TaylorSeer order 1 and 2 (a polynomial in sigma)
# TaylorSeer's dampings, also tried on the plans below the one found (the search's descent): over the longer gap a
# dropped step leaves, a forecast that follows the trend less far read 1-3 dB higher on the video model, where it
# let a growing cadence compute a step less; on the digits model it read lower (bench/damped_forecast.md). 0.4 is
# the damping the video model's grid chose most; with it the video model's 45 dB plan computes a step less
# (bench/autocalibrate/margin_rules.md).
DAMPINGS = (0.2, 0.4)


def gram(outputs: Sequence[torch.Tensor], sample_size: int = 1 << 20) -> torch.Tensor:
    """``O O^T`` (float64, n x n) of the flattened outputs, on an even subsample of at most ``sample_size``
    elements (the same elements of every output) so that large video latents stay cheap."""
    flat = [o.detach().flatten() for o in outputs]
    if flat and flat[0].numel() > sample_size:
        index = torch.linspace(0, flat[0].numel() - 1, sample_size).long()
        flat = [f[index] for f in flat]
    o = torch.stack([f.to("cpu", torch.float64) for f in flat])
    return o @ o.T


def forecast_weights(sigmas: Sequence[float], points: Sequence[int], at: int,
                     order: int | Forecast) -> dict[int, float]:
    """The weights TaylorSeer of ``order`` (an order, or a :class:`Forecast` with its damping) gives the computed
    evaluations ``points`` (oldest first, as many as it keeps) when forecasting evaluation ``at``: the polynomial
    through the last ``order + 1`` distinct sigmas."""
    forecast = Forecast.of(order)
    kept: list[int] = []
    for i in points:  # a repeated sigma replaces the older point, as TaylorSeer.observe does
        kept = [k for k in kept if not same_sigma(sigmas[k], sigmas[i])] + [i]
    kept = kept[-(forecast.order + 1):]
    return dict(zip(kept, taylorseer_weights([sigmas[k] for k in kept], sigmas[at], forecast.damping)))


def _quadratic(g: torch.Tensor, coefficients: dict[int, float]) -> float:
    keys = list(coefficients)
    c = torch.tensor([coefficients[k] for k in keys], dtype=torch.float64)
    return float(c @ g[keys][:, keys] @ c)


def steps_after(sigmas: Sequence[float]) -> list[float]:
    """``sigma_next - sigma`` of every evaluation (the last one steps to 0)."""
    return [b - a for a, b in zip(sigmas, list(sigmas[1:]) + [0.0])]


def step_error(g: torch.Tensor, sigmas: Sequence[float], points: Sequence[int], j: int, order: int) -> float:
    """Squared norm of ``dt_j * (forecast_j - out_j)``: what forecasting ``j`` from ``points`` adds to the result."""
    c = forecast_weights(sigmas, points, j, order)
    c[j] = c.get(j, 0.0) - 1.0
    return steps_after(sigmas)[j] ** 2 * _quadratic(g, c)


def plan_error(g: torch.Tensor, sigmas: Sequence[float], compute: Sequence[int], order: int) -> float:
    """Squared norm of the change of the final latent when only ``compute`` is computed and the rest forecast
    (open loop, first order: the signed sum of the forecast errors, so errors of opposite sign cancel)."""
    dts = steps_after(sigmas)
    total: dict[int, float] = {}
    history: list[int] = []
    computed = set(compute)
    for j in range(len(sigmas)):
        if j in computed:
            history.append(j)
            continue
        for i, w in forecast_weights(sigmas, history, j, order).items():
            total[i] = total.get(i, 0.0) + dts[j] * w
        total[j] = total.get(j, 0.0) - dts[j]
    return _quadratic(g, total) if total else 0.0


def error_table(g: torch.Tensor, sigmas: Sequence[float], order: int) -> torch.Tensor:
    """``E[s_0, .., s_order, j]``: the squared error that forecasting evaluation ``j`` with TaylorSeer of ``order``
    adds to the result when the last computed evaluations are ``s`` (oldest first; while fewer have been computed
    the oldest is repeated: (0, 0, 5) = 0 and 5 computed). 0 for ``j <= s_order``; +inf for tuples that are no
    state (decreasing, or a repeat not at the front)."""
    n = len(sigmas)
    dts = torch.tensor(steps_after(sigmas), dtype=torch.float64)
    table = torch.full((n,) * (order + 1) + (n,), math.inf, dtype=torch.float64)
    sig = torch.tensor([float(x) for x in sigmas], dtype=torch.float64)
    for state in _states(n, order):
        row = torch.zeros(n, dtype=torch.float64)
        last = state[-1]
        if last + 1 < n:
            kept: list[int] = []
            for i in dict.fromkeys(state):  # a repeated sigma replaces the older point, as TaylorSeer keeps them
                kept = [k for k in kept if not same_sigma(sigmas[k], sigmas[i])] + [i]
            js = torch.arange(last + 1, n)
            # the Lagrange weights of the kept points at every later sigma: w (js, points)
            w = torch.ones(len(js), len(kept), dtype=torch.float64)
            for a, p in enumerate(kept):
                for q in kept:
                    if q != p:
                        w[:, a] *= (sig[js] - sig[q]) / (sig[p] - sig[q])
            # all forecasts from one state at once: E = w G_pp w - 2 w G_pj + G_jj
            err = (w @ g[kept][:, kept] * w).sum(1) - 2 * (w * g[kept][:, js].T).sum(1) + g[js, js]
            row[js] = dts[js] ** 2 * err.clamp(min=0.0)
        table[state] = row
    return table


def _states(n: int, order: int):
    """The DP's states: nondecreasing tuples of ``order + 1`` evaluation indices, repeats only at the front."""
    def grow(prefix):
        if len(prefix) == order + 1:
            yield tuple(prefix)
            return
        for k in range(prefix[-1] + 1, n):
            yield from grow(prefix + [k])
    for first in range(n):
        for repeats in range(1, order + 2):
            yield from grow([first] * repeats)


def additive_error(table: torch.Tensor, compute: Sequence[int], metric: str = "squared") -> float:
    """The additive error model of a plan (what :func:`dp_plans` minimises), summed step by step."""
    order, n = table.dim() - 2, table.shape[-1]
    state, total, computed = (0,) * (order + 1), 0.0, set(compute)
    for j in range(1, n):
        if j in computed:
            state = state[1:] + (j,)
        else:
            e = float(table[state + (j,)])
            total += e if metric == "squared" else math.sqrt(e)
    return total


def dp_plans(g: torch.Tensor | None, sigmas: Sequence[float], order: int, *, metric: str = "squared",
             max_budget: int | None = None, table: torch.Tensor | None = None) -> dict[int, tuple[int, ...]]:
    """For every budget b from 1 to ``max_budget`` (all evaluations by default), the b computed evaluations, the
    first always among them, that minimise the additive error model: the sum over the skipped evaluations of their
    squared errors (``metric`` "squared") or of their norms ("norm"), each forecast by TaylorSeer of ``order`` from
    the computed evaluations before it. Exact for that model: a dynamic program whose state is the last
    ``order + 1`` computed evaluations (all the forecast depends on), one layer per computed evaluation,
    ``layer'[s_1.., k] = min over s_0 of layer[s] + (error of s_last + 1 .. k - 1 forecast from s)``, as CEM's
    ``dp[t][k] = min_g dp[t - g][k - 1] + err`` with the forecast's own history in the state."""
    n = len(sigmas)
    if n == 0:
        return {}
    table = table if table is not None else error_table(g, sigmas, order)
    if metric == "norm":
        table = table.sqrt()
    elif metric != "squared":
        raise ValueError(f"unknown metric {metric!r}")
    # cum[s, k]: the error of forecasting evaluations s_last + 1 .. k - 1 from state s (k = n: to the end)
    finite = torch.where(torch.isfinite(table), table, torch.zeros_like(table))
    cum = torch.cat([torch.zeros(finite.shape[:-1] + (1,), dtype=torch.float64), finite.cumsum(-1)], -1)
    invalid = ~torch.isfinite(table[..., :1])  # not a state
    last = torch.arange(n).view((1,) * order + (n,) + (1,))
    ahead = torch.arange(n).view((1,) * (order + 1) + (n,)) > last  # a next computed evaluation k > s_last
    step = torch.where(ahead & ~invalid, cum[..., :n], torch.full_like(cum[..., :n], math.inf))
    max_budget = min(max_budget or n, n)
    layer = torch.full((n,) * (order + 1), math.inf, dtype=torch.float64)
    layer[(0,) * (order + 1)] = 0.0
    back = []  # per layer: for each state, the oldest evaluation of the state it came from
    plans = {}
    for count in range(1, max_budget + 1):
        total = layer + cum[..., n].masked_fill(invalid[..., 0], math.inf)
        state = _argmin(total)
        plans[count] = _backtrack(state, back)
        if count == max_budget:
            break
        moved = layer.unsqueeze(-1) + step        # (s_0, .., s_order, k)
        layer, came = moved.min(0)                 # state (s_1, .., s_order, k), and the s_0 it came from
        back.append(came)
    return plans


def _argmin(t: torch.Tensor) -> tuple[int, ...]:
    flat = int(torch.argmin(t))
    index = []
    for size in reversed(t.shape):
        index.append(flat % size)
        flat //= size
    return tuple(reversed(index))


def _backtrack(state: tuple[int, ...], back: list[torch.Tensor]) -> tuple[int, ...]:
    """The computed evaluations of the path that ends in ``state`` after ``len(back) + 1`` computed ones."""
    computed = [state[-1]]
    for came in reversed(back):
        state = (int(came[state]),) + state[:-1]
        computed.append(state[-1])
    return tuple(sorted(computed))


def front_loaded(n: int, budget: int, power: float = 2.0) -> tuple[int, ...]:
    """A front-loaded schedule of ``budget`` computed evaluations of ``n`` in the manner of L2P (arXiv 2604.26365):
    evaluation ``(n - 1) * (k / budget) ** power`` for k = 0 .. budget - 1, i.e. gaps that grow from the start;
    ``power`` 1 is even spacing from 0 (the last evaluations are forecast, as in L2P's schedules). Always starts at 0,
    exactly ``min(budget, n)`` distinct evaluations."""
    budget = max(1, min(budget, n))
    picks = {0}
    for k in range(1, budget):
        u = k / budget
        picks.add(min(n - 1, round((n - 1) * u ** power)))
    free = iter(i for i in range(n) if i not in picks)
    while len(picks) < budget:  # rounding merged two: the first free evaluations fill in, keeping it front-loaded
        picks.add(next(free))
    return tuple(sorted(picks))


# The growing schedules proposed (Fixed Cadence's settings, the last step forecast): warm-up steps, first gap, and the
# gap's additive growth and factor per computed step, the growth on Fixed Cadence's 0.05 grid
GROWING_WARMUPS = (1, 2, 3)
GROWING_INTERVALS = (1, 2, 3)
GROWING_ADDITIVE = tuple(k / 20 for k in range(0, 81))
GROWING_RATIOS = (1.25, 1.5, 2.0)


def growing_schedules(n: int, budget: int) -> dict[tuple[int, ...], FixedCadence]:
    """The distinct placements of ``budget`` computed evaluations of ``n`` that Fixed Cadence gives with a warm-up
    and growing gaps (additive or geometric) and the last step forecast, each with the settings that give it (the
    first found, the smallest growth)."""
    found: dict[tuple[int, ...], FixedCadence] = {}
    settings = [dict(growth=g) for g in GROWING_ADDITIVE] + [dict(growth_ratio=r) for r in GROWING_RATIOS]
    for warmup in GROWING_WARMUPS:
        for interval in GROWING_INTERVALS:
            for setting in settings:
                cadence = FixedCadence(interval=interval, warmup_steps=warmup, last_step=LAST_STEP_FORECAST, **setting)
                steps = cadence.computed_steps(n)
                if len(steps) == budget:
                    found.setdefault(steps, cadence)
    return found


GROWING_PER_BUDGET = 1  # of those, how many are measured at a budget after the other candidates

DP_ORDER_LIMIT = {2: 32}  # the largest trajectory each order's DP runs on (order 2: n^4 entries); above, that
                          # order still forecasts the other orders' placements


@dataclasses.dataclass(frozen=True)
class Candidate:
    compute: tuple[int, ...]
    order: int
    error: float          # the model's squared error of the final latent (ranks, never decides)
    source: str           # which search proposed it: "dp", "front-loaded", "even", ...


class Proposals:
    """Candidate plans for any budget from one recorded trajectory: the DP optima of every order and metric
    (computed once for all budgets), front-loaded and even schedules, ranked by the final-latent error model."""

    def __init__(self, sigmas: Sequence[float], outputs: Sequence[torch.Tensor], orders: Sequence[int] = ORDERS,
                 extra=None):
        self.sigmas = list(sigmas)
        self.orders = tuple(orders)
        self.g = gram(outputs)
        self.extra = extra  # budget -> [(plan, source)], e.g. the former greedy placements
        n = len(self.sigmas)
        self.dp = {}
        for order in self.orders:
            if n <= DP_ORDER_LIMIT.get(order, n):
                table = error_table(self.g, self.sigmas, order)
                for metric in ("squared", "norm"):
                    self.dp[(order, metric)] = dp_plans(None, self.sigmas, order, metric=metric, table=table)

    def ranked(self, budget: int) -> list[Candidate]:
        n = len(self.sigmas)
        budget = max(1, min(budget, n))
        pool: dict[tuple[int, ...], str] = {}
        for (order, metric), plans in sorted(self.dp.items()):
            if budget in plans:
                pool.setdefault(plans[budget], "dp")
        for power in (1.5, 2.0, 3.0):
            pool.setdefault(front_loaded(n, budget, power), "front-loaded")
        pool.setdefault(front_loaded(n, budget, 1.0), "even")
        for k in range(1, n + 1):  # a fixed cadence (every k-th from the first), where it has this budget
            if len(range(0, n, k)) == budget:
                pool.setdefault(tuple(range(0, n, k)), "cadence")
        for plan, source in (self.extra(budget) if self.extra else ()):
            if len(set(plan)) == budget:
                pool.setdefault(tuple(sorted(set(plan))), source)
        ranked = [Candidate(plan, order, plan_error(self.g, self.sigmas, plan, order), source)
                  for plan, source in pool.items() for order in self.orders]
        ranked.sort(key=lambda c: (c.error, c.order, c.compute))
        return ranked

    def growing(self, budget: int) -> list[Candidate]:
        """The growing schedules of this budget (:func:`growing_schedules`), ranked as :meth:`ranked` ranks."""
        n = len(self.sigmas)
        ranked = [Candidate(plan, order, plan_error(self.g, self.sigmas, plan, order), "growing")
                  for plan in growing_schedules(n, max(1, min(budget, n))) for order in self.orders]
        ranked.sort(key=lambda c: (c.error, c.order, c.compute))
        return ranked

    def to_measure(self, budget: int, count: int, growing_count: int = GROWING_PER_BUDGET) -> list[Candidate]:
        """The ``count`` best-ranked candidates with distinct placements (each with its best-ranked order), then the
        ``growing_count`` best-ranked growing schedules not among them."""
        chosen, seen = [], set()
        for c in self.ranked(budget):
            if c.compute not in seen:
                seen.add(c.compute)
                chosen.append(c)
            if len(chosen) == count:
                break
        growing = 0
        for c in self.growing(budget):
            if growing == growing_count:
                break
            if c.compute not in seen:
                seen.add(c.compute)
                chosen.append(c)
                growing += 1
        return chosen


def neighbours(compute: tuple[int, ...], n: int) -> list[tuple[int, ...]]:
    """The plans that move one computed evaluation (never the first) one step earlier or later."""
    out, taken = [], set(compute)
    for i in compute[1:]:
        for j in (i - 1, i + 1):
            if 0 < j < n and j not in taken:
                out.append(tuple(sorted(taken - {i} | {j})))
    return out


PATIENCE = 3  # budgets in a row below the bisection's answer that must fail before the search stops trying fewer


@dataclasses.dataclass
class SearchOutcome:
    compute: tuple[int, ...]
    order: int | Forecast      # a bare order, or a Forecast where the descent kept a damped one
    quality: object            # what ``measure`` returned for it (has .psnr)
    runs: int                  # distinct plans measured (sampling runs per seed)
    source: str


def dropped(compute: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The plans that leave out one computed evaluation (never the first, which every forecast starts from)."""
    return [tuple(i for i in compute if i != j) for j in compute[1:]]


def search(sigmas: Sequence[float], outputs: Sequence[torch.Tensor], measure, *, min_psnr: float | None = None,
           budget: int | None = None, orders: Sequence[int] = ORDERS, per_budget: int = 4, refine: int | None = None,
           extra=None, patience: int = PATIENCE, descend: bool = True,
           growing: int = GROWING_PER_BUDGET, dampings: Sequence[float] = ()) -> SearchOutcome:
    """The least work that meets ``min_psnr`` (or, for ``budget``, the best plan of exactly that many computed
    evaluations), every candidate confirmed by ``measure(compute, order) -> quality`` (a real sampling run: the
    measured PSNR decides, the error model only ranks).

    ``min_psnr``: bisection over budgets; at each budget up to ``per_budget`` candidates with distinct placements
    are measured in the model's order until one meets the bound. Then one budget less is tried once more by a
    measured local search (``refine`` runs at most, default 2 per free evaluation): from the best plan measured
    there, moving one computed evaluation by a step while that raises the PSNR. Bisection takes a budget that
    fails to mean that every smaller one fails too, which is not so on every model (on the video model one computed
    step more or less moves the result by several dB either way), so the budgets below the one found are then
    tried in turn, each with its candidates, until ``patience`` budgets in a row (the one just below included)
    have none that meets the bound; a budget that meets it becomes the one found. Last, the budget found is
    *polished*: its remaining candidates are measured and the same local search climbs from the best of them, so
    the plan returned is the highest PSNR found at the least work that meets the bound, not the first placement
    that just did. The margin above the bound is what carries the plan to seeds it was not measured on (on the
    digits model the first placement to meet a 40 dB target at 7 of 28 steps measured 40.1 dB and met it on 3 of
    8 held-out seeds; the polished one 42.6 dB, and all 8). With ``descend``, the polished plan then loses one
    computed evaluation at a time: of the plans that leave one out, the ``per_budget`` the error model ranks best
    are measured, and where one meets the bound the best plan of that budget is polished and the descent goes
    on. The best plan of a budget is often the best of the budget above less one step, which neither the error
    model's candidates nor moving steps one by one reaches (on the digits model the 11-step plan for 47.5 dB read
    51.9 dB, the best 10-step candidate below 46.25 dB, and the 11-step plan without its last step 48.8 dB).
    ``budget``: the ``per_budget`` best-ranked candidates, then the same local search for the highest PSNR.
    ``growing``: how many growing schedules are measured at a budget after its candidates (0: the search of before
    they were proposed, run for run). ``dampings``: the descent also measures each dropped plan with TaylorSeer
    damped by these (a plan's order 1 or 2; the key's forecast is then a :class:`Forecast`), so a step less can be
    met where the longer gap it leaves needs a forecast that follows the trend less far; () measures what the
    search measured before they were tried, run for run."""
    n = len(sigmas)
    if (budget is None) == (min_psnr is None):
        raise ValueError("Give exactly one target: a budget of computed steps or a minimum PSNR.")
    proposals = Proposals(sigmas, outputs, orders, extra)
    measured: dict[tuple[tuple[int, ...], int], object] = {}
    sources: dict[tuple[tuple[int, ...], int], str] = {}

    def run(compute, order, source):
        key = (tuple(compute), order)
        if key not in measured:
            measured[key] = measure(key[0], order)
            sources[key] = source
        return measured[key]

    def meets(key) -> bool:
        return min_psnr is not None and measured[key].psnr >= min_psnr

    def at_budget(b: int, stop: bool):
        best = None
        for c in proposals.to_measure(b, per_budget, growing):
            run(c.compute, c.order, c.source)
            key = (c.compute, c.order)
            if best is None or measured[key].psnr > measured[best].psnr:
                best = key
            if stop and meets(key):
                return key
        return best

    def climb(key, limit: int, stop: bool):
        """Measured hill climb from ``key``: first improvement, at most ``limit`` runs."""
        spent, improved = 0, True
        while improved and spent < limit:
            improved = False
            for plan in neighbours(key[0], n):
                if (plan, key[1]) in measured:
                    continue
                if spent >= limit:
                    break
                run(plan, key[1], "refined")
                spent += 1
                if measured[(plan, key[1])].psnr > measured[key].psnr:
                    key, improved = (plan, key[1]), True
                    if stop and meets(key):
                        return key
                    break
        return key

    def climb_limit(b: int) -> int:
        return refine if refine is not None else 2 * (b - 1)

    def outcome(key) -> SearchOutcome:
        return SearchOutcome(key[0], key[1], measured[key], len(measured), sources[key])

    def polish(b: int):
        """The highest PSNR at budget ``b``: every candidate there measured, then a climb from the best measured."""
        at_budget(b, stop=False)
        start = max((k for k in measured if len(k[0]) == b), key=lambda k: measured[k].psnr)
        return climb(start, climb_limit(b), stop=False)

    if budget is not None:
        return outcome(polish(max(1, min(budget, n))))
    lo, hi, best = min(2, n), n, None
    while lo <= hi:
        mid = (lo + hi) // 2
        key = at_budget(mid, stop=True)
        if meets(key):
            best, hi = key, mid - 1
        else:
            lo = mid + 1
    if best is None:  # nothing met the bound: every evaluation computed
        return outcome(at_budget(n, stop=True))
    b = len(best[0]) - 1
    if b >= 1:
        start = max((k for k in measured if len(k[0]) == b), key=lambda k: measured[k].psnr, default=None)
        start = start or at_budget(b, stop=True)
        found = start if meets(start) else climb(start, climb_limit(b), stop=True)
        if meets(found):
            best = found
    misses, b = 0, len(best[0]) - 1
    while b >= min(2, n) and misses < patience:  # the scan below the bisection's answer
        key = at_budget(b, stop=True)
        if meets(key):
            best, misses = key, 0
        else:
            misses += 1
        b -= 1
    best = polish(len(best[0]))
    while descend and len(best[0]) > min(2, n):
        plans = sorted(dropped(best[0]),  # the model ranks, runs confirm
                       key=lambda plan: plan_error(proposals.g, sigmas, plan, best[1]))[:per_budget]
        lower = [(plan, forecast) for plan in plans for forecast in with_damping(best[1], dampings)]
        for key in lower:
            run(key[0], key[1], "dropped")
        if not any(meets(key) for key in lower):
            break
        best = polish(len(best[0]) - 1)
    return outcome(best)


def with_damping(order: int | Forecast, dampings: Sequence[float]) -> list[int | Forecast]:
    """The forecasts a descent measures a dropped plan with: ``order`` undamped (a bare order, as every other
    candidate is keyed) and damped by each of ``dampings``; reuse (order 0) has no trend to damp."""
    base = Forecast.of(order).order
    return [base] + [Forecast(base, d) for d in dampings if base > 0 and d > 0]


def negatives_to_leave_out(compute: Sequence[int], n: int, measure, min_psnr: float):
    """On a plan that meets ``min_psnr``, the computed evaluations whose negative CFG branch may be left out too
    (estimated from the positive one, as the Guidance Cache does), each costing half a computed evaluation less:
    tried one at a time from the last computed evaluation back, each kept while ``measure(leave_out) -> quality``
    of all the omissions kept so far stays at or above the bound (the signed errors of several omissions need not
    add up, so every set is measured as a whole). Never the first evaluation, which every forecast starts from,
    nor the run's last (always computed in full). Returns (the evaluations, the quality of the last set measured
    that met the bound, or None when no omission did)."""
    kept: tuple[int, ...] = ()
    quality = None
    for j in sorted(compute[1:], reverse=True):
        if j == n - 1:
            continue
        trial = tuple(sorted(kept + (j,)))
        q = measure(trial)
        if q.psnr >= min_psnr:
            kept, quality = trial, q
    return kept, quality
