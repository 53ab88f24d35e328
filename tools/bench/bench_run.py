"""The bench's runner: API-format prompts for a method at a setting, run through ComfyUI's executor, and
what they measured (work counted on the model, latents, CPU and wall time); ``run_bench`` runs it all."""
from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import math
import os
import platform
import re
import statistics
import time
import traceback
from pathlib import Path
from typing import Callable

import torch

from . import bench_metrics
from . import bench_nodes
from .bench_discover import _inputs as discover_inputs  # noqa: E402
from .bench_discover import (CHAIN_TYPE, GUIDANCE, ROOT, TAYLORSEER, Config, Method, discover, return_types,
                            start_comfy, widget_defaults)
from .bench_report import (FEWER_STEPS, TARGETS, VERSUS_LEVELS, analyse_steps, fewer_steps_name, fmt_db, fmt_pct,
                           write_outputs)
from ..devkit.work_nodes import CAPTURED

EXTEND_BELOW_DB = 30.0  # sweeps are extended until a curve's PSNR drops below this
OVERHEAD_TAYLORSEER_ON = ("fixed_cadence", "fbcache")  # TaylorSeer's own overhead, measured on these
FEWER_STEPS_FROM = 3  # the fewer-steps baseline runs the uncached sampler at this many steps up to the full count - 1


def progress(line: str) -> None:
    """Print one progress line now: a bench runs for an hour and its output is mostly redirected to a file, where
    Python buffers it in blocks, so without the flush a user following the file sees nothing for minutes."""
    print(line, flush=True)


class BenchError(RuntimeError):
    pass



# ------------------------------------------------------------------------------- workloads ----

@dataclasses.dataclass
class Workload:
    name: str
    nodes: dict                          # API-format nodes providing model/conditioning/latent
    model: list
    positive: list
    negative: list
    latent: list
    vae: list | None = None              # the decoder, wired into calibrating nodes that take one (Auto Calibrate)


def digits_workload(config: Config) -> Workload:
    nodes = {"digits": {"class_type": "CachedSamplerDigitsModel", "inputs": {"digits": config.digits}}}
    return Workload("digits", nodes, ["digits", 0], ["digits", 1], ["digits", 2], ["digits", 3], ["digits", 4])


def video_workload(config: Config) -> Workload:
    nodes = {"video": {"class_type": "CachedSamplerVideoModel", "inputs": {"classes": config.classes}}}
    return Workload("video", nodes, ["video", 0], ["video", 1], ["video", 2], ["video", 3], ["video", 4])


def measured_workload(config: Config) -> Workload:
    """The model the bench measures: the digits model, the video model or the photos model (``config.model``)."""
    if config.model == "photos":
        nodes = {"photos": {"class_type": "CachedSamplerPhotosModel", "inputs": {"classes": config.classes}}}
        return Workload("photos", nodes, ["photos", 0], ["photos", 1], ["photos", 2], ["photos", 3], ["photos", 4])
    return video_workload(config) if config.model == "video" else digits_workload(config)


def heavy_workload(config: Config) -> Workload:
    nodes = {
        "heavy": {"class_type": "BenchRandomFlux", "inputs": dict(config.overhead_model)},
        "cond": {"class_type": "CachedSamplerDigitsModel", "inputs": {"digits": "3"}},
        "empty": {"class_type": "EmptyLatentImage", "inputs": {"width": config.overhead_image,
                                                               "height": config.overhead_image, "batch_size": 1}},
    }
    return Workload("heavy", nodes, ["heavy", 0], ["cond", 1], ["cond", 2], ["empty", 0])


def build_prompt(config: Config, wl: Workload, method: Method | None, value, steps: int, key: str,
                 sampler_name: str | None = None) -> dict:
    prompt = json.loads(json.dumps(wl.nodes))
    prompt["work"] = {"class_type": "BenchCountWork", "inputs": {"model": list(wl.model), "key": key + "w"}}
    if method is not None and method.copy_input:
        prompt["work"]["inputs"]["copy_input"] = True
    model, chain, sampler = "work", None, "KSampler"
    if method is not None and method.kind == "chain":
        inputs = dict(method.fixed)
        if isinstance(value, dict):  # a setting of several inputs (a growing cadence)
            inputs.update(value)
        else:
            inputs[method.param] = value
        prompt["m_config"] = {"class_type": method.node, "inputs": inputs}
        chain, sampler = "m_config", "CachedSampler"
        if method.taylorseer is not None:
            prompt["m_taylorseer"] = {"class_type": TAYLORSEER,
                                      "inputs": {"order": method.taylorseer, "interceptors": ["m_config", 0]}}
            chain = "m_taylorseer"
        elif method.estimator is not None:
            node, fixed = method.estimator
            prompt["m_estimator"] = {"class_type": node, "inputs": {**fixed, "interceptors": ["m_config", 0]}}
            chain = "m_estimator"
        if method.guidance is not None:
            prompt["m_guidance"] = {"class_type": GUIDANCE, "inputs": {**method.guidance, "interceptors": [chain, 0]}}
            chain = "m_guidance"
    elif method is not None and method.kind == "planned":
        prompt["m_plan"] = {"class_type": "BenchChain", "inputs": {"key": method.fixed["chain_key"]}}
        chain, sampler = "m_plan", "CachedSampler"
    elif method is not None:
        inputs = dict(method.fixed)
        inputs["model"] = ["work", 0]
        if isinstance(value, dict):  # a setting of several inputs (a peer's schedule)
            inputs.update(value)
        elif method.param is not None:
            inputs[method.param] = value
        prompt["m_patch"] = {"class_type": method.node, "inputs": inputs}
        model = "m_patch"
    inputs = {"model": [model, 0], "seed": config.seed, "steps": steps, "cfg": config.cfg,
              "sampler_name": sampler_name or config.sampler, "scheduler": config.scheduler, "positive": list(wl.positive),
              "negative": list(wl.negative), "latent_image": list(wl.latent), "denoise": 1.0}
    if chain is not None:
        inputs["interceptors"] = [chain, 0]
    prompt["sampler"] = {"class_type": sampler, "inputs": inputs}
    prompt["capture"] = {"class_type": "BenchCaptureLatent", "inputs": {"samples": ["sampler", 0], "key": key}}
    return prompt


# ---------------------------------------------------------------------------------- runner ----

@dataclasses.dataclass
class RunResult:
    latent: torch.Tensor
    seconds: float
    cpu_seconds: float
    block_cpu_seconds: float
    blocks: int
    forwards: int
    evaluations: int
    block_rows: int  # block executions times the batch rows they ran on: the work metric


class Bench:
    def __init__(self, comfy, config: Config, log: Callable[[str], None] = progress):
        import nodes
        self.comfy = comfy
        self.config = config
        self.log = log if config.verbose else (lambda *_: None)
        self.nodes = nodes
        bench_nodes.register(nodes, comfy.pack.__name__)
        self.digits_model = comfy.module("nodes.demo_models.digits")
        self.video_model = comfy.module("nodes.demo_models.video") if config.model == "video" else None
        self.photos_model = comfy.module("nodes.demo_models.photos") if config.model == "photos" else None
        self.executor = comfy.executor(cache=True)
        self._n = 0

    def _execute(self, prompt: dict, what: str = "") -> None:
        """Run a prompt quietly: no progress bars, and no ComfyUI error log (failures go into the results)."""
        import comfy.utils as comfy_utils
        root = logging.getLogger()
        level, bars = root.level, comfy_utils.PROGRESS_BAR_ENABLED
        root.setLevel(logging.CRITICAL)
        comfy_utils.PROGRESS_BAR_ENABLED = False
        try:
            self.comfy.run(prompt, executor=self.executor)
        except AssertionError as e:
            raise BenchError(what + _first_line(str(e))) from None
        finally:
            root.setLevel(level)
            comfy_utils.PROGRESS_BAR_ENABLED = bars

    def run(self, wl: Workload, method: Method | None, value, steps: int, sampler_name: str | None = None
            ) -> RunResult:
        self._n += 1
        key = f"bench{self._n}"
        prompt = build_prompt(self.config, wl, method, value, steps, key, sampler_name)
        self._execute(prompt)
        record = CAPTURED.pop(key + "w", None)
        latent = CAPTURED.pop(key, None)
        if record is None or latent is None or record["runs"] != 1:
            raise BenchError("the prompt ran but produced no sampling run")
        return RunResult(latent, record["seconds"], record["cpu_seconds"], record["block_cpu_seconds"],
                         record["blocks"], record["block_forwards"], record["evaluations"], record["block_rows"])

    def _try_run(self, wl: Workload, method: Method, value, steps: int, row: dict) -> RunResult | None:
        """``run``, with a failure written into ``row`` (and None returned) instead of raised."""
        try:
            return self.run(wl, method, value, steps)
        except BenchError as e:
            row["error"] = str(e)
        except Exception as e:  # a bench bug or an unexpected failure: report it, keep going
            row["error"] = f"{type(e).__name__}: {_first_line(str(e))}"
            row["traceback"] = traceback.format_exc(limit=4)
        return None

    # -- quality / work / speed on the measured model -----------------------------------------------
    def decode(self, latent: torch.Tensor) -> torch.Tensor:
        """The measured model's decoded images (for the video model: every frame of every video)."""
        model = self.video_model or self.photos_model or self.digits_model
        return model.decode(latent.float())

    def accuracy(self, latent: torch.Tensor) -> float:
        """Share of the batch recognised as its prompted class: a k-NN on sklearn's digits for the digits
        model; for the video model, the colour, the shape and the direction of motion recovered from the decoded
        frames; for the photos model, the share whose colour and texture
        statistics are nearest to their class's training crops."""
        if self.photos_model is not None:
            labels = [int(c) for c in self.config.classes]
            return self.photos_model.class_accuracy(self.photos_model.decode_images(latent.float()), labels)
        if self.video_model is not None:
            labels = [int(c) for c in self.config.classes]
            return self.video_model.learned_accuracy(self.video_model.decode_videos(latent.float()), labels)
        labels = [int(c) for c in self.config.digits]
        return self.digits_model.knn_label_accuracy(self.digits_model.decode_digits(latent.float()), labels)

    def reference(self, wl: Workload, steps: int) -> dict:
        self.run(wl, None, None, steps)  # warm-up (first-run allocations, imports)
        ref = self.run(wl, None, None, steps)
        images = self.decode(ref.latent)
        accuracy = self.accuracy(ref.latent)
        return {"latent": ref.latent, "images": images, "blocks": ref.blocks, "block_rows": ref.block_rows,
                "forwards": ref.forwards,
                "evaluations": ref.evaluations, "seconds": ref.seconds, "knn_accuracy": accuracy}

    def fewer_steps(self, wl: Workload, steps: int, ref: dict, first: int = FEWER_STEPS_FROM,
                    sampler_name: str | None = None) -> list[dict]:
        """The baseline every caching method must beat: the uncached sampler (same sampler, scheduler, seed,
        model; or the sampler ``sampler_name``) at every step count from ``first`` to ``steps`` - 1. Work is
        counted by the same counting node as every method's, relative to the full-step uncached run; PSNR/SSIM/k-NN
        of the decoded images against that run's output (the reference sampler's), as for the methods."""
        rows = []
        name = fewer_steps_name(sampler_name)
        for n in range(first, steps):
            row = {"method": name, "key": "fewer_steps", "family": name, "source": "baseline",
                   "node": None, "kind": "fewer_steps", "taylorseer": None, "param": "steps", "value": n,
                   "setting": f"steps={n}", "steps": n, "sampler": sampler_name or self.config.sampler, "error": None}
            rows.append(row)
            try:
                r = self.run(wl, None, None, n, sampler_name)
            except BenchError as e:
                row["error"] = str(e)
                continue
            finite = bool(torch.isfinite(r.latent).all())
            images = self.decode(r.latent)
            row.update(
                work=r.block_rows / ref["block_rows"] if ref["block_rows"] else None,
                work_ratio=ref["block_rows"] / r.block_rows if r.block_rows else None,
                block_rows=r.block_rows, blocks=r.blocks, evaluations=r.evaluations,
                forwards=r.forwards / ref["forwards"] if ref["forwards"] else None,
                psnr=bench_metrics.psnr(images, ref["images"]) if finite else None,
                ssim=bench_metrics.ssim(images, ref["images"]) if finite else None,
                knn_accuracy=self.accuracy(r.latent) if finite else None,
                seconds=r.seconds, identical=bool(torch.equal(r.latent, ref["latent"])))
            if row["work"] is not None:
                row["work_saved"] = 1.0 - row["work"]
            if not finite:
                row["error"] = "non-finite output"
        return rows

    def sweep(self, wl: Workload, points: list[tuple[Method, object, dict]], steps: int, ref: dict,
              repeats: int, on_row: Callable[[dict], None] | None = None) -> list[dict]:
        """Measure every (method, value, extra row fields) point. Runs alternate with the uncached baseline
        (baseline, method, baseline, method, ..., baseline) over all points, ``repeats`` rounds; each method
        run is compared with the mean of the two baseline runs around it, and the speedup is the median over
        the rounds. Quality and work come from the first round (later rounds check they repeat exactly).
        In the first round a curve whose last setting still gives PSNR >= ``EXTEND_BELOW_DB`` and still saves
        more work than the one before is extended (up to ``config.extend`` more settings), so that the
        targets table is limited by the method, not by the sweep."""
        points = list(points)
        rows = [{**self._row(m, v), **extra} for m, v, extra in points]
        firsts: dict[int, RunResult] = {}
        timing: dict[int, dict] = {}
        stable: dict[int, bool] = {}
        before = self.run(wl, None, None, steps)
        baseline_stable = torch.equal(before.latent, ref["latent"])
        for round_ in range(max(1, repeats)):
            i = 0
            while i < len(points):
                m, value, _ = points[i]
                row = rows[i]
                i += 1
                if row.get("error"):
                    continue
                result = self._try_run(wl, m, value, steps, row)
                if result is None:
                    if on_row and round_ == 0:
                        on_row(row)
                    continue
                after = self.run(wl, None, None, steps)
                baseline_stable &= torch.equal(after.latent, ref["latent"])
                base = (before.seconds + after.seconds) / 2
                base_cpu = (before.cpu_seconds + after.cpu_seconds) / 2
                base_around = ((before.cpu_seconds - before.block_cpu_seconds)
                               + (after.cpu_seconds - after.block_cpu_seconds)) / 2
                before = after
                t = timing.setdefault(id(row), {"base": [], "method": [], "ratio": [], "cpu_ratio": [], "around": []})
                t["around"].append((result.cpu_seconds - result.block_cpu_seconds) - base_around)
                t["base"].append(base)
                t["method"].append(result.seconds)
                t["ratio"].append(base / result.seconds if result.seconds > 0 else math.nan)
                t["cpu_ratio"].append(base_cpu / result.cpu_seconds if result.cpu_seconds > 0 else math.nan)
                if id(row) not in firsts:
                    firsts[id(row)] = result
                    stable[id(row)] = True
                    self._quality(row, result, ref)
                    row.update(seconds=result.seconds, baseline_seconds=base, speedup=t["ratio"][0],
                               cpu_speedup=t["cpu_ratio"][0], repeats=1)
                    if on_row:
                        on_row(row)
                    last_of_curve = i == len(points) or points[i][0].key != m.key
                    if round_ == 0 and last_of_curve:
                        extra = self._extension(m, value, [r for r in rows if r["key"] == m.key])
                        if extra is not None:
                            points.insert(i, (m, extra, {"extended": True}))
                            rows.insert(i, {**self._row(m, extra), "extended": True})
                else:
                    first = firsts[id(row)]
                    stable[id(row)] &= torch.equal(first.latent, result.latent) and first.blocks == result.blocks
        for row in rows:
            t = timing.get(id(row))
            if row.get("error") or not t:
                continue
            row.update(seconds=statistics.median(t["method"]), baseline_seconds=statistics.median(t["base"]),
                       speedup=statistics.median(t["ratio"]), speedup_range=[min(t["ratio"]), max(t["ratio"])],
                       cpu_speedup=statistics.median(t["cpu_ratio"]), repeats=len(t["ratio"]),
                       deterministic=stable[id(row)], baseline_stable=baseline_stable)
            if row.get("identical"):  # nothing skipped: the CPU time it added around the blocks is its overhead
                row["overhead_ms_per_step"] = 1000.0 * statistics.median(t["around"]) / steps
                row["overhead_percent"] = 100.0 * statistics.median(t["around"]) / row["baseline_seconds"]
        return rows

    def _extension(self, m: Method, value, curve: list[dict]):
        """The next setting for a curve that ends above the PSNR range of interest, or None."""
        if m.kind == "planned" or m.param is None or not isinstance(value, (int, float)):
            return None
        if sum(1 for r in curve if r.get("extended")) >= self.config.extend:
            return None
        done = [r for r in curve if not r.get("error") and r.get("psnr") is not None and r.get("work") is not None]
        if len(done) < 2 or done[-1]["psnr"] < EXTEND_BELOW_DB:
            return None
        if done[-1]["work"] >= done[-2]["work"] - 1e-9:
            return None  # the method's own limits (consecutive skips, warm-up) cap it: a larger value adds nothing
        if m.param == "interval":
            return int(value) + max(1, int(value) // 2)
        nxt = round(float(value) * 1.5, 6)
        top = m.param_max if m.param_max is not None else math.inf
        return min(nxt, top) if min(nxt, top) > value else None

    def _quality(self, row: dict, first: RunResult, ref: dict) -> None:
        images = self.decode(first.latent)
        finite = bool(torch.isfinite(first.latent).all())
        row.update(
            # a block run on only the positive rows (Guidance Cache) does half a block's work
            work=first.block_rows / ref["block_rows"] if ref["block_rows"] else None,
            forwards=first.forwards / ref["forwards"] if ref["forwards"] else None,
            evaluations=first.evaluations,
            blocks=first.blocks,
            psnr=bench_metrics.psnr(images, ref["images"]) if finite else None,
            ssim=bench_metrics.ssim(images, ref["images"]) if finite else None,
            knn_accuracy=self.accuracy(first.latent) if finite else None,
            identical=bool(torch.equal(first.latent, ref["latent"])),
        )
        if row["work"] is not None:
            row["work_saved"] = 1.0 - row["work"]
        if ref["blocks"] and first.blocks == 0 and first.evaluations > 0:
            row["work"] = row["work_saved"] = None
            row["note"] = "bypasses ComfyUI's block hooks: model work not countable"
        if not finite:
            row["error"] = "non-finite output"

    def _row(self, method: Method, value) -> dict:
        return {"method": method.label, "key": method.key, "family": method.family, "source": method.source,
                "node": method.node, "kind": method.kind, "taylorseer": method.taylorseer,
                "estimator": method.estimator[0] if method.estimator else None, "param": method.param,
                "value": value, "setting": method.describe(value), "error": None}

    def calibration(self, wl: Workload, node_id: str, steps: int, inputs: dict) -> dict:
        """Run a calibrating node (KSampler-like inputs) once on ``wl`` at another seed (seed + 1) than the
        measured one; returns its STRING and chain outputs and how long it took."""
        cfg = self.config
        self._n += 1
        key = f"bench{self._n}"
        cls = self.nodes.NODE_CLASS_MAPPINGS[node_id]
        values, _ = widget_defaults(cls)
        values.update(inputs)
        values.update({"model": list(wl.model), "seed": cfg.seed + 1, "steps": steps, "cfg": cfg.cfg,
                       "sampler_name": cfg.sampler, "scheduler": cfg.scheduler, "positive": list(wl.positive),
                       "negative": list(wl.negative), "latent_image": list(wl.latent), "denoise": 1.0})
        if wl.vae is not None and "vae" in discover_inputs(cls):  # plans judged on the decoded images
            values["vae"] = list(wl.vae)
        prompt = json.loads(json.dumps(wl.nodes))
        prompt["calibrate"] = {"class_type": node_id, "inputs": values}
        outputs = return_types(cls)
        if "STRING" in outputs:
            prompt["capture_text"] = {"class_type": "BenchCaptureText",
                                      "inputs": {"text": ["calibrate", outputs.index("STRING")], "key": key + "t"}}
        if CHAIN_TYPE in outputs:
            prompt["capture_chain"] = {"class_type": "BenchCaptureChain",
                                       "inputs": {"chain": ["calibrate", outputs.index(CHAIN_TYPE)], "key": key + "c"}}
        started = time.perf_counter()
        self._execute(prompt, "calibration failed: ")
        return {"text": CAPTURED.pop(key + "t", None), "chain": CAPTURED.pop(key + "c", None),
                "seconds": time.perf_counter() - started}

    def calibrate(self, wl: Workload, method: Method, steps: int) -> Method:
        """``method`` on the curve its calibration node records from this workload."""
        got = self.calibration(wl, method.calibrate, steps, {})
        if not got["text"]:
            raise BenchError("calibration recorded nothing")
        return dataclasses.replace(method, fixed={**method.fixed, "custom_ratios": got["text"]})

    def plan(self, wl: Workload, method: Method, value, steps: int) -> tuple[Method, dict]:
        """``method`` with the chain its planning node made for ``value``."""
        got = self.calibration(wl, method.node, steps, {**method.fixed, method.param: value})
        if got["chain"] is None:
            raise BenchError("the planning node made no chain")
        key = f"plan{self._n}"
        bench_nodes.CHAINS[key] = got["chain"]
        return dataclasses.replace(method, fixed={**method.fixed, "chain_key": key}), got

    # -- overhead on the heavy model -----------------------------------------------------------------
    def overhead(self, methods: list[Method]) -> dict:
        """Cost of each method when it skips nothing, on a model whose forward dominates a step."""
        cfg = self.config
        wl = heavy_workload(cfg)
        steps = cfg.overhead_steps
        self.log(f"[overhead] heavy random-weight Flux {cfg.overhead_model}, {cfg.overhead_image}px, {steps} steps")
        self.run(wl, None, None, steps)  # warm-up
        ref = self.run(wl, None, None, steps)
        self.log(f"[overhead] uncached: {ref.seconds:.3f}s per run, {ref.forwards} forwards, "
                 f"{ref.blocks} block executions")
        points, rows = [], []
        for m in methods:
            if m.kind == "planned":
                continue  # a plan always skips; per step it costs what Fixed Cadence does
            zero = m.skips_nothing
            row = self._row(m, zero)
            rows.append(row)
            if m.param is not None and zero is None:
                row["error"] = "no known setting that skips nothing"
                continue
            if m.calibrate:
                try:
                    m = self.calibrate(wl, m, steps)
                except BenchError as e:
                    row["error"] = str(e)
                    continue
            points.append((m, zero, row))
        # Alternated like the sweep: baseline, method, baseline, method, ..., rounds over all methods.
        times = {id(row): {"wall": [], "cpu": [], "around": [], "mw": [], "mc": [], "bw": [], "bc": []}
                 for _, _, row in points}
        before = self.run(wl, None, None, steps)
        for _ in range(max(1, cfg.overhead_repeats)):
            for m, zero, row in points:
                if row.get("error"):
                    continue
                r = self._try_run(wl, m, zero, steps, row)
                if r is None:
                    continue
                after = self.run(wl, None, None, steps)
                bw, bc = (before.seconds + after.seconds) / 2, (before.cpu_seconds + after.cpu_seconds) / 2
                # CPU time spent around the blocks (sampler, embedders, every hook): nothing is skipped, so the
                # blocks do the same work in both runs and only their noise is taken out.
                b_around = ((before.cpu_seconds - before.block_cpu_seconds)
                            + (after.cpu_seconds - after.block_cpu_seconds)) / 2
                before = after
                t = times[id(row)]
                t["wall"].append(r.seconds / bw - 1.0)
                t["cpu"].append(r.cpu_seconds / bc - 1.0)
                t["around"].append(((r.cpu_seconds - r.block_cpu_seconds) - b_around) / bc)
                t["mw"].append(r.seconds)
                t["mc"].append(r.cpu_seconds)
                t["bw"].append(bw)
                t["bc"].append(bc)
                row.update(work=r.block_rows / ref.block_rows if ref.block_rows else None,
                           identical=bool(torch.equal(r.latent, ref.latent)))
        # On a GPU the pack's work is kernel launches overlapping the model's: what it costs is wall time.
        cost, scale = ("wall", "bw") if cfg.device == "cuda" else ("around", "bc")
        for m, _, row in points:
            t = times[id(row)]
            if row.get("error") or not t["cpu"]:
                continue
            row.update(seconds=statistics.median(t["mw"]), baseline_seconds=statistics.median(t["bw"]),
                       cpu_seconds=statistics.median(t["mc"]), baseline_cpu_seconds=statistics.median(t["bc"]),
                       overhead_percent=100.0 * statistics.median(t[cost]),
                       overhead_ms_per_step=1000.0 * statistics.median(t[cost]) * statistics.median(t[scale])
                       / steps,
                       overhead_range=[100.0 * min(t[cost]), 100.0 * max(t[cost])],
                       total_cpu_overhead_percent=100.0 * statistics.median(t["cpu"]),
                       wall_overhead_percent=100.0 * statistics.median(t["wall"]), repeats=len(t["cpu"]))
        for row in rows:
            self.log(f"[overhead] {row['method']:<44} {_fmt_overhead(row)}")
        return {"model": dict(cfg.overhead_model), "image": cfg.overhead_image, "steps": steps, "cfg": cfg.cfg,
                "sampler": cfg.sampler, "scheduler": cfg.scheduler, "baseline_seconds": ref.seconds,
                "baseline_cpu_seconds": ref.cpu_seconds, "repeats": cfg.overhead_repeats, "device": cfg.device,
                "blocks_per_forward": ref.blocks // max(ref.forwards, 1), "rows": rows}


def _first_line(text: str) -> str:
    """A one-line error message; for a prompt ComfyUI refused, the validation details it gave."""
    text = text.strip()
    if text.startswith("prompt invalid"):
        details = [d for _, d in re.findall(r"""'details': (['"])(.*?)\1""", text) if d]
        if details:
            return "refused: " + "; ".join(dict.fromkeys(details))[:300]
    return text.splitlines()[0][:300] if text else "error"


def _fmt_overhead(row: dict) -> str:
    if row.get("error"):
        return f"ERROR {row['error']}"
    return (f"{row['overhead_percent']:+6.2f}% ({row['overhead_ms_per_step']:+.2f} ms/step), total CPU "
            f"{row['total_cpu_overhead_percent']:+6.2f}%, wall {row['wall_overhead_percent']:+6.2f}%, "
            f"identical={row['identical']}")


# ---------------------------------------------------------------------------------- driver ----

def measure_steps(bench: Bench, wl: Workload, methods: list[Method], steps: int, repeats: int) -> dict:
    """Every method's sweep, the fewer-steps baselines and the uncached reference at ``steps`` steps and the
    seed of ``bench.config``: the measurements, not yet analysed."""
    config = bench.config
    ref = bench.reference(wl, steps)
    bench.log(f"[{steps} steps] uncached: {ref['seconds']:.2f}s, {ref['forwards']} forwards, "
              f"{ref['blocks']} blocks, k-NN {ref['knn_accuracy']:.0%}")
    points, failed = [], []
    calibrated: dict[str, Method | str] = {}
    for m in methods:
        if m.calibrate:
            base_key = m.key.split("+")[0]
            if base_key not in calibrated:
                try:
                    calibrated[base_key] = bench.calibrate(wl, m, steps)
                except BenchError as e:
                    calibrated[base_key] = str(e)
            got = calibrated[base_key]
            if isinstance(got, str):
                failed += [{**bench._row(m, value), "error": got} for value in m.values]
                continue
            m = dataclasses.replace(m, fixed=got.fixed)
        for value in m.values:
            if m.kind == "planned":
                try:
                    planned, got = bench.plan(wl, m, value, steps)
                except BenchError as e:
                    failed.append({**bench._row(m, value), "error": str(e)})
                    continue
                points.append((planned, value, {"note": got["text"], "calibration_seconds": got["seconds"]}))
            else:
                points.append((m, value, {}))
    rows = bench.sweep(wl, points, steps, ref, repeats, on_row=lambda row: bench.log(
        f"[{steps} steps] {row['method']:<44} {row['setting']:<24} {_fmt_row(row)}"))
    rows += failed
    for row in failed:
        bench.log(f"[{steps} steps] {row['method']:<44} {row['setting']:<24} {_fmt_row(row)}")
    fewer = bench.fewer_steps(wl, steps, ref)
    for row in fewer:
        bench.log(f"[{steps} steps] {row['method']:<44} {row['setting']:<24} " + (
            f"ERROR {row['error']}" if row.get("error") else
            f"work {row['work']:.2f} (1/{row['work_ratio']:.2f})  PSNR {fmt_db(row['psnr']):>15}  "
            f"SSIM {row['ssim']:.4f}  k-NN {fmt_pct(row['knn_accuracy'])}"))
    samplers = {}
    for sampler in config.fewer_steps_samplers:
        samplers[sampler] = bench.fewer_steps(wl, steps, ref, sampler_name=sampler)
        for row in samplers[sampler]:
            bench.log(f"[{steps} steps, seed {config.seed}] {row['method']:<44} {row['setting']:<24} " + (
                f"ERROR {row['error']}" if row.get("error") else f"work {row['work']:.2f}  PSNR {fmt_db(row['psnr'])}"))
    return {"baseline": {k: ref[k] for k in ("blocks", "forwards", "evaluations", "seconds", "knn_accuracy")},
            "rows": rows, "fewer_steps": fewer, "fewer_steps_samplers": samplers}


def run_bench(config: Config, comfy=None, log: Callable[[str], None] = progress) -> dict:
    started = time.perf_counter()
    if comfy is None:
        comfy = start_comfy(config.other_packs, config.device)
    torch.set_num_threads(1)
    bench = Bench(comfy, config, log)
    methods, skipped = discover(bench.nodes, config)
    bench.log(f"bench: {len(methods)} curves: " + ", ".join(m.label for m in methods))
    for s in skipped:
        bench.log(f"bench: not benchmarked: {s['node']} ({s['why']})")
    wl = measured_workload(config)
    digits: dict = {}
    seeds = [config.seed + i for i in range(config.seeds)]
    for index, steps in enumerate(config.steps):
        repeats = config.repeats[min(index, len(config.repeats) - 1)]
        per_seed = []
        for seed in seeds:  # the Bench reads the seed from its config
            bench.config = dataclasses.replace(config, seed=seed)
            per_seed.append({"seed": seed, **measure_steps(bench, wl, methods, steps, repeats)})
        bench.config = config
        w = {k: v for k, v in per_seed[0].items() if k != "seed"}  # the first seed's: the figures of one seed
        if len(seeds) > 1:
            w["per_seed"] = [{k: m[k] for k in ("seed", "rows", "fewer_steps", "fewer_steps_samplers")}
                             for m in per_seed]
        w.update(analyse_steps(w))
        digits[str(steps)] = w
    overhead = None
    if config.overhead:
        overhead = bench.overhead([dataclasses.replace(m, values=[m.zero] if m.zero is not None else m.values[:1])
                                   for m in methods if _overhead_curve(m, config)])
    from ..devkit import comfy_harness
    results = {
        "meta": {
            "command": config.command or ("python3 -m cached_sampler_dev.bench.bench" + (" --quick" if config.quick else "")
                                          + (f" --device {config.device}" if config.device != "cpu" else "")),
            "device": config.device,
            "date": datetime.date.today().isoformat(),
            "platform": f"{platform.machine()} {platform.system()}, {os.cpu_count()} CPU cores",
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "comfyui": comfy_harness.comfyui_version(comfy.path),
            "pack_commit": _pack_commit(),
            "other_packs_loaded": list(getattr(comfy, "bench_other_packs", [])),
            "steps": list(config.steps), "cfg": config.cfg, "sampler": config.sampler,
            "scheduler": config.scheduler, "seed": config.seed, "seeds": seeds, "digits": config.digits, "repeats": config.repeats,
            "model": config.model, "classes": config.classes,
            "taylorseer_orders": list(config.taylorseer), "curves": [m.label for m in methods],
            "targets_db": list(TARGETS), "versus_levels_db": list(VERSUS_LEVELS),
        },
        wl.name: digits,
        "overhead": overhead,
        "skipped": skipped,
    }
    results["meta"]["seconds"] = time.perf_counter() - started
    if config.out:
        write_outputs(results, Path(config.out), config.plot)
    return results


def _pack_commit() -> str | None:
    """The pack's git commit, marked '+local changes' when its code differs from it (None outside git)."""
    import subprocess
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "interceptors", "nodes", "adapter",
                                "__init__.py"], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + (" +local changes" if dirty else "")) if head else None


def _overhead_curve(m: Method, config: Config) -> bool:
    """Methods measured on the heavy model: every caching node, and TaylorSeer chained to one whole-model and
    one block-level node (what it adds when nothing is skipped is storing order + 1 values per step)."""
    if m.guidance is not None:
        return False  # its Guidance Cache skips negative branches at every setting; the cadence's cost is measured
    if m.taylorseer is None:
        return True
    return not config.quick and m.key.split("+")[0] in OVERHEAD_TAYLORSEER_ON


def _fmt_row(row: dict) -> str:
    if row.get("error"):
        return f"ERROR {row['error']}"
    work = "n/a" if row["work"] is None else f"{row['work']:.2f}"
    return (f"work {work}  PSNR {fmt_db(row['psnr']):>15}  SSIM {row['ssim']:.4f}  "
            f"speedup {row['speedup']:.2f}x  k-NN {fmt_pct(row['knn_accuracy'])}")
