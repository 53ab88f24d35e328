"""Which margin rule carries an Auto Calibrate plan to seeds it was not measured on, replayed on the plans it measured.

Auto Calibrate picks the cheapest plan that meets ``min_psnr`` on its calibration seeds, then plans again for the
target plus a margin (``interceptors.quality.seed_margin``). Measuring another margin rule with the held-out study
costs a whole calibration per rule and target. Here the node runs once per target at its defaults, and every plan it
measures (its per-seed PSNRs on the calibration seeds) is recorded, with the plans its first search (at the target)
had measured when it asked for its margin. Each rule is then replayed: its margin, from the first search's plans as
the node has them; the plan found at the target where that meets the target plus the margin, else the node's pick
(the least computed steps that meet it on every calibration seed, then the highest worst PSNR) among every plan
measured; and that plan sampled on 8 held-out seeds. The node's second search measured around its own margin, so a
rule with another margin picks what the node would only where the plans it would measure were measured; the node's
own row is its plan (the first check).

Rules:

* ``k x spread``: ``k`` times the sample standard deviation of the plan found at the target (3: the node's rule
  before the 1 dB floor);
* ``leave-one-out``: for each calibration seed, the plan picked on the others, and how far below the target it
  reads on the seed left out; the largest such shortfall (0 where none falls short): how much a plan picked on
  the seeds at hand loses on the next one, measured rather than assumed proportional to a spread;
* ``the node's``: 1.5 x spread, at least 1 dB (``seed_margin``);
* ``pooled k x spread``: ``k`` times the seed-to-seed deviation of all the plans measured near the pick (within
  3 computed steps of it), the plan-by-seed residual after each plan's and each seed's mean are removed: the
  part of the spread that a pick's luck is made of, estimated from many plans instead of three numbers.

    python3 -m cached_sampler_dev.studies.margin_rules --model photos   # targets 35, 40, 45 dB (about 20 min)
    python3 -m cached_sampler_dev.studies.margin_rules --model digits --targets 35 --held-out 4
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys

from .calibration_spaces import HELD_OUT_FROM, base_prompt, capture, register_study_chains, sampling, start_study
from .held_out_seeds import MODEL_WORDS, TOLERANCE

SPREAD_FACTORS = (1.0, 1.5, 2.0, 3.0)
NEAR = 3  # computed steps either side of the pick whose plans the pooled spread is estimated from


def pick(pool: dict, bound: float):
    """The plan the node would pick for ``bound`` from ``pool`` ((compute, order) -> per-seed PSNRs): the fewest
    computed steps that meet it on every seed, then the highest worst PSNR; None where none does."""
    ok = [key for key, per_seed in pool.items() if min(per_seed) >= bound]
    return min(ok, key=lambda key: (len(key[0]), -min(pool[key]))) if ok else None


def leave_one_out_margin(pool: dict, target: float) -> float:
    """The largest shortfall below ``target``, on the seed left out, of the plan picked on the other seeds."""
    seeds = len(next(iter(pool.values())))
    worst = 0.0
    for left in range(seeds):
        others = {key: tuple(p for s, p in enumerate(per_seed) if s != left) for key, per_seed in pool.items()}
        chosen = pick(others, target)
        if chosen is not None:
            worst = max(worst, target - pool[chosen][left])
    return worst


def pooled_margin(pool: dict, around: tuple, factor: float) -> float:
    """``factor`` times the plan-by-seed residual deviation of the finite plans within ``NEAR`` computed steps of
    ``around``."""
    near = [per_seed for key, per_seed in pool.items()
            if abs(len(key[0]) - len(around[0])) <= NEAR and all(math.isfinite(p) for p in per_seed)]
    if len(near) < 2:
        return 0.0
    seeds = len(near[0])
    grand = statistics.mean(p for row in near for p in row)
    seed_mean = [statistics.mean(row[s] for row in near) for s in range(seeds)]
    residuals = [row[s] - statistics.mean(row) - seed_mean[s] + grand for row in near for s in range(seeds)]
    dof = (len(near) - 1) * (seeds - 1)
    return factor * math.sqrt(sum(r * r for r in residuals) / dof)


def record_measured(calibrate_module, pool: dict, chains: dict, first: dict) -> None:
    """Record every plan Auto Calibrate's node measures: its (compute, order), its per-seed PSNRs, and its chain's
    items to sample it again; and, when the node asks for its margin, the plans measured so far (the search at the
    target, ``first["pool"]``) and the plan it found (``first["plan"]``). The node builds a plan's chain, then
    measures it over the seeds with ``worst_quality``; those names and ``seed_margin`` are wrapped in its module."""
    built = {}
    planned, taylor, worst, margin = (calibrate_module.PlannedSchedule, calibrate_module.TaylorSeer,
                                      calibrate_module.worst_quality, calibrate_module.seed_margin)

    def planned_schedule(**kwargs):
        built["planned"] = planned(**kwargs)
        return built["planned"]

    def taylor_seer(**kwargs):
        built["taylor"] = taylor(**kwargs)
        return built["taylor"]

    def worst_quality(qualities):
        quality = worst(qualities)
        key = (tuple(built["planned"].compute), built["taylor"].order)
        pool[key] = quality.per_seed or (quality.psnr,)
        chains[key] = (built["planned"], built["taylor"])
        return quality

    def seed_margin(per_seed, *args, **kwargs):
        first["pool"] = dict(pool)
        first["plan"] = next(key for key, values in pool.items() if tuple(values) == tuple(per_seed))
        return margin(per_seed, *args, **kwargs)

    calibrate_module.PlannedSchedule = planned_schedule
    calibrate_module.TaylorSeer = taylor_seer
    calibrate_module.worst_quality = worst_quality
    calibrate_module.seed_margin = seed_margin


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=tuple(MODEL_WORDS), default="digits")
    parser.add_argument("--steps", type=int, default=28)
    parser.add_argument("--targets", type=float, nargs="+", default=[35.0, 40.0, 45.0])
    parser.add_argument("--seed", type=int, default=1, help="the first calibration seed")
    parser.add_argument("--seeds", type=int, default=3, help="Auto Calibrate's 'seeds'")
    parser.add_argument("--held-out", type=int, default=8)
    parser.add_argument("--dump", help="also write every plan measured, per target, with its PSNRs (JSON) here")
    args = parser.parse_args(argv)

    app, ic, decode = start_study(args.model)
    executor = app.executor()
    pool, items, first = {}, {}, {}
    record_measured(app.module("nodes.calibrate"), pool, items, first)
    chains = {}
    register_study_chains(app, chains)
    held_out = list(range(HELD_OUT_FROM, HELD_OUT_FROM + args.held_out))
    from ..support.tiny_nodes import CAPTURED

    prompt = base_prompt(args.model)
    del prompt["vae"]
    for seed in held_out:
        prompt[f"plain{seed}"] = {"class_type": "KSampler", "inputs": sampling(args, seed)}
        capture(prompt, f"plain{seed}", f"plain{seed}")
    app.run(prompt, executor)
    reference = {seed: decode(CAPTURED[f"plain{seed}"]) for seed in held_out}
    held_psnr: dict = {}

    def on_held_out(key) -> list[float]:
        if key not in held_psnr:
            chains[repr(key)] = ic.InterceptorChain.of(list(items[key]))
            prompt = base_prompt(args.model)
            del prompt["vae"]
            prompt["chain"] = {"class_type": "ToolStudyChain", "inputs": {"key": repr(key)}}
            for seed in held_out:
                prompt[f"s{seed}"] = {"class_type": "CachedSampler", "inputs": {
                    **sampling(args, seed), "interceptors": ["chain", 0]}}
                capture(prompt, f"s{seed}", f"held{seed}")
            app.run(prompt, executor)
            held_psnr[key] = [ic.image_quality(reference[s], decode(CAPTURED[f"held{s}"])).psnr for s in held_out]
        return held_psnr[key]

    dumped = []
    model, batch, images = MODEL_WORDS[args.model]
    print(f"Margin rules replayed on Auto Calibrate's measured plans: {model}, {args.steps} steps, euler / simple, "
          f"cfg 3, {batch}, the VAE connected, {args.seeds} calibration seeds from seed {args.seed}; each rule's "
          f"plan sampled at {len(held_out)} held-out seeds ({held_out[0]}-{held_out[-1]}). Where more seeds come "
          f"within {TOLERANCE:g} dB of the target than meet it, their count follows in brackets.\n")
    print("| target | rule | margin | plan: computed steps, order | work saved | calibration seeds | "
          "held-out seeds meeting the target | held-out worst / median |")
    print("|---|---|---|---|---|---|---|---|")
    for target in args.targets:
        pool.clear()
        first.clear()
        calibration = {"class_type": "CachedSamplerAutoCalibrate", "inputs": {
            **sampling(args, args.seed), "target": "quality", "min_psnr": target, "budget": 8, "order": 1,
            "seeds": args.seeds, "vae": ["source", 4]}}
        prompt = base_prompt(args.model) | {"calibrate": calibration}
        capture(prompt, "calibrate", "calibration_uncached", output=1)  # an output, so that the node runs
        _, ui = app.run(prompt, executor)
        print(f"[{target:g} dB, {len(pool)} plans measured] {ui['calibrate']['text'][0]}", file=sys.stderr, flush=True)
        at_target, searched = first["plan"], first["pool"]
        rules = {"none": 0.0}
        rules.update({f"{k:g} x spread": ic.seed_margin(pool[at_target], k, floor=0.0, cap=math.inf)
                      for k in SPREAD_FACTORS})
        rules["leave-one-out"] = leave_one_out_margin(searched, target)
        rules["the node's: 1.5 x spread, at least 1 dB"] = ic.seed_margin(pool[at_target])
        rules.update({f"pooled {k:g} x spread": pooled_margin(searched, at_target, k) for k in (2.0, 3.0)})
        for rule, margin in rules.items():
            # as the node: the plan found at the target is kept where it already meets the target plus the margin;
            # else the pick among every plan measured (the node's second search measured them for its own margin)
            chosen = at_target if min(pool[at_target]) >= target + margin else pick(pool, target + margin)
            if chosen is None:
                print(f"| {target:g} dB | {rule} | {margin:.2f} | no plan measured meets it | - | - | - | - |")
                continue
            values = on_held_out(chosen)
            met, close = sum(v >= target for v in values), sum(v >= target - TOLERANCE for v in values)
            within = f" ({close} within {TOLERANCE:g} dB)" if close != met else ""
            print(f"| {target:g} dB | {rule} | {margin:.2f} | {len(chosen[0])}/{args.steps}, o{chosen[1]} | "
                  f"{1 - len(chosen[0]) / args.steps:.0%} | {min(pool[chosen]):.1f}-{max(pool[chosen]):.1f} dB | "
                  f"{met}/{len(held_out)}{within} | {min(values):.1f} / {statistics.median(values):.1f} dB |",
                  flush=True)
        dumped.append({"target": target, "plan": list(at_target), "first_search": [list(k) for k in searched],
                       "plans": [{"compute": k[0], "order": k[1], "per_seed": v, "held_out": held_psnr.get(k)}
                                 for k, v in pool.items()]})
    if args.dump:
        with open(args.dump, "w") as f:
            json.dump(dumped, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
