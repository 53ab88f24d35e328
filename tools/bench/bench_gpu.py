"""GPU bench: the pack's overhead, wall speedup and memory on real-size models, with random weights.

    python3 -m cached_sampler_dev.bench.bench_gpu                       # on CUDA: FLUX.1-dev and Wan 2.1 14B dimensions
    python3 -m cached_sampler_dev.bench.bench_gpu --models flux --steps 8  # one model, fewer steps
    python3 -m cached_sampler_dev.bench.bench_gpu --device cpu --size tiny # what CI runs: the same code at toy sizes

The models are built through ComfyUI's own classes (``comfy.supported_models.Flux`` / ``WAN21_T2V`` ->
``comfy.model_base`` -> ``ModelPatcher``) directly on the device, with random weights, and sampled through
``comfy.sample.sample`` with the pack's chain installed by ``adapter.install`` (what the Cached
Sampler does):

* **FLUX.1-dev** dimensions: hidden 3072, 24 heads, 19 double + 38 single blocks, T5 width 4096, bf16;
  1024x1024 (4096 image tokens) with 512 text tokens; cfg 1 (guidance-distilled, one branch).
* **Wan 2.1 14B** dimensions: hidden 5120, 40 heads, 40 blocks, FFN 13824, bf16; a 480p clip (832x480,
  ``--frames`` frames, 81 by default) with 512 text tokens; cfg 5 (two branches).

Each run is timed with CUDA events (wall clock on a CPU) after a warm-up run; runs of all settings alternate
round after round and medians are reported. It writes ``bench/results-gpu.md`` (``--out``):

* **overhead** of each method at a setting that skips nothing (and whether the output is unchanged): every chain
  the shared guarantees run, at the settings of it that never skip;
* **wall speedup** at fixed skip schedules (Fixed Cadence at whole-model level; DBCache with an infinite
  threshold, so ``max_consecutive_cached`` fixes its schedule, at block level), with the work really saved;
* **peak VRAM** of the run (``torch.cuda.max_memory_allocated``) and the bytes its caches held, with and
  without caching and with ``cache_on_cpu``.

With ``--compile BACKEND`` the model is compiled as ComfyUI's TorchCompileModel node compiles it (the whole
diffusion model, ``comfy_api.torch_helpers.set_torch_compile_wrapper``) before the chain is installed, as a user
would chain the two; the pack then compiles the blocks one by one for its block caches. Every setting then runs
once untimed first (its graphs compile there), the uncompiled uncached run is timed beside them, and each
speedup is read against both uncached runs::

    python3 -m cached_sampler_dev.bench.bench_gpu --models flux --compile inductor   # caching on a compiled FLUX
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

import torch  # noqa: E402

FLUX = {"image_model": "flux", "guidance_embed": True, "in_channels": 16, "out_channels": 16, "mlp_ratio": 4.0,
        "theta": 10000, "patch_size": 2, "qkv_bias": True, "txt_ids_dims": [], "yak_mlp": False, "txt_norm": False}
WAN = {"image_model": "wan2.1", "model_type": "t2v", "patch_size": (1, 2, 2), "in_dim": 16, "out_dim": 16,
       "freq_dim": 256, "window_size": (-1, -1), "qk_norm": True, "cross_attn_norm": True, "eps": 1e-6}
# model -> size -> (unet_config additions, latent shape (C, [T,] H, W), text tokens, text width, pooled width, cfg)
SIZES = {
    "flux": {
        "full": (dict(FLUX, hidden_size=3072, num_heads=24, depth=19, depth_single_blocks=38, axes_dim=[16, 56, 56],
                      context_in_dim=4096, vec_in_dim=768), (16, 128, 128), 512, 4096, 768, 1.0),
        "tiny": (dict(FLUX, hidden_size=64, num_heads=2, depth=2, depth_single_blocks=4, axes_dim=[4, 14, 14],
                      context_in_dim=32, vec_in_dim=32), (16, 16, 16), 8, 32, 32, 1.0),
    },
    "wan": {
        "full": (dict(WAN, dim=5120, ffn_dim=13824, num_heads=40, num_layers=40, text_dim=4096), None, 512, 4096,
                 None, 5.0),
        "tiny": (dict(WAN, dim=64, ffn_dim=128, num_heads=2, num_layers=4, text_dim=32), (16, 2, 16, 16), 8, 32,
                 None, 5.0),
    },
}
CONFIG_CLASSES = {"flux": "Flux", "wan": "WAN21_T2V"}
NOT_COMPILED = "uncached, not compiled"  # with --compile: the baseline a user without compile has
NAMES = {"flux": "FLUX.1-dev", "wan": "Wan 2.1 14B"}


def wan_latent(frames: int, height: int = 480, width: int = 832) -> tuple[int, ...]:
    return 16, (frames - 1) // 4 + 1, height // 8, width // 8


def start_comfy(device: str):
    """Import ComfyUI (``COMFYUI_PATH``, else ``~/ComfyUI``) headless, on ``device``, and the pack as a package."""
    from ..devkit.comfy_harness import find_comfyui, import_headless
    path = find_comfyui()
    if path is None:
        raise SystemExit("bench_gpu: no ComfyUI found (set COMFYUI_PATH or keep a checkout at ~/ComfyUI).")
    import_headless(path, cpu=device == "cpu")
    from ..devkit.pack import NAME, load_core
    load_core()
    return importlib.import_module(f"{NAME}.adapter"), importlib.import_module(f"{NAME}.interceptors")


@torch.no_grad()
def init_on_device(module: torch.nn.Module, seed: int) -> None:
    """Random weights drawn where they live (ComfyUI's ops skip initialisation): Linear/Conv weights
    N(0, 1/sqrt(fan_in)), norm scales 1, everything else N(0, 0.02); uninitialised buffers N(0, 0.02)."""
    for _, mod in module.named_modules():
        is_norm = "norm" in type(mod).__name__.lower()
        for name, p in mod.named_parameters(recurse=False):
            gen = torch.Generator(device=p.device).manual_seed(seed)
            seed += 1
            if isinstance(mod, (torch.nn.Linear, torch.nn.modules.conv._ConvNd)) and name == "weight":
                p.normal_(0.0, 1.0 / math.sqrt(p[0].numel()), generator=gen)
            elif is_norm and name in ("weight", "scale"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
        for _, b in mod.named_buffers(recurse=False):
            if b is not None and torch.is_floating_point(b) and b.numel() and not bool(torch.isfinite(b).all()):
                b.normal_(0.0, 0.02)


def build(model: str, size: str, device: torch.device, dtype: torch.dtype):
    import comfy.model_patcher
    import comfy.supported_models
    unet_config = SIZES[model][size][0]
    config = getattr(comfy.supported_models, CONFIG_CLASSES[model])(dict(unet_config))
    config.set_inference_dtype(dtype, None)
    base = config.get_model({}, device=device)
    init_on_device(base.diffusion_model, seed=0)
    base.eval()
    return comfy.model_patcher.ModelPatcher(base, load_device=device, offload_device=device)


def inputs(model: str, size: str, frames: int):
    _, latent, tokens, width, pooled, cfg = SIZES[model][size]
    latent = latent or wan_latent(frames)
    gen = torch.Generator().manual_seed(1)
    extras = {} if pooled is None else {"pooled_output": torch.randn(1, pooled, generator=gen), "guidance": 3.5}
    positive = [[torch.randn(1, tokens, width, generator=gen), dict(extras)]]
    negative = [[torch.randn(1, tokens, width, generator=gen), dict(extras)]]
    return positive, negative, torch.zeros((1,) + tuple(latent)), cfg


class Timer:
    """CUDA events on a GPU (the device's own clock, no host sync inside the run), the wall clock on a CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __enter__(self):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            self.end.record()
            torch.cuda.synchronize()
            self.seconds = self.start.elapsed_time(self.end) / 1000
            self.peak = torch.cuda.max_memory_allocated()
        else:
            self.seconds, self.peak = time.perf_counter() - self.t0, None


def settings(ic) -> list[tuple[str, str, list, bool]]:
    """(group, label, chain, cache_on_cpu): every method's shared examples at settings that skip nothing (their
    names; ``tests/support/methods.py``, so a method added there is measured here too), then fixed skip schedules."""
    from ..support.methods import never_skips
    fixed_blocks = dict(threshold=1e9, warmup=0.0, max_cached_steps=-1)
    return [
        *(("overhead", name, chain, False) for name, chain in never_skips(ic).items()),
        ("schedule", "Fixed Cadence interval=2", [ic.FixedCadence(interval=2)], False),
        ("schedule", "Fixed Cadence interval=3 + TaylorSeer o1", [ic.FixedCadence(interval=3), ic.TaylorSeer(order=1)], False),
        ("schedule", "DBCache F1B0, 2 cached in a row", [ic.DBCache(max_consecutive_cached=2, **fixed_blocks)], False),
        ("schedule", "DBCache F1B0, 2 cached in a row + TaylorSeer o1",
         [ic.DBCache(max_consecutive_cached=2, **fixed_blocks), ic.TaylorSeer(order=1)], False),
        ("schedule", "DBCache F1B0, 2 cached in a row + TaylorSeer o1, cache_on_cpu",
         [ic.DBCache(max_consecutive_cached=2, **fixed_blocks), ic.TaylorSeer(order=1)], True),
    ]


def bench_model(adapter, ic, model_name: str, args, log=print) -> dict:
    import comfy.sample
    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    patcher = build(model_name, args.size, device, dtype)
    positive, negative, latent, cfg = inputs(model_name, args.size, args.frames)
    noise = comfy.sample.prepare_noise(latent, 0)
    runs = settings(ic)
    if args.only:
        runs = [r for r in runs if any(word in r[1] for word in args.only)]
    model_bytes = sum(p.numel() * p.element_size() for p in patcher.model.diffusion_model.parameters())
    eager = patcher
    if args.compile:  # as TorchCompileModel does: a clone sharing the weights, compiled whole
        from comfy_api.torch_helpers import set_torch_compile_wrapper
        patcher = eager.clone()
        set_torch_compile_wrapper(patcher, backend=args.compile)

    def sample(chain, cache_on_cpu, source=None):
        summaries = []
        source = source or patcher
        m = source if chain is None else adapter.install(
            source, ic.InterceptorChain.of(chain), cache_on_cpu=cache_on_cpu,
            on_run_end=lambda run, summary: summaries.append(summary))
        with Timer(device) as timer:
            out = comfy.sample.sample(m, noise, args.steps, cfg, "euler", "simple", positive, negative, latent,
                                      disable_pbar=True, seed=0)
        return out, timer, summaries[-1] if summaries else None

    log(f"{NAMES[model_name]} ({args.size}): {model_bytes / 1e9:.2f} GB of weights, latent {tuple(latent.shape)}")
    sample(None, False)  # warm-up: loads the model, picks kernels
    baseline, _, _ = sample(None, False)
    times: dict[str, list[float]] = {"uncached": []}
    rows: dict[str, dict] = {"uncached": {"group": "baseline"}}
    specs = {"uncached": (None, False, None)}
    if args.compile:
        times[NOT_COMPILED], rows[NOT_COMPILED], specs[NOT_COMPILED] = [], {"group": "baseline"}, (None, False, eager)
    for group, label, chain, on_cpu in runs:
        times[label] = []
        rows[label] = {"group": group}
        specs[label] = (chain, on_cpu, None)
    if args.compile:  # each setting's graphs compile on its first run, which is not timed
        for label, spec in specs.items():
            sample(*spec)
            log(f"  compiled for {label}")
    for round_index in range(args.repeats):
        for label in times:
            out, timer, summary = sample(*specs[label])
            times[label].append(timer.seconds)
            row = rows[label]
            row["peak"] = max(row.get("peak") or 0, timer.peak or 0) or None
            if summary is not None:
                row.update(work_saved=summary.work_saved, cache=summary.cache_peak_bytes,
                           computed=f"{summary.evaluations - summary.evaluations_skipped}/{summary.evaluations}")
            row["max_diff"] = float((out.float() - baseline.float()).abs().max())
            log(f"  round {round_index + 1} {label}: {timer.seconds:.3f} s")
    base = statistics.median(times["uncached"])
    plain = statistics.median(times[NOT_COMPILED]) if args.compile else base
    for label, values in times.items():
        median = statistics.median(values)
        rows[label].update(seconds=median, per_step_ms=(median - base) / args.steps * 1000,
                           overhead=median / base - 1, speedup=base / median, speedup_plain=plain / median)
    import comfy.model_management
    comfy.model_management.unload_all_models()  # ComfyUI keeps the last loaded model: free it for the next one
    return {"model": NAMES[model_name], "size": args.size, "latent": tuple(latent.shape), "weights": model_bytes,
            "base_seconds": base, "plain_seconds": plain, "rows": rows}


def _bytes(n) -> str:
    from ..devkit.pack import NAME
    return "-" if n is None else importlib.import_module(f"{NAME}.interceptors.stats").format_bytes(n)


def _cache(row) -> str:
    cache = row.get("cache") or {}
    return ", ".join(f"{_bytes(b)} on {d}" for d, b in sorted(cache.items())) or "-"


def write(results: list[dict], args, out: Path) -> str:
    device = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "CPU"
    lines = [f"# GPU bench: {args.device} ({device})", "",
             f"Written by `python3 -m cached_sampler_dev.bench.bench_gpu {' '.join(sys.argv[1:])}`".rstrip() +
             f" on {datetime.date.today()}, torch {torch.__version__}. Random weights built through ComfyUI's "
             f"classes, {args.steps} steps, euler / simple, seed 0; medians of {args.repeats} alternating rounds "
             f"after a warm-up run ({'CUDA events' if args.device == 'cuda' else 'wall clock'})."
             + (f" Compiled with TorchCompileModel's helper, backend `{args.compile}`, each setting run once "
                f"untimed first." if args.compile else ""), ""]
    for result in results:
        rows = result["rows"]
        lines += [f"## {result['model']} ({result['size']} size, latent {result['latent']}, "
                  f"{result['weights'] / 1e9:.2f} GB of weights)", "",
                  f"Uncached: {result['base_seconds']:.3f} s per run, "
                  f"{result['base_seconds'] / args.steps * 1000:.1f} ms per step, peak "
                  f"{_bytes(rows['uncached'].get('peak'))}." + (
                      f" Not compiled: {result['plain_seconds']:.3f} s per run (compile alone: "
                      f"{result['plain_seconds'] / result['base_seconds']:.2f}x)." if args.compile else ""), "",
                  "Overhead with nothing skipped:", "",
                  "| Method | Overhead | ms per step | Output max abs diff | Peak VRAM | Cache held |",
                  "|---|---|---|---|---|---|"]
        for label, row in rows.items():
            if row["group"] == "overhead":
                lines.append(f"| {label} | {row['overhead']:+.2%} | {row['per_step_ms']:+.2f} | {row['max_diff']:.3g} "
                             f"| {_bytes(row.get('peak'))} | {_cache(row)} |")
        plain = " | Wall speedup, against not compiled" if args.compile else ""
        lines += ["", "Fixed skip schedules:", "",
                  f"| Schedule | Computed | Work saved | Wall speedup{plain} | Peak VRAM | Cache held |",
                  "|---|---|---|---|---|---|" + ("---|" if args.compile else "")]
        for label, row in rows.items():
            if row["group"] == "schedule":
                against = f" | {row['speedup_plain']:.2f}x" if args.compile else ""
                lines.append(f"| {label} | {row.get('computed', '-')} | {row.get('work_saved', 0):.0%} | "
                             f"{row['speedup']:.2f}x{against} | {_bytes(row.get('peak'))} | {_cache(row)} |")
        lines.append("")
    text = "\n".join(lines)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return text


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    parser.add_argument("--size", default=None, choices=["full", "tiny"],
                        help="model dimensions: full (default on cuda) or tiny (default on cpu)")
    parser.add_argument("--models", nargs="+", default=["flux", "wan"], choices=["flux", "wan"])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--frames", type=int, default=81, help="Wan clip length in frames (4k+1)")
    parser.add_argument("--repeats", type=int, default=3, help="alternating timing rounds (medians)")
    parser.add_argument("--only", nargs="*", default=None, help="only settings whose name contains one of these")
    parser.add_argument("--compile", default=None, metavar="BACKEND", help="compile the model first as "
                        "TorchCompileModel does (inductor, aot_eager, eager, ...): caching on a compiled model")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results-gpu.md"))
    args = parser.parse_args(argv)
    args.size = args.size or ("full" if args.device == "cuda" else "tiny")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.device == "cpu":
        torch.set_num_threads(1)
    adapter, ic = start_comfy(args.device)
    results, text = [], ""
    for name in args.models:  # written after each model: a run cut short keeps the models it finished
        results.append(bench_model(adapter, ic, name, args))
        text = write(results, args, Path(args.out))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
