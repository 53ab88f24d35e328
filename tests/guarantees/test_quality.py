"""Quality on the trained digits model: smooth trade-offs, forecasting beats reuse, calibration hits targets.

Random-weight models say nothing about quality (their consecutive outputs are nearly unrelated), so these
claims rest on the small Flux trained by the project.
"""
import math

import pytest

pytestmark = pytest.mark.slow

STEPS = 20


@pytest.fixture(scope="module")
def digits(comfy):
    import comfy.sample as comfy_sample
    dm = comfy.module("nodes.demo_models.digits")
    ic = comfy.module("interceptors")
    adapter = comfy.module("adapter")
    model = dm.load_model()
    labels = list(range(10))
    positive, negative = dm.class_conditioning(labels)

    def sample(chain=None, steps=STEPS, runs=None):
        m = model if chain is None else adapter.install(
            model, ic.InterceptorChain.of(chain), on_run_end=lambda run, summary: runs.append(summary))
        latent = comfy_sample.fix_empty_latent_channels(m, dm.empty_latent(len(labels)))
        noise = comfy_sample.prepare_noise(latent, 0)
        return comfy_sample.sample(m, noise, steps, 3.0, "euler", "simple", positive, negative, latent,
                                   disable_pbar=True, seed=0)

    reference = {STEPS: sample()}

    def measure(chain, steps=STEPS):
        summaries = []
        out = sample(chain, steps, summaries)
        ref = reference.setdefault(steps, sample(steps=steps))
        a, b = dm.decode(ref), dm.decode(out)
        mse = float(((a - b) ** 2).mean())
        psnr = math.inf if mse == 0 else 10 * math.log10(1 / mse)
        return psnr, 1 - summaries[-1].work_saved

    class Digits:
        pass

    d = Digits()
    d.ic, d.measure, d.sample, d.model, d.dm, d.adapter = ic, measure, sample, model, dm, adapter
    return d


SWEEPS = {
    "dbcache": lambda ic, t: [ic.DBCache(front=1, back=0, threshold=t, warmup=0.1, max_consecutive_cached=-1)],
    "fbcache": lambda ic, t: [ic.FirstBlockCache(threshold=t, warmup=0.1, max_consecutive_cached=-1)],
    "adaptive": lambda ic, t: [ic.AdaptiveCache(threshold=t, start_percent=0.0, end_percent=1.0)],
    "teacache": lambda ic, t: [ic.TeaCache(threshold=t * 5, model_type="flux")],
    "fixed_cadence": lambda ic, t: [ic.FixedCadence(interval=1 + round(t * 20))],
}


@pytest.mark.parametrize("method", sorted(SWEEPS))
def test_quality_falls_smoothly_as_threshold_rises(digits, method):
    results = [digits.measure(SWEEPS[method](digits.ic, t)) for t in (0.0, 0.05, 0.1, 0.2)]
    psnrs, works = [p for p, _ in results], [w for _, w in results]
    assert psnrs[0] == math.inf and works[0] == 1.0, "threshold 0 reproduces the uncached result"
    assert all(w1 >= w2 for w1, w2 in zip(works, works[1:])), f"work must not grow with the threshold: {works}"
    assert works[-1] < 0.9, f"{method} barely skipped anything on a trained model: {works}"
    assert all(p1 >= p2 - 0.5 for p1, p2 in zip(psnrs, psnrs[1:])), f"quality must fall with the threshold: {psnrs}"
    assert psnrs[-1] > 20, f"{method} collapsed: {psnrs}"


@pytest.mark.parametrize("interval", [3, 4])
def test_forecasting_beats_reuse_at_equal_compute(digits, interval):
    ic = digits.ic
    reuse = digits.measure([ic.FixedCadence(interval=interval)])
    forecast = digits.measure([ic.FixedCadence(interval=interval), ic.TaylorSeer(order=1)])
    assert reuse[1] == forecast[1], "same schedule, same compute"
    assert forecast[0] > reuse[0] + 3, f"TaylorSeer {forecast[0]:.1f} dB vs reuse {reuse[0]:.1f} dB"
    fb_reuse = digits.measure([ic.FirstBlockCache(threshold=0.2, max_consecutive_cached=-1)])
    fb_forecast = digits.measure([ic.FirstBlockCache(threshold=0.2, max_consecutive_cached=-1), ic.TaylorSeer(order=1)])
    assert fb_forecast[1] == fb_reuse[1] and fb_forecast[0] > fb_reuse[0]


def _calibrate(digits, **target):
    ic = digits.ic
    runs = []
    recorder = digits.adapter.install(digits.model, ic.InterceptorChain.of([ic.Recorder()]),
                                      on_run_end=lambda run, summary: runs.append(run))
    import comfy.sample as comfy_sample
    dm = digits.dm
    labels = list(range(10))
    positive, negative = dm.class_conditioning(labels)
    latent = comfy_sample.fix_empty_latent_channels(recorder, dm.empty_latent(10))
    noise = comfy_sample.prepare_noise(latent, 0)
    reference = comfy_sample.sample(recorder, noise, STEPS, 3.0, "euler", "simple", positive, negative, latent,
                                    disable_pbar=True, seed=0)
    sigmas, outputs = ic.recorded_trajectory(runs[-1])
    schedule = tuple(runs[-1].sample_sigmas)

    def chain(compute):
        return [ic.PlannedSchedule(compute=tuple(compute), sigmas=tuple(sigmas), schedule=schedule),
                ic.TaylorSeer(order=1)]

    plan = ic.calibrate(sigmas, outputs, lambda c: ic.latent_quality(reference, digits.sample(chain(c), runs=[])),
                        order=1, **target)
    summaries = []
    again = digits.sample(chain(plan.compute), runs=summaries)
    return plan, ic.latent_psnr(reference, again), summaries[-1]


@pytest.mark.parametrize("budget", [4, 6, 9])
def test_auto_calibration_hits_its_budget_exactly(digits, budget):
    plan, psnr, summary = _calibrate(digits, budget=budget)
    assert len(plan.compute) == budget
    assert summary.forwards_computed == budget, "one batched forward per computed evaluation"
    assert 0 in plan.compute and STEPS - 1 in plan.compute, "the first and last steps are always computed"
    assert abs(psnr - plan.psnr) < 1e-6, "the reported quality is what the plan really gives"


@pytest.mark.parametrize("target", [30.0, 38.0])
def test_auto_calibration_meets_its_quality_target(digits, target):
    plan, psnr, summary = _calibrate(digits, min_psnr=target)
    assert psnr >= target and abs(psnr - plan.psnr) < 1e-6
    assert len(plan.compute) < STEPS, "a reachable target must save work"
    smaller, _, _ = _calibrate(digits, budget=len(plan.compute) - 1)
    assert smaller.psnr < target, "the budget chosen is the smallest that meets the target"
