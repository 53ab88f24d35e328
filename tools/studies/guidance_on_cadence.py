"""Where the Guidance Cache pays on a growing cadence: the negative branch left out late, over several seeds.

On the video model (a tiny Wan 2.1, 8 classes, 28 steps, cfg 3) the growing cadence (Spectrum's schedule, Fixed
Cadence's ``growth``) + TaylorSeer o1 and Spectrum's ComfyUI port reach the same work at every PSNR floor, one
computed step apart. Leaving the negative CFG branch out of some of the computed steps halves their work; this
study measures, through the pack's Cached Sampler path, what that costs at the growing settings that are best at
31, 35 and 40 dB on the bench, for the Guidance Cache at interval 2 and 3 from several ``start_percent``. The
bench measures seed 0: the setting it chains (``GUIDANCE_ON_CADENCE`` in tools/bench/bench_discover.py) is chosen
on the other seeds. Work is the run's own count (batch rows the model ran, against the uncached run). Prints a
markdown report.

``--each-step`` asks the other question, on the photos model at 35 dB: whether one negative branch left out
anywhere halves a computed step's work there cheaply enough. At 8 computed steps (the pack's best at 35 dB there)
half a computed step fewer (7.5 of 28) would be 1.20x the Spectrum port's; it leaves the negative branch out of one
computed step at a time, as Auto Calibrate's ``negative_branch`` plans do (the ``planned`` mode), with each estimate
the Guidance Cache has, over seeds 0-7.

    python3 -m cached_sampler_dev.studies.guidance_on_cadence               # about 6 min on 2 cores
    python3 -m cached_sampler_dev.studies.guidance_on_cadence --quick       # one setting, two seeds
    python3 -m cached_sampler_dev.studies.guidance_on_cadence --each-step   # photos model, about 15 min
"""
from __future__ import annotations

import argparse
import statistics

from .forecast_limits import CFG, STEPS, Workload, pack_run  # noqa: E402

CADENCES = ((3, 0.75), (2, 0.5), (2, 0.25))  # the growing settings best at 31, 35 and 40 dB on the bench
GUIDANCE = ((2, 0.5), (2, 0.6), (2, 0.7), (2, 0.8), (3, 0.6))  # (interval, start_percent)
EACH_STEP_CADENCES = ((3, 0.5), (3, 0.75))  # on the photos model: 8 and 7 computed steps, the best at 35 dB


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one cadence, one Guidance Cache setting, two seeds")
    parser.add_argument("--each-step", action="store_true", help="the photos model: one negative branch left out, "
                        "at each computed step in turn, with each estimate")
    args = parser.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    from .calibration_spaces import start_study
    app, ic, _ = start_study()
    if args.each_step:
        return each_step(app, ic, args.quick)
    module = app.module("nodes.demo_models.video")
    video = Workload(module, list(range(8)), module.decode)
    seeds = (0, 1) if args.quick else (0, 1, 2, 3, 4, 5)
    cadences = CADENCES[1:2] if args.quick else CADENCES
    guidance = GUIDANCE[1:2] if args.quick else GUIDANCE

    print("# The Guidance Cache on a growing cadence (video model)\n")
    print(f"Tiny Wan 2.1 video model, 8 videos, {STEPS} steps, euler / simple, cfg {CFG:g}; Fixed Cadence with "
          f"`growth` + TaylorSeer o1, then the Guidance Cache (`cadence` mode, `difference forecast`). Work saved "
          f"by batch rows; decoded-frame PSNR against the uncached run at each seed. Seed 0 is the bench's; "
          f"*mean 1-{seeds[-1]}* leaves it out.\n")
    print("| chain | work saved | " + " | ".join(f"seed {s}" for s in seeds) + f" | mean 1-{seeds[-1]} |")
    print("|---|---|" + "---|" * (len(seeds) + 1))
    for interval, growth in cadences:
        base = [ic.FixedCadence(interval=interval, growth=growth), ic.TaylorSeer(order=1)]
        chains = {f"Fixed Cadence {interval}, growth {growth:g}": base}
        for every, start in guidance:
            chains[f"... + Guidance Cache {every} from {start:g}"] = base + [
                ic.GuidanceCache(interval=every, start_percent=start)]
        for name, items in chains.items():
            results = [pack_run(app, video, items, s) for s in seeds]
            values = [p for p, _ in results]
            saved = sorted({round(summary.work_saved, 3) for _, summary in results})
            print(f"| {name} | " + " / ".join(f"{w:.1%}" for w in saved) + " | "
                  + " | ".join(f"{v:.2f}" for v in values) + f" | {statistics.mean(values[1:]):.2f} |", flush=True)
    return 0


def each_step(app, ic, quick: bool) -> int:
    """One negative branch left out of a growing cadence on the photos model, at each computed step in turn."""
    module = app.module("nodes.demo_models.photos")
    photos = Workload(module, list(range(8)), module.decode)
    sigmas = tuple(float(s) for s in photos.sigmas)
    seeds = (0, 1) if quick else tuple(range(8))
    cadences = EACH_STEP_CADENCES[:1] if quick else EACH_STEP_CADENCES
    estimates = app.module("interceptors.methods.guidance").ESTIMATES[:1 if quick else None]
    print("# One negative branch left out of a growing cadence (photos model)\n")
    print(f"Tiny Flux photos model, 8 pictures, {STEPS} steps, euler / simple, cfg {CFG:g}; Fixed Cadence with "
          f"`growth` + TaylorSeer o1, the negative branch left out of one computed step (the Guidance Cache's "
          f"`planned` mode, as Auto Calibrate's `negative_branch` plans it) with each estimate. Work saved by batch "
          f"rows; decoded-image PSNR against the uncached run at seeds {', '.join(map(str, seeds))}.\n")
    print("| chain | work saved | " + " | ".join(f"seed {s}" for s in seeds) + " | median | worst |")
    print("|---|---|" + "---|" * (len(seeds) + 2))
    for interval, growth in cadences:
        cadence = ic.FixedCadence(interval=interval, growth=growth)
        base = [cadence, ic.TaylorSeer(order=1)]
        steps = cadence.computed_steps(STEPS)
        chains = {f"Fixed Cadence {interval}, growth {growth:g} (steps {', '.join(map(str, steps))})": base}
        for step in steps[1:-1]:  # the first has nothing to estimate from; the last is computed whole
            for estimate in estimates:
                chains[f"... negative branch left out at step {step}, {estimate}"] = base + [ic.GuidanceCache(
                    mode="planned", leave_out=(step,), sigmas=sigmas[:-1], schedule=sigmas, estimate=estimate)]
        for name, items in chains.items():
            results = [pack_run(app, photos, items, s) for s in seeds]
            values = [p for p, _ in results]
            saved = sorted({round(summary.work_saved, 3) for _, summary in results})
            print(f"| {name} | " + " / ".join(f"{w:.1%}" for w in saved) + " | "
                  + " | ".join(f"{v:.2f}" for v in values)
                  + f" | {statistics.median(values):.2f} | {min(values):.2f} |", flush=True)
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
