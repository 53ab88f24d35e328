"""tools/bench/bench.py over several seeds (``--seeds``) and with fewer steps of ComfyUI's multistep samplers.

Checks that each reduction at a PSNR target over seeds is read from each seed's own rows (the median and the
worst, the smallest, of those), that the fewer-steps baseline is measured with every sampler asked for, and that
``--seeds 1`` (the default) gives the figures and report columns of a single seed as before."""
import json
import math
import statistics

import pytest

from cached_sampler_dev.bench import bench
from cached_sampler_dev.bench.bench_report import (TARGETS, analyse, best_reduction, fewer_steps_name,
                                                   over_seeds)

STEPS = 5
SAMPLERS = ["dpmpp_2m", "uni_pc", "deis"]


def _row(psnr, work, method="A"):
    return {"method": method, "family": method, "source": "pack", "psnr": psnr, "work": work}


def test_over_seeds_is_read_from_each_seeds_rows_without_comfyui():
    per_seed = [
        {"seed": 0, "rows": [_row(math.inf, 1.0), _row(41.0, 0.4), _row(33.0, 0.3)],
         "fewer_steps": [{"steps": 9, "psnr": 44.0, "work": 0.9}, {"steps": 5, "psnr": 31.0, "work": 0.5}],
         "fewer_steps_samplers": {"dpmpp_2m": [{"steps": 7, "psnr": 36.0, "work": 0.7}]}},
        {"seed": 1, "rows": [_row(math.inf, 1.0), _row(36.0, 0.4), _row(30.5, 0.3)],
         "fewer_steps": [{"steps": 9, "psnr": 42.0, "work": 0.9}, {"steps": 5, "psnr": 29.0, "work": 0.5}],
         "fewer_steps_samplers": {"dpmpp_2m": [{"steps": 7, "psnr": 37.0, "work": 0.7}]}},
        {"seed": 2, "rows": [_row(math.inf, 1.0), _row(45.5, 0.4), _row(35.0, 0.3)],
         "fewer_steps": [{"steps": 9, "psnr": 46.0, "work": 0.9}, {"steps": 5, "psnr": 35.0, "work": 0.5}],
         "fewer_steps_samplers": {"dpmpp_2m": [{"steps": 7, "psnr": 34.0, "work": 0.7}]}},
    ]
    spread = over_seeds(per_seed)
    assert spread["seeds"] == [0, 1, 2]
    a = spread["targets"]["A"]
    assert a["30"]["values"] == pytest.approx([0.7, 0.7, 0.7])
    assert a["35"]["values"] == pytest.approx([0.6, 0.6, 0.7])
    assert a["35"]["median"] == pytest.approx(0.6) and a["35"]["worst"] == pytest.approx(0.6)
    assert a["40"]["values"] == pytest.approx([0.6, 0.0, 0.6])
    assert a["40"]["median"] == pytest.approx(0.6) and a["40"]["worst"] == 0.0  # the worst seed, not the median
    fewer = spread["targets"][fewer_steps_name()]
    assert fewer["30"]["values"] == pytest.approx([0.5, 0.1, 0.5]) and fewer["30"]["worst"] == pytest.approx(0.1)
    dpm = spread["targets"][fewer_steps_name("dpmpp_2m")]
    assert dpm["35"]["values"] == pytest.approx([0.3, 0.3, 0.0]) and dpm["35"]["worst"] == 0.0
    for by_target in spread["targets"].values():  # every figure is the median and the minimum of its seeds'
        for v in by_target.values():
            assert v["median"] == statistics.median(v["values"]) and v["worst"] == min(v["values"])
    single = analyse(per_seed[0]["rows"], per_seed[0]["fewer_steps"], per_seed[0]["fewer_steps_samplers"])
    assert single["fewer_steps_sampler_targets"]["dpmpp_2m"] == pytest.approx(
        {"30": 0.3, "31": 0.3, "35": 0.3, "40": 0.0, "45": 0.0})
    assert single["fewer_steps_sampler_settings"]["dpmpp_2m"]["35"] == 7
    assert "over_seeds" not in single


def _config(out, *extra):
    config = bench.parse_args(["--steps", str(STEPS), "--taylorseer", "", "--extend", "0", "--only", "fixed_cadence",
                               "--sweep", "fixed_cadence=1,2", "--no-spectrum", "--no-other-packs", "--no-overhead",
                               "--no-plot", "--out", str(out), *extra])
    config.verbose = False
    return config


@pytest.fixture(scope="module")
def runs(comfy, tmp_path_factory):
    out1, out2 = tmp_path_factory.mktemp("bench_one_seed"), tmp_path_factory.mktemp("bench_two_seeds")
    one = bench.run_bench(_config(out1), comfy=comfy)
    two = bench.run_bench(_config(out2, "--seeds", "2"), comfy=comfy)
    return one, out1, two, out2


@pytest.mark.slow
def test_two_seeds_read_the_median_and_the_worst_of_each_seeds_rows(runs):
    _, _, two, out = runs
    assert two["meta"]["seeds"] == [0, 1]
    w = two["digits"][str(STEPS)]
    assert [m["seed"] for m in w["per_seed"]] == [0, 1]
    first, second = w["per_seed"]
    assert [r["psnr"] for r in first["rows"]] == [r["psnr"] for r in w["rows"]]  # the table's seed is the first
    assert any(a["psnr"] != b["psnr"] for a, b in zip(first["rows"], second["rows"]) if math.isfinite(a["psnr"]))
    spread = w["over_seeds"]
    assert spread["seeds"] == [0, 1]
    for method, by_target in spread["targets"].items():
        for t in TARGETS:
            per_seed_rows = [[r for r in m["rows"] if r["method"] == method] or
                             next(rows for s, rows in {None: m["fewer_steps"], **m["fewer_steps_samplers"]}.items()
                                  if fewer_steps_name(s) == method) for m in w["per_seed"]]
            expected = [best_reduction(rows, t) for rows in per_seed_rows]
            v = by_target[f"{t:g}"]
            assert v["values"] == pytest.approx(expected)
            assert v["worst"] == pytest.approx(min(expected)) and v["median"] == pytest.approx(
                statistics.median(expected))
    assert {fewer_steps_name(s) for s in SAMPLERS} | {fewer_steps_name()} <= set(spread["targets"])
    text = (out / "results.md").read_text()
    assert "### Over seeds 0, 1, 5 steps" in text
    stored = json.loads((out / "results.json").read_text())
    assert len(stored["digits"][str(STEPS)]["per_seed"]) == 2


@pytest.mark.slow
def test_fewer_steps_is_measured_with_each_sampler(runs):
    one, out, _, _ = runs
    w = one["digits"][str(STEPS)]
    assert list(w["fewer_steps_samplers"]) == SAMPLERS
    euler = {r["steps"]: r for r in w["fewer_steps"]}
    for sampler in SAMPLERS:
        rows = {r["steps"]: r for r in w["fewer_steps_samplers"][sampler]}
        assert sorted(rows) == [3, 4]
        for n, r in rows.items():
            assert r["error"] is None and r["sampler"] == sampler and r["method"] == fewer_steps_name(sampler)
            assert r["work"] == pytest.approx(n / STEPS)  # one model evaluation a step, as euler
            assert math.isfinite(r["psnr"])
        assert [rows[n]["psnr"] for n in (3, 4)] != [euler[n]["psnr"] for n in (3, 4)]  # another sampler ran
        for t in TARGETS:
            ok = [n for n, r in rows.items() if r["psnr"] >= t]
            assert w["fewer_steps_sampler_targets"][sampler][f"{t:g}"] == pytest.approx(
                1 - min(ok) / STEPS if ok else 0.0)
    lines = (out / "results.md").read_text().splitlines()
    for sampler in SAMPLERS:
        row = next(line for line in lines if line.startswith(f"| {fewer_steps_name(sampler)} |"))
        assert row.count("|") == next(line for line in lines if line.startswith("| fewer steps (uncached) |")).count("|")


@pytest.mark.slow
def test_one_seed_gives_the_single_seed_figures(runs):
    one, out1, two, out2 = runs
    w1, w2 = one["digits"][str(STEPS)], two["digits"][str(STEPS)]
    assert one["meta"]["seed"] == 0 and one["meta"]["seeds"] == [0]
    assert "per_seed" not in w1 and "over_seeds" not in w1
    for key in ("targets", "target_settings", "fewer_steps_targets", "fewer_steps_settings", "vs_fewer_steps",
                "fewer_steps_sampler_targets"):
        assert w1[key] == w2[key], key
    text1, text2 = (out1 / "results.md").read_text(), (out2 / "results.md").read_text()
    assert "Over seeds" not in text1

    def targets_table(text):
        lines = text.splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("| Method |"))
        end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
        return lines[start:end]
    assert targets_table(text1) == targets_table(text2)


@pytest.mark.slow
def test_runs_at_other_seeds_merge_into_the_run_at_all_of_them(runs, comfy, tmp_path):
    """Seed 0 and seed 1 measured apart (on two cores, say) and joined with --merge read as seeds 0 and 1
    measured in one run: the same rows at each seed, the same median and worst."""
    one, out1, two, _ = runs
    out_seed1 = tmp_path / "seed1"
    bench.run_bench(_config(out_seed1, "--seed", "1"), comfy=comfy)
    merged_out = tmp_path / "merged"
    # given in either order: the run at the lower seed is the first
    assert bench.main(["--merge", str(out_seed1 / "results.json"), str(out1 / "results.json"),
                       "--out", str(merged_out), "--no-plot"]) == 0
    merged = bench.load_results(merged_out / "results.json")
    assert merged["meta"]["seeds"] == [0, 1] and merged["meta"]["seed"] == 0
    w, together = merged["digits"][str(STEPS)], two["digits"][str(STEPS)]
    assert [m["seed"] for m in w["per_seed"]] == [0, 1]
    for apart, joint in zip(w["per_seed"], together["per_seed"]):
        assert [r["psnr"] for r in apart["rows"]] == pytest.approx([r["psnr"] for r in joint["rows"]])
        assert [r["work"] for r in apart["rows"]] == pytest.approx([r["work"] for r in joint["rows"]])
    assert [r["psnr"] for r in w["rows"]] == [r["psnr"] for r in one["digits"][str(STEPS)]["rows"]]
    for method, by_target in together["over_seeds"]["targets"].items():
        for t, v in by_target.items():
            got = w["over_seeds"]["targets"][method][t]
            assert got["values"] == pytest.approx(v["values"]), (method, t)
            assert (got["median"], got["worst"]) == pytest.approx((v["median"], v["worst"]))
    assert "### Over seeds 0, 1, 5 steps" in (merged_out / "results.md").read_text()


def test_merge_refuses_runs_that_measured_different_things(tmp_path):
    def run(seed, **meta):
        return {"meta": {"model": "digits", "steps": [STEPS], "cfg": 3.0, "sampler": "euler", "scheduler": "simple",
                         "seed": seed, "seeds": [seed], "curves": ["A"], "command": "bench", "seconds": 1.0, **meta},
                "digits": {str(STEPS): {"rows": [_row(40.0, 0.5)], "fewer_steps": [], "fewer_steps_samplers": {}}}}

    paths = {}
    for name, results in {"a": run(0), "b": run(1, cfg=5.0), "c": run(0), "d": run(1, curves=["A", "B"])}.items():
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(results))
    for pair in (("a", "b"), ("a", "c"), ("a", "d")):  # another cfg, the same seed twice, other methods swept
        out = tmp_path / ("out_" + "".join(pair))
        assert bench.main(["--merge", *(str(paths[n]) for n in pair), "--out", str(out), "--no-plot"]) == 2
        assert not out.exists()
