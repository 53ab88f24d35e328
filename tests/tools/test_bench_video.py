"""tools/bench/bench.py on the tiny Wan 2.1 video model (``--model video``), at a tiny size: a few steps, a few
methods at the setting that skips nothing and one that skips, the fewer-steps baseline.

Checks that the video path writes its own files (results_video.md/json, pareto_video.png) with the video
results under "video", that caching switched off reproduces the uncached run exactly with all the work done,
that a setting that skips saves work counted on Wan's blocks, and that fewer steps is measured and compared."""
import json
import math
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

WEIGHTS = Path(__file__).resolve().parents[2] / "assets" / "tiny_wan_video.safetensors"
STEPS = 5


@pytest.fixture(scope="module")
def results(comfy, tmp_path_factory):
    if not WEIGHTS.is_file():
        pytest.skip("tiny_wan_video.safetensors missing (run python3 -m cached_sampler_dev.training.train_video_model)")
    from cached_sampler_dev.bench import bench
    out = tmp_path_factory.mktemp("bench_video")
    config = bench.parse_args(["--model", "video", "--steps", str(STEPS), "--taylorseer", "1", "--extend", "0",
                               "--only", "fixed_cadence,fbcache,guidancecache,easycache",
                               "--sweep", "fixed_cadence=1,2", "--sweep", "fbcache=0", "--sweep", "guidancecache=1,2",
                               "--sweep", "easycache=0", "--no-other-packs", "--out", str(out)])
    config.classes = "0347"
    config.verbose = False
    assert config.model == "video" and not config.overhead
    return bench.run_bench(config, comfy=comfy), out


def test_writes_its_own_files(results):
    data, out = results
    from PIL import Image
    assert not (out / "results.md").exists() and not (out / "results.json").exists()
    text = (out / "results_video.md").read_text()
    assert f"Best work reduction at a PSNR target, {STEPS} steps" in text
    assert "Wan 2.1 video model" in text and "pareto_video.png" in text
    stored = json.loads((out / "results_video.json").read_text())
    assert "digits" not in stored and set(stored["video"][str(STEPS)]) >= {"baseline", "rows", "targets",
                                                                           "fewer_steps"}
    assert stored["meta"]["model"] == "video" and stored["meta"]["classes"] == "0347"
    with Image.open(out / "pareto_video.png") as img:
        assert img.width >= 600 and img.height >= 400


def test_caching_off_reproduces_the_uncached_run(results):
    data, _ = results
    w = data["video"][str(STEPS)]
    assert w["baseline"]["blocks"] == STEPS * 4  # every Wan block of every step, counted at the hooks
    rows = w["rows"]
    off = [r for r in rows if r["value"] == (1 if r["param"] == "interval" else 0.0)]
    assert {r["key"] for r in off} >= {"fixed_cadence", "fbcache", "guidancecache", "easycache"}
    for r in off:
        assert r["error"] is None, r
        assert r["psnr"] == math.inf and r["work"] == 1.0 and r["identical"], r
    skipping = [r for r in rows if r["key"].startswith("fixed_cadence") and r["value"] == 2]
    assert skipping and all(r["work"] < 0.8 and math.isfinite(r["psnr"]) for r in skipping), skipping


def test_fewer_steps_baseline_is_measured(results):
    data, _ = results
    w = data["video"][str(STEPS)]
    fewer = w["fewer_steps"]
    assert [r["steps"] for r in fewer] == list(range(3, STEPS))
    assert all(r["error"] is None and r["work"] < 1.0 and math.isfinite(r["psnr"]) for r in fewer)
    assert set(w["fewer_steps_targets"]) == {"30", "31", "35", "40", "45"}
    assert "Fixed Cadence" in w["vs_fewer_steps"]
