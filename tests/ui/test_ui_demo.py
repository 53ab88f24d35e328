"""The README's main command: tools/demo.py runs the tiny example uncached and cached and says what caching did,
with nothing installed beyond what ComfyUI's own requirements install."""
import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_demo_prints_summary_psnr_and_times_and_saves_images(comfy, tmp_path):
    env = {**os.environ, "COMFYUI_PATH": str(comfy.path), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "demo.py"), "--out", str(tmp_path), "--steps", "12"],
                            capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert "What caching did" in out and "First Block Cache + TaylorSeer" in out
    assert re.search(r"computed \d+/12 steps \(cond \d+/12, uncond \d+/12\)", out), out
    assert "estimated speedup" in out and "acted: First Block Cache" in out
    psnr = float(re.search(r"PSNR of the cached digits against the uncached ones: ([\d.]+|inf) dB", out).group(1))
    assert psnr > 25, out
    assert re.search(r"Wall time: uncached [\d.]+ s, cached [\d.]+ s", out), out
    for name in ("uncached.png", "cached.png", "side_by_side.png", "tuning_plot.png"):
        assert Image.open(tmp_path / name).size[0] > 100


def test_the_video_demo_samples_the_video_model_with_the_video_recipe(comfy, tmp_path):
    """``--model video``: the README's video recipe (Adaptive Cache 0.1 + TaylorSeer) on the bundled video model at
    the bench's 28 steps, with the work saved and the PSNR the README's recipe table quotes for it."""
    env = {**os.environ, "COMFYUI_PATH": str(comfy.path), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "demo.py"), "--model", "video", "--out",
                             str(tmp_path)], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert "Tiny video model, 28 steps" in out and "Adaptive Cache + TaylorSeer" in out, out
    saved = re.search(r"model work saved (\d+)%", out).group(1)
    psnr = float(re.search(r"PSNR of the cached videos against the uncached ones: ([\d.]+) dB", out).group(1))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"video: {saved}% at {psnr:.1f}" in readme, (saved, psnr)
    width, height = Image.open(tmp_path / "side_by_side.png").size
    assert Image.open(tmp_path / "cached.png").size == (8 * 64, 8 * 64) and width > 2 * 8 * 64 > height, (width, height)


NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?")


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def comfyui_requirements(comfy_path: Path) -> set[str]:
    """The distributions ComfyUI's requirements.txt installs: those it lists and, through the installed ones'
    metadata, everything they require in turn (with the extras asked for), by normalized name."""
    todo = [NAME.match(line.split("#")[0]) for line in (comfy_path / "requirements.txt").read_text().splitlines()]
    todo = [(m.group(1), m.group(2) or "") for m in todo if m]
    seen, names = set(), set()
    while todo:
        name, extras = todo.pop()
        key = (normalized(name), frozenset(normalized(e) for e in extras.split(",") if e.strip()))
        if key in seen:
            continue
        seen.add(key)
        names.add(key[0])
        try:
            requires = importlib.metadata.requires(key[0]) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for requirement in requires:
            spec, _, marker = requirement.partition(";")
            wanted = {normalized(e) for e in re.findall(r"extra\s*==\s*[\"']([^\"']+)[\"']", marker)}
            if wanted and not wanted & key[1]:
                continue
            m = NAME.match(spec)
            if m:
                todo.append((m.group(1), m.group(2) or ""))
    return names


# Installed as the sitecustomize of a Python that then runs `python3 tools/demo.py` exactly as the README says (the
# folder holding it on PYTHONPATH, nothing else): an import hook that makes every distribution outside ComfyUI's
# requirements look uninstalled to the pack's own code (the demo, devkit, the pack; the developer wing's installed
# package among them): what a Python with only ComfyUI installed offers it. What ComfyUI or torch import themselves
# is left alone: a working ComfyUI has it.
ONLY_COMFYUI = r"""
import atexit, importlib.abc, importlib.metadata, json, os, re, sys
allowed, root = set(json.loads(os.environ["DEMO_ALLOWED"])), os.environ["DEMO_ROOT"]
owners = importlib.metadata.packages_distributions()
refused = []

class OnlyComfyUIRequirements(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        dists = owners.get(top)
        if not dists or any(re.sub(r"[-_.]+", "-", d).lower() in allowed for d in dists):
            return None
        frame = sys._getframe(1)
        while frame and frame.f_code.co_filename.startswith("<"):  # importlib's frames and this hook's
            frame = frame.f_back
        ours = frame and (frame.f_code.co_filename.startswith(root + "/") or
                          "/custom_nodes/cached-sampler/" in frame.f_code.co_filename)  # the pack, as ComfyUI loads it
        if ours:
            refused.append(f"{name} ({', '.join(dists)}) from {frame.f_code.co_filename}")
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, OnlyComfyUIRequirements())
atexit.register(lambda: print("REFUSED:", json.dumps(refused), file=sys.stderr))
"""


def test_demo_runs_with_only_what_comfyuis_requirements_install(comfy, tmp_path):
    allowed = comfyui_requirements(comfy.path)
    assert {"torch", "numpy", "pillow", "aiohttp", "safetensors"} <= allowed
    assert "pytest" not in allowed and "scikit-learn" not in allowed  # what the developer's set-up adds
    assert "cached-sampler-dev" not in allowed  # the developer wing, which the demo must not need
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(ONLY_COMFYUI, encoding="utf-8")
    env = {**os.environ, "COMFYUI_PATH": str(comfy.path), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(hook),
           "DEMO_ALLOWED": json.dumps(sorted(allowed)), "DEMO_ROOT": str(ROOT)}
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "demo.py"), "--out", str(tmp_path / "out"),
                             "--steps", "8"], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert "REFUSED: " in result.stderr, result.stderr[-3000:]  # the hook was there
    refused = json.loads(result.stderr.rpartition("REFUSED: ")[2].splitlines()[0])
    assert result.returncode == 0 and refused == [], (refused, result.stdout[-2000:] + result.stderr[-3000:])
    assert re.search(r"computed \d+/8 steps", result.stdout), result.stdout
    assert (tmp_path / "out" / "cached.png").is_file()


def test_demo_run_by_a_python_without_comfyuis_requirements_says_which_python_to_use(tmp_path):
    """A Python that lacks ComfyUI's requirements (torch here) gets told to use ComfyUI's, not a traceback."""
    stub = tmp_path / "torch.py"
    stub.write_text("raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "demo.py"), "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert result.returncode == 1
    assert "has no module 'torch'" in result.stderr and "the Python that runs ComfyUI" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
