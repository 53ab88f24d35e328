"""The last step partly computed: a growing cadence whose last step runs only its front blocks, over seeds.

The growing cadence (Fixed Cadence's ``growth``, Spectrum's schedule) + TaylorSeer o1 computes its last step whole
by default; forecasting it whole costs 2.7 dB at the median seed on the photos model. In between: Partial Last Step
chained after the cadence, so that on the last step only the first ``Fn`` transformer blocks run and the rest of the
block stack's residual is forecast, which saves ``1 - Fn / blocks`` of a step. This study sweeps the bench's whole
growing grid (``interval`` 1-3, ``growth`` 0-3, ``warmup_steps`` 0 and 3) with that last step at ``Fn`` 1-3, and
with it forecast whole (``last_step`` forecast), through the pack's Cached Sampler path, over seeds 0-7, and reads
every PSNR floor from 31 to 45 dB at each seed against what the peers run of ``bench/peers.md`` measured at the same
seeds: the pack's curves there (the growing cadence with its last step computed, with TaylorSeer o1 and with the
Guidance Cache) and Spectrum's ComfyUI ports. The growing settings with the last step computed are run again here
and must reproduce that run's PSNR (checked, and the difference printed). Work is the run's own count (block
executions x batch rows, against the uncached run). Prints a markdown report.

    python3 -m cached_sampler_dev.studies.last_step_blocks --model photos   # 12 min on one core, 25 with --guidance
    python3 -m cached_sampler_dev.studies.last_step_blocks --model video    # 20 min, 40 with --guidance
    python3 -m cached_sampler_dev.studies.last_step_blocks --quick          # photos, seeds 0-1, two settings
"""
from __future__ import annotations

import argparse
import math
import statistics
import types
from pathlib import Path

from .forecast_limits import Workload, pack_run

FRONTS = (1, 2, 3)
FORECAST = 0  # the last step forecast whole (Fixed Cadence's ``last_step`` forecast), for comparison
FLOORS = tuple(range(31, 46))
PEERS = Path(__file__).resolve().parents[2] / "bench" / "peers"
PORTS = {"peer:Spectrum": "judian17 `Spectrum`", "peer:SpectrumApplyFlux": "xmarre `SpectrumApplyFlux`"}
SAME_PSNR = 1e-3  # dB: a stored setting run again must read the same (within float noise of the ops' order)


def reduction(saved: float) -> float:
    return 1.0 / max(1.0 - saved, 1e-9)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("photos", "video"), default="photos")
    parser.add_argument("--quick", action="store_true", help="seeds 0-1, two growing settings")
    parser.add_argument("--guidance", action="store_true", help="each setting also with the bench's Guidance Cache "
                        "after it (the peers run's third curve)")
    args = parser.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    from ..bench.bench_discover import GUIDANCE_ON_CADENCE, growing_grid
    from ..bench.bench_report import best_reduction, load_results
    from .calibration_spaces import start_study
    app, ic, _ = start_study(args.model)
    stored = load_results(PEERS / f"results_{args.model}.json")
    per_seed = {m["seed"]: m for m in stored[args.model]["28"]["per_seed"]}
    seeds = (0, 1) if args.quick else tuple(sorted(per_seed))
    grid = growing_grid(types.SimpleNamespace(sweeps={"growing.warmup_steps": [0, 3]}))[1:]
    if args.quick:
        grid = [s for s in grid if s["interval"] == 3 and s["growth"] in (0.5, 0.75) and s["warmup_steps"] == 0]
    module = app.module(f"nodes.demo_models.{args.model}")
    work = Workload(module, list(range(8)), module.decode)
    blocks = app.module("adapter").model_card(work.model).total_blocks  # what Partial Last Step's Fn counts

    ours: dict[int, list[dict]] = {s: [] for s in seeds}      # the last step partly computed
    forecast: dict[int, list[dict]] = {s: [] for s in seeds}  # the last step forecast whole
    worst_diff = 0.0
    for seed in seeds:
        stored_rows = {(r["key"].endswith("guidance"), tuple(sorted(r["value"].items()))): r
                       for r in per_seed[seed]["rows"]
                       if r["key"] in ("fixed_cadence_growing+ts1", "fixed_cadence_growing+ts1+guidance")}
        for setting in grid:
            # the check runs without the Guidance Cache (with it, it reads the same: --quick --guidance checks both)
            for front, guided in [(f, g) for f in (None, FORECAST, *FRONTS) for g in (False, True)
                                  if not g or (args.guidance and (f is not None or args.quick))]:
                cadence = ic.FixedCadence(**setting, last_step="forecast" if front == FORECAST else "compute")
                partial = [ic.PartialLastStep(last_steps=1, front=front)] if front not in (None, FORECAST) else []
                guidance = [ic.GuidanceCache(**GUIDANCE_ON_CADENCE)] if guided else []
                items = [cadence, *partial, ic.TaylorSeer(order=1), *guidance]
                value, summary = pack_run(app, work, items, seed)
                if front is None:
                    before = stored_rows[guided, tuple(sorted(setting.items()))]["psnr"]
                    diff = abs(value - before) if math.isfinite(before) else 0.0
                    worst_diff = max(worst_diff, diff)
                    if diff > SAME_PSNR:
                        raise SystemExit(f"seed {seed}, {setting}: {value:.4f} dB here, {before:.4f} dB in the "
                                         f"peers run; the two measure different things")
                    continue
                row = {"psnr": value, "work": 1.0 - summary.work_saved, "front": front, "guidance": guided, **setting}
                (forecast if front == FORECAST else ours)[seed].append(row)
        print(f"seed {seed} done", flush=True)

    def curve_rows(seed: int, keys) -> list[dict]:
        return [r for r in per_seed[seed]["rows"] if r["key"] in keys]

    pack_keys = {r["key"] for r in per_seed[seeds[0]]["rows"] if r["source"] == "pack"}
    ports = [k for k in PORTS if any(r["key"] == k for r in per_seed[seeds[0]]["rows"])]
    print(f"# The last step partly computed ({args.model} model)\n")
    with_guidance = ", each also with the Guidance Cache after it (the peers run's setting)" if args.guidance else ""
    print(f"Tiny {'Flux photos' if args.model == 'photos' else 'Wan 2.1 video'} model ({blocks} blocks), 8 "
          f"samples, 28 steps, euler / simple, cfg 3, seeds {seeds[0]}-{seeds[-1]}; the growing grid "
          f"({len(grid)} settings) + TaylorSeer o1{with_guidance}. Work saved by the best setting at each floor, read at "
          f"every seed, *median / worst*. *Last step computed*: the pack's curves of the peers run "
          f"(`bench/peers/results_{args.model}.json`); *forecast*: the same grid with `last_step` forecast; "
          f"*partly computed*: with Partial Last Step after the cadence, `Fn` {', '.join(map(str, FRONTS))} "
          f"({', '.join(f'{1 - f / blocks:.0%}' for f in FRONTS)} of that step saved); *the pack's best*: the best "
          f"of the three at each seed. The ratios are median reductions (full work / the run's work) over the "
          f"better port's: the pack's best, and in brackets with the last step computed or forecast only. Run "
          f"again here, the peers run's settings read the same to {worst_diff:.1e} dB.\n")
    print("| Floor | last step computed | forecast | partly computed | the pack's best | "
          + " | ".join(PORTS[k] for k in ports) + " | the pack's best / the better port (without) |")
    print("|---|---|---|---|---|" + "---|" * len(ports) + "---|")
    for floor in FLOORS:
        computed = [best_reduction(curve_rows(s, pack_keys), floor) for s in seeds]
        forecast_only = [best_reduction(forecast[s], floor) for s in seeds]
        partial = [best_reduction(ours[s], floor) for s in seeds]
        without = [max(a, b) for a, b in zip(computed, forecast_only)]
        best = [max(a, b) for a, b in zip(without, partial)]
        port = {k: [best_reduction(curve_rows(s, {k}), floor) for s in seeds] for k in ports}
        better = max(statistics.median([reduction(v) for v in vs]) for vs in port.values())
        ratio = statistics.median([reduction(v) for v in best]) / better
        ratio_without = statistics.median([reduction(v) for v in without]) / better

        def cell(values):
            return f"{statistics.median(values):.0%} / {min(values):.0%}"

        print(f"| >= {floor} dB | {cell(computed)} | {cell(forecast_only)} | {cell(partial)} | {cell(best)} | "
              + " | ".join(cell(vs) for vs in port.values()) + f" | {ratio:.2f}x ({ratio_without:.2f}x) |")
    print("\nThe best setting with the last step partly computed, per floor and seed (interval, growth, warmup, Fn"
          + (", + G: with the Guidance Cache" if args.guidance else "") + "):\n")
    for floor in (31, 33, 35, 40, 45):
        picks = []
        for s in seeds:
            fit = [r for r in ours[s] if r["psnr"] >= floor]
            r = min(fit, key=lambda r: r["work"]) if fit else None
            picks.append(f"{s}: " + (f"({r['interval']}, {r['growth']:g}, {r['warmup_steps']}, {r['front']})"
                                     + (" + G" if r["guidance"] else "") if r else "none"))
        print(f"* {floor} dB: " + "; ".join(picks))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
