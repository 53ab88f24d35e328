"""The layout of the bench's results (results.json), read by both the report (bench_report) and the plot
(bench_plot), so that neither imports the other's module for it."""
from __future__ import annotations


def per_steps(results: dict) -> dict:
    """The measured model's results by step count (stored under the model's name: "digits" or "video")."""
    return results[results["meta"].get("model", "digits")]


# What must agree for runs at different seeds to be read as one run: the workload, the sampling and what was swept.
SAME_IN_MERGED_RUNS = ("model", "steps", "cfg", "sampler", "scheduler", "classes", "digits", "taylorseer_orders",
                       "curves", "comfyui", "device")


def merge_seed_runs(runs: list[dict]) -> dict:
    """Runs of one bench command at different seeds (``--seed S --seeds N`` each, for instance on two cores or
    machines at once) as the one run at all their seeds: each step count's ``per_seed`` measurements joined in seed
    order, the first seed's rows and fewer-steps rows as the run's own. The caller analyses it again
    (bench_report.analyse_steps). Refuses runs that measured different things, or the same seed twice."""
    if len(runs) < 2:
        raise ValueError("merging needs at least two runs")
    runs = sorted(runs, key=lambda r: r["meta"]["seeds"][0] if r["meta"].get("seeds") else r["meta"]["seed"])
    first = runs[0]["meta"]
    for run in runs[1:]:
        differ = [k for k in SAME_IN_MERGED_RUNS if run["meta"].get(k) != first.get(k)]
        if differ:
            raise ValueError(f"these runs measured different things ({', '.join(differ)} differ); only runs of one "
                             "command at other seeds can be merged")
    seeds = [s for run in runs for s in (run["meta"].get("seeds") or [run["meta"]["seed"]])]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"a seed was measured twice: {seeds}")
    merged = {**runs[0], "meta": {**first, "seeds": seeds, "seed": seeds[0],
                                  "command": " and ".join(dict.fromkeys(r["meta"]["command"] for r in runs)),
                                  "seconds": sum(r["meta"].get("seconds", 0.0) for r in runs),
                                  "merged_from": [{k: r["meta"].get(k) for k in ("command", "seeds", "pack_commit",
                                                                                   "date", "seconds")}
                                                  for r in runs]}}
    by_steps = {}
    for steps, w in per_steps(runs[0]).items():
        joined = []
        for run in runs:
            other = per_steps(run).get(steps)
            if other is None:
                raise ValueError(f"a run has no measurements at {steps} steps")
            joined += other.get("per_seed") or [{"seed": run["meta"]["seed"],
                                                 **{k: other.get(k) for k in ("rows", "fewer_steps",
                                                                              "fewer_steps_samplers")}}]
        by_steps[steps] = {**w, "per_seed": joined}
    merged[first.get("model", "digits")] = by_steps
    return merged
