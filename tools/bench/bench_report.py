"""The bench's analysis (best work reduction at each PSNR target, comparison with ComfyUI's own caching
nodes) and its report: results.md, results.json and the Pareto plot."""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from .bench_results import per_steps

TARGETS = (30.0, 31.0, 35.0, 40.0, 45.0)
VERSUS_LEVELS = tuple(float(v) for v in range(30, 46))
FEWER_STEPS = "fewer steps (uncached)"  # the baseline: the uncached sampler at fewer steps


def fewer_steps_name(sampler: str | None = None) -> str:
    """The fewer-steps baseline's name: with the bench's own sampler, or with another sampler of ComfyUI's."""
    return FEWER_STEPS if sampler is None else f"fewer steps (uncached, {sampler})"


# ------------------------------------------------------------------------------- analysis ----

def output_names(results: dict) -> tuple[str, str, str]:
    """File names of the report, the data and the plot: results.md/json and pareto.png for the digits model,
    with the model's name appended for another one (results_video.md ...)."""
    model = results["meta"].get("model", "digits")
    tail = "" if model == "digits" else "_" + model
    return f"results{tail}.md", f"results{tail}.json", f"pareto{tail}.png"


def _workload_text(results: dict) -> str:
    meta = results["meta"]
    if meta.get("model", "digits") == "photos":
        return (f"Workload: the pack's tiny Flux trained on crops of two photographs (Tiny Photos Model node), one "
                f"48x48 picture per class (batch {len(meta['classes'])}), {meta['sampler']}/{meta['scheduler']}, "
                f"cfg {meta['cfg']:g}, seed {meta['seed']}, decoded by its fixed lossy decoder. ")
    if meta.get("model", "digits") == "video":
        return (f"Workload: the pack's tiny Wan 2.1 video model trained on moving shapes (Tiny Video Model node), "
                f"one 8-frame 32x32 video per class (batch {len(meta['classes'])}), {meta['sampler']}/"
                f"{meta['scheduler']}, cfg {meta['cfg']:g}, seed {meta['seed']}, decoded by its fixed lossy "
                f"decoder. ")
    return (f"Workload: the pack's tiny Flux trained on 8x8 digits (Tiny Digits Model node), one image per class "
            f"(batch {len(meta['digits'])}), {meta['sampler']}/{meta['scheduler']}, cfg {meta['cfg']:g}, seed "
            f"{meta['seed']}. ")


def _accuracy_text(results: dict) -> str:
    if results["meta"].get("model", "digits") == "photos":
        return ("the decoded images against the uncached run; k-NN column = share of pictures whose colour and "
                "texture statistics are nearest to the prompted class's training crops (uncached: ")
    if results["meta"].get("model", "digits") == "video":
        return ("the decoded frames against the uncached run (every frame of every video); k-NN column = share of "
                "videos whose colour, shape and direction of motion, recovered from the decoded frames, are the "
                "prompted class's (uncached: ")
    return ("the decoded images against the uncached run; k-NN = share of digits a k-NN on sklearn's digits "
            "recognises as the prompted class (uncached: ")

def best_point(rows: list[dict], level: float) -> tuple[float, dict | None]:
    """The largest work reduction among ``rows`` with PSNR >= level, and its row (0 and None when only the
    uncached run qualifies: every method reproduces it with caching switched off)."""
    best, where = 0.0, None
    for r in rows:
        if r.get("error") or r.get("psnr") is None or r.get("work") is None:
            continue
        if r["psnr"] >= level and 1.0 - r["work"] > best + 1e-12:
            best, where = 1.0 - r["work"], r
    return best, where


def best_reduction(rows: list[dict], level: float) -> float:
    return best_point(rows, level)[0]


def analyse_steps(w: dict) -> dict:
    """The whole analysis of one step count's measurements ``w`` (rows, fewer_steps, fewer_steps_samplers and,
    over several seeds, per_seed): what :func:`analyse` says of the first seed's, and the spread over seeds."""
    out = analyse(w["rows"], w.get("fewer_steps"), w.get("fewer_steps_samplers"))
    if w.get("per_seed"):
        out["over_seeds"] = over_seeds(w["per_seed"])
    return out


def over_seeds(per_seed: list[dict]) -> dict:
    """Each method's and each fewer-steps baseline's best work reduction at each PSNR target, read at every seed
    from that seed's rows: the values in seed order, their median and their worst (the smallest)."""
    values: dict[str, dict[str, list]] = {}
    for measured in per_seed:
        curves = {}
        for r in measured["rows"]:
            curves.setdefault(r["method"], []).append(r)
        for sampler, rows in {None: measured.get("fewer_steps") or [],
                              **(measured.get("fewer_steps_samplers") or {})}.items():
            if rows:
                curves[fewer_steps_name(sampler)] = rows
        for name, rows in curves.items():
            if all(r.get("error") for r in rows):
                continue
            for t in TARGETS:
                values.setdefault(name, {}).setdefault(f"{t:g}", []).append(best_reduction(rows, t))
    # a curve missing at a seed (refused there) is read over the seeds that measured it
    return {"seeds": [m["seed"] for m in per_seed],
            "targets": {name: {t: {"values": v, "median": statistics.median(v), "worst": min(v)}
                               for t, v in by_target.items()} for name, by_target in values.items()}}


def analyse(rows: list[dict], fewer: list[dict] | None = None, fewer_samplers: dict | None = None) -> dict:
    """Per method: the best work reduction at each PSNR target (and its setting), how it compares with
    ComfyUI's own nodes over every level, and, given the fewer-steps rows, with simply running fewer steps
    (and with fewer steps of each other sampler in ``fewer_samplers``: sampler -> rows)."""
    by_method: dict[str, list] = {}
    for r in rows:
        by_method.setdefault(r["method"], []).append(r)
    # a chain refused at every setting (an estimator after a decider that forecasts itself) measured nothing:
    # named apart instead of a row of 0%
    refused = {m: rs[0]["error"] for m, rs in by_method.items() if all(r.get("error") for r in rs)}
    by_method = {m: rs for m, rs in by_method.items() if m not in refused}
    out = _analyse(by_method)
    out["refused"] = refused
    if fewer:
        out.update(analyse_fewer_steps(by_method, fewer))
    if fewer_samplers:
        out["fewer_steps_sampler_targets"] = {
            sampler: {f"{t:g}": best_point(rs, t)[0] for t in TARGETS} for sampler, rs in fewer_samplers.items()}
        out["fewer_steps_sampler_settings"] = {
            sampler: {f"{t:g}": (best_point(rs, t)[1] or {}).get("steps") for t in TARGETS}
            for sampler, rs in fewer_samplers.items()}
    return out


def analyse_fewer_steps(by_method: dict[str, list], fewer: list[dict]) -> dict:
    """The fewer-steps baseline at each PSNR target (its best reduction and step count), and for each method's
    best setting at that target by how much it beats it: ``ratio`` = method's work reduction / fewer steps'
    (None where fewer steps saves nothing), ``work_ratio`` = fewer steps' work / the method's (how many times
    less block work the method does at the same floor), ``beats`` = it saves strictly more."""
    fs_targets, fs_steps, vs = {}, {}, {}
    for t in TARGETS:
        b, where = best_point(fewer, t)
        fs_targets[f"{t:g}"] = b
        fs_steps[f"{t:g}"] = (where or {}).get("steps")
    for m, rs in by_method.items():
        vs[m] = {}
        for t in TARGETS:
            a, b = best_reduction(rs, t), fs_targets[f"{t:g}"]
            vs[m][f"{t:g}"] = {
                "reduction": a, "fewer_steps_reduction": b,
                "ratio": a / b if b > 1e-12 else None,
                "work_ratio": (1.0 - b) / (1.0 - a) if a < 1.0 - 1e-12 else None,
                "beats": a > b + 1e-9, "equal": abs(a - b) <= 1e-9}
    versus = {}
    core = {m: rs for m, rs in by_method.items() if rs[0]["source"] == "ComfyUI core"}
    for p, prs in core.items():
        versus[rows_family(prs)] = _versus(fewer, prs)
    over_levels = {m: _versus(rs, fewer) for m, rs in by_method.items()}  # like vs EasyCache, every level
    return {"fewer_steps_targets": fs_targets, "fewer_steps_settings": fs_steps, "vs_fewer_steps": vs,
            "fewer_steps_versus": versus, "versus_fewer_steps": over_levels}


def _versus(rs: list[dict], prs: list[dict]) -> dict:
    better = equal = worse = 0
    for level in VERSUS_LEVELS:
        a, b = best_reduction(rs, level), best_reduction(prs, level)
        if a > b + 1e-9:
            better += 1
        elif a < b - 1e-9:
            worse += 1
        else:
            equal += 1
    return {"better": better, "equal": equal, "worse": worse, "beats": worse == 0 and better > 0}


def _analyse(by_method: dict[str, list]) -> dict:
    targets = {m: {f"{t:g}": best_reduction(rs, t) for t in TARGETS} for m, rs in by_method.items()}
    settings = {m: {f"{t:g}": (best_point(rs, t)[1] or {}).get("value") for t in TARGETS}
                for m, rs in by_method.items()}
    peers = {m: rs for m, rs in by_method.items() if rs[0]["source"] != "pack"}
    core = {m: rs for m, rs in peers.items() if rs[0]["source"] == "ComfyUI core"}
    versus = {}
    for m, rs in by_method.items():
        if m in core:
            continue
        versus[m] = {}
        for p, prs in core.items():
            versus[m][rows_family(prs)] = _versus(rs, prs)
    return {"targets": targets, "target_settings": settings, "versus": versus}


def rows_family(rows: list[dict]) -> str:
    return rows[0]["family"]


# -------------------------------------------------------------------------------- report ----

def _rounds(meta: dict) -> list[tuple[int, int]]:
    reps = meta["repeats"]
    return [(s, reps[min(i, len(reps) - 1)]) for i, s in enumerate(meta["steps"])]


def fmt_pct(x) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def fmt_db(x) -> str:
    if x is None:
        return "-"
    return "inf (identical)" if math.isinf(x) else f"{x:.2f}"


def markdown(results: dict) -> str:
    meta = results["meta"]
    lines = [
        "# Cached Sampler bench",
        "",
        f"Measured with `{meta['command']}` on {meta['platform']}, torch {meta['torch']} "
        f"({meta['threads']} thread), ComfyUI {meta['comfyui']}"
        + (f", pack at {meta['pack_commit']}" if meta.get("pack_commit") else "")
        + f"; total {meta['seconds'] / 60:.1f} min.",
        "",
        _workload_text(results) + "**Work** = transformer-block executions times the batch rows they ran on, counted "
        f"on the model, relative to the uncached run (whole-forward skips run no block; a block run on the "
        f"positive rows only, as the Guidance Cache does, counts half). **Speedup** = wall-clock sampling time of the uncached "
        f"run / this run (baseline and method runs alternated, each method run against the mean of the baseline "
        f"runs around it; median over " + ", ".join(f"{r} at {s} steps" for s, r in _rounds(meta)) + " rounds). "
        "PSNR/SSIM of " + _accuracy_text(results)
        + ", ".join(f"{s} steps {fmt_pct(w['baseline']['knn_accuracy'])}" for s, w in per_steps(results).items())
        + ").",
        "",
    ]
    for steps, w in per_steps(results).items():
        lines += [f"## Best work reduction at a PSNR target, {steps} steps", "",
                  "Largest share of block work saved by any swept setting whose output stays at or above the "
                  "PSNR (dB). *vs EasyCache / LazyCache*: over every PSNR level 30, 31, ..., 45 dB, at how many "
                  "levels the method saves more / the same / less than ComfyUI's node; **beats** = never less "
                  "and more at least once."
                  + (f" **{FEWER_STEPS}** (first row) = the uncached sampler (same sampler, scheduler, seed) at "
                     f"fewer steps, {_fewer_span(w)}, its PSNR against the {steps}-step output: the baseline every "
                     "method must beat. After each method's cell, its reduction against fewer steps' at the same "
                     "floor (*1.50x fewer steps' reduction* = it saves 1.5 times the share of work; *below* = "
                     "fewer steps saves more there); *vs fewer steps* = over the 16 levels, like the columns before it." if w.get("fewer_steps_targets") is not None else ""), ""]
        lines += targets_table(results, steps)
        lines.append("")
        if w.get("over_seeds"):
            seeds = w["over_seeds"]["seeds"]
            lines += [f"### Over seeds {', '.join(map(str, seeds))}, {steps} steps", "",
                      "The best work reduction at each PSNR target read at every seed from that seed's own sweep: "
                      "*median / worst* over the seeds, then each seed's value in order (the table above is seed "
                      f"{seeds[0]}'s).", ""]
            lines += over_seeds_table(w["over_seeds"])
            lines.append("")
    lines += ["## Overhead when nothing is skipped", ""]
    lines += overhead_table(results)
    lines.append("")
    lines += tiny_overhead_table(results)
    for steps, w in per_steps(results).items():
        b = w["baseline"]
        lines += [f"## Full sweep, {steps} steps", "",
                  f"Uncached: {b['seconds']:.2f} s per run, {b['forwards']} forwards, {b['blocks']} block executions, "
                  f"k-NN {fmt_pct(b['knn_accuracy'])}.", ""]
        lines += sweep_table(w["rows"])
        lines.append("")
        if w.get("fewer_steps"):
            lines += [f"### {FEWER_STEPS}, against the {steps}-step output", "",
                      "| Steps | Work | Work ratio (full / this) | PSNR dB | SSIM | k-NN |", "|---|---|---|---|---|---|"]
            for r in w["fewer_steps"]:
                if r.get("error"):
                    lines.append(f"| {r['steps']} | error: {r['error']} | | | | |")
                else:
                    lines.append(f"| {r['steps']} | {fmt_pct(r['work'])} | {r['work_ratio']:.2f} | "
                                 f"{fmt_db(r['psnr'])} | {r['ssim']:.4f} | {fmt_pct(r['knn_accuracy'])} |")
            lines.append("")
    if results.get("skipped"):
        lines += ["## Found but not benchmarked", ""]
        lines += [f"* `{s['node']}`: {s['why']}" for s in results["skipped"]]
        lines.append("")
    return "\n".join(lines)


def _fewer_span(w: dict) -> str:
    done = [r["steps"] for r in w.get("fewer_steps") or []]
    return f"{min(done)} to {max(done)} steps" if done else "no step counts"


def targets_table(results: dict, steps: str) -> list[str]:
    w = per_steps(results)[steps]
    targets, versus = w["targets"], w["versus"]
    peers = sorted({p for v in versus.values() for p in v})
    over = w.get("versus_fewer_steps")
    head = ("| Method | " + " | ".join(f">= {t:g} dB" for t in TARGETS) + "".join(f" | vs {p}" for p in peers)
            + (" | vs fewer steps" if over is not None else "") + " |")
    lines = [head, "|" + "---|" * (1 + len(TARGETS) + len(peers) + (over is not None))]
    settings = w.get("target_settings", {})
    fs = w.get("fewer_steps_targets")
    if fs is not None:
        fs_steps = w.get("fewer_steps_settings", {})
        cells = [fmt_pct(fs[f"{x:g}"]) + (f" ({fs_steps[f'{x:g}']} steps)" if fs_steps.get(f"{x:g}") else "")
                 for x in TARGETS]
        cells += [_fmt_versus(w.get("fewer_steps_versus", {}).get(p)) for p in peers]
        if over is not None:
            cells.append("-")
        lines.append(f"| {FEWER_STEPS} | " + " | ".join(cells) + " |")
    for sampler, by_target in (w.get("fewer_steps_sampler_targets") or {}).items():
        where = w.get("fewer_steps_sampler_settings", {}).get(sampler, {})
        cells = [fmt_pct(by_target[f"{x:g}"]) + (f" ({where[f'{x:g}']} steps)" if where.get(f"{x:g}") else "")
                 for x in TARGETS]
        cells += ["-"] * (len(peers) + (over is not None))
        lines.append(f"| {fewer_steps_name(sampler)} | " + " | ".join(cells) + " |")
    vs_fs = w.get("vs_fewer_steps", {})
    for method, t in targets.items():
        where = settings.get(method, {})
        cells = [fmt_pct(t[f"{x:g}"]) + (f" ({fmt_setting(where[f'{x:g}'])})" if where.get(f"{x:g}") is not None
                                         else "")
                 + (f"; {fmt_vs_fewer(vs_fs[method][f'{x:g}'])}" if method in vs_fs else "")
                 for x in TARGETS]
        for p in peers:
            cells.append(_fmt_versus(versus.get(method, {}).get(p)))
        if over is not None:
            cells.append(_fmt_versus(over.get(method)))
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    if w.get("refused"):
        lines += ["", "Not in the table, every setting having failed: "
                  + "; ".join(f"{m} ({error})" for m, error in w["refused"].items()) + "."]
    return lines


def over_seeds_table(spread: dict) -> list[str]:
    lines = ["| Method | " + " | ".join(f">= {t:g} dB" for t in TARGETS) + " |", "|" + "---|" * (1 + len(TARGETS))]
    for name, by_target in spread["targets"].items():
        cells = [f"{fmt_pct(v['median'])} / {fmt_pct(v['worst'])} ({', '.join(fmt_pct(x) for x in v['values'])})"
                 for v in (by_target[f"{t:g}"] for t in TARGETS)]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def fmt_setting(value) -> str:
    """A best setting in the targets table: a number, or a schedule's inputs (several at once)."""
    if isinstance(value, dict):
        return ", ".join(f"{k} {v:g}" if isinstance(v, (int, float)) else f"{k} {v}" for k, v in value.items())
    return f"{value:g}" if isinstance(value, (int, float)) else str(value)


def _fmt_versus(v: dict | None) -> str:
    if v is None:
        return "-"
    return f"**beats** ({v['better']}/{v['equal']}/{v['worse']})" if v["beats"] else \
        f"{v['better']}/{v['equal']}/{v['worse']}"


def fmt_vs_fewer(v: dict) -> str:
    """A method's best setting at a PSNR floor against fewer steps at the same floor."""
    if v["equal"]:
        return "same as fewer steps"
    if not v["beats"]:
        return "below fewer steps"
    if v["ratio"] is None:
        return "fewer steps saves none"
    return f"{v['ratio']:.2f}x fewer steps' reduction"


def overhead_table(results: dict) -> list[str]:
    o = results.get("overhead")
    if not o:
        return ["(not measured)"]
    m = o["model"]
    tokens = (o["image"] // 16) ** 2
    lines = [f"Random-weight Flux built through ComfyUI's classes (hidden {m['hidden_size']}, {m['depth']} double + "
             f"{m['depth_single_blocks']} single blocks), {o['image']}x{o['image']} image ({tokens} image tokens), "
             f"{o['steps']} steps, cfg {o['cfg']:g}: uncached {o['baseline_seconds']:.2f} s per run, "
             f"{1000 * o['baseline_seconds'] / o['steps']:.0f} ms per step. Each method at the setting that skips "
             f"nothing; TaylorSeer's own cost shown chained to Fixed Cadence and First Block Cache. **Overhead** = "
             + ("wall time (CUDA events) the method adds on the GPU, as a share of the uncached run: "
                if o.get("device") == "cuda" else
                "CPU time the method adds around the transformer blocks (the blocks do the same work in both runs, "
                "so their timing noise is taken out), as a share of the uncached run: ")
             + f"median over {o['repeats']} rounds, "
             f"baseline and method runs alternated. *Total CPU* = the plain difference of the runs' CPU times, "
             f"which the machine's other load moves by a few percent either way.",
             ""]
    return lines + table(["Method", "Setting", "Overhead", "ms per step", "Total CPU (noisy)", "Output identical"],
                         o["rows"], lambda r: [f"{r['overhead_percent']:+.2f}%", f"{r['overhead_ms_per_step']:+.2f}",
                                               f"{r['total_cpu_overhead_percent']:+.1f}%",
                                               "yes" if r["identical"] else "no"])


def tiny_overhead_table(results: dict) -> list[str]:
    """The same measure on the digits model, from the sweep's settings that skip nothing."""
    steps_list = list(per_steps(results))
    per_method: dict[str, dict] = {}
    for steps in steps_list:
        for r in per_steps(results)[steps]["rows"]:
            if r.get("overhead_ms_per_step") is not None:
                per_method.setdefault(r["method"], {})[steps] = r
    if not per_method:
        return []
    base = {s: per_steps(results)[s]["baseline"]["seconds"] * 1000 / int(s) for s in steps_list}
    lines = [f"On the {results['meta'].get('model', 'digits')} model itself, where a step takes only "
             + ", ".join(f"{base[s]:.0f} ms ({s} steps)" for s in steps_list)
             + ", the same measure from the sweep's settings that skip nothing (one round, so rougher):", "",
             "| Method | " + " | ".join(f"{s} steps" for s in steps_list) + " |",
             "|---|" + "---|" * len(steps_list)]
    for method, by_steps in per_method.items():
        cells = [f"{by_steps[s]['overhead_ms_per_step']:+.2f} ms ({by_steps[s]['overhead_percent']:+.1f}%)"
                 if s in by_steps else "-" for s in steps_list]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines + [""]


def table(header: list[str], rows: list[dict], cells) -> list[str]:
    """A markdown table of result rows: method, setting, then ``cells(row)``; a failed row shows its error."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        if r.get("error"):
            lines.append(f"| {r['method']} | {r['setting']} | error: {r['error']} |" + " |" * (len(header) - 3))
        else:
            lines.append("| " + " | ".join([r["method"], r["setting"], *cells(r)]) + " |")
    return lines


def sweep_table(rows: list[dict]) -> list[str]:
    header = ["Method", "Setting", "Work", "Forwards", "Speedup (wall)", "Speedup (CPU)", "PSNR dB", "SSIM", "k-NN"]
    return table(header, rows, lambda r: [fmt_pct(r["work"]), fmt_pct(r["forwards"]), f"{r['speedup']:.2f}x",
                                          f"{r['cpu_speedup']:.2f}x", fmt_db(r["psnr"]), f"{r['ssim']:.4f}",
                                          fmt_pct(r["knn_accuracy"])])


def _json_safe(value):
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        if math.isnan(value):
            return None
        return value
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _from_json(value):
    if value in ("inf", "-inf"):
        return math.inf if value == "inf" else -math.inf
    if isinstance(value, dict):
        return {k: _from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value


def load_results(path: Path) -> dict:
    """A results.json read back (PSNR "inf" -> float inf)."""
    return _from_json(json.loads(Path(path).read_text()))


def write_outputs(results: dict, out: Path, plot: bool = True) -> None:
    out.mkdir(parents=True, exist_ok=True)
    md_name, json_name, plot_name = output_names(results)
    if plot:
        try:
            from . import bench_plot
            bench_plot.pareto(results, out / plot_name)
            results["meta"]["plot"] = plot_name
        except Exception as e:  # the numbers matter more than the picture
            results["meta"]["plot_error"] = f"{type(e).__name__}: {e}"
    text = markdown(results)
    if results["meta"].get("plot"):
        text = text.replace("## Overhead", f"![PSNR against block work]({plot_name})\n\n## Overhead", 1)
    (out / md_name).write_text(text + "\n")
    (out / json_name).write_text(json.dumps(_json_safe(results), indent=1, allow_nan=False) + "\n")
