"""Verified forecasts on hand-made models: the error each decider compares with its threshold is the error of the
forecast the skip would use, the tiers run the blocks they name, and a variant that checks against the wrong step
lets a change of course through."""
import pytest
import torch

from cached_sampler_dev.devkit.pack import load_core

ic = load_core()
from cached_sampler_pack.interceptors.engine import BlockPlan, block_call, model_forward  # noqa: E402

SIGMAS = [1.0 - i / 16 for i in range(17)]
WINDOW = dict(start_percent=0.0, end_percent=1.0)
GROUPS = [("double_block", 2), ("single_block", 3)]  # 5 blocks: probe, 3 middle, 1 back with Fn=1, Bn=1


def smooth_blocks(kink_at: float | None = None, width: int = 6):
    """Blocks whose residuals are smooth in sigma (each adds ``(position + 1) * f(sigma)`` with ``f`` a
    quadratic); past ``kink_at`` every residual turns sharply (a change of course the forecast cannot know)."""
    def f(sigma):
        value = 0.3 + 0.5 * sigma + 0.2 * sigma * sigma
        if kink_at is not None and sigma < kink_at:
            value += 4.0 * (kink_at - sigma)
        return value

    ran = []

    def make(position):
        def block(args):
            ran.append(position)
            sigma = args["sigma"]
            return {"img": args["img"] + (position + 1) * f(sigma) * torch.linspace(0.5, 1.5, width)}
        return block
    return [make(p) for p in range(5)], ran


def drive_blocks(decider, blocks, estimator=None, sigmas=SIGMAS, branches=((0, "c"),)):
    """One evaluation per step, one forward of one row per branch; the stream is a constant (so only what the
    blocks add matters) and sigma reaches the blocks through ``args``."""
    chain = ic.InterceptorChain.of([decider] + ([estimator] if estimator else []))
    run = ic.LoopState(chain, sigmas)
    plan = BlockPlan(GROUPS, *decider.blocks())
    outs, per_eval = [], []
    for sigma in sigmas[:-1]:
        run.begin_evaluation(sigma)
        rows = len(branches)
        fwd = run.begin_forward(sigma, rows, (6,), torch.float32, [b for b, _ in branches], [u for _, u in branches])
        img = torch.ones(rows, 6)
        for pos in range(5):
            img = block_call(run, plan, pos, ("img",), {"img": img, "sigma": sigma},
                             lambda a, b=blocks[pos]: b(a))["img"]
        run.end_forward(fwd, img)  # the forward's blocks reach the evaluation's record as it ends
        per_eval.append(fwd.evaluation.record.blocks_run)
        run.end_evaluation()
        outs.append(img)
    return run, outs, per_eval


def test_back_tier_plan_makes_the_back_blocks_a_segment_of_their_own():
    plan = BlockPlan(GROUPS, 1, 1, True)
    assert plan.segments == [(1, 1), (2, 3), (4, 4)] and plan.back_segments == {2}
    assert BlockPlan(GROUPS, 1, 1).back_segments == set()
    assert BlockPlan(GROUPS, 1, 0, True).segments == [(1, 1), (2, 4)]  # no back blocks: no middle tier


def test_the_probe_error_is_the_forecasts_error_against_the_computed_probe():
    """The error formed on the host from sums (Gram products) equals the relative L2 error of the estimator's own
    forecast of the probe against the residual the probe computed, at every decision."""
    decider = ic.VerifiedBlockCache(front=1, back=1, threshold=1e-9, refresh_ratio=1.0, **WINDOW)
    blocks, _ = smooth_blocks(kink_at=0.6)
    seen = []
    original = decider.forecast_error

    class Checked(ic.VerifiedBlockCache):
        def forecast_error(self, run, ev, keys, sums):
            value = original(run, ev, keys, sums)
            num = den = 0.0
            for key in keys:
                r = run.current_forward.signals[self.id][key]
                f = run.estimate(key, "probe", ev.sigma, r)
                num += float(((f - r) ** 2).sum())
                den += float((r ** 2).sum())
            seen.append((value, (num / den) ** 0.5))
            return value

    checked = Checked(front=1, back=1, threshold=1e-9, refresh_ratio=1.0, **WINDOW)
    drive_blocks(checked, blocks, ic.TaylorSeer(order=2), branches=((1, "u"), (0, "c")))
    assert len(seen) == 14  # every evaluation but the first (no point yet) and the last (always computed)
    for value, direct in seen:
        assert value == pytest.approx(direct, rel=1e-3, abs=1e-6)
    assert max(d for _, d in seen) > 1e-2  # the kink gives errors far from zero: the check compared something


def test_tiers_run_the_blocks_they_name():
    """Every evaluation runs what the tier of its measured error names: under the threshold the probe alone (1
    block), up to the refresh threshold the probe and the back block (2), above it all 5; all three occur."""
    blocks, _ = smooth_blocks(kink_at=0.4)
    low, high = 2e-3, 2e-2
    run, _, per_eval = drive_blocks(ic.VerifiedBlockCache(threshold=low, refresh_ratio=high / low, **WINDOW),
                                    blocks, ic.TaylorSeer(order=2))
    for record, ran in zip(run.records[1:-1], per_eval[1:-1]):
        m = record.metric
        assert ran == (5 if m is None or m >= high else 2 if m >= low else 1), (m, ran, per_eval)
    assert {1, 2, 5} <= set(per_eval), [(r.metric, n) for r, n in zip(run.records, per_eval)]
    # the smooth quadratic stretch is forecast exactly by order 2 once three points exist: every block after the
    # probe is forecast there and the output equals the computed one
    blocks, _ = smooth_blocks()
    _, full, _ = drive_blocks(ic.VerifiedBlockCache(threshold=0.0, **WINDOW), blocks, ic.TaylorSeer(order=2))
    _, outs, per_eval = drive_blocks(ic.VerifiedBlockCache(threshold=1e-4, refresh_ratio=1.0, **WINDOW),
                                     blocks, ic.TaylorSeer(order=2))
    assert per_eval[-1] == 5 and per_eval.count(1) >= 10, per_eval
    assert all(torch.allclose(a, b, rtol=1e-4) for a, b in zip(outs, full))


def test_threshold_zero_is_bit_identical_and_runs_every_block():
    blocks, ran = smooth_blocks(kink_at=0.5)
    plain = []
    for sigma in SIGMAS[:-1]:
        img = torch.ones(1, 6)
        for b in blocks:
            img = b({"img": img, "sigma": sigma})["img"]
        plain.append(img)
    ran.clear()
    run, outs, _ = drive_blocks(ic.VerifiedBlockCache(threshold=0.0, **WINDOW), blocks, ic.TaylorSeer(order=2))
    assert len(ran) == 5 * 16 and all(torch.equal(a, b) for a, b in zip(outs, plain))
    assert "probe" not in next(iter(run.caches.branches.values())).slots  # nothing kept for a check never made


class CheckedAgainstTheLastComputedStep(ic.VerifiedBlockCache):
    """Broken on purpose: verifies the forecast against the probe of the last computed step instead of this one."""

    def measure(self, run, ev, signals):
        stale = {k: self._points(run, k)[-1] for k in (signals or {}) if self._points(run, k)}
        return super().measure(run, ev, stale or signals)


@pytest.mark.parametrize("decider_class, passes", [(ic.VerifiedBlockCache, True),
                                                   (CheckedAgainstTheLastComputedStep, False)])
def test_a_change_of_course_is_caught_only_when_the_probe_of_this_step_is_checked(decider_class, passes):
    """The residuals turn sharply at sigma 0.55. Checked against this step's probe, the forecast's error shows
    at once and the step computes; checked against the last computed step, it never does, and the forecast
    sails past the turn."""
    blocks, _ = smooth_blocks(kink_at=0.55)
    _, full, _ = drive_blocks(ic.VerifiedBlockCache(threshold=0.0, **WINDOW), blocks, ic.TaylorSeer(order=1))
    run, outs, per_eval = drive_blocks(decider_class(threshold=0.02, refresh_ratio=1.0, **WINDOW), blocks,
                                       ic.TaylorSeer(order=1))
    assert 1 in per_eval, "nothing was skipped: the test would prove nothing"
    worst = max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(outs, full))
    assert (worst < 0.05) == passes, (worst, per_eval)


# -- whole model -----------------------------------------------------------------------------------------------

def smooth_model(kink_at=None):
    """denoised = x * (1 - g(sigma)): the epsilon it implies is smooth in sigma, with an optional turn."""
    calls = []

    def model(x, sigma):
        calls.append(float(sigma[0]))
        s = sigma.reshape(-1, 1)
        g = 0.2 + 0.3 * s + 0.1 * s * s
        if kink_at is not None:
            g = g + 3.0 * torch.clamp(kink_at - s, min=0.0)
        return x * (1 - g * s)
    return model, calls


def drive_model(decider, model, estimator=None, x_of=lambda sigma: torch.full((2, 4), 1.0 + sigma)):
    chain = ic.InterceptorChain.of([decider] + ([estimator] if estimator else []))
    run = ic.LoopState(chain, SIGMAS)
    outs = []
    for sigma in SIGMAS[:-1]:
        run.begin_evaluation(sigma)
        x = x_of(sigma)
        s = torch.full((2,), sigma)
        fwd = run.begin_forward(sigma, 2, (4,), x.dtype, [1, 0], ["u", "c"])
        outs.append(model_forward(run, fwd, x, s, lambda: model(x, s)))
        run.end_forward(fwd, outs[-1])
        run.end_evaluation()
    return run, outs


def test_the_measured_error_is_that_of_the_forecast_a_skip_would_have_used():
    """On a computed step the decider learns the relative L1 error of the estimator's forecast at this sigma
    (made from the steps before) against the computed output, and the input change since the last computed step."""
    seen = []

    class Watched(ic.VerifiedForecast):
        def computed(self, run, ev, forward, signals, outputs=None):
            if forward.forecasts:
                f = torch.cat([forward.forecasts[k] for k in forward.keys])
                o = torch.cat([outputs[k] for k in forward.keys])
                seen.append(float((f - o).abs().sum() / o.abs().sum()))
            super().computed(run, ev, forward, signals, outputs)

        @staticmethod
        def _take(state, values):
            ic.VerifiedForecast._take(state, values)
            seen.append(("taken", state.error))

    model, calls = smooth_model(kink_at=0.5)
    run, _ = drive_model(Watched(threshold=1e-9, **WINDOW), model, ic.TaylorSeer(order=1))
    assert len(calls) == 16  # nothing is under a threshold of 1e-9
    errors = [e for e in seen if not isinstance(e, tuple)]
    taken = [e for tag, e in (t for t in seen if isinstance(t, tuple))]
    # each error is read with the next evaluation's transfer; the last one is never needed
    assert taken == pytest.approx(errors[:len(taken)]) and len(taken) == len(errors) - 1
    assert max(errors) > 1e-2


@pytest.mark.parametrize("order", [0, 1, 2])
def test_whole_model_skips_fewer_when_the_threshold_is_lower_and_never_at_zero(order):
    estimator = ic.TaylorSeer(order=order)
    counts = []
    plain_model, _ = smooth_model(kink_at=0.5)
    _, plain = drive_model(ic.FixedCadence(interval=1), plain_model)
    for threshold in (0.0, 0.005, 0.02, 0.1):
        model, calls = smooth_model(kink_at=0.5)
        run, outs = drive_model(ic.VerifiedForecast(threshold=threshold, **WINDOW), model, estimator)
        counts.append(len(calls))
        if threshold == 0.0:
            assert all(torch.equal(a, b) for a, b in zip(outs, plain))
        for record in run.records:  # a skip only where the predicted error was under the threshold
            assert not record.skipped or record.metric < threshold, (record.metric, threshold)
    assert counts[0] == 16 and counts == sorted(counts, reverse=True) and counts[-1] < counts[1], counts


class ForecastAfterStoring(ic.VerifiedForecast):
    """Broken on purpose: measures the forecast's error against the computed step it already holds (the forecast
    made after the step was stored), so it learns that forecasts never err."""

    def computed(self, run, ev, forward, signals, outputs=None):
        forward.forecasts = {k: run.estimate(k, "output", ev.sigma, v) for k, v in (outputs or {}).items()}
        super().computed(run, ev, forward, signals, outputs)


@pytest.mark.parametrize("decider_class, passes", [(ic.VerifiedForecast, True), (ForecastAfterStoring, False)])
def test_whole_model_error_measured_against_the_wrong_step_skips_through_the_turn(decider_class, passes):
    """The output turns at sigma 0.5. The error checked on computed steps sees the turn and skips get scarcer;
    checked against the step it already holds, every forecast looks exact and the run skips through it."""
    plain_model, _ = smooth_model(kink_at=0.5)
    _, plain = drive_model(ic.FixedCadence(interval=1), plain_model)
    model, calls = smooth_model(kink_at=0.5)
    _, outs = drive_model(decider_class(threshold=0.01, **WINDOW), model, ic.TaylorSeer(order=1))
    assert len(calls) < 16, "nothing was skipped: the test would prove nothing"
    # nothing at whole-model level can see the turn before a step past it computes: judged from sigma 0.375 on, by
    # when the checked variant has computed one; from then on its forecasts stay close and the unchecked do not
    after = [i for i, sigma in enumerate(SIGMAS[:-1]) if sigma < 0.375]
    worst = max(float((outs[i] - plain[i]).abs().max() / plain[i].abs().max()) for i in after)
    assert (worst < 0.02) == passes, (worst, calls)
