"""Verified forecasts: skip only where the forecast that would stand in for the model is checked to be close.

Forecast-then-verify, after SpeCa (Liu et al., "SpeCa: Accelerating Diffusion Transformers with Speculative
Feature Caching", arXiv 2509.11628; Shenyi-Z/Cache4Diffusion) and X-Slim (arXiv 2512.12604). The threshold of
both deciders here is a *forecast error* (a relative error of the estimator's forecast against what the model
really computes), not a raw change of an input: the same number means the same damage on another model, which a
change threshold does not.

**Blocks** (:class:`VerifiedBlockCache`). The front blocks (the probe) run on every step anyway; the chain's
estimator (TaylorSeer, Spectrum, or plain reuse) also forecasts the probe's residual from the same fully
computed steps it forecasts the other blocks from, and the relative L2 error of that forecast against the
residual the probe really computed decides, in X-Slim's three tiers:

* below ``threshold`` (X-Slim's warn level): every block after the probe is forecast, the back blocks included;
* from ``threshold`` up to ``refresh_ratio`` times it (its critical level): the middle tier, X-Slim's partial
  refresh and DBCache's Bn in the engine's words: the ``back`` blocks run on the forecast middle, which is forecast;
* above: the step is computed in full and becomes a new point of every forecast.

SpeCa checks its draft on the last block, computed a second time, and decides the *next* step; here the probe is
the block that runs anyway, so the check costs no block execution and decides the step it is made on. The
forecast needs the evaluation's sigma, which the run reads with the decision's transfer; so the error is formed
on the host from sums taken on the device before it, ``|f - r|^2 = sum_ij w_i w_j <p_i, p_j> - 2 sum_i w_i
<p_i, r> + <r, r>`` for the forecast ``f = sum_i w_i p_i`` of the kept probe residuals ``p_i`` and this step's
``r``: every estimator of the pack is such a linear combination (``Estimator.terms``). The products
``<p_i, p_j>`` are summed when a point is kept and read with the next transfer; the decision costs one transfer,
as every decision does.

**Whole model** (:class:`VerifiedForecast`). Nothing runs on a skipped step, so the cheapest signal that predicts
the forecast's error is the change of the model input since the last computed step. On every computed step the
engine forecasts the output too (what a skip would have used there); its relative L1 error ``e_c`` against the
computed output, over the input change ``d_c`` that led to it, calibrates the prediction for the steps after:
``e = e_c * (d / d_c) ** (order + 1)``, ``d`` the input's relative L1 change since the last computed step and
``order`` the estimator's (0 for reuse: a polynomial forecast of order p errs by the step to the power p + 1). The
model is skipped while the predicted error stays under the threshold. EasyCache's rate (Adaptive Cache) predicts
the output's *change*; this predicts the *error of the forecast* that replaces it, measured where it can be.
"""
from __future__ import annotations

import dataclasses

import torch

from ..base import Decider
from .dbcache import check_probe, split_problems
from ..kinds import LAST_STEP_COMPUTE, Anchor, Cached, Granularity, Signal, check_range
from ..memory import Footprint
from ..metrics import Measure, _local, _sums, deliver, relative_l1_of
from ..threads import AfterComputed
from ..spec import (Example, Input, MemoryRow, MethodSpec, Prose, Sweep, WINDOW, last_step_input,
                    max_consecutive_input, percent_inputs, threshold_input)

def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """<a, b> in float64 (float32 where the device has no float64, as MPS): the error is a difference of such
    products, which are larger than it by the square of the forecast's weights."""
    wide = torch.float32 if a.device.type == "mps" else torch.float64
    return torch.dot(a.reshape(-1).to(wide), b.to(a.device).reshape(-1).to(wide))


def _sums_measure(terms: list[torch.Tensor], group) -> Measure:
    """The terms' values, reduced over the rank group; ``value()`` is the list of them."""
    return Measure(terms, lambda host: _sums(group, *host) if terms else [])


@dataclasses.dataclass(frozen=True)
class VerifiedBlockCache(Decider):
    declaration = Decider.declaration.but(
        kind="verified_blocks",
        footprint=Footprint(Cached.BLOCK_STREAMS_AND_BACK, anchor=Anchor.PROBE_POINTS),
        display_name="Verified Block Cache",
        granularity=Granularity.BLOCKS,
        signal=Signal.PROBE_RESIDUAL,
        checks_forecast=True,
        gathers_over_threads=True,
    )

    front: int = 1
    back: int = 1
    threshold: float = 0.05
    refresh_ratio: float = 2.0  # the critical level as a multiple of the threshold (1: no middle tier)

    def validate(self) -> None:
        super().validate()
        check_probe(self.label, self.front, self.back)
        check_range(self.label, "threshold", self.threshold, 0.0)
        check_range(self.label, "refresh_ratio", self.refresh_ratio, 1.0)

    def blocks(self) -> tuple[int, int, bool]:
        return self.front, self.back, True  # the back blocks are skippable too: the middle tier runs them

    def check_model(self, card) -> list[str]:
        return split_problems(self.label, self.front, self.back, card, "forecast")

    @dataclasses.dataclass
    class BranchState:
        gram: dict = dataclasses.field(default_factory=dict)  # (id(p_i), id(p_j)) -> <p_i, p_j> (host values)
        sigma: float | None = None                            # of the last kept probe residual

    @dataclasses.dataclass
    class RunState:
        tier: int = 2  # of the current evaluation: 0 full skip, 1 back blocks refreshed, 2 computed

    PROBE = "probe"  # the estimator's slot of the probe residuals, beside the segments' ones

    def _points(self, run, key) -> list[torch.Tensor]:
        """The kept probe residuals of one branch, in the estimator's order (empty if none or not linear)."""
        slot = run.slot(key, self.PROBE)
        state = run.branch_of(self, key)
        if slot is None or state.sigma is None or not run.estimator.ready(slot):
            return []
        return [t for _, t in run.estimator.terms(slot, state.sigma) or []]

    def measure(self, run, ev, signals) -> list:
        if self.threshold <= 0 or not signals:
            return []
        keys = [k for k in signals if self._points(run, k)]
        if not keys:
            return []
        terms = []
        for key in keys:
            r = _local(run.group, signals[key])
            terms += [_dot(r, _local(run.group, p)) for p in self._points(run, key)]
            terms.append(_dot(r, r))
        measure = _sums_measure(terms, run.group)
        measure.keys = keys  # which branches, in order, for decide
        return [measure]

    def gathered(self, parts: list[list[Measure]]) -> list[Measure] | None:
        """The devices' threads' products, one branch after the other, as one device lists them: each branch's
        products are paired with its own forecast in :meth:`forecast_error`, so they are joined, not added."""
        if any(len(measured) != 1 for measured in parts):
            return None  # a thread with no forecast to check yet: computed, as on one device
        joined = Measure([], lambda host: host, host=[value for (m,) in parts for value in m.value()])
        joined.keys = [key for (m,) in parts for key in m.keys]
        return [joined]

    def forecast_error(self, run, ev, keys, sums) -> float | None:
        """Relative L2 error, pooled over the branches, of the forecast of the probe at ``ev.sigma`` (host), or
        None where a product is missing."""
        num = den = 0.0
        at = 0
        for key in keys:
            slot = run.slot(key, self.PROBE)
            gram = run.branch_of(self, key).gram
            pairs = run.estimator.terms(slot, ev.sigma)
            b, c = sums[at:at + len(pairs)], sums[at + len(pairs)]
            at += len(pairs) + 1
            quad = 0.0
            for wi, pi in pairs:
                for wj, pj in pairs:
                    g = gram.get((id(pi), id(pj)))
                    if g is None:
                        return None
                    quad += wi * wj * g
            num += max(quad - 2.0 * sum(w * bi for (w, _), bi in zip(pairs, b)) + c, 0.0)
            den += c
        return None if den == 0.0 else (num / den) ** 0.5

    def decide(self, run, ev, signals, measured) -> bool:
        state = run.state_of(self)
        state.tier = 2
        if not measured:
            return True
        err = self.forecast_error(run, ev, measured[0].keys, measured[0].value())
        if err is None or err != err:  # no products yet, or a NaN probe: compute
            return True
        run.report_metric(self, err, self.threshold)
        if err < self.threshold:
            state.tier = 0
        elif err < self.threshold * self.refresh_ratio:
            state.tier = 1
        return state.tier == 2

    @property
    def threshold_rule(self) -> str:
        if self.refresh_ratio > 1:
            return f"skip below; back blocks rerun up to {self.refresh_ratio:g}x"
        return super().threshold_rule

    def refreshes_back(self, run, ev) -> bool:
        return run.state_of(self).tier == 1

    def computed(self, run, ev, forward, signals, outputs=None) -> None:
        """A fully computed step: its probe residual becomes a point the probe's forecasts are made from, as the
        segments' residuals become points of theirs."""
        if self.threshold <= 0 or not signals:
            return
        for key, residual in signals.items():
            run.store(key, self.PROBE, residual, ev.sigma)
            state = run.branch_of(self, key)
            state.sigma = ev.sigma
            points = self._points(run, key)
            if not points:
                run.note(f"{self.label}: the forecast ({run.estimator.display_name}) is not a combination of kept "
                         f"values, so it cannot be verified and every step was computed")
                continue
            ids = {id(p) for p in points}
            for ij in [ij for ij in state.gram if ij[0] not in ids or ij[1] not in ids]:
                del state.gram[ij]
            new, local = points[-1], _local(run.group, points[-1])
            measure = _sums_measure([_dot(local, _local(run.group, p)) for p in points], run.group)
            run.read_later(measure.terms, lambda host, m=measure, g=state.gram, n=new, ps=points:
                           self._take_gram(m, g, n, ps, host))

    @staticmethod
    def _take_gram(measure, gram, new, points, host) -> None:
        deliver([measure], host)
        for p, value in zip(points, measure.value()):
            gram[(id(new), id(p))] = gram[(id(p), id(new))] = value


@dataclasses.dataclass(frozen=True)
class VerifiedForecast(Decider):
    declaration = Decider.declaration.but(
        kind="verified_forecast",
        footprint=Footprint(Cached.MODEL_OUTPUTS, anchor=Anchor.MODEL_INPUT),
        display_name="Verified Forecast",
        granularity=Granularity.MODEL,
        signal=Signal.MODEL_INPUT,
        verifies_forecast=True,
        checks_forecast=True,
        gathers_over_threads=True,
    )

    threshold: float = 0.05

    def validate(self) -> None:
        super().validate()
        check_range(self.label, "threshold", self.threshold, 0.0)

    @dataclasses.dataclass
    class BranchState:
        x_anchor: torch.Tensor | None = None  # model input at the last computed evaluation

    @dataclasses.dataclass
    class RunState:
        error: float | None = None   # relative error of the forecast at the last computed step that had one
        change: float | None = None  # the input change that led to it
        found: AfterComputed = dataclasses.field(default_factory=AfterComputed)  # from which they are taken

    def exponent(self, run) -> int:
        return int(getattr(run.estimator, "order", 0)) + 1

    def measure(self, run, ev, signals) -> list:
        if self.threshold <= 0 or not signals:
            return []
        anchors = {k: run.branch_of(self, k).x_anchor for k in signals}
        anchors = {k: v for k, v in anchors.items() if v is not None}
        return [relative_l1_of(signals, anchors, run.group)] if anchors else []

    def decide(self, run, ev, signals, measured) -> bool:
        state = run.state_of(self)
        if not measured or state.error is None:
            return True  # no forecast checked yet
        change = measured[0].value()
        if change is None or change != change:
            return True
        predicted = state.error * (change / state.change) ** self.exponent(run)
        run.report_metric(self, predicted, self.threshold)
        return predicted >= self.threshold

    def computed(self, run, ev, forward, signals, outputs=None) -> None:
        if self.threshold <= 0 or not signals:
            return
        state = run.state_of(self)
        anchors = {k: run.branch_of(self, k).x_anchor for k in signals}
        anchors = {k: v for k, v in anchors.items() if v is not None}
        if anchors and forward.forecasts and state.found.admit(run, ev.index):
            # the first forward of the evaluation (of each device's thread) measures; another one, of split CFG,
            # only moves its anchors
            found = [relative_l1_of(forward.forecasts, outputs or {}, run.group),
                     relative_l1_of(signals, anchors, run.group)]
            state.found.add(run, found, lambda values: self._take(state, values))
        for key, x in run.keep(signals).items():
            run.branch_of(self, key).x_anchor = x

    @staticmethod
    def _take(state, values) -> None:
        error, change = values
        if error is not None and change:
            state.error, state.change = error, change


SPECS = (
    MethodSpec(
        "VerifiedForecast", "Verified Forecast",
        "Skips the whole model while the predicted error of the forecast that replaces it stays under the threshold "
        "(forecast-then-verify, SpeCa arXiv 2509.11628, X-Slim arXiv 2512.12604). On every computed step the forecast "
        "a skip would have used is checked against what the model computed; that error, scaled by how much the input "
        "has changed since, predicts the error of the next skips. Chain TaylorSeer Forecast after it. Works on every "
        "model.",
        (threshold_input(0.05, "Predicted relative error of the forecast (mean |forecast - computed| / mean |computed| "
                         "of the model's prediction) under which a step is skipped. An error, not a change: the same "
                         "value means about the same damage on another model. 0 disables caching (bit-identical).",
                         maximum=10.0, step=0.005),
         max_consecutive_input(-1), *percent_inputs(), last_step_input()),
        lambda threshold, max_consecutive_cached, start_percent, end_percent, last_step=LAST_STEP_COMPUTE:
        VerifiedForecast(threshold=threshold, max_consecutive_cached=max_consecutive_cached,
                         start_percent=start_percent, end_percent=end_percent, last_step=last_step),
        VerifiedForecast,
        Prose(when=(
            "Whole model steps on any model, skipped only where the forecast that replaces them is predicted close: "
            "every computed step checks the forecast a skip would have used against what the model computed, and "
            "that error, scaled by the input's change since, predicts the next skips' error. Chain TaylorSeer "
            "Forecast after it. On the bundled digits model (28 steps) the bench measured it saving less than Fixed "
            "Cadence + TaylorSeer at the same quality.",
        ), families=(
            ("Any model", "0.05 cautious, 0.1 balanced, 0.2 fast (with TaylorSeer order 1)"),
        )),
        sweep=Sweep("verifiedforecast", (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.4)),
        examples=(Example("verified forecast + taylorseer", (
            ("VerifiedForecast", dict(threshold=10.0, max_consecutive_cached=-1, **WINDOW),
             dict(threshold=0.0, max_consecutive_cached=-1, **WINDOW)),
            ("TaylorSeer", dict(order=1), dict(order=1)))),),
        memory=(MemoryRow("Verified Forecast"),),
        summary=(
            "Skips the model while the predicted error of the forecast replacing it stays under the threshold; checked "
            "against the model on every computed step. Any model; chain TaylorSeer after it."),
    ),
    MethodSpec(
        "VerifiedBlockCache", "Verified Block Cache",
        "The probe blocks run every step and their output is forecast too; the other blocks are forecast only when the "
        "probe's forecast is close to what the probe really computed (SpeCa arXiv 2509.11628, X-Slim arXiv "
        "2512.12604). Three tiers: below 'threshold' every block after the probe is forecast; up to "
        "'refresh_ratio' times it the last Bn blocks run on the forecast middle; above, the step is computed. Chain "
        "TaylorSeer Forecast after it. Needs a model with transformer-block hooks (Flux, Wan, HunyuanVideo, ...).",
        (Input("Fn", "int", default=1, min=1, max=200, tooltip="Front blocks that always run; they are the probe "
               "whose forecast is verified."),
         Input("Bn", "int", default=1, min=0, max=200, tooltip=(
             "Back blocks that run in the middle tier (forecast error between the two thresholds); forecast with the "
             "middle below 'threshold'. 0: no middle tier.")),
         threshold_input(0.05, "Relative error of the probe's forecast (root of sum (forecast - computed)^2 over "
                         "sum computed^2) under which every block after the probe is forecast. 0 disables caching "
                         "(bit-identical output).", maximum=10.0, step=0.005),
         Input("refresh_ratio", "float", default=2.0, min=1.0, max=100.0, step=0.1, tooltip=(
             "Up to this multiple of 'threshold' the back blocks are recomputed and the middle forecast (the middle "
             "tier); above it the step is computed in full. 1: no middle tier.")),
         max_consecutive_input(-1), *percent_inputs(), last_step_input()),
        lambda Fn, Bn, threshold, refresh_ratio, max_consecutive_cached, start_percent, end_percent,
        last_step=LAST_STEP_COMPUTE:
        VerifiedBlockCache(front=Fn, back=Bn, threshold=threshold, refresh_ratio=refresh_ratio,
                           max_consecutive_cached=max_consecutive_cached, start_percent=start_percent,
                           end_percent=end_percent, last_step=last_step),
        VerifiedBlockCache,
        Prose(when=(
            "Block-hooked models (Flux, Wan, HunyuanVideo, ...): the probe blocks run every step and their forecast "
            "is checked against what they computed; below the threshold every later block is forecast, up to "
            "refresh_ratio times it the back blocks run on the forecast middle, above it the step is computed. The "
            "probe runs on every step, so a model with few blocks saves less than with a whole-model method.",
        ), families=(
            ("Any block-hooked model", "0.05 with TaylorSeer order 1 or 2, refresh_ratio 2"),
        )),
        sweep=Sweep("verifiedblockcache", (0.0, 0.01, 0.02, 0.05, 0.1, 0.2)),
        examples=(Example("verified blocks + taylorseer", (
            ("VerifiedBlockCache", dict(Fn=1, Bn=1, threshold=10.0, refresh_ratio=2.0, max_consecutive_cached=-1,
                                        **WINDOW),
             dict(Fn=1, Bn=1, threshold=0.0, refresh_ratio=2.0, max_consecutive_cached=-1, **WINDOW)),
            ("TaylorSeer", dict(order=2), dict(order=2)))),),
        memory=(MemoryRow("Verified Block Cache"),),
        summary=(
            "The probe blocks' forecast is checked against what they computed; three tiers (forecast everything after "
            "the probe, refresh the back blocks, compute). Block-hooked models."),
    ),
)
