"""Measure in which dtype caches and forecasts should be kept, on the trained digits model in bf16 and fp16.

    python3 -m cached_sampler_dev.studies.measure_dtypes     # about 3 minutes on one CPU thread; writes bench/dtypes.md

The digits model is built through ComfyUI's classes computing in bfloat16 / float16 (what ComfyUI does on a
GPU that supports them), all ten digits in one batch, 28 steps, euler, cfg 3, seed 0. Block-level methods
with TaylorSeer (the only place the dtype matters: whole-model caches hold ComfyUI's float32 model output)
run three ways:

* **model dtype**: forecast points kept and combined in the model's dtype (the pack before this measurement);
* **model dtype, float32 forecast**: points kept in the model's dtype, the combination formed in float32
  (what the pack does);
* **float32**: points converted to float32 when stored, combined in float32 (twice the memory).

PSNR is of the decoded digits against the uncached run in the same dtype.
"""
from __future__ import annotations

import dataclasses
import importlib
import math
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

STEPS = 28
OUT = ROOT / "bench" / "dtypes.md"


def variants(ic):
    """TaylorSeer as the pack has it, and the two alternatives measured against it."""
    taylorseer = importlib.import_module(f"{ic.__name__}.methods.taylorseer")

    @dataclasses.dataclass(frozen=True)
    class HalfForecast(ic.TaylorSeer):
        def estimate(self, slot, sigma):
            points = slot["points"]
            weights = taylorseer.lagrange_weights([s for s, _ in points], sigma)
            out = points[0][1] * weights[0]
            for (_, value), w in zip(points[1:], weights[1:]):
                out = out + value * w
            return out

    @dataclasses.dataclass(frozen=True)
    class Float32Points(ic.TaylorSeer):
        def observe(self, slot, value, sigma):
            super().observe(slot, value.float(), sigma)

    return {"model dtype": HalfForecast, "model dtype, float32 forecast": ic.TaylorSeer, "float32": Float32Points}


def measure(comfy) -> list[dict]:
    import comfy.sample as comfy_sample
    dm, ic, adapter = comfy.module("nodes.demo_models.digits"), comfy.module("interceptors"), comfy.module("adapter")
    labels = list(range(10))
    positive, negative = dm.class_conditioning(labels)
    deciders = {"First Block Cache 0.25": lambda: ic.FirstBlockCache(threshold=0.25),
                "TeaCache 0.4": lambda: ic.TeaCache(threshold=0.4),
                "MagCache 0.09": lambda: ic.MagCache(threshold=0.09)}
    rows = []
    for dtype in (torch.bfloat16, torch.float16):
        model = dm.load_model(dtype=dtype)

        def sample(chain=None, runs=None):
            m = model if chain is None else adapter.install(
                model, ic.InterceptorChain.of(chain), on_run_end=lambda run, summary: runs.append(summary))
            latent = comfy_sample.fix_empty_latent_channels(m, dm.empty_latent(len(labels)))
            noise = comfy_sample.prepare_noise(latent, 0)
            return comfy_sample.sample(m, noise, STEPS, 3.0, "euler", "simple", positive, negative, latent,
                                       disable_pbar=True, seed=0)

        reference = dm.decode(sample())
        for name, decider in deciders.items():
            for order in (1, 2):
                for variant, estimator in variants(ic).items():
                    summaries = []
                    out = dm.decode(sample([decider(), estimator(order=order)], summaries))
                    mse = float(((reference - out) ** 2).mean())
                    rows.append({"dtype": str(dtype).removeprefix("torch."), "method": f"{name} + TaylorSeer o{order}",
                                 "variant": variant, "finite": bool(torch.isfinite(out).all()),
                                 "psnr": math.inf if mse == 0 else 10 * math.log10(1 / mse),
                                 "saved": summaries[-1].work_saved,
                                 "cache": sum(summaries[-1].cache_peak_bytes.values())})
                    print(rows[-1], flush=True)
    return rows


def write(rows: list[dict]) -> str:
    names = list(dict.fromkeys(r["variant"] for r in rows))
    lines = ["# Cache and forecast dtype on the digits model", "",
             f"Written by `python3 -m cached_sampler_dev.studies.measure_dtypes` ({STEPS} steps, euler, cfg 3, seed 0, all ten digits; "
             "PSNR of the decoded digits against the uncached run in the same dtype; work saved and peak cache "
             "bytes of the run).", "",
             "| dtype | method | " + " | ".join(f"PSNR (work saved), {n}" for n in names) + " | "
             + " | ".join(f"cache, {n}" for n in names) + " |",
             "|---" * (2 + 2 * len(names)) + "|"]
    keyed = {}
    for r in rows:
        keyed.setdefault((r["dtype"], r["method"]), {})[r["variant"]] = r
    for (dtype, method), by in keyed.items():
        psnr = " | ".join((f"{by[n]['psnr']:.2f} dB" if by[n]["finite"] else "NaN") + f" ({by[n]['saved']:.0%})"
                          for n in names)
        cache = " | ".join(f"{by[n]['cache'] / 1e3:.0f} KB" for n in names)
        lines.append(f"| {dtype} | {method} | {psnr} | {cache} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    from ..bench.bench_discover import start_comfy
    torch.set_num_threads(1)
    comfy = start_comfy(other_packs=False)
    text = write(measure(comfy))
    OUT.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
