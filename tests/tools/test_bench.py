"""tools/bench/bench.py in a tiny configuration: every discovered method at the setting that skips nothing
(plus one setting that skips), a few steps, one timing round, the overhead workload on a small model.

Checks the structure of what the bench writes, that caching switched off reproduces the uncached
output (PSNR inf, full work), that ComfyUI's EasyCache/LazyCache are measured as peers, that another
pack's caching node is discovered, that a method that fails is reported, not fatal, and that the
fewer-steps baseline (the uncached sampler at 3 .. steps - 1) is measured and every method compared with it.
"""
import json
import math

import pytest

pytestmark = pytest.mark.slow



class FakePackTeaCache:
    """Stands in for another pack's caching node (MODEL -> MODEL with a threshold); fails above 0.5."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",),
                             "rel_l1_thresh": ("FLOAT", {"default": 0.4, "min": 0.0, "max": 10.0}),
                             "model_type": (["hunyuan_video", "flux", "wan2.1"],)}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "apply"
    CATEGORY = "testing"

    def apply(self, model, rel_l1_thresh, model_type):
        if model_type != "flux":
            raise ValueError("the bench should pick the Flux option")
        if rel_l1_thresh > 0.5:
            raise RuntimeError("fake peer failure")
        return (model.clone(),)


@pytest.fixture(scope="module")
def results(comfy, tmp_path_factory):
    import nodes

    from cached_sampler_dev.bench import bench
    nodes.NODE_CLASS_MAPPINGS["FakePackTeaCache"] = FakePackTeaCache
    out = tmp_path_factory.mktemp("bench")
    zero = {key: [1 if key == "fixed_cadence" else 0.0] for key in bench.SWEEPS}
    zero["fixed_cadence"] = [1, 2]
    zero["autocalibrate"] = [30.0]
    zero["fakepackteacache"] = [0.0, 1.0]
    config = bench.Config(steps=[5], repeats=[1], taylorseer=[1], sweeps=zero, overhead_repeats=1,
                          overhead_steps=2, overhead_image=64,
                          overhead_model={"hidden_size": 64, "num_heads": 2, "depth": 1, "depth_single_blocks": 1,
                                          "seed": 0},
                          other_packs=False, out=str(out), verbose=False, extend=0)
    try:
        data = bench.run_bench(config, comfy=comfy)
    finally:
        del nodes.NODE_CLASS_MAPPINGS["FakePackTeaCache"]
    return data, out


def test_writes_table_json_and_plot(results):
    data, out = results
    from PIL import Image
    text = (out / "results.md").read_text()
    assert "Best work reduction at a PSNR target, 5 steps" in text
    assert "Overhead when nothing is skipped" in text and "pareto.png" in text
    stored = json.loads((out / "results.json").read_text())
    assert set(stored) >= {"meta", "digits", "overhead", "skipped"}
    assert set(stored["digits"]["5"]) >= {"baseline", "rows", "targets", "versus"}
    with Image.open(out / "pareto.png") as img:
        assert img.width >= 600 and img.height >= 400


def test_caching_off_reproduces_the_uncached_run(results):
    data, out = results
    rows = data["digits"]["5"]["rows"]
    off = [r for r in rows if r["value"] == (1 if r["param"] == "interval" else 0.0)]
    assert len(off) >= 8
    for r in off:
        assert r["error"] is None, r
        assert r["psnr"] == math.inf and r["work"] == 1.0 and r["identical"], r
    stored = json.loads((out / "results.json").read_text())
    assert all(r["psnr"] == "inf" for r in stored["digits"]["5"]["rows"]
               if r["value"] == 0.0 and r["param"] == "threshold")
    skipping = next(r for r in rows if r["key"] == "fixed_cadence" and r["value"] == 2)
    assert skipping["work"] < 0.8 and math.isfinite(skipping["psnr"]) and skipping["speedup"] > 0


def test_peers_are_measured_and_compared(results):
    data, _ = results
    w = data["digits"]["5"]
    rows = w["rows"]
    assert any(r["method"] == "EasyCache (ComfyUI core)" and r["source"] == "ComfyUI core" for r in rows)
    assert any(r["method"].startswith("LazyCache") for r in rows)
    assert "EasyCache (ComfyUI core)" in w["targets"]
    first_pack = next(r["method"] for r in rows if r["source"] == "pack")
    assert {"EasyCache", "LazyCache"} <= set(w["versus"][first_pack])
    assert set(w["targets"][first_pack]) == {"30", "31", "35", "40", "45"}


def test_other_pack_discovered_and_failure_reported(results):
    data, _ = results
    fake = [r for r in data["digits"]["5"]["rows"] if r["node"] == "FakePackTeaCache"]
    assert [r["value"] for r in fake] == [0.0, 1.0]
    assert fake[0]["error"] is None and fake[0]["psnr"] == math.inf
    assert "fake peer failure" in fake[1]["error"]


def test_pack_methods_and_overhead_rows(results):
    data, _ = results
    keys = {r["key"] for r in data["digits"]["5"]["rows"]}
    assert {"fixed_cadence", "fbcache", "adaptive", "easycache", "lazycache"} <= keys
    assert "fbcache+ts1" in keys
    overhead = data["overhead"]["rows"]
    assert overhead and all(r["error"] or r["work"] == 1.0 for r in overhead)
    ok = [r for r in overhead if not r["error"]]
    assert ok and all(r["identical"] and "overhead_percent" in r for r in ok)


def test_sweep_extension_and_targets_without_comfyui():
    import types

    from cached_sampler_dev.bench import bench
    bench_self = types.SimpleNamespace(config=bench.Config())
    fc = bench.Method("fixed_cadence", "Fixed Cadence", "Fixed Cadence", "pack", "N", "interval", [1, 2])
    th = bench.Method("fbcache", "FB", "FB", "pack", "N", "threshold", [0.0, 0.4], param_max=1.0)
    curve = [{"key": "x", "psnr": math.inf, "work": 1.0}, {"key": "x", "psnr": 38.0, "work": 0.5}]
    assert bench.Bench._extension(bench_self, fc, 2, curve) == 3
    assert bench.Bench._extension(bench_self, th, 0.8, curve) == 1.0  # capped at the node's maximum
    assert bench.Bench._extension(bench_self, th, 1.0, curve) is None
    saturated = [{"key": "x", "psnr": 38.0, "work": 0.5}, {"key": "x", "psnr": 37.0, "work": 0.5}]
    assert bench.Bench._extension(bench_self, th, 0.4, saturated) is None
    below = curve[:1] + [{"key": "x", "psnr": 29.0, "work": 0.4}]
    assert bench.Bench._extension(bench_self, th, 0.4, below) is None

    rows = [{"method": "A", "family": "A", "source": "pack", "psnr": math.inf, "work": 1.0},
            {"method": "A", "family": "A", "source": "pack", "psnr": 41.0, "work": 0.5},
            {"method": "A", "family": "A", "source": "pack", "psnr": 33.0, "work": 0.3},
            {"method": "E", "family": "EasyCache", "source": "ComfyUI core", "psnr": math.inf, "work": 1.0},
            {"method": "E", "family": "EasyCache", "source": "ComfyUI core", "psnr": 36.0, "work": 0.6}]
    analysis = bench.analyse(rows)
    assert analysis["targets"]["A"] == {"30": 0.7, "31": 0.7, "35": 0.5, "40": 0.5, "45": 0.0}
    versus = analysis["versus"]["A"]["EasyCache"]
    assert versus == {"better": 12, "equal": 4, "worse": 0, "beats": True}

    # a chain refused at every setting is named apart, not scored as a method that saves nothing
    refused = rows + [{"method": "R", "family": "R", "source": "pack", "error": "prompt failed: refused"}] * 2
    analysis = bench.analyse(refused)
    assert "R" not in analysis["targets"] and analysis["refused"] == {"R": "prompt failed: refused"}
    partly = refused[:-1] + [{"method": "R", "family": "R", "source": "pack", "psnr": 36.0, "work": 0.6}]
    assert bench.analyse(partly)["targets"]["R"]["35"] == 0.4


def test_device_flag_reaches_comfyui_and_the_overhead_definition(results):
    """``--device cuda`` asks ComfyUI for its GPU and defines overhead as wall time; the default stays on the CPU
    with CPU time around the blocks. The tiny run above went through the CPU path end to end."""
    from cached_sampler_dev.bench import bench
    from cached_sampler_dev.bench.bench_report import overhead_table
    assert bench.parse_args([]).device == "cpu" and bench.parse_args(["--device", "cuda"]).device == "cuda"
    data, _ = results
    assert data["meta"]["device"] == data["overhead"]["device"] == "cpu"
    assert "CPU time the method adds around" in "\n".join(overhead_table(data))
    on_gpu = dict(data, overhead=dict(data["overhead"], device="cuda"))
    assert "wall time (CUDA events)" in "\n".join(overhead_table(on_gpu))


def test_fewer_steps_baseline_is_counted_and_compared(results):
    """The uncached sampler at 3 and 4 of the 5 steps: its work counted by the counting node (block
    executions x rows, so exactly N/5 of the full run's), its PSNR against the 5-step output, finite and
    higher with more steps; every method's best setting at each floor compared with it."""
    data, out = results
    w = data["digits"]["5"]
    fewer = {r["steps"]: r for r in w["fewer_steps"]}
    assert sorted(fewer) == [3, 4]
    for n, r in fewer.items():
        assert r["error"] is None, r
        assert r["work"] == pytest.approx(n / 5) and r["work_ratio"] == pytest.approx(5 / n), r
        assert r["blocks"] > 0 and not r["identical"]
    assert math.isfinite(fewer[4]["psnr"]) and math.isfinite(fewer[3]["psnr"])
    assert fewer[4]["psnr"] > fewer[3]["psnr"]
    # the floors: fewer steps' best reduction is that of the fewest steps still at or above the floor
    for t, b in w["fewer_steps_targets"].items():
        ok = [n for n, r in fewer.items() if r["psnr"] >= float(t)]
        assert b == pytest.approx(1 - min(ok) / 5 if ok else 0.0), (t, b)
    # each method against it, at every floor, from its own best reduction
    for method, targets in w["targets"].items():
        for t, a in targets.items():
            v = w["vs_fewer_steps"][method][t]
            assert v["reduction"] == a and v["fewer_steps_reduction"] == w["fewer_steps_targets"][t]
            assert v["beats"] == (a > w["fewer_steps_targets"][t] + 1e-9)
            if v["beats"] and v["ratio"] is not None:
                assert v["ratio"] == pytest.approx(a / w["fewer_steps_targets"][t]) and v["ratio"] > 1
    stored = json.loads((out / "results.json").read_text())
    assert [r["steps"] for r in stored["digits"]["5"]["fewer_steps"]] == [3, 4]
    text = (out / "results.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| fewer steps (uncached) |"))
    assert row.count("|") >= 7
    fc = next(line for line in text.splitlines() if line.startswith("| Fixed Cadence |"))
    assert "fewer steps" in fc


def test_vs_fewer_steps_without_comfyui():
    from cached_sampler_dev.bench import bench
    rows = [{"method": "A", "family": "A", "source": "pack", "psnr": math.inf, "work": 1.0},
            {"method": "A", "family": "A", "source": "pack", "psnr": 41.0, "work": 0.4},
            {"method": "A", "family": "A", "source": "pack", "psnr": 33.0, "work": 0.3}]
    fewer = [{"steps": n, "psnr": db, "work": n / 10} for n, db in ((9, 44.0), (8, 40.0), (7, 36.0), (5, 31.0))]
    a = bench.analyse(rows, fewer)
    assert a["fewer_steps_targets"] == pytest.approx({"30": 0.5, "31": 0.5, "35": 0.3, "40": 0.2, "45": 0.0})
    assert a["fewer_steps_settings"] == {"30": 5, "31": 5, "35": 7, "40": 8, "45": None}
    v = a["vs_fewer_steps"]["A"]
    assert v["30"]["beats"] and v["30"]["ratio"] == pytest.approx(0.7 / 0.5)
    assert v["30"]["work_ratio"] == pytest.approx(0.5 / 0.3)
    assert v["40"]["ratio"] == pytest.approx(0.6 / 0.2)
    assert not v["45"]["beats"] and v["45"]["equal"]  # neither saves anything above 45 dB
    from cached_sampler_dev.bench.bench_report import fmt_vs_fewer
    assert fmt_vs_fewer(v["30"]) == "1.40x fewer steps' reduction"
    # over every level 30..45 dB: A saves more up to 41 dB, less at 42..44 dB (fewer steps' 9 steps keep 44 dB,
    # A has nothing there), the same at 45 dB (neither saves anything)
    assert a["versus_fewer_steps"]["A"] == {"better": 12, "equal": 1, "worse": 3, "beats": False}
    worse = bench.analyse(rows[:1] + [{"method": "A", "family": "A", "source": "pack", "psnr": 32.0, "work": 0.6}],
                          fewer)
    assert fmt_vs_fewer(worse["vs_fewer_steps"]["A"]["30"]) == "below fewer steps"


def test_progress_lines_reach_a_redirected_file_as_they_are_written(monkeypatch):
    """The bench's output usually goes to a file, which Python buffers in blocks: each progress line is flushed,
    so a user following the file sees every setting measured, not minutes of nothing."""
    import inspect
    import io

    from cached_sampler_dev.bench import bench_run
    raw = io.BytesIO()
    monkeypatch.setattr("sys.stdout", io.TextIOWrapper(raw, encoding="utf-8", line_buffering=False))
    bench_run.progress("[28 steps] uncached: 1.00s")
    assert raw.getvalue() == b"[28 steps] uncached: 1.00s\n"
    assert inspect.signature(bench_run.run_bench).parameters["log"].default is bench_run.progress
    assert inspect.signature(bench_run.Bench).parameters["log"].default is bench_run.progress


def test_overhead_width_sets_the_heavy_models_hidden_size_and_heads():
    """``--overhead-hidden`` widens the heavy model with 64-wide heads and leaves its depth alone; a width the
    heads cannot divide is refused before anything runs."""
    from cached_sampler_dev.bench import bench
    default = bench.parse_args([]).overhead_model
    wide = bench.parse_args(["--overhead-hidden", "1024"]).overhead_model
    assert (default["hidden_size"], default["num_heads"]) == (256, 4)
    assert (wide["hidden_size"], wide["num_heads"]) == (1024, 16)
    assert {k: v for k, v in wide.items() if k not in ("hidden_size", "num_heads")} == {
        k: v for k, v in default.items() if k not in ("hidden_size", "num_heads")}
    with pytest.raises(SystemExit):
        bench.parse_args(["--overhead-hidden", "100"])


def test_guidance_cache_is_chained_after_the_growing_cadence_and_its_forecast(results):
    """The growing cadence + TaylorSeer o1 + Guidance Cache curve: at every setting its Guidance Cache (last in
    the chain) leaves negative branches out, so it does less work than the same setting without it, on the
    rows the model computed; and it is not on the overhead table, since it skips at every setting."""
    data, _ = results
    rows = data["digits"]["5"]["rows"]
    with_guidance = {json.dumps(r["value"], sort_keys=True): r for r in rows
                     if r["key"] == "fixed_cadence_growing+ts1+guidance"}
    without = {json.dumps(r["value"], sort_keys=True): r for r in rows if r["key"] == "fixed_cadence_growing+ts1"}
    assert with_guidance and set(with_guidance) == set(without)
    assert all(r["error"] is None and math.isfinite(r["psnr"]) for r in with_guidance.values())
    less = [v for v, r in with_guidance.items() if r["work"] < without[v]["work"]]
    assert less and all(with_guidance[v]["work"] <= without[v]["work"] for v in with_guidance)
    assert "Guidance Cache 2 from 0.6" in next(iter(with_guidance.values()))["method"]
    assert not any(r["key"].endswith("+guidance") for r in data["overhead"]["rows"])


def test_the_guidance_cache_takes_the_estimators_output():
    from cached_sampler_dev.bench import bench_run
    from cached_sampler_dev.bench.bench_discover import GUIDANCE, TAYLORSEER, Config, Method
    wl = bench_run.Workload("w", {"m": {}}, ["m", 0], ["m", 1], ["m", 2], ["m", 3])
    m = Method("fixed_cadence_growing+ts1+guidance", "L", "L", "pack", "CachedSamplerFixedCadence", "schedule",
               [{"interval": 2, "growth": 0.5}], taylorseer=1, guidance={"interval": 2, "start_percent": 0.6})
    prompt = bench_run.build_prompt(Config(), wl, m, m.values[0], 28, "k")
    assert prompt["m_taylorseer"]["class_type"] == TAYLORSEER
    assert prompt["m_guidance"] == {"class_type": GUIDANCE, "inputs": {"interval": 2, "start_percent": 0.6,
                                                                       "interceptors": ["m_taylorseer", 0]}}
    assert prompt["sampler"]["inputs"]["interceptors"] == ["m_guidance", 0]
    assert prompt["m_config"]["inputs"] == {"interval": 2, "growth": 0.5}
