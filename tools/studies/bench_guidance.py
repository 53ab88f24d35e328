"""Guidance Cache on the trained digits model: work and quality, alone and chained with a step schedule.

Runs through ComfyUI's executor like the bench (Tiny Digits Model -> BenchCountWork -> Cached Sampler with a
chain; all ten digits in one batch, euler / simple, cfg 3, seed 0). Work is **transformer-block executions
times batch rows**, counted on the model (a forward of only the positive rows of a CFG step counts half),
relative to the uncached run; quality is the PSNR of the decoded images against the uncached run.

Compares, at one step count (``--quick``: a handful of settings):

* Fixed Cadence + TaylorSeer o1 over its interval (the strongest step schedule), the baseline;
* Guidance Cache alone, for every estimate and a few intervals, and in the adaptive and agreement modes over
  their thresholds;
* Fixed Cadence + TaylorSeer o1 + Guidance Cache, over both intervals.

    python3 -m cached_sampler_dev.studies.bench_guidance                 # 28 steps, about 3 minutes on one core
    python3 -m cached_sampler_dev.studies.bench_guidance --steps 50 --json out.json
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from ..bench import bench_metrics  # noqa: E402
from ..bench import bench_nodes  # noqa: E402
from ..devkit.work_nodes import CAPTURED  # noqa: E402

TARGETS = (35.0, 40.0, 45.0)
GUIDANCE_ESTIMATES = ("difference forecast", "difference", "negative forecast", "negative reuse")


def chain_nodes(cadence: int | None, guidance: dict | None) -> tuple[dict, str | None]:
    """API nodes of a chain: Fixed Cadence (+ TaylorSeer o1) and/or Guidance Cache; returns (nodes, last id)."""
    nodes, last = {}, None
    window = {"start_percent": 0.0, "end_percent": 1.0}
    if cadence is not None:
        nodes["fc"] = {"class_type": "CachedSamplerFixedCadence", "inputs": {"interval": cadence, **window}}
        nodes["ts"] = {"class_type": "CachedSamplerTaylorSeer", "inputs": {"order": 1, "interceptors": ["fc", 0]}}
        last = "ts"
    if guidance is not None:
        inputs = {"interval": 2, "mode": "cadence", "threshold": 0.0, "estimate": "difference forecast", **window,
                  **guidance}
        if last is not None:
            inputs["interceptors"] = [last, 0]
        nodes["gc"] = {"class_type": "CachedSamplerGuidanceCache", "inputs": inputs}
        last = "gc"
    return nodes, last


def prompt_for(args, key: str, cadence=None, guidance=None) -> dict:
    prompt = {"digits": {"class_type": "CachedSamplerDigitsModel", "inputs": {"digits": args.digits}},
              "work": {"class_type": "BenchCountWork", "inputs": {"model": ["digits", 0], "key": key + "w"}}}
    extra, last = chain_nodes(cadence, guidance)
    prompt.update(extra)
    inputs = {"model": ["work", 0], "seed": args.seed, "steps": args.steps, "cfg": args.cfg, "sampler_name": "euler",
              "scheduler": "simple", "positive": ["digits", 1], "negative": ["digits", 2],
              "latent_image": ["digits", 3], "denoise": 1.0}
    if last is not None:
        inputs["interceptors"] = [last, 0]
    prompt["sampler"] = {"class_type": "CachedSampler" if last else "KSampler", "inputs": inputs}
    prompt["capture"] = {"class_type": "BenchCaptureLatent", "inputs": {"samples": ["sampler", 0], "key": key}}
    return prompt


class Runner:
    def __init__(self, args):
        from ..devkit.comfy_harness import start
        self.comfy = start()
        import comfy.utils
        comfy.utils.PROGRESS_BAR_ENABLED = False
        import nodes
        bench_nodes.register(nodes, self.comfy.pack.__name__)
        self.digits = self.comfy.module("nodes.demo_models.digits")
        self.executor = self.comfy.executor(cache=True)
        self.args = args
        self.n = 0
        self.ref = self.run()

    def run(self, cadence=None, guidance=None) -> dict:
        self.n += 1
        key = f"guidance{self.n}"
        self.comfy.run(prompt_for(self.args, key, cadence, guidance), executor=self.executor)
        record, latent = CAPTURED.pop(key + "w"), CAPTURED.pop(key)
        return {"latent": latent, "images": self.digits.decode(latent.float()), "block_rows": record["block_rows"],
                "blocks": record["blocks"]}

    def measure(self, label: str, cadence=None, guidance=None) -> dict:
        out = self.run(cadence, guidance)
        work = out["block_rows"] / self.ref["block_rows"]
        row = {"method": label, "cadence": cadence, "guidance": guidance, "work": work, "reduction": 1 / work,
               "block_work": out["blocks"] / self.ref["blocks"],
               "psnr": bench_metrics.psnr(out["images"], self.ref["images"]),
               "identical": bool(torch.equal(out["latent"], self.ref["latent"]))}
        print(f"{label:58s} work {work:6.1%} ({1 / work:4.2f}x)  PSNR {row['psnr']:6.2f} dB", flush=True)
        return row


def sweep(runner: Runner, quick: bool) -> list[dict]:
    rows = [runner.measure("Guidance Cache interval 1 (must be identical)", guidance={"interval": 1})]
    cadences = (3, 4, 5, 6, 7) if not quick else (5, 6)
    for c in cadences:
        rows.append(runner.measure(f"Fixed Cadence {c} + TaylorSeer", cadence=c))
    for estimate in (GUIDANCE_ESTIMATES if not quick else GUIDANCE_ESTIMATES[:1]):
        for interval in ((2, 3, 4, 6) if not quick else (3,)):
            rows.append(runner.measure(f"Guidance Cache {interval} ({estimate})",
                                       guidance={"interval": interval, "estimate": estimate}))
    for threshold in ((0.2, 0.3, 0.4, 0.6) if not quick else (0.3,)):
        rows.append(runner.measure(f"Guidance Cache adaptive {threshold:g} (max gap 100)",
                                   guidance={"mode": "adaptive", "threshold": threshold, "interval": 100}))
    for threshold in ((0.001, 0.003, 0.01, 0.03) if not quick else (0.01,)):
        for interval in ((4, 8) if not quick else (4,)):
            rows.append(runner.measure(f"Guidance Cache agreement {threshold:g} (re-check {interval})",
                                       guidance={"mode": "agreement", "threshold": threshold, "interval": interval}))
    for c in cadences[1:]:
        for threshold in ((0.0005, 0.001, 0.003) if not quick else ()):
            rows.append(runner.measure(f"Fixed Cadence {c} + TaylorSeer + Guidance Cache agreement {threshold:g}",
                                       cadence=c, guidance={"mode": "agreement", "threshold": threshold,
                                                            "interval": 4}))
        for start in ((0.0, 0.5, 0.7) if not quick else (0.7,)):
            rows.append(runner.measure(f"Fixed Cadence {c} + TaylorSeer + Guidance Cache 2 (from {start:g})",
                                       cadence=c, guidance={"interval": 2, "start_percent": start}))
    return rows


def best(rows: list[dict], prefix: str, level: float) -> dict | None:
    fits = [r for r in rows if r["method"].startswith(prefix) and r["psnr"] >= level]
    return max(fits, key=lambda r: r["reduction"]) if fits else None


def summary(rows: list[dict]) -> list[str]:
    groups = {"Fixed Cadence + TaylorSeer": lambda r: r["cadence"] and not r["guidance"],
              "Guidance Cache alone": lambda r: r["guidance"] and not r["cadence"],
              "Fixed Cadence + TaylorSeer + Guidance Cache": lambda r: r["cadence"] and r["guidance"]}
    lines = ["| Method | " + " | ".join(f">= {t:g} dB" for t in TARGETS) + " |",
             "|---|" + "---|" * len(TARGETS)]
    for name, member in groups.items():
        cells = []
        for level in TARGETS:
            fits = [r for r in rows if member(r) and r["psnr"] >= level]
            top = max(fits, key=lambda r: r["reduction"]) if fits else None
            cells.append(f"{top['reduction']:.2f}x ({top['method'].split(' (')[0]}, {top['psnr']:.1f} dB)"
                         if top else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=28)
    parser.add_argument("--cfg", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--digits", default="0123456789")
    parser.add_argument("--quick", action="store_true", help="a handful of settings (a smoke run)")
    parser.add_argument("--json", help="write every row here")
    args = parser.parse_args(argv)
    runner = Runner(args)
    rows = sweep(runner, args.quick)
    print("\n".join(summary(rows)))
    if args.json:
        clean = [{k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in r.items()} for r in rows]
        Path(args.json).write_text(json.dumps({"steps": args.steps, "cfg": args.cfg, "rows": clean}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
