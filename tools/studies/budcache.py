"""Cache-aware schedule alignment (Auto Calibrate's ``align_schedule``) against the plain plan and fewer steps.

BudCache (arXiv 2606.13496) fixes the budget of computed steps, searches their placement, and then moves the
sampling schedule's timesteps to suit the plan. Auto Calibrate does the first two (its 'budget' target); with
``align_schedule`` it also moves the computed steps' sigmas (schedule_alignment.py). This study measures, on a
bundled model (euler / simple, cfg 3, 28 steps), for each budget of computed steps:

* the plain plan: Auto Calibrate, 'budget' target, the model's VAE connected (decoded-image PSNR), ``seeds`` the
  calibration seeds;
* the aligned plan: the same with ``align_schedule`` on (its plan search is the same, then the alignment);
* fewer steps at equal evaluations: the uncached sampler at as many steps as the budget, with euler and with the
  few-step samplers dpmpp_2m, uni_pc and deis (each one model evaluation per step).

Each is sampled at the calibration seeds (where the plans were chosen) and at held-out seeds none was chosen on, and
its decoded images compared with the uncached 28-step euler run at the same seed. Prints a markdown report.

    nice -n 5 python3 -m cached_sampler_dev.studies.budcache --model digits --model photos
    nice -n 5 python3 -m cached_sampler_dev.studies.budcache --model digits --budgets 8 --held-out 0   # quick
"""
from __future__ import annotations

import argparse
import statistics
import time

from .calibration_spaces import MODELS, base_prompt, capture, sampling, start_study  # noqa: E402

STEPS = 28
BUDGETS = (6, 8, 10)
FEW_STEP_SAMPLERS = ("euler", "dpmpp_2m", "uni_pc", "deis")


class Args:
    steps = STEPS


def calibration(model: str, budget: int, seeds: int, align: bool) -> dict:
    return {"class_type": "CachedSamplerAutoCalibrate", "inputs": {
        **sampling(Args, 0), "target": "budget", "min_psnr": 35.0, "budget": budget, "order": 1,
        "vae": ["vae", 0], "seeds": seeds, "align_schedule": align}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", choices=sorted(MODELS), help="repeatable; default digits")
    parser.add_argument("--budgets", type=int, nargs="+", default=list(BUDGETS))
    parser.add_argument("--seeds", type=int, default=4, help="calibration seeds 0 .. N-1 (Auto Calibrate's 'seeds')")
    parser.add_argument("--held-out", type=int, default=4, help="held-out seeds N .. N+H-1")
    args = parser.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    from ..support.tiny_nodes import CAPTURED
    app, ic, _ = start_study()
    calibration_seeds = list(range(args.seeds))
    held_out = list(range(args.seeds, args.seeds + args.held_out))
    seeds = calibration_seeds + held_out
    print("# Cache-aware schedule alignment against the plain plan and fewer steps\n")
    print(f"{STEPS} steps, euler / simple, cfg 3. Decoded-image PSNR against the uncached {STEPS}-step euler run at the "
          f"same seed, *median / worst* over the calibration seeds {calibration_seeds} (where the plans were chosen) "
          f"and over the held-out seeds {held_out}. Every row computes the same number of model evaluations.\n")
    for model in args.model or ["digits"]:
        decode = app.module(MODELS[model][1]).decode
        executor = app.executor()
        started = time.perf_counter()
        psnr: dict[tuple[str, int], float] = {}
        for seed in seeds:  # the references and fewer steps, one prompt per seed
            prompt = base_prompt(model)
            prompt["full"] = {"class_type": "KSampler", "inputs": sampling(Args, seed)}
            capture(prompt, "full", f"full@{seed}")
            for budget in args.budgets:
                for name in FEW_STEP_SAMPLERS:
                    node = f"{name}{budget}"
                    prompt[node] = {"class_type": "KSampler", "inputs": {**sampling(Args, seed), "steps": budget,
                                                                          "sampler_name": name}}
                    capture(prompt, node, f"{node}@{seed}")
            app.run(prompt, executor)
            reference = decode(CAPTURED[f"full@{seed}"])
            for budget in args.budgets:
                for name in FEW_STEP_SAMPLERS:
                    node = f"{name}{budget}"
                    psnr[(node, seed)] = ic.image_quality(reference, decode(CAPTURED[f"{node}@{seed}"])).psnr
        texts, seconds = {}, {}
        for budget in args.budgets:
            for align in (False, True):
                key = f"{'aligned' if align else 'plan'}{budget}"
                prompt = base_prompt(model) | {"calibrate": calibration(model, budget, args.seeds, align)}
                capture(prompt, "calibrate", f"{key}_uncached", output=1)
                began = time.perf_counter()
                _, ui = app.run(prompt, executor)
                seconds[key] = time.perf_counter() - began
                texts[key] = ui["calibrate"]["text"][0]
                for seed in seeds:  # the calibration node is cached by the executor: this prompt only samples
                    prompt[f"s{seed}"] = {"class_type": "CachedSampler", "inputs": {
                        **sampling(Args, seed), "interceptors": ["calibrate", 0]}}
                    prompt[f"r{seed}"] = {"class_type": "KSampler", "inputs": sampling(Args, seed)}
                    capture(prompt, f"s{seed}", f"{key}@{seed}")
                    capture(prompt, f"r{seed}", f"ref@{seed}")
                app.run(prompt, executor)
                for seed in seeds:
                    reference = decode(CAPTURED[f"ref@{seed}"])
                    psnr[(key, seed)] = ic.image_quality(reference, decode(CAPTURED[f"{key}@{seed}"])).psnr

        def cell(key, among):
            values = [psnr[(key, s)] for s in among]
            return f"{statistics.median(values):.2f} / {min(values):.2f}" if values else "-"

        print(f"## {model} model\n")
        print("| evaluations | schedule | calibration seeds | held-out seeds | calibration time |")
        print("|---|---|---|---|---|")
        for budget in args.budgets:
            rows = [(f"plan{budget}", "Auto Calibrate, plain plan"), (f"aligned{budget}", "Auto Calibrate, aligned")]
            rows += [(f"{name}{budget}", f"{name}, {budget} steps uncached") for name in FEW_STEP_SAMPLERS]
            for key, label in rows:
                took = f"{seconds[key]:.0f} s" if key in seconds else ""
                print(f"| {budget} | {label} | {cell(key, calibration_seeds)} | {cell(key, held_out)} | {took} |")
        print()
        for key, text in texts.items():
            print(f"* `{key}`: {text.split(' This is latent')[0]}")
        print(f"\n{model}: {time.perf_counter() - started:.0f} s in all\n", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
