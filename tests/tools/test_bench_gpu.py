"""tools/bench/bench_gpu.py runs end to end on a CPU at toy sizes (the GPU bench is the same code at full size)."""
from __future__ import annotations




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
        assert len(overhead) == 8 and len(schedules) == 5
        for label, row in overhead.items():
            assert row["max_diff"] == 0 and row["work_saved"] == 0, f"{label} changed the output or skipped"
            assert f"| {label} | " in text
        for label, row in schedules.items():
            assert row["work_saved"] > 0 and sum(row["cache"].values()) > 0, label
            assert row["speedup"] > 0 and f"| {label} | " in text
        assert schedules["DBCache F1B0, 2 cached in a row + TaylorSeer o1, cache_on_cpu"]["cache"].keys() == {"cpu"}
