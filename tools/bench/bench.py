"""Benchmark the pack's caching methods against ComfyUI's own EasyCache/LazyCache, headless.

Everything runs through ComfyUI's executor on API-format prompts, in one process:

* quality and model work on the pack's trained tiny Flux (8x8 digits, one image per class, euler,
  cfg 3, fixed seed) at 28 and 50 steps, for every caching method over a sweep of its threshold
  (and each pack method with TaylorSeer order 1 and 2 chained); model work is counted on the model
  itself (transformer blocks that really ran), PSNR/SSIM are measured on the decoded images against
  the uncached run at the same seed, recognisability with a k-NN on sklearn's digits;
* the baseline every method must beat: the uncached sampler at every step count from 3 to the full one - 1,
  its work counted the same way and its PSNR against the full-step output, and each method's best setting at
  a PSNR floor against it;
* wall-clock speedup against the uncached run, alternating baseline and method runs, medians;
* per-step overhead when nothing is skipped, on a heavier random-weight Flux whose forward dominates.

Writes bench/results.md, bench/results.json and bench/pareto.png (see docs/measured-results.md). With
``--model video`` the same rows are measured on the pack's tiny Wan 2.1 video model (moving shapes, one video
per class, 28 steps) into bench/results_video.md, results_video.json and pareto_video.png; with ``--model photos``
on the pack's tiny Flux photos model (crops of two photographs, one picture per class) into results_photos.*.

    python3 -m cached_sampler_dev.bench.bench            # the full bench (about 35-40 minutes on 2 CPU cores)
    python3 -m cached_sampler_dev.bench.bench --quick    # a 1-2 minute smoke run
    python3 -m cached_sampler_dev.bench.bench --model video
    python3 -m cached_sampler_dev.bench.bench --merge a/results.json b/results.json --out c  # seeds run apart, joined
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

os.environ.setdefault("OMP_NUM_THREADS", "1")

# The bench in parts: which methods (bench_discover), running them (bench_run), analysis and report
# (bench_report); this file is the command line.
from .bench_discover import DBCACHE_PRESETS, QUICK_SWEEPS, SCHEDULE_GRID, SWEEPS, Config, Method  # noqa: E402,F401
from .bench_report import analyse, analyse_steps, load_results, markdown, output_names, write_outputs  # noqa: E402,F401
from .bench_results import merge_seed_runs, per_steps  # noqa: E402
from .bench_run import Bench, run_bench  # noqa: E402,F401  (Bench, Method: for tests)


def parse_args(argv=None) -> Config:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a 1-2 minute run: 28 steps, 3 settings per method, "
                   "TaylorSeer order 1 only, one timing pair")
    p.add_argument("--steps", help="comma-separated step counts (default 28,50)")
    p.add_argument("--repeats", help="timing rounds (baseline and method runs alternated) per step count, "
                   "comma-separated; the last one applies to further step counts (default 1)")
    p.add_argument("--taylorseer", help="TaylorSeer orders to chain, comma-separated, '' for none (default 1,2)")
    p.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2",
                   help="override a sweep, e.g. fbcache=0,0.1,0.2 (keys: " + ", ".join(SWEEPS) + "; and "
                   + ", ".join(f"schedule.{k}" for k in SCHEDULE_GRID) + " for Spectrum-style peers' grid; "
                   "growing.warmup_steps and growing.last_step for Fixed Cadence's growing schedule)")
    p.add_argument("--levels", help="the levels measured of the whole-model nodes that have a 'level' input, "
                   "comma-separated (default model; model,features compares both)")
    p.add_argument("--no-spectrum", action="store_true",
                   help="do not chain the pack's Spectrum Forecast after each pack decider")
    p.add_argument("--extend", type=int, help="settings a sweep may add to reach below 30 dB PSNR (default 3; "
                   "0 with --quick)")
    p.add_argument("--only", help="comma-separated method keys to run (e.g. fbcache,easycache)")
    p.add_argument("--dbcache-presets", help="DBCache presets, comma-separated (default F1B1; known: "
                   + ", ".join(DBCACHE_PRESETS) + ")")
    p.add_argument("--seed", type=int)
    p.add_argument("--seeds", type=int, help="measure at this many seeds (--seed, --seed + 1, ...) and read each "
                   "reduction at a PSNR target as the median and the worst over them (default 1)")
    p.add_argument("--fewer-steps-samplers", help="ComfyUI samplers also run uncached at fewer steps, as more "
                   "baselines, comma-separated, '' for none (default dpmpp_2m,uni_pc,deis)")
    p.add_argument("--model", choices=["digits", "video", "photos"], default="digits",
                   help="the measured model: the tiny Flux digits model, the tiny Wan 2.1 video model (moving "
                        "shapes; 28 steps unless --steps, no overhead workload, results_video.* files) or the tiny "
                        "Flux photos model (crops of two photographs; no overhead workload, results_photos.* files)")
    p.add_argument("--no-overhead", action="store_true", help="skip the heavy-model overhead workload")
    p.add_argument("--overhead-repeats", type=int, help="timing rounds on the heavy model (default 5)")
    p.add_argument("--overhead-steps", type=int, help="steps on the heavy model (default 8)")
    p.add_argument("--overhead-hidden", type=int, help="hidden size of the heavy model (default 256, 64 per head): "
                   "the blocks' work grows with its square and the copies a block cache makes only with it, so "
                   "a wider model shows how a method's share of a step falls on larger models")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: ComfyUI loads and samples every model on the GPU, runs are timed with CUDA events "
                        "(warm-up run first, baseline and method runs alternated, medians), and a method's overhead "
                        "is the wall time it adds (default cpu)")
    p.add_argument("--no-other-packs", action="store_true",
                   help="do not load the packs in ComfyUI's custom_nodes folder (peers such as TeaCache)")
    p.add_argument("--out", help="output folder (default bench/)")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--replot", metavar="RESULTS_JSON",
                   help="only rewrite results.md and the plot from an earlier results.json (into --out)")
    p.add_argument("--merge", nargs="+", metavar="RESULTS_JSON",
                   help="only join the results.json of runs of one command at other seeds (--seed S --seeds N each, "
                        "run at once on several cores or machines) into one run at all their seeds, and write its "
                        "results.md and .json into --out")
    a = p.parse_args(argv)
    c = Config()
    c.replot = a.replot
    c.merge = a.merge
    if a.quick:
        c.quick = True
        c.steps = [28]
        c.repeats = [1]
        c.taylorseer = [1]
        c.sweeps = {k: list(v) for k, v in QUICK_SWEEPS.items()}
        c.overhead_repeats = 2
        c.overhead_steps = 4
        c.dbcache_presets = ["F1B1"]
        c.extend = 0
    c.model = a.model
    if a.model == "video":
        c.steps = [28]
    if a.model != "digits":
        c.overhead = False  # measured on the heavy random-weight Flux, whatever model is measured
    if a.extend is not None:
        c.extend = a.extend
    if a.steps is not None:
        c.steps = [int(s) for s in a.steps.split(",") if s.strip()]
    if a.repeats is not None:
        c.repeats = [int(r) for r in a.repeats.split(",") if r.strip()] or [1]
    if a.taylorseer is not None:
        c.taylorseer = [int(s) for s in a.taylorseer.split(",") if s.strip()]
    for item in a.sweep:
        key, _, values = item.partition("=")
        c.sweeps[key.strip()] = [_number(v) for v in values.split(",") if v.strip()]
    if a.levels is not None:
        c.levels = [s.strip() for s in a.levels.split(",") if s.strip()] or ["model"]
    if a.only:
        c.only = [s.strip() for s in a.only.split(",") if s.strip()]
    if a.dbcache_presets is not None:
        c.dbcache_presets = [s.strip() for s in a.dbcache_presets.split(",") if s.strip()]
    if a.seed is not None:
        c.seed = a.seed
    if a.seeds is not None:
        if a.seeds < 1:
            p.error("--seeds must be at least 1")
        c.seeds = a.seeds
    if a.fewer_steps_samplers is not None:
        c.fewer_steps_samplers = [s.strip() for s in a.fewer_steps_samplers.split(",") if s.strip()]
    if a.no_overhead:
        c.overhead = False
    if a.overhead_repeats is not None:
        c.overhead_repeats = a.overhead_repeats
    if a.overhead_steps is not None:
        c.overhead_steps = a.overhead_steps
    if a.overhead_hidden is not None:
        if a.overhead_hidden < 64 or a.overhead_hidden % 64:
            p.error("--overhead-hidden must be a multiple of 64 (the heads are 64 wide)")
        c.overhead_model = dict(c.overhead_model, hidden_size=a.overhead_hidden, num_heads=a.overhead_hidden // 64)
    c.other_packs = not a.no_other_packs
    c.spectrum = not a.no_spectrum
    c.device = a.device
    if a.out:
        c.out = a.out
    c.plot = not a.no_plot
    c.command = recorded_command(sys.argv[1:] if argv is None else list(argv))
    return c


def recorded_command(args: list[str]) -> str:
    """The command line the results record: what was measured, so without --out (where they were written)."""
    kept, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--out":
            skip = True
        elif not arg.startswith("--out="):
            kept.append(arg)
    return " ".join(["python3 -m cached_sampler_dev.bench.bench", *(shlex.quote(a) for a in kept)])


def _number(text: str):
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text  # a choice's value (growing.last_step=forecast)


def main(argv=None) -> int:
    config = parse_args(argv)
    if config.replot or config.merge:
        if config.merge:
            try:
                results = merge_seed_runs([load_results(Path(f)) for f in config.merge])
            except ValueError as e:
                print(f"bench: {e}", file=sys.stderr)
                return 2
        else:
            results = load_results(Path(config.replot))
        results["meta"].pop("plot", None)
        for w in per_steps(results).values():
            w.update(analyse_steps(w))
        write_outputs(results, Path(config.out), config.plot)
        md_name, _, plot_name = output_names(results)
        print(f"bench: rewrote {config.out}/{md_name}" + (f", {plot_name}" if results["meta"].get("plot") else ""))
        return 0
    results = run_bench(config)
    print()
    print(markdown(results))
    md_name, json_name, plot_name = output_names(results)
    print(f"\nbench: wrote {config.out}/{md_name}, {json_name}" + (f", {plot_name}" if results["meta"].get("plot")
                                                                   else "")
          + f" in {results['meta']['seconds'] / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
