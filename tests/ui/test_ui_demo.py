"""The README's main command: tools/demo.py runs the tiny example uncached and cached and says what caching did."""
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
    for name in ("uncached.png", "cached.png", "tuning_plot.png"):
        assert Image.open(tmp_path / name).size[0] > 100
