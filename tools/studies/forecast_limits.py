"""How far better forecasts could carry a sparse schedule, and how much one seed says about a plan.

The pack's forecast between computed evaluations is TaylorSeer's polynomial in sigma (order 0-2, chosen per plan
by Auto Calibrate). This study asks whether another forecast of the same computed outputs would let fewer of them
meet a PSNR floor. It samples with ComfyUI's own model function and CFG (``comfy.sample.sample_custom``) in a
plain euler loop that computes exactly the plan's evaluations and forecasts the others, each variant a different
rule, on the bundled digits model (all ten digits, simple schedule, cfg 3, 28 steps):

* ``taylorseer o0/o1/o2``: the pack's forecast (the loop's o1 is checked against the pack's own Cached Sampler
  with the same plan: the first table's last column);
* ``per-gap order``: order 1 or 2 chosen separately for every gap between computed evaluations, the combination
  that scores best at the calibration seed (all 2^(gaps - 1) tried there), then measured on the other seeds;
* ``scaled x``: the linear forecast's step from the last computed output scaled (less or more than extrapolation);
* ``abscissa``: the polynomial in sqrt(sigma) or in the log-SNR instead of sigma;
* ``x0 blend k``: extrapolating ``k x + (1 - k) (-eps) - k sigma eps`` (k = 1: the denoised image, as DDIM-type
  solvers do; 0: epsilon) and converting back at the current latent, so the forecast follows the latent;
* ``corrector``: after each computed evaluation the skipped steps before it are re-integrated with the polynomial
  through the new output as well (UniPC's corrector, Zhao et al., arXiv 2302.04867), moving the latent;
* ``open-loop fit``: known only after the fact: the linear forecast's step scaled per gap by the factor that makes
  the gap's integrated error least on the uncached run at that very seed. Were the error of the uncached
  trajectory's forecasts what decided, this would bound every rule above.

Then, on the bundled video model (a tiny Wan 2.1, 8 classes), Fixed Cadence (growing and not) + TaylorSeer through
the pack's Cached Sampler path at several seeds: how far one schedule's PSNR moves from one noise to the next;
and, for one plan in the loop, whether the forecast's miss at the computed steps (what a run can check while it
samples) tells the seeds that fall short from those that do not, and whether more computed steps give a better
result there. Prints a markdown report.

    python3 -m cached_sampler_dev.studies.forecast_limits            # about 6 min on 2 cores
    python3 -m cached_sampler_dev.studies.forecast_limits --quick    # one plan, two seeds
"""
from __future__ import annotations

import argparse
import bisect
import itertools
import math
import statistics


STEPS = 28
CFG = 3.0
CALIBRATION_SEED = 1
HELD_OUT = (0, 3, 100, 101)
# Auto Calibrate's 35 dB plan for the video model at seed 1 (tools/studies/held_out_seeds.py --model video)
VIDEO_PLAN = (0, 5, 9, 13, 17, 21, 23, 25, 27)


lagrange = None  # the pack's own interpolation weights (interceptors.methods.taylorseer.lagrange_weights), bound in main()


def combine(points: list, at: float, abscissa=lambda s: s):
    """The polynomial through ``points`` [(sigma, tensor)] at ``at``, in the given abscissa."""
    w = lagrange([abscissa(s) for s, _ in points], abscissa(at))
    return sum(v * wi for (_, v), wi in zip(points, w))


class Rule:
    """One forecast rule: which quantity is kept per computed evaluation, how a skipped one is formed."""

    def __init__(self, order=1, orders=None, scale=1.0, abscissa=None, blend=0.0, corrector=False, weights=None):
        self.order, self.orders, self.scale, self.blend, self.corrector = order, orders, scale, blend, corrector
        self.weights = weights  # evaluation -> weights on the last len(weights) computed outputs (oldest first)
        self.abscissa = abscissa or (lambda s: s)

    def kept(self, x, eps, s):
        # k x - (k s + 1 - k) eps: the denoised image at k = 1, -eps at k = 0
        return self.blend * x - (self.blend * s + 1 - self.blend) * eps if self.blend else eps

    def back(self, x, q, s):
        return (self.blend * x - q) / (self.blend * s + 1 - self.blend) if self.blend else q

    def forecast(self, history, x, s, gap, index):
        if self.weights is not None:
            w = self.weights.get(index)
            if w is None:
                return combine(history[-(self.order + 1):], s, self.abscissa)
            return sum(v * wi for (_, v), wi in zip(history[-len(w):], w))
        order = self.orders[gap] if self.orders is not None else self.order
        points = history[-(order + 1):]
        q = combine(points, s, self.abscissa)
        if self.scale != 1.0:
            q = points[-1][1] + self.scale * (q - points[-1][1])
        return self.back(x, q, s)


def planned_euler(plan: tuple[int, ...], rule: Rule, record: list, misses: list | None = None):
    """A ComfyUI KSAMPLER: euler over the given sigmas, the model computed on ``plan``'s evaluations only. With
    ``misses``, each computed evaluation after the second adds (evaluation, relative L1 error of the forecast a
    skip would have used there against the computed output): the miss of the gap it ends."""
    import comfy.samplers
    computed = sorted(set(plan))

    def sample(model, x, sigmas, extra_args=None, callback=None, disable=None):
        extra_args = extra_args or {}
        record.clear()
        ones = x.new_ones([x.shape[0]])
        history, pending = [], []  # (sigma, kept quantity); skipped since the last computed: (sigma, dt, eps)
        for i in range(len(sigmas) - 1):
            s, dt = float(sigmas[i]), float(sigmas[i + 1] - sigmas[i])
            if i in computed or not history:
                eps = (x - model(x, sigmas[i] * ones, **extra_args)) / s
                record.append(eps)
                if misses is not None and len(history) >= 2:
                    forecast = rule.forecast(history, x, s, bisect.bisect(computed, i) - 1, i)
                    misses.append((i, float((forecast - eps).abs().mean() / eps.abs().mean())))
                if rule.corrector and pending:
                    through = history[-rule.order:] + [(s, eps)]
                    for sj, dtj, forecast in pending:
                        x = x + dtj * (combine(through, sj) - forecast)
                pending = []
                history.append((s, rule.kept(x, eps, s)))
            else:
                eps = rule.forecast(history, x, s, bisect.bisect(computed, i) - 1, i)  # the gap's index
                pending.append((s, dt, eps))
            x = x + dt * eps
        return x

    return comfy.samplers.KSAMPLER(sample)


class Workload:
    def __init__(self, module, labels, decode):
        import comfy.sample
        import comfy.samplers
        self.model = module.load_model()
        self.positive, self.negative = module.class_conditioning(labels)
        self.latent = comfy.sample.fix_empty_latent_channels(self.model, module.empty_latent(len(labels)))
        self.sigmas = comfy.samplers.calculate_sigmas(self.model.get_model_object("model_sampling"), "simple", STEPS)
        self.decode = decode
        self.references = {}
        self.outputs = {}  # seed -> the uncached run's eps of every evaluation

    def images(self, seed: int, plan, rule: Rule, record=None, misses=None):
        import comfy.sample
        noise = comfy.sample.prepare_noise(self.latent, seed)
        sampler = planned_euler(plan, rule, record if record is not None else [], misses)
        out = comfy.sample.sample_custom(self.model, noise, CFG, sampler, self.sigmas, self.positive,
                                         self.negative, self.latent, disable_pbar=True, seed=seed)
        return self.decode(out)

    def reference(self, seed: int):
        if seed not in self.references:
            self.outputs[seed] = []
            self.references[seed] = self.images(seed, tuple(range(STEPS)), Rule(), self.outputs[seed])
        return self.references[seed]

    def hindsight(self, seed: int, plan) -> Rule:
        """TaylorSeer o1 with its step from the last computed output scaled per gap, each scale fitted to that seed's
        uncached run so that the gap's integrated error, ``sum_j dt_j (forecast_j - out_j)`` (what the gap adds to
        the result, open loop), is least. Fitted each skipped output on its own instead, by least squares, the
        weights shrink the extrapolation in the same way."""
        self.reference(seed)
        outs = [o.double() for o in self.outputs[seed]]
        sig = [float(v) for v in self.sigmas]
        computed = sorted(set(plan))
        weights = {}
        for g, first in enumerate(computed):
            skipped = range(first + 1, computed[g + 1] if g + 1 < len(computed) else STEPS)
            before = computed[max(0, g - 1):g + 1]
            if not skipped or len(before) < 2:
                continue
            lin = {j: lagrange([sig[i] for i in before], sig[j]) for j in skipped}  # o1's weights
            last = outs[before[-1]]
            a = sum((sig[j + 1] - sig[j]) * (last - outs[j]) for j in skipped)
            b = sum((sig[j + 1] - sig[j]) * (lin[j][0] * outs[before[0]] + (lin[j][1] - 1) * last) for j in skipped)
            scale = float(-(a * b).sum() / (b * b).sum())
            for j in skipped:  # last + scale * (o1 - last), as weights on the two points
                weights[j] = [scale * lin[j][0], 1 + scale * (lin[j][1] - 1)]
        return Rule(1, weights=weights)

    def psnr(self, seed: int, plan, rule: Rule, misses=None) -> float:
        from ..bench.bench_metrics import psnr
        return psnr(self.images(seed, plan, rule, misses=misses), self.reference(seed))


def pack_run(app, work: Workload, items: list, seed: int) -> tuple[float, object]:
    """PSNR of the pack's own Cached Sampler path (ComfyUI's KSampler code) with the chain of ``items``, and the
    run's summary (what it computed)."""
    import nodes as comfy_nodes
    from ..bench.bench_metrics import psnr
    ic, adapter = app.module("interceptors"), app.module("adapter")
    summaries = []
    patched = adapter.install(work.model, ic.InterceptorChain.of(items), schedule=adapter.schedule_of(STEPS, 1.0),
                              on_run_end=lambda run, summary: summaries.append(summary))
    (latent,) = comfy_nodes.common_ksampler(patched, seed, STEPS, CFG, "euler", "simple", work.positive,
                                            work.negative, {"samples": work.latent}, denoise=1.0)
    return psnr(work.decode(latent["samples"]), work.reference(seed)), summaries[-1]


def pack_psnr(app, work: Workload, items: list, seed: int) -> float:
    return pack_run(app, work, items, seed)[0]


def planned(app, work: Workload, plan) -> list:
    """The pack's Calibrated Schedule for ``plan`` + TaylorSeer o1, what the euler loop's o1 rule does."""
    ic = app.module("interceptors")
    sigmas = tuple(float(s) for s in work.sigmas)
    return [ic.PlannedSchedule(compute=tuple(plan), sigmas=sigmas[:-1], schedule=sigmas), ic.TaylorSeer(order=1)]


def every(k: int) -> tuple[int, ...]:
    return tuple(range(0, STEPS, k))


def cell(values: list[float]) -> str:
    return f"{statistics.mean(values):.2f} / {min(values):.2f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one plan, one held-out seed")
    args = parser.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    from .calibration_spaces import start_study
    app, _, digits_decode = start_study()
    global lagrange
    lagrange = app.module("interceptors.methods.taylorseer").lagrange_weights

    digits = Workload(app.module("nodes.demo_models.digits"), list(range(10)), digits_decode)
    plans = {"6 of 28 (every 5th)": every(5)} if args.quick else {
        "5 of 28 (every 6th)": every(6), "6 of 28 (every 5th)": every(5), "7 of 28 (every 4th)": every(4)}
    held_out = HELD_OUT[:1] if args.quick else HELD_OUT
    rules = {
        "taylorseer o1 (the pack's)": Rule(1), "taylorseer o0": Rule(0), "taylorseer o2": Rule(2),
        "scaled x0.8": Rule(1, scale=0.8), "scaled x1.15": Rule(1, scale=1.15),
        "abscissa sqrt(sigma)": Rule(1, abscissa=lambda s: math.sqrt(max(s, 0.0))),
        "abscissa log-SNR": Rule(1, abscissa=lambda s: math.log(max(s, 1e-4) / max(1 - s, 1e-4))),
        "x0 blend 0.5": Rule(1, blend=0.5), "x0 blend 1 (denoised)": Rule(1, blend=1.0),
        "corrector (UniPC-type)": Rule(1, corrector=True),
    }
    print("# Forecast limits: other forecasts of the same computed outputs\n")
    print(f"Digits model, 28 steps, euler / simple, cfg {CFG:g}; decoded-image PSNR against the uncached run at the "
          f"same seed, as *mean / worst* over the held-out seeds {', '.join(map(str, held_out))}; the per-gap order is "
          f"chosen at seed {CALIBRATION_SEED}. Work = computed evaluations of 28.\n")
    print("| forecast | " + " | ".join(plans) + " |")
    print("|---|" + "---|" * len(plans))
    results = {}
    for name, rule in rules.items():
        results[name] = {p: [digits.psnr(s, plan, rule) for s in held_out] for p, plan in plans.items()}
    chosen = {}
    for p, plan in plans.items():  # the per-gap order, chosen at the calibration seed
        gaps = len(plan)
        # the first gap has one point to forecast from (a reuse whatever the order); orders 1 and 2 after it
        best = max(((1, *o) for o in itertools.product((1, 2), repeat=gaps - 1)),
                   key=lambda o: digits.psnr(CALIBRATION_SEED, plan, Rule(orders=o)))
        chosen[p] = best
        results.setdefault("per-gap order (chosen at the calibration seed)", {})[p] = [
            digits.psnr(s, plan, Rule(orders=best)) for s in held_out]
    for p, plan in plans.items():  # the bound: weights fitted at each seed's own uncached run
        results.setdefault("open-loop fit per gap (to the uncached run at that seed)", {})[p] = [
            digits.psnr(s, plan, digits.hindsight(s, plan)) for s in held_out]
    base = results["taylorseer o1 (the pack's)"]
    for name, row in results.items():
        cells = []
        for p in plans:
            delta = statistics.mean(row[p]) - statistics.mean(base[p])
            cells.append(cell(row[p]) + ("" if row is base else f" ({delta:+.2f})"))
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("\nPer-gap orders chosen: " + "; ".join(f"{p}: {', '.join(map(str, o))}" for p, o in chosen.items()) + ".")
    check = {p: pack_psnr(app, digits, planned(app, digits, plan), held_out[0]) for p, plan in plans.items()}
    print(f"\nThe loop against the pack (seed {held_out[0]}, TaylorSeer o1): "
          + "; ".join(f"{p}: loop {base[p][0]:.2f} dB, Cached Sampler {check[p]:.2f} dB" for p in plans) + ".\n")

    video_module = app.module("nodes.demo_models.video")
    video = Workload(video_module, list(range(8)), video_module.decode)
    seeds = (0, 1) if args.quick else (0, 1, 2, 3, 4, 5)
    ic = app.module("interceptors")
    video_plans = {f"Fixed Cadence {i}, growth {g:g}": [ic.FixedCadence(interval=i, growth=g), ic.TaylorSeer(order=1)]
                   for i, g in ((2, 0.5), (2, 0.25), (3, 0))}
    if args.quick:
        video_plans = dict(itertools.islice(video_plans.items(), 1))
    print("## One schedule, several seeds (video model)\n")
    print(f"Tiny Wan 2.1 video model, 8 videos, 28 steps, cfg {CFG:g}, the Cached Sampler with Fixed Cadence + "
          f"TaylorSeer o1; decoded-frame PSNR against the uncached run at each seed.\n")
    print("| schedule | " + " | ".join(f"seed {s}" for s in seeds) + " | spread |")
    print("|---|" + "---|" * (len(seeds) + 1))
    for p, items in video_plans.items():
        values = [pack_psnr(app, video, items, s) for s in seeds]
        print(f"| {p} | " + " | ".join(f"{v:.2f}" for v in values) + f" | {max(values) - min(values):.1f} dB |")
    seed_misses(video, VIDEO_PLAN, (1, 100) if args.quick else (1, *range(100, 108)))
    more_steps(video, (12, 14) if args.quick else (9, 12, 14, 16, 18, 20), (1, 2) if args.quick else (1, 2, 3))
    return 0


def spread_evenly(k: int) -> tuple[int, ...]:
    """``k`` computed evaluations of STEPS, the first and the last among them, as evenly apart as whole steps allow."""
    return tuple(sorted({round(i * (STEPS - 1) / (k - 1)) for i in range(k)}))


def more_steps(video: Workload, counts, seeds) -> None:
    """Whether computing more evaluations gives a better result on the video model: evenly spread plans of
    ``counts`` computed evaluations, TaylorSeer o1 and o2, at ``seeds``."""
    print("\n## More computed steps, seed by seed (video model)\n")
    print(f"Plans computing N of {STEPS} evaluations spread evenly (the first and the last among them), in the "
          f"loop above; decoded-frame PSNR against the uncached run at each seed.\n")
    print("| computed | forecast | " + " | ".join(f"seed {s}" for s in seeds) + " |")
    print("|---|---|" + "---|" * len(seeds))
    for k in counts:
        for order in (1, 2):
            values = [video.psnr(s, spread_evenly(k), Rule(order)) for s in seeds]
            print(f"| {k} | TaylorSeer o{order} | " + " | ".join(f"{v:.2f}" for v in values) + " |")


def seed_misses(video: Workload, plan: tuple[int, ...], seeds) -> None:
    """Whether a run could tell, while it samples, that its seed will fall short: for one plan, each seed's PSNR
    beside how far the forecast missed at the plan's computed steps (what a check of the forecast against the
    computed output, as the Verified Forecast makes, can see)."""
    results = {}
    for seed in seeds:
        misses = []
        results[seed] = (video.psnr(seed, plan, Rule(1), misses), dict(misses))
    steps = sorted(results[seeds[0]][1])
    print("\n## What a run can see of its seed (video model)\n")
    print(f"The plan Auto Calibrate makes for 35 dB at seed 1 (steps {', '.join(str(i + 1) for i in plan)}; "
          f"TaylorSeer o1) in the loop above, at seed 1 and at held-out seeds: the decoded-frame PSNR, and at each "
          f"computed step from the third on the relative L1 error of the forecast a skip would have used there "
          f"against the computed output.\n")
    print("| seed | PSNR | " + " | ".join(f"miss at step {i + 1}" for i in steps) + " |")
    print("|---|---|" + "---|" * len(steps))
    for seed, (value, misses) in results.items():
        print(f"| {seed} | {value:.2f} | " + " | ".join(f"{misses[i]:.3f}" for i in steps) + " |")
    values = [v for v, _ in results.values()]
    spread = [max(m[i] for _, m in results.values()) / min(m[i] for _, m in results.values()) for i in steps]
    mean_miss = [statistics.mean(m.values()) for _, m in results.values()]
    print(f"\nPSNR spread {max(values) - min(values):.1f} dB; the miss at one step differs by at most "
          f"{max(spread) - 1:.0%} from seed to seed; correlation of the PSNR with the mean miss over the seeds: "
          f"{statistics.correlation(values, mean_miss) if len(values) > 2 else float('nan'):.2f}.")


if __name__ == "__main__":
    raise SystemExit(main())
