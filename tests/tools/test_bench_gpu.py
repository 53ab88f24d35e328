"""tools/bench/bench_gpu.py runs end to end on a CPU at toy sizes (the GPU bench is the same code at full size)."""
from __future__ import annotations

from cached_sampler_dev.support.methods import NAMES


def test_the_gpu_bench_runs_on_a_cpu_at_tiny_size(comfy, tmp_path):
    from cached_sampler_dev.bench import bench_gpu
    out = tmp_path / "results-gpu.md"
    args = bench_gpu.parse(["--device", "cpu", "--size", "tiny", "--steps", "4", "--repeats", "1", "--out", str(out)])
    adapter, ic = bench_gpu.start_comfy(args.device)
    results = [bench_gpu.bench_model(adapter, ic, name, args, log=lambda line: None) for name in args.models]
    text = bench_gpu.write(results, args, out)
    assert out.read_text() == text
    for result in results:
        rows = result["rows"]
        overhead = {k: r for k, r in rows.items() if r["group"] == "overhead"}
        schedules = {k: r for k, r in rows.items() if r["group"] == "schedule"}
        assert list(overhead) == NAMES and len(schedules) == 5, "every method's examples, once each"
        for label, row in overhead.items():
            assert row["max_diff"] == 0 and row["work_saved"] == 0, f"{label} changed the output or skipped"
            assert f"| {label} | " in text
        for label, row in schedules.items():
            assert row["work_saved"] > 0 and sum(row["cache"].values()) > 0, label
            assert row["speedup"] > 0 and f"| {label} | " in text
        assert schedules["DBCache F1B0, 2 cached in a row + TaylorSeer o1, cache_on_cpu"]["cache"].keys() == {"cpu"}


def test_the_gpu_bench_measures_caching_on_a_compiled_model(comfy, tmp_path):
    """``--compile``: the model compiled as TorchCompileModel compiles it, the pack's block caches on it compiled block
    by block; every setting computes what it computes uncompiled (the same steps, the same work), settings that skip
    nothing leave the output as it is, and the uncompiled uncached run is timed beside them."""
    from cached_sampler_dev.bench import bench_gpu
    common = ["--device", "cpu", "--size", "tiny", "--models", "flux", "--steps", "4", "--repeats", "1"]
    plain_args = bench_gpu.parse(common + ["--out", str(tmp_path / "plain.md")])
    compiled_args = bench_gpu.parse(common + ["--compile", "eager", "--out", str(tmp_path / "compiled.md")])
    adapter, ic = bench_gpu.start_comfy("cpu")
    plain = bench_gpu.bench_model(adapter, ic, "flux", plain_args, log=lambda line: None)
    compiled = bench_gpu.bench_model(adapter, ic, "flux", compiled_args, log=lambda line: None)
    text = bench_gpu.write([compiled], compiled_args, tmp_path / "compiled.md")
    rows = compiled["rows"]
    assert rows[bench_gpu.NOT_COMPILED]["group"] == "baseline" and compiled["plain_seconds"] > 0
    assert "Not compiled:" in text and "against not compiled" in text
    for label, row in plain["rows"].items():
        if row["group"] == "overhead":
            assert rows[label]["max_diff"] == 0 and rows[label]["work_saved"] == 0, label
        if row["group"] == "schedule":
            assert (rows[label]["computed"], rows[label]["work_saved"]) == (row["computed"], row["work_saved"]), label
            assert rows[label]["speedup_plain"] > 0
