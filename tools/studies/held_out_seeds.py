"""Auto Calibrate and hand-tuned settings on seeds neither was tuned on.

A hand-tuned setting is tuned on some seed too: the bench's "best hand-tuned" is the best setting at the seed it
measures, which no user knows in advance for the next seed. This study puts Auto Calibrate and the hand-tuned
settings on the same footing. On a bundled model (``--model``: the digits model, all ten digits, or the video
model, a tiny Wan 2.1, all eight classes, or the photos model, a tiny Flux trained on photographs, all eight
classes; euler / simple, cfg 3, 28 steps):

* Auto Calibrate plans each PSNR target at the calibration seed (image PSNR, the model's VAE connected), with
  ``seeds`` 1 and 3;
* the hand-tuned settings are those the bench finds best at these floors on that model, and fewer steps (the
  uncached sampler at 3-27 steps). Digits: Fixed Cadence + TaylorSeer order 1 and 2 over intervals 2-8. Video and
  photos: Fixed
  Cadence with ``growth`` (Spectrum's growing schedule, intervals 2-3, growth 0-3) + TaylorSeer order 1, alone and
  with the bench's Guidance Cache after it. The one a user would pick is the one with the least work that meets
  the target *at the calibration seed*, as Auto Calibrate is planned there;
* all of them are then sampled at held-out seeds that none was tuned on, and their decoded images compared with the
  uncached ones.

For each held-out seed it also reports the *oracle*: the best hand-tuned setting chosen at that very seed, the
bench's comparison; and *hindsight*: the one hand-tuned setting with the least work that meets the target on every
held-out seed, the best a user could have picked knowing those seeds; and fewer steps chosen at each held-out seed
itself (median and worst), the bench's yardstick, which says how easy those seeds are. Prints a markdown report.

    python3 -m cached_sampler_dev.studies.held_out_seeds   # targets 35, 40, 45 dB, 8 held-out seeds (about 25 min on 2 cores)
    python3 -m cached_sampler_dev.studies.held_out_seeds --targets 35 --held-out 2 --confirm-seeds 1
    python3 -m cached_sampler_dev.studies.held_out_seeds --targets 45 --margin 2.5 --confirm-seeds 1  # the 47.5 dB plan at 45 dB
    python3 -m cached_sampler_dev.studies.held_out_seeds --model video       # the video model (about 80 min on 2 cores)
    python3 -m cached_sampler_dev.studies.held_out_seeds --model video --auto-only --confirm-seeds 3  # Auto Calibrate's rows only
    python3 -m cached_sampler_dev.studies.held_out_seeds --model video --targets 35 --auto-only --confirm-seeds 3 \
        --negative-branch  # its plan with the negative branch left out where the target holds
    python3 -m cached_sampler_dev.studies.held_out_seeds --model photos --targets 35 40 --confirm-seeds 3
    python3 -m cached_sampler_dev.studies.held_out_seeds --model video --targets 35 40 --confirm-seeds  # no Auto Calibrate
"""
from __future__ import annotations

import argparse
import statistics
import sys

from ..bench.bench_discover import GUIDANCE, GUIDANCE_ON_CADENCE, widget_defaults  # noqa: E402
from .calibration_spaces import HELD_OUT_FROM, base_prompt, capture, run_plan, sampling, start_study  # noqa: E402

INTERVALS = range(2, 9)  # digits: Fixed Cadence + TaylorSeer order 1 and 2
ORDERS = (1, 2)
GROWING = tuple((i, g) for i in (2, 3) for g in (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0))  # others: (interval, growth)
GUIDED_NAME = " + Guidance Cache {interval} from {start_percent:g}".format(**GUIDANCE_ON_CADENCE)  # the bench's
WORK_TIE = 1e-4  # work shares closer than this are the same work (the run's work_saved is rounded to 4 places)
TOLERANCE = 1.0  # dB: the project's target for a plan is the target within this on at least 7 of 8 held-out seeds
MODEL_WORDS = {"digits": ("digits model", "all ten digits", "digits"),
               "video": ("video model (a tiny Wan 2.1)", "all eight classes", "frames"),
               "photos": ("photos model (a tiny Flux trained on crops of photographs)", "all eight classes",
                          "pictures")}


def hand_tuned(model: str) -> dict:
    """The hand-tuned settings the bench finds best on ``model``: name -> ("cadence", (interval, order, growth,
    Guidance Cache after it))."""
    if model == "digits":
        return {f"Fixed Cadence {i} + TaylorSeer o{o}": ("cadence", (i, o, 0.0, False)) for o in ORDERS for i in INTERVALS}
    settings = {}
    for guided in (False, True):
        for i, g in GROWING:
            name = f"Fixed Cadence {i}, growth {g:g} + TaylorSeer o1{GUIDED_NAME if guided else ''}"
            settings[name] = ("cadence", (i, 1, g, guided))
    return settings


def sample_all(app, executor, args, seeds: list[int], settings: dict) -> tuple[dict, dict]:
    """Latents of every setting at every seed, one prompt per seed, and the work each cached setting did as its
    run's own count (its share of the uncached run's model work; the same at every seed). ``settings`` maps a
    name to ("fewer", steps) or ("cadence", (interval, order, growth, guided)); "uncached" is the full-step
    KSampler."""
    from ..support.tiny_nodes import CAPTURED
    # the Guidance Cache the bench chains after the growing cadence, its other inputs at the node's defaults
    guided_inputs = {**widget_defaults(app.nodes.NODE_CLASS_MAPPINGS[GUIDANCE])[0], **GUIDANCE_ON_CADENCE}
    out, work, samplers = {}, {}, {}
    for seed in seeds:
        prompt = base_prompt(args.model)
        del prompt["vae"]
        for name, (kind, value) in settings.items():
            node = f"n{len(prompt)}"
            if kind == "fewer":
                prompt[node] = {"class_type": "KSampler", "inputs": {**sampling(args, seed), "steps": value}}
            else:
                interval, order, growth, guided = value
                prompt[f"{node}c"] = {"class_type": "CachedSamplerFixedCadence", "inputs": {
                    "interval": interval, "start_percent": 0.0, "end_percent": 1.0, "growth": growth}}
                prompt[f"{node}t"] = {"class_type": "CachedSamplerTaylorSeer", "inputs": {
                    "order": order, "interceptors": [f"{node}c", 0]}}
                last = f"{node}t"
                if guided:
                    prompt[f"{node}g"] = {"class_type": "CachedSamplerGuidanceCache", "inputs": {
                        **guided_inputs, "interceptors": [last, 0]}}
                    last = f"{node}g"
                prompt[node] = {"class_type": "CachedSampler", "inputs": {
                    **sampling(args, seed), "interceptors": [last, 0]}}
            capture(prompt, node, f"{name}@{seed}")
            samplers[name] = node
        _, ui = app.run(prompt, executor)
        out.update({(name, seed): CAPTURED[f"{name}@{seed}"] for name in settings})
        for name, (kind, value) in settings.items():  # work_saved is rounded to 4 places: compare with WORK_TIE
            work[name] = (value / args.steps if kind == "fewer" else
                          1 - ui[samplers[name]]["cached_sampler"][0]["runs"][0]["work_saved"])
    return out, work


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=tuple(MODEL_WORDS), default="digits", help="the bundled model to measure")
    parser.add_argument("--steps", type=int, default=28)
    parser.add_argument("--targets", type=float, nargs="+", default=[35.0, 40.0, 45.0], help="PSNR targets (dB)")
    parser.add_argument("--seed", type=int, default=1, help="the seed everything is tuned and planned at")
    parser.add_argument("--held-out", type=int, default=8, help=f"how many held-out seeds ({HELD_OUT_FROM}, ...)")
    parser.add_argument("--confirm-seeds", type=int, nargs="*", default=[1, 3], help="Auto Calibrate's 'seeds' "
                        "(none given: no Auto Calibrate rows, the hand-tuned settings only)")
    parser.add_argument("--margin", type=float, default=0.0, help="Auto Calibrate plans for the target plus this "
                        "many dB (negative: below it); everything is still judged against the target")
    parser.add_argument("--negative-branch", action="store_true", help="Auto Calibrate's 'negative_branch': left "
                        "out where the target holds (the Guidance Cache's saving inside the plan)")
    parser.add_argument("--auto-only", action="store_true", help="Auto Calibrate's rows only (no hand-tuned "
                        "settings, fewer steps or oracle): to measure its plans again after a change to its search")
    args = parser.parse_args(argv)

    app, ic, decode = start_study(args.model)
    held_out = list(range(HELD_OUT_FROM, HELD_OUT_FROM + args.held_out))
    seeds = [args.seed, *held_out]
    executor = app.executor()

    full = args.steps
    settings = {"uncached": ("fewer", full)}
    if not args.auto_only:
        settings.update({f"fewer steps {k}": ("fewer", k) for k in range(3, full)})
        settings.update(hand_tuned(args.model))
    latents, work = sample_all(app, executor, args, seeds, settings)
    del work["uncached"]
    reference = {s: decode(latents[("uncached", s)]) for s in seeds}
    psnr = {(name, s): ic.image_quality(reference[s], decode(latents[(name, s)])).psnr
            for name in work for s in seeds}

    def pick(candidates, at, target):
        """The least work among ``candidates`` meeting ``target`` at every seed of ``at`` (None if none does);
        of equal work, the one whose worst PSNR there is highest."""
        ok = [n for n in candidates if all(psnr[(n, s)] >= target for s in at)]
        return min(ok, key=lambda n: (work[n], -min(psnr[(n, s)] for s in at))) if ok else None

    hand = [n for n in work if n.startswith("Fixed")]
    fewer = [n for n in work if n.startswith("fewer")]
    model, batch, images = MODEL_WORDS[args.model]
    print(f"Auto Calibrate and hand-tuned settings on held-out seeds: {model}, {full} steps, euler / simple, "
          f"cfg 3, {batch}. Everything tuned or planned at seed {args.seed}; measured at {len(held_out)} "
          f"held-out seeds ({', '.join(map(str, held_out))}). Work = the model work of the run against the uncached "
          f"one (an evaluation computes every block on both CFG rows; the Guidance Cache's computes the positive "
          f"row only); image PSNR of the decoded {images} against the uncached ones at the same seed. *Oracle* = "
          f"the best hand-tuned setting chosen at each held-out seed itself. Where more seeds come within "
          f"{TOLERANCE:g} dB of the target than meet it, their count follows in brackets.\n")
    print("| target | method (tuned at the calibration seed) | work saved | held-out seeds meeting the target | "
          "held-out PSNR: worst / mean | seeds where it meets the target and saves at least the oracle |")
    print("|---|---|---|---|---|---|")
    for target in args.targets:
        oracle = {s: pick(hand, [s], target) for s in held_out}
        asked = target + args.margin  # what Auto Calibrate plans for
        rows = []
        for confirm in args.confirm_seeds:
            plan = run_plan(app, executor, args, asked, True, confirm, seeds, args.negative_branch)
            values = [ic.image_quality(reference[s], decode(plan["cached"][s])).psnr for s in held_out]
            left_out = (", negative branches left out where the target holds" if "only the positive" in plan["text"]
                        else "")
            rows.append((f"Auto Calibrate{f' for {asked:g} dB' if args.margin else ''}, seeds {confirm}: "
                         f"{plan['computed']}/{plan['evaluations']} computed{left_out}", 1 - plan["work_saved"],
                         values))
            print(f"[{asked:g} dB, seeds {confirm}] {plan['text']}", file=sys.stderr, flush=True)
        for label, pool in () if args.auto_only else (("hand-tuned", hand), ("fewer steps", fewer)):
            chosen = pick(pool, [args.seed], target)
            if chosen is None:
                rows.append((f"{label}: nothing meets it at the calibration seed", 1.0, []))
                continue
            rows.append((f"{label}: {chosen}", work[chosen], [psnr[(chosen, s)] for s in held_out]))
        # the project's yardstick for a plan: the one hand-tuned setting that holds on every held-out seed, chosen
        # with hindsight (no user can); a plan that saves as much without hindsight is as good as tuning gets
        chosen = pick(hand, held_out, target)
        if chosen is not None:
            rows.append((f"hindsight: the hand-tuned setting with the least work that holds on every held-out seed, "
                         f"{chosen}", work[chosen], [psnr[(chosen, s)] for s in held_out]))
        for label, used, values in rows:
            met = [v >= target for v in values]
            close = sum(v >= target - TOLERANCE for v in values)
            beats = [m and (oracle[s] is None or used <= work[oracle[s]] + WORK_TIE) for m, s in zip(met, held_out)]
            spread = f"{min(values):.1f} / {statistics.mean(values):.1f} dB" if values else "-"
            within = f" ({close} within {TOLERANCE:g} dB)" if close != sum(met) else ""
            print(f"| {target:g} dB | {label} | {1 - used:.0%} | {sum(met)}/{len(held_out)}{within} | {spread} | "
                  f"{'-' if args.auto_only else f'{sum(beats)}/{len(held_out)}'} |")
        if args.auto_only:
            continue
        # the bench's yardstick on these seeds: fewer steps, the least that meets the target at each seed itself
        fewest = [pick(fewer, [s], target) for s in held_out]
        kept = sorted(1 - work[n] if n else 0.0 for n in fewest)
        print(f"| {target:g} dB | fewer steps at each seed: the least that meets the target there, median / worst | "
              f"{statistics.median(kept):.0%} / {kept[0]:.0%} | {sum(n is not None for n in fewest)}/{len(held_out)} "
              f"| - | - |")
        saved = [1 - work[oracle[s]] for s in held_out if oracle[s] is not None]
        print(f"| {target:g} dB | oracle: the best hand-tuned setting at each seed | "
              f"{min(saved):.0%}-{max(saved):.0%} | {len(saved)}/{len(held_out)} | - | - |" if saved else
              f"| {target:g} dB | oracle | - | 0/{len(held_out)} | - | - |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
