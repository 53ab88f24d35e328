"""Auto Calibrate on the bench, each quality target against the best hand-tuned setting of any method.

Runs the bench (tools/bench/bench.py) for Auto Calibrate alone, with the digits model's VAE connected so that its
``min_psnr`` is decoded-image PSNR, planned at seed 1 and measured at seed 0 as the bench measures every method,
and writes bench/autocalibrate/results.{md,json}. Then, for each target, it compares Auto Calibrate's measured
row with the best hand-tuned setting of any other method (every swept setting of the full bench, read from
bench/results.json) and with fewer steps, at the same floor: the work reduction each saves while its output
stays at or above the target. Writes bench/autocalibrate/comparison.md.

    python3 -m cached_sampler_dev.bench.bench_autocalibrate   # 28 steps, targets 30, 35, 40, 45 dB (about 5 min on 2 cores)
    python3 -m cached_sampler_dev.bench.bench_autocalibrate --steps 28,50
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]

from .bench_discover import Config  # noqa: E402
from .bench_report import best_point, load_results  # noqa: E402

TARGETS = (30.0, 35.0, 40.0, 45.0)


def comparison(ours: dict, full: dict, targets=TARGETS) -> str:
    """Markdown: per step count and target, Auto Calibrate against the best hand-tuned row and fewer steps."""
    lines = ["# Auto Calibrate against the best hand-tuned setting", "",
             "Work = transformer-block executions x batch rows against the uncached run; PSNR of the decoded "
             "images against the uncached run at seed 0 (plans made at seed 1, a seed they are then not measured "
             "on). *Best hand-tuned* = the largest reduction of any swept setting of any other method of the full "
             "bench (`bench/results.json`) whose PSNR is at or above the target; *today's Auto Calibrate* = its "
             "row there (the former greedy search, latent-space targets).", ""]
    for steps, w in ours["digits"].items():
        other = full["digits"].get(steps, {})
        hand = [r for r in other.get("rows", []) if r.get("kind") != "planned"]
        former = [r for r in other.get("rows", []) if r.get("kind") == "planned"]
        fewer = other.get("fewer_steps") or w.get("fewer_steps") or []
        lines += [f"## {steps} steps", "",
                  "| target | Auto Calibrate: plan | measured PSNR | work saved (x less) | best hand-tuned at the target "
                  "| fewer steps at the target | today's Auto Calibrate at the target | at least the best hand-tuned |",
                  "|---|---|---|---|---|---|---|---|"]
        rows = {r["value"]: r for r in w["rows"] if r.get("key") == "autocalibrate"}
        for t in targets:
            r = rows.get(t)
            if r is None or r.get("error") or r.get("work") is None:
                lines.append(f"| {t:g} dB | {'error: ' + str(r.get('error')) if r else 'not run'} | | | | | | |")
                continue
            ours_red = 1.0 - r["work"] if r["psnr"] >= t else 0.0
            hb, hw = best_point(hand, t)
            fb, fw = best_point(fewer, t)
            ob, _ = best_point(former, t)
            plan = (r.get("note") or "").split(";")[0]
            cell = lambda b, where: (f"{b:.0%} ({1 / (1 - b):.2f}x, {where['method']} {where['setting']}, "
                                     f"{where['psnr']:.1f} dB)" if where else "0%")
            lines.append(
                f"| {t:g} dB | {plan} | {r['psnr']:.2f} dB | {1 - r['work']:.0%} ({1 / r['work']:.2f}x) | "
                f"{cell(hb, hw)} | {cell(fb, fw)} | {ob:.0%} | "
                f"{'yes' if ours_red >= hb - 1e-9 else 'no'}{'' if r['psnr'] >= t else ' (target missed at seed 0)'} |")
        lines += [""]
        secs = [r.get("calibration_seconds") for r in w["rows"] if r.get("calibration_seconds")]
        if secs:
            lines += [f"Calibration time per target: {min(secs):.0f}-{max(secs):.0f} s.", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", default="28")
    p.add_argument("--targets", default=",".join(f"{t:g}" for t in TARGETS))
    p.add_argument("--full", default=str(ROOT / "bench" / "results.json"), help="the full bench's results.json")
    p.add_argument("--out", default=str(ROOT / "bench" / "autocalibrate"))
    a = p.parse_args(argv)
    targets = tuple(float(t) for t in a.targets.split(","))
    from .bench_run import run_bench
    config = Config(steps=[int(s) for s in a.steps.split(",")], only=["autocalibrate"], overhead=False,
                    out=a.out, plot=False, taylorseer=[], extend=0)
    config.sweeps["autocalibrate"] = list(targets)
    results = run_bench(config)
    text = comparison(results, load_results(Path(a.full)), targets)
    Path(a.out, "comparison.md").write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
