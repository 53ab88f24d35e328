"""What caching does, in one command and on a CPU: the tiny-model example workflow, uncached and cached.

Loads the pack into a headless ComfyUI (as the tests do), turns example_workflows/tiny_digits_tuning_plot.json
into a prompt, and runs it through ComfyUI's executor twice: once with the caching chain disconnected
(plain KSampler) and once as saved (First Block Cache + TaylorSeer). Prints the run summary, the PSNR of
the cached digits against the uncached ones and the wall time of each, and saves both images, the two one above
the other, and the tuning plot. ``--model video`` does the same with the bundled tiny video model (8 classes of
moving shapes, 28 steps) and the video recipe's Adaptive Cache 0.1 + TaylorSeer: a row of 8 frames per video.

Needs nothing beyond what ComfyUI's own requirements install: run it with the Python that runs ComfyUI (its
virtual environment activated), from the pack's folder; ComfyUI is found through ``COMFYUI_PATH``, the folder
above ``custom_nodes/`` when the pack is installed there, or ``~/ComfyUI``.

    python3 tools/demo.py [--model digits|video] [--threshold 0.25] [--steps 20] [--out artifacts/demo]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / "example_workflows" / "tiny_digits_tuning_plot.json"

if __package__:  # python3 -m cached_sampler_dev.demo, the developer wing installed
    from .devkit import comfy_harness, workflow_api
else:  # python3 tools/demo.py with nothing installed: Python puts the script's own folder, tools/, on the path
    from devkit import comfy_harness, workflow_api


def start_comfy():
    """A headless ComfyUI with the pack loaded by ComfyUI's own loader (the tests' harness), its output kept; without
    the tests' nodes, which need the developer wing installed."""
    return comfy_harness.start(quiet=True, test_nodes=False)


def images(comfy, outputs: dict, node_id: str):
    from PIL import Image
    return [Image.open(comfy.tmp / i["type"] / i["subfolder"] / i["filename"]).convert("RGB")
            for i in outputs[node_id]["images"]]


def grid(tiles, columns=None):
    """The tiles in rows of ``columns`` (all in one row by default)."""
    from PIL import Image
    w, h = tiles[0].size
    columns = columns or len(tiles)
    rows = -(-len(tiles) // columns)
    out = Image.new("RGB", (w * columns, h * rows))
    for i, t in enumerate(tiles):
        out.paste(t, ((i % columns) * w, (i // columns) * h))
    return out


def video_prompt() -> dict:
    """The tiny video model sampled by a Cached Sampler with the video recipe's chain, its frames and tuning plot
    previewed (node ids named as the digits workflow's roles)."""
    sampling = {"seed": 0, "steps": 28, "cfg": 3.0, "sampler_name": "euler", "scheduler": "simple", "denoise": 1.0}
    return {
        "video": {"class_type": "CachedSamplerVideoModel", "inputs": {"classes": "01234567"}},
        "cache": {"class_type": "CachedSamplerAdaptiveCache", "inputs": {
            "threshold": 0.1, "max_consecutive_cached": -1, "start_percent": 0.15, "end_percent": 0.95}},
        "ts": {"class_type": "CachedSamplerTaylorSeer", "inputs": {"order": 1, "interceptors": ["cache", 0]}},
        "sampler": {"class_type": "CachedSampler", "inputs": {
            "model": ["video", 0], "positive": ["video", 1], "negative": ["video", 2], "latent_image": ["video", 3],
            "interceptors": ["ts", 0], **sampling}},
        "decode": {"class_type": "VAEDecode", "inputs": {"samples": ["sampler", 0], "vae": ["video", 4]}},
        "frames": {"class_type": "PreviewImage", "inputs": {"images": ["decode", 0]}},
        "plot": {"class_type": "PreviewImage", "inputs": {"images": ["sampler", 1]}},
    }


def side_by_side(plain, cached, labels: tuple[str, str], scale: int = 2, across: bool = False):
    """The uncached and the cached picture, each under its label, enlarged ``scale`` times: one above the other,
    or next to each other (``across``)."""
    from PIL import Image, ImageDraw, ImageFont
    try:
        font = ImageFont.load_default(size=14)
    except TypeError:  # Pillow before 10.1
        font = ImageFont.load_default()
    w, h = plain.size[0] * scale, plain.size[1] * scale
    band, gap = 24, 12 if across else 0
    size = (2 * w + gap, h + band) if across else (w, 2 * (h + band))
    out = Image.new("RGB", size, (255, 255, 255))
    draw = ImageDraw.Draw(out)
    for i, (picture, label) in enumerate(((plain, labels[0]), (cached, labels[1]))):
        left, top = (i * (w + gap), 0) if across else (0, i * (h + band))
        draw.text((left + 6, top + 4), label, fill=(33, 33, 33), font=font)
        out.paste(picture.resize((w, h), Image.NEAREST), (left, top + band))
    return out


def psnr(a, b) -> float:
    import torch
    x = torch.frombuffer(bytearray(a.tobytes()), dtype=torch.uint8).float()
    y = torch.frombuffer(bytearray(b.tobytes()), dtype=torch.uint8).float()
    mse = float(((x - y) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(255.0 ** 2 / mse)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("digits", "video"), default="digits",
                        help="the bundled digits model (the tiny example workflow) or the tiny video model")
    parser.add_argument("--threshold", type=float, default=None,
                        help="the cache's threshold (default: as saved; video: 0.1)")
    parser.add_argument("--steps", type=int, default=None, help="sampling steps (default: as saved)")
    parser.add_argument("--out", default=str(ROOT / "artifacts" / "demo"), help="where to save the images")
    args = parser.parse_args(argv)

    print("Starting a headless ComfyUI with the pack ...", flush=True)
    try:
        app = start_comfy()
    except ModuleNotFoundError as e:
        raise SystemExit(f"The demo needs only what ComfyUI's requirements install, and this Python ({sys.executable}) "
                         f"has no module '{e.name}': run it with the Python that runs ComfyUI (activate ComfyUI's "
                         f"virtual environment first), from the pack's folder.") from None
    home = Path.home()
    shown = f"~/{app.path.relative_to(home)}" if app.path.is_relative_to(home) else str(app.path)
    print(f"ComfyUI {app.version} at {shown}")
    if args.model == "video":
        prompt, sampler, cache, digits_node, plot_node = video_prompt(), "sampler", "cache", "frames", "plot"
        model_name, method, columns = "Tiny video model", "Adaptive Cache", 8  # 8 frames per video, a row each
    else:
        workflow = json.loads(WORKFLOW.read_text(encoding="utf-8"))
        prompt = workflow_api.workflow_to_api(workflow, workflow_api.object_info())
        sampler = next(k for k, v in prompt.items() if v["class_type"] == "CachedSampler")
        cache = next(k for k, v in prompt.items() if v["class_type"] == "CachedSamplerFirstBlockCache")
        titles = {str(n["id"]): n.get("title") for n in workflow["nodes"]}
        digits_node = next(k for k, v in prompt.items()
                           if v["class_type"] == "PreviewImage" and titles.get(k) == "Digits")
        plot_node = next(k for k, v in prompt.items()
                         if v["class_type"] == "PreviewImage" and titles.get(k) == "Tuning plot")
        model_name, method, columns = "Tiny digits model", "First Block Cache", None
    if args.threshold is not None:
        prompt[cache]["inputs"]["threshold"] = args.threshold
    if args.steps is not None:
        prompt[sampler]["inputs"]["steps"] = args.steps
    uncached = json.loads(json.dumps(prompt))
    del uncached[sampler]["inputs"]["interceptors"]

    import comfy.utils
    comfy.utils.PROGRESS_BAR_ENABLED = False
    executor = app.executor()
    warmup = json.loads(json.dumps(uncached))
    warmup[sampler]["inputs"]["seed"] += 1
    app.run(warmup, executor)  # loads the model once (ComfyUI caches it), so both timings below are sampling
    runs = {}
    for name, p in (("uncached", uncached), ("cached", prompt)):
        started = time.perf_counter()
        _, outputs = app.run(p, executor)
        runs[name] = (time.perf_counter() - started, outputs)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plain, cached = (grid(images(app, runs[n][1], digits_node), columns) for n in ("uncached", "cached"))
    plain.save(out / "uncached.png")
    cached.save(out / "cached.png")
    images(app, runs["cached"][1], plot_node)[0].save(out / "tuning_plot.png")

    summary = runs["cached"][1][sampler]["text"][0]
    inputs = prompt[sampler]["inputs"]
    print()
    print(f"{model_name}, {inputs['steps']} steps, {inputs['sampler_name']}/{inputs['scheduler']}, cfg {inputs['cfg']}, "
          f"{method} threshold {prompt[cache]['inputs']['threshold']} + TaylorSeer")
    print()
    print("What caching did (shown on the Cached Sampler node):")
    print("  " + summary.replace("\n", "\n  "))
    print()
    t_plain, t_cached = runs["uncached"][0], runs["cached"][0]
    what = "videos" if args.model == "video" else "digits"
    print(f"PSNR of the cached {what} against the uncached ones: {psnr(plain, cached):.1f} dB")
    computed = summary.split("computed ")[1].split(" (")[0]
    side_by_side(plain, cached, (f"uncached, {inputs['steps']} steps", f"cached ({method} + TaylorSeer): "
                                 f"{computed}, {psnr(plain, cached):.1f} dB"),
                 scale=1 if columns else 2, across=bool(columns)).save(out / "side_by_side.png")
    print(f"Wall time: uncached {t_plain:.2f} s, cached {t_cached:.2f} s ({t_plain / t_cached:.2f}x; a tiny model "
          f"on a CPU, so fixed overheads weigh more than on a real one)")
    shown = [os.path.relpath(out / f) if not os.path.relpath(out / f).startswith("..") else str(out / f)
             for f in ("uncached.png", "cached.png", "side_by_side.png", "tuning_plot.png")]
    print(f"Saved {', '.join(shown[:-1])} and {shown[-1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
