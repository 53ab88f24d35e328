"""TaylorSeer with damping on the growing cadence, over seeds, against Spectrum's ComfyUI ports.

TaylorSeer's ``damping`` scales the forecast's k-th Newton term by ``(1 - damping) ** k`` (HiCache's scaling,
arXiv 2508.16984): over a long gap the forecast follows the last trend less far. This study sweeps the bench's whole
growing grid (``interval`` 1-3, ``growth`` 0-3, ``warmup_steps`` 0 and 3), each setting with its last step computed
and forecast, with and without the bench's Guidance Cache after it, + TaylorSeer o1 at each ``damping``, through the
pack's Cached Sampler path at seeds 0-7, and reads every PSNR floor from 31 to 45 dB at each seed against what the
peers run of ``bench/peers.md`` measured at the same seeds: the pack's curves there (TaylorSeer undamped, the last
step computed) and Spectrum's ComfyUI ports. Work is the run's own count (block executions x batch rows, against
the uncached run). Prints a markdown report.

    python3 -m cached_sampler_dev.studies.damped_forecast --model video    # about 25 min per damping on one core
    python3 -m cached_sampler_dev.studies.damped_forecast --model photos   # about 10 min per damping
    python3 -m cached_sampler_dev.studies.damped_forecast --quick          # video, seeds 0-1, two settings

The sweep splits over processes: ``--damping 0.1 --rows a.json`` in one, ``--damping 0.2 --rows b.json`` in
another, then ``--merge a.json b.json`` prints the report of both.
"""
from __future__ import annotations

import argparse
import json
import statistics
import types
from pathlib import Path

from .forecast_limits import Workload, pack_run
from .last_step_blocks import FLOORS, PEERS, PORTS, reduction  # the same peers run, read the same way

DAMPINGS = (0.1, 0.2)


def sweep(model: str, dampings, seeds, quick: bool) -> list[dict]:
    """Every setting of the grid at every damping and seed: one row each (psnr, work, the setting)."""
    import torch
    torch.set_num_threads(1)
    from ..bench.bench_discover import GUIDANCE_ON_CADENCE, growing_grid
    from .calibration_spaces import start_study
    app, ic, _ = start_study(model)
    grid = growing_grid(types.SimpleNamespace(sweeps={"growing.warmup_steps": [0, 3]}))[1:]
    if quick:
        grid = [s for s in grid if s["interval"] == 3 and s["growth"] in (0.5, 0.75) and s["warmup_steps"] == 0]
    module = app.module(f"nodes.demo_models.{model}")
    work = Workload(module, list(range(8)), module.decode)
    rows = []
    for seed in seeds:
        for setting in grid:
            for damping in dampings:
                for last in ("compute", "forecast"):
                    for guided in (False, True):
                        items = [ic.FixedCadence(**setting, last_step=last), ic.TaylorSeer(order=1, damping=damping),
                                 *([ic.GuidanceCache(**GUIDANCE_ON_CADENCE)] if guided else [])]
                        value, summary = pack_run(app, work, items, seed)
                        rows.append({"seed": seed, "psnr": value, "work": 1.0 - summary.work_saved,
                                     "damping": damping, "last_step": last, "guidance": guided, **setting})
        print(f"seed {seed} done", flush=True)
    return rows


def report(model: str, rows: list[dict]) -> None:
    from ..bench.bench_report import best_reduction, load_results
    stored = load_results(PEERS / f"results_{model}.json")
    per_seed = {m["seed"]: m for m in stored[model]["28"]["per_seed"]}
    seeds = sorted({r["seed"] for r in rows})
    dampings = sorted({r["damping"] for r in rows})

    def stored_rows(seed: int, keys) -> list[dict]:
        return [r for r in per_seed[seed]["rows"] if r["key"] in keys]

    def ours(seed: int, damping=None) -> list[dict]:
        return [r for r in rows if r["seed"] == seed and (damping is None or r["damping"] == damping)]

    def cell(values):
        return f"{statistics.median(values):.0%} / {min(values):.0%}"

    pack_keys = {r["key"] for r in per_seed[seeds[0]]["rows"] if r["source"] == "pack"}
    ports = [k for k in PORTS if any(r["key"] == k for r in per_seed[seeds[0]]["rows"])]
    grid = len({tuple(sorted((k, v) for k, v in r.items() if k in ("interval", "growth", "warmup_steps")))
                for r in rows})
    print(f"# TaylorSeer with damping on the growing cadence ({model} model)\n")
    print(f"Tiny {'Flux photos' if model == 'photos' else 'Wan 2.1 video'} model, 8 samples, 28 steps, euler / "
          f"simple, cfg 3, seeds {seeds[0]}-{seeds[-1]}; the growing grid ({grid} settings), each with its last step "
          f"computed and forecast, with and without the Guidance Cache after it, + TaylorSeer o1 at damping "
          f"{', '.join(f'{d:g}' for d in dampings)}. Work saved by the best setting at each floor, read at every "
          f"seed, *median / worst*. *Undamped*: the pack's curves of the peers run "
          f"(`bench/peers/results_{model}.json`: the growing cadence + TaylorSeer o1, the last step computed, with "
          f"and without the Guidance Cache); *damped, best*: the best damped setting at each seed; *the best*: the best "
          f"of all of them at each seed. The ratio is its median reduction (full work / the run's work) over the "
          f"better port's.\n")
    print("| Floor | undamped | " + " | ".join(f"damping {d:g}" for d in dampings) + " | damped, best | the best | "
          + " | ".join(PORTS[k] for k in ports) + " | the best / the better port |")
    print("|---|---|" + "---|" * len(dampings) + "---|---|" + "---|" * len(ports) + "---|")
    for floor in FLOORS:
        undamped = [best_reduction(stored_rows(s, pack_keys), floor) for s in seeds]
        each = {d: [best_reduction(ours(s, d), floor) for s in seeds] for d in dampings}
        damped = [best_reduction(ours(s), floor) for s in seeds]
        best = [max(a, b) for a, b in zip(undamped, damped)]
        port = {k: [best_reduction(stored_rows(s, {k}), floor) for s in seeds] for k in ports}
        better = max(statistics.median([reduction(v) for v in vs]) for vs in port.values())
        ratio = statistics.median([reduction(v) for v in best]) / better
        print(f"| >= {floor} dB | {cell(undamped)} | " + " | ".join(cell(v) for v in each.values())
              + f" | {cell(damped)} | {cell(best)} | " + " | ".join(cell(vs) for vs in port.values())
              + f" | {ratio:.2f}x |")
    print("\nThe best damped setting per floor and seed (interval, growth, warmup, damping, last step; + G: with the "
          "Guidance Cache):\n")
    for floor in (31, 32, 35, 38, 40, 45):
        picks = []
        for s in seeds:
            fit = [r for r in ours(s) if r["psnr"] >= floor]
            r = min(fit, key=lambda r: (r["work"], -r["psnr"])) if fit else None
            picks.append(f"{s}: " + (f"({r['interval']}, {r['growth']:g}, {r['warmup_steps']}, {r['damping']:g}, "
                                     f"{r['last_step']})" + (" + G" if r["guidance"] else "") if r else "none"))
        print(f"* {floor} dB: " + "; ".join(picks))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("photos", "video"), default="video")
    parser.add_argument("--damping", default=",".join(map(str, DAMPINGS)), help="comma-separated dampings")
    parser.add_argument("--quick", action="store_true", help="seeds 0-1, two growing settings")
    parser.add_argument("--rows", type=Path, help="also write the measured rows here (JSON)")
    parser.add_argument("--merge", type=Path, nargs="+", help="print the report of these rows files; measure nothing")
    args = parser.parse_args(argv)
    if args.merge:
        rows = [r for path in args.merge for r in json.loads(path.read_text(encoding="utf-8"))["rows"]]
    else:
        seeds = (0, 1) if args.quick else tuple(range(8))
        rows = sweep(args.model, [float(d) for d in args.damping.split(",")], seeds, args.quick)
        if args.rows:
            args.rows.write_text(json.dumps({"model": args.model, "rows": rows}), encoding="utf-8")
    report(args.model, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
