"""Benchmark the pack's caching methods against ComfyUI's own EasyCache/LazyCache, headless.

Everything runs through ComfyUI's executor on API-format prompts, in one process:

* quality and model work on the pack's trained tiny Flux (8x8 digits, one image per class, euler,
  cfg 3, fixed seed) at 28 and 50 steps, for every caching method over a sweep of its threshold
  (and each pack method with TaylorSeer order 1 and 2 chained); model work is counted on the model
  itself (transformer blocks that really ran), PSNR/SSIM are measured on the decoded images against
  the uncached run at the same seed, recognisability with a k-NN on sklearn's digits;
* wall-clock speedup against the uncached run, alternating baseline and method runs, medians;
* per-step overhead when nothing is skipped, on a heavier random-weight Flux whose forward dominates.

Writes bench/results.md, bench/results.json and bench/pareto.png (see README, "Measured results").

    python3 tools/bench.py            # the full bench (about 10-15 minutes on 2 CPU cores)
    python3 tools/bench.py --quick    # a 1-2 minute smoke run
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import math
import os
import platform
import re
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / "tools"
TESTS = ROOT / "tests"
for _p in (TOOLS, TESTS):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

import bench_metrics  # noqa: E402
import bench_nodes  # noqa: E402

PACK_PREFIX = "CachedSampler"
CHAIN_TYPE = "CACHED_SAMPLER_CHAIN"
TAYLORSEER = "CachedSamplerTaylorSeer"
CORE_PEERS = ("EasyCache", "LazyCache")
# Node ids of other installed packs that look like caching methods (TeaCache, MagCache, WaveSpeed's FBCache...).
PEER_PATTERNS = ("teacache", "magcache", "fbcache", "firstblockcache", "applyfbcacheonmodel", "taylorseer",
                 "easycache", "lazycache", "dbcache", "blockcache", "cachedit")
TARGETS = (30.0, 31.0, 35.0, 40.0, 45.0)
EXTEND_BELOW_DB = 30.0  # sweeps are extended until a curve's PSNR drops below this
OVERHEAD_TAYLORSEER_ON = ("fixed_cadence", "fbcache")  # TaylorSeer's own overhead, measured on these
VERSUS_LEVELS = tuple(float(v) for v in range(30, 46))

# Sweeps per method key. The first value turns caching off (bit-identical output): it anchors each curve.
SWEEPS: dict[str, list] = {
    "fixed_cadence": [1, 2, 3, 4, 5, 6],
    "fbcache": [0.0, 0.1, 0.15, 0.2, 0.3, 0.4],
    "dbcache": [0.0, 0.1, 0.15, 0.2, 0.3, 0.4],
    "adaptive": [0.0, 0.02, 0.04, 0.07, 0.1, 0.15, 0.2, 0.3],
    "teacache": [0.0, 0.2, 0.3, 0.4, 0.6, 0.8],
    "magcache": [0.0, 0.01, 0.02, 0.04, 0.06],
    "magcache_calibrated": [0.0, 0.01, 0.02, 0.04, 0.06],
    "autocalibrate": [30.0, 35.0, 40.0, 45.0],
    "easycache": [0.0, 0.005, 0.01, 0.02],
    "easycache_copy": [0.0, 0.005, 0.01, 0.02, 0.04, 0.07, 0.1, 0.2],
    "lazycache": [0.0, 0.005, 0.01, 0.02, 0.04],
}
QUICK_SWEEPS: dict[str, list] = {
    "fixed_cadence": [1, 2, 4],
    "fbcache": [0.0, 0.15, 0.3],
    "dbcache": [0.0, 0.15, 0.3],
    "adaptive": [0.0, 0.04, 0.15],
    "teacache": [0.0, 0.3, 0.6],
    "magcache": [0.0, 0.02, 0.06],
    "magcache_calibrated": [0.0, 0.02, 0.06],
    "easycache": [0.0, 0.01, 0.04],
    "easycache_copy": [0.0, 0.01, 0.04],
    "lazycache": [0.0, 0.01, 0.04],
    "autocalibrate": [35.0],
}
# Pack nodes with a known role; any other pack config node with a 'threshold' or 'interval' input is
# benchmarked too (sweeping that input around its default).
PACK_KEYS = {"CachedSamplerAutoCalibrate": "autocalibrate", "CachedSamplerFixedCadence": "fixed_cadence",
             "CachedSamplerFirstBlockCache": "fbcache", "CachedSamplerDBCache": "dbcache",
             "CachedSamplerAdaptiveCache": "adaptive", "CachedSamplerTeaCache": "teacache",
             "CachedSamplerMagCache": "magcache"}
# DBCache presets (Fn front blocks that always run, Bn back blocks that always run). Fn=1, Bn=0 is the
# First Block Cache node.
DBCACHE_PRESETS = {"F1B1": {"Fn": 1, "Bn": 1}, "F2B0": {"Fn": 2, "Bn": 0}}
GENERIC_MULTIPLIERS = (0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0)
# Calibration nodes -> the method node whose curve they record.
CALIBRATORS = {"CachedSamplerMagCacheCalibrate": "CachedSamplerMagCache"}
# Nodes that plan a schedule from an uncached run of the prompt (at another seed here): swept input, fixed inputs.
PLANNERS = {"CachedSamplerAutoCalibrate": ("min_psnr", {"target": "quality"})}
# Inputs of calibrating nodes that the bench wires like a KSampler's.
KSAMPLER_LINKS = ("model", "positive", "negative", "latent_image")


class BenchError(RuntimeError):
    pass


@dataclasses.dataclass
class Config:
    steps: list = dataclasses.field(default_factory=lambda: [28, 50])
    cfg: float = 3.0
    sampler: str = "euler"
    scheduler: str = "simple"
    seed: int = 0
    digits: str = "0123456789"
    repeats: list = dataclasses.field(default_factory=lambda: [1])  # timing rounds per step count (last repeats)
    taylorseer: list = dataclasses.field(default_factory=lambda: [1, 2])
    sweeps: dict = dataclasses.field(default_factory=lambda: {k: list(v) for k, v in SWEEPS.items()})
    dbcache_presets: list = dataclasses.field(default_factory=lambda: ["F1B1"])
    only: list | None = None            # method keys to run (None: all discovered)
    overhead: bool = True
    overhead_repeats: int = 5
    overhead_steps: int = 8
    overhead_model: dict = dataclasses.field(default_factory=lambda: {
        "hidden_size": 256, "num_heads": 4, "depth": 2, "depth_single_blocks": 4, "seed": 0})
    overhead_image: int = 256            # pixels; the latent is image/8 per side (Flux patch 2 -> (image/16)^2 tokens)
    other_packs: bool = True
    out: str | None = str(ROOT / "bench")
    plot: bool = True
    quick: bool = False
    verbose: bool = True
    replot: str | None = None
    extend: int = 3                      # settings a sweep may add to reach below EXTEND_BELOW_DB


@dataclasses.dataclass
class Method:
    """One curve: a caching node (plus TaylorSeer) swept over one input."""

    key: str
    label: str
    family: str
    source: str
    node: str | None                     # node id; None for the uncached baseline
    param: str | None
    values: list
    fixed: dict = dataclasses.field(default_factory=dict)
    taylorseer: int | None = None
    kind: str = "chain"                  # "chain" (pack: Cached Sampler + chain), "model" (MODEL -> MODEL patch)
                                         # or "planned" (a planning node's chain, made once per setting)
    zero: object = None                  # the value that turns caching off, if known
    copy_input: bool = False             # hand the diffusion model a copy of its input (see BenchCountWork)
    param_max: float | None = None       # the swept input's maximum, as the node declares it
    calibrate: str | None = None         # node that records this method's model curve first (MagCache Calibrate)

    def describe(self, value) -> str:
        if self.param is None:
            return "defaults"
        if isinstance(value, float):
            return f"{self.param}={value:g}"
        return f"{self.param}={value}"


# ----------------------------------------------------------------------------- ComfyUI setup ----

class _Quiet(logging.Filter):
    """Hides ComfyUI's import-failure noise for optional core nodes (audio without torchaudio...)."""

    def __init__(self):
        super().__init__()
        self.hidden = 0

    def filter(self, record):
        self.hidden += 1
        return False


def start_comfy(other_packs: bool = True):
    """A headless ComfyUI (tests/comfy_harness.Comfy) with the bench nodes and, optionally, the caching
    packs installed in that ComfyUI's own custom_nodes folder."""
    from comfy_harness import Comfy, find_comfyui
    path = find_comfyui()
    if path is None:
        raise SystemExit("bench: no ComfyUI found (set COMFYUI_PATH or keep a checkout at ~/ComfyUI).")
    torch.set_num_threads(1)
    quiet = _Quiet()
    root = logging.getLogger()
    root.addFilter(quiet)  # ComfyUI logs import failures on the root logger
    try:
        comfy = Comfy(path)
        loaded = load_other_packs(comfy) if other_packs else []
    finally:
        root.removeFilter(quiet)
    comfy.bench_other_packs = loaded
    return comfy


def load_other_packs(comfy) -> list[str]:
    """Load the packs in ComfyUI's own custom_nodes folder (where peers such as TeaCache would be
    installed) through ComfyUI's loader; a copy of this pack there is skipped."""
    import asyncio
    import nodes
    folder = comfy.path / "custom_nodes"
    loaded = []
    if not folder.is_dir():
        return loaded
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith((".", "__")) or entry.name.endswith((".example", ".disabled")):
            continue
        if entry.is_dir() and (entry / "nodes" / "digits_model.py").is_file():
            continue  # another copy of this pack
        if entry.is_file() and entry.suffix != ".py":
            continue
        try:
            if entry.resolve() == ROOT:
                continue
            if asyncio.run(nodes.load_custom_node(str(entry))):
                loaded.append(entry.name)
        except Exception:  # a broken pack must not stop the bench
            pass
    return loaded


# ------------------------------------------------------------------------------- discovery ----

def _inputs(cls) -> dict:
    spec = cls.INPUT_TYPES()
    out = {}
    for section in ("required", "optional"):
        for name, value in (spec.get(section) or {}).items():
            out[name] = (section, value)
    return out


def _default(value):
    kind = value[0]
    options = value[1] if len(value) > 1 and isinstance(value[1], dict) else {}
    if isinstance(kind, (list, tuple)):
        return options.get("default", kind[0] if kind else None)
    if kind == "COMBO":
        choices = options.get("options") or []
        return options.get("default", choices[0] if choices else None)
    return options.get("default")


def _returns(cls) -> tuple:
    return tuple(getattr(cls, "RETURN_TYPES", ()) or ())


def _widget_defaults(cls, skip=(), prefer: str | None = None) -> tuple[dict, list[str]]:
    """Default values for a node's widget inputs (for a list, the first option containing ``prefer`` if
    any), and the names of link inputs it requires."""
    values, links = {}, []
    for name, (section, spec) in _inputs(cls).items():
        if name in skip:
            continue
        kind = spec[0]
        is_widget = isinstance(kind, (list, tuple)) or kind in ("INT", "FLOAT", "STRING", "BOOLEAN", "COMBO")
        if not is_widget:
            if section == "required":
                links.append(name)
            continue
        default = _default(spec)
        if isinstance(kind, (list, tuple)) or kind == "COMBO":
            choices = list(kind) if isinstance(kind, (list, tuple)) else list(spec[1].get("options", []))
            preferred = [c for c in choices if prefer and isinstance(c, str) and prefer in c.lower()]
            if preferred:
                default = preferred[0]
        if default is None and section == "required":
            links.append(name)
            continue
        if default is not None:
            values[name] = default
    return values, links


def _sweep_for(cls, param: str, quick: bool) -> list:
    spec = _inputs(cls)[param][1]
    options = spec[1] if len(spec) > 1 else {}
    if param == "interval":
        return [1, 2, 4] if quick else [1, 2, 3, 4, 5, 6]
    default = float(options.get("default", 0.1)) or 0.1
    top = float(options.get("max", math.inf))
    multipliers = (0.0, 1.0, 2.0) if quick else GENERIC_MULTIPLIERS
    return sorted({round(min(default * m, top), 6) for m in multipliers})


def discover(nodes_module, config: Config) -> tuple[list[Method], list[dict]]:
    """The methods to benchmark, from the node ids ComfyUI has loaded right now; and what was found
    but cannot be benchmarked (with why)."""
    mappings = nodes_module.NODE_CLASS_MAPPINGS
    names = nodes_module.NODE_DISPLAY_NAME_MAPPINGS
    methods: list[Method] = []
    skipped: list[dict] = []
    has_ts = TAYLORSEER in mappings

    def sweep(key, cls, param):
        if key in config.sweeps:
            return list(config.sweeps[key])
        return _sweep_for(cls, param, config.quick)

    def add_with_taylorseer(m: Method):
        methods.append(m)
        if not has_ts:
            return
        for order in config.taylorseer:
            values = [v for v in m.values if v != m.zero] or list(m.values)
            methods.append(dataclasses.replace(m, key=f"{m.key}+ts{order}", label=f"{m.label} + TaylorSeer o{order}",
                                               values=values, taylorseer=order))

    for node_id in sorted(mappings):
        cls = mappings[node_id]
        if not node_id.startswith(PACK_PREFIX) or node_id == TAYLORSEER or CHAIN_TYPE not in _returns(cls):
            continue
        inputs = _inputs(cls)
        param = "interval" if "interval" in inputs else "threshold" if "threshold" in inputs else None
        if node_id in CALIBRATORS:
            continue
        if node_id in PLANNERS:
            param, extra = PLANNERS[node_id]
            key = PACK_KEYS.get(node_id, node_id[len(PACK_PREFIX):].lower())
            fixed, links = _widget_defaults(cls, skip=(param,))
            label = names.get(node_id, node_id)
            if [n for n in links if n not in KSAMPLER_LINKS]:
                skipped.append({"node": node_id, "why": f"needs linked inputs {links}"})
                continue
            methods.append(Method(key, f"{label} ({extra.get('target', param)} target)", label, "pack", node_id,
                                  param, sweep(key, cls, param), {**fixed, **extra}, kind="planned"))
            continue
        if param is None:
            skipped.append({"node": node_id, "why": "no threshold or interval input to sweep"})
            continue
        key = PACK_KEYS.get(node_id, node_id[len(PACK_PREFIX):].lower())
        label = names.get(node_id, node_id)
        zero = 1 if param == "interval" else 0.0
        fixed, links = _widget_defaults(cls, skip=(param,))
        if links:
            skipped.append({"node": node_id, "why": f"needs linked inputs {links}"})
            continue
        if key == "dbcache":
            for preset in config.dbcache_presets:
                if preset not in DBCACHE_PRESETS:
                    skipped.append({"node": node_id, "why": f"unknown DBCache preset {preset}"})
                    continue
                name = f"{label} {preset}"
                add_with_taylorseer(Method(f"dbcache_{preset.lower()}", name, name, "pack", node_id, param,
                                           sweep(key, cls, param), {**fixed, **DBCACHE_PRESETS[preset]}, zero=zero))
            continue
        add_with_taylorseer(Method(key, label, label, "pack", node_id, param, sweep(key, cls, param), fixed,
                                   zero=zero))
        calibrator = next((c for c, target in CALIBRATORS.items() if target == node_id and c in mappings), None)
        if calibrator is not None:
            # The same node on a curve recorded from this model by its calibration node (one uncached run
            # at another seed than the one measured), instead of the published curve for real Flux.
            ckey = f"{key}_calibrated"
            add_with_taylorseer(Method(ckey, f"{label} (calibrated)", f"{label} (calibrated)", "pack", node_id,
                                       param, sweep(ckey, cls, param), {**fixed, "model_type": "custom"}, zero=zero,
                                       calibrate=calibrator))
    for node_id in CALIBRATORS:
        if node_id in mappings and CALIBRATORS[node_id] not in mappings:
            skipped.append({"node": node_id, "why": f"{CALIBRATORS[node_id]} is missing"})

    for node_id in CORE_PEERS:
        cls = mappings.get(node_id)
        if cls is None:
            continue
        key = node_id.lower()
        fixed, _ = _widget_defaults(cls, skip=("reuse_threshold",))
        fixed["verbose"] = False
        methods.append(Method(key, f"{names.get(node_id, node_id)} (ComfyUI core)", node_id, "ComfyUI core", node_id,
                              "reuse_threshold", sweep(key, cls, "reuse_threshold"), fixed, kind="model", zero=0.0))
        if node_id == "EasyCache":
            # EasyCache adds its cached difference into the model's input in place when it skips; for a
            # float32 flow model ComfyUI then computes the prediction from that same tensor. A copy of
            # the input (what a cast to bf16/fp16 makes anyway) shows what the method itself does.
            methods.append(Method("easycache_copy", "EasyCache (ComfyUI core, input copied)",
                                  "EasyCache (input copied)", "ComfyUI core", node_id, "reuse_threshold",
                                  sweep("easycache_copy", cls, "reuse_threshold"), fixed, kind="model", zero=0.0,
                                  copy_input=True))

    for node_id in sorted(mappings):
        if node_id.startswith(PACK_PREFIX) or node_id in CORE_PEERS or node_id.startswith("Bench"):
            continue
        if not any(p in node_id.lower() for p in PEER_PATTERNS):
            continue
        cls = mappings[node_id]
        inputs = _inputs(cls)
        source = getattr(cls, "RELATIVE_PYTHON_MODULE", None) or getattr(cls, "__module__", "?")
        if "model" not in inputs or "MODEL" not in _returns(cls)[:1]:
            skipped.append({"node": node_id, "source": source, "why": "not a MODEL -> MODEL patch"})
            continue
        params = [n for n, (_, s) in inputs.items() if s[0] == "FLOAT" and "thresh" in n.lower()]
        param = params[0] if params else None
        fixed, links = _widget_defaults(cls, skip=(param, "model"), prefer="flux")  # the bench's models are Flux
        links = [n for n in links if n != "model"]
        if links:
            skipped.append({"node": node_id, "source": source, "why": f"needs linked inputs {links}"})
            continue
        values = sweep(node_id.lower(), cls, param) if param else [None]
        methods.append(Method(f"peer:{node_id}", f"{names.get(node_id, node_id)} ({source})", node_id, source,
                              node_id, param, values, fixed, kind="model", zero=0.0 if param else None))

    for m in methods:
        spec = _inputs(mappings[m.node]).get(m.param) if m.param else None
        if spec is not None and len(spec[1]) > 1 and isinstance(spec[1][1], dict):
            m.param_max = spec[1][1].get("max")
    if config.only:
        wanted = set(config.only)
        methods = [m for m in methods if m.key in wanted or m.key.split("+")[0] in wanted]
    return methods, skipped


# ------------------------------------------------------------------------------- workloads ----

@dataclasses.dataclass
class Workload:
    name: str
    nodes: dict                          # API-format nodes providing model/conditioning/latent
    model: list
    positive: list
    negative: list
    latent: list


def digits_workload(config: Config) -> Workload:
    nodes = {"digits": {"class_type": "CachedSamplerDigitsModel", "inputs": {"digits": config.digits}}}
    return Workload("digits", nodes, ["digits", 0], ["digits", 1], ["digits", 2], ["digits", 3])


def heavy_workload(config: Config) -> Workload:
    nodes = {
        "heavy": {"class_type": "BenchRandomFlux", "inputs": dict(config.overhead_model)},
        "cond": {"class_type": "CachedSamplerDigitsModel", "inputs": {"digits": "3"}},
        "empty": {"class_type": "EmptyLatentImage", "inputs": {"width": config.overhead_image,
                                                               "height": config.overhead_image, "batch_size": 1}},
    }
    return Workload("heavy", nodes, ["heavy", 0], ["cond", 1], ["cond", 2], ["empty", 0])


def build_prompt(config: Config, wl: Workload, method: Method | None, value, steps: int, key: str) -> dict:
    prompt = json.loads(json.dumps(wl.nodes))
    prompt["work"] = {"class_type": "BenchCountWork", "inputs": {"model": list(wl.model), "key": key}}
    if method is not None and method.copy_input:
        prompt["work"]["inputs"]["copy_input"] = True
    model, chain, sampler = "work", None, "KSampler"
    if method is not None and method.kind == "chain":
        inputs = dict(method.fixed)
        inputs[method.param] = value
        prompt["m_config"] = {"class_type": method.node, "inputs": inputs}
        chain, sampler = "m_config", "CachedSampler"
        if method.taylorseer is not None:
            prompt["m_taylorseer"] = {"class_type": TAYLORSEER,
                                      "inputs": {"order": method.taylorseer, "interceptors": ["m_config", 0]}}
            chain = "m_taylorseer"
    elif method is not None and method.kind == "planned":
        prompt["m_plan"] = {"class_type": "BenchChain", "inputs": {"key": method.fixed["chain_key"]}}
        chain, sampler = "m_plan", "CachedSampler"
    elif method is not None:
        inputs = dict(method.fixed)
        inputs["model"] = ["work", 0]
        if method.param is not None:
            inputs[method.param] = value
        prompt["m_patch"] = {"class_type": method.node, "inputs": inputs}
        model = "m_patch"
    inputs = {"model": [model, 0], "seed": config.seed, "steps": steps, "cfg": config.cfg,
              "sampler_name": config.sampler, "scheduler": config.scheduler, "positive": list(wl.positive),
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


class Bench:
    def __init__(self, comfy, config: Config, log: Callable[[str], None] = print):
        import nodes
        self.comfy = comfy
        self.config = config
        self.log = log if config.verbose else (lambda *_: None)
        self.nodes = nodes
        bench_nodes.register(nodes, comfy.pack.__name__)
        self.digits_model = comfy.module("nodes.digits_model")
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

    def run(self, wl: Workload, method: Method | None, value, steps: int) -> RunResult:
        self._n += 1
        key = f"bench{self._n}"
        prompt = build_prompt(self.config, wl, method, value, steps, key)
        self._execute(prompt)
        record = bench_nodes.RECORDS.pop(key, None)
        latent = bench_nodes.CAPTURED.pop(key, None)
        if record is None or latent is None or record["runs"] != 1:
            raise BenchError("the prompt ran but produced no sampling run")
        return RunResult(latent, record["seconds"], record["cpu_seconds"], record["block_cpu_seconds"],
                         record["blocks"], record["forwards"], record["evaluations"])

    # -- quality / work / speed on the digits model --------------------------------------------------
    def reference(self, wl: Workload, steps: int) -> dict:
        self.run(wl, None, None, steps)  # warm-up (first-run allocations, imports)
        ref = self.run(wl, None, None, steps)
        images = self.digits_model.decode(ref.latent.float())
        labels = [int(c) for c in self.config.digits]
        accuracy = self.digits_model.knn_label_accuracy(self.digits_model.decode_digits(ref.latent.float()), labels)
        return {"latent": ref.latent, "images": images, "blocks": ref.blocks, "forwards": ref.forwards,
                "evaluations": ref.evaluations, "seconds": ref.seconds, "knn_accuracy": accuracy}

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
                try:
                    result = self.run(wl, m, value, steps)
                except BenchError as e:
                    row["error"] = str(e)
                except Exception as e:  # a bench bug or an unexpected failure: report it, keep going
                    row["error"] = f"{type(e).__name__}: {_first_line(str(e))}"
                    row["traceback"] = traceback.format_exc(limit=4)
                if row.get("error"):
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
        images = self.digits_model.decode(first.latent.float())
        labels = [int(c) for c in self.config.digits]
        digits = self.digits_model.decode_digits(first.latent.float())
        finite = bool(torch.isfinite(first.latent).all())
        row.update(
            work=first.blocks / ref["blocks"] if ref["blocks"] else None,
            forwards=first.forwards / ref["forwards"] if ref["forwards"] else None,
            evaluations=first.evaluations,
            blocks=first.blocks,
            psnr=bench_metrics.psnr(images, ref["images"]) if finite else None,
            ssim=bench_metrics.ssim(images, ref["images"]) if finite else None,
            knn_accuracy=self.digits_model.knn_label_accuracy(digits, labels) if finite else None,
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
                "node": method.node, "kind": method.kind, "taylorseer": method.taylorseer, "param": method.param,
                "value": value, "setting": method.describe(value), "error": None}

    def calibration(self, wl: Workload, node_id: str, steps: int, inputs: dict) -> dict:
        """Run a calibrating node (KSampler-like inputs) once on ``wl`` at another seed (seed + 1) than the
        measured one; returns its STRING and chain outputs and how long it took."""
        cfg = self.config
        self._n += 1
        key = f"bench{self._n}"
        cls = self.nodes.NODE_CLASS_MAPPINGS[node_id]
        values, _ = _widget_defaults(cls)
        values.update(inputs)
        values.update({"model": list(wl.model), "seed": cfg.seed + 1, "steps": steps, "cfg": cfg.cfg,
                       "sampler_name": cfg.sampler, "scheduler": cfg.scheduler, "positive": list(wl.positive),
                       "negative": list(wl.negative), "latent_image": list(wl.latent), "denoise": 1.0})
        prompt = json.loads(json.dumps(wl.nodes))
        prompt["calibrate"] = {"class_type": node_id, "inputs": values}
        outputs = _returns(cls)
        if "STRING" in outputs:
            prompt["capture_text"] = {"class_type": "BenchCaptureText",
                                      "inputs": {"text": ["calibrate", outputs.index("STRING")], "key": key + "t"}}
        if CHAIN_TYPE in outputs:
            prompt["capture_chain"] = {"class_type": "BenchCaptureChain",
                                       "inputs": {"chain": ["calibrate", outputs.index(CHAIN_TYPE)], "key": key + "c"}}
        started = time.perf_counter()
        self._execute(prompt, "calibration failed: ")
        return {"text": bench_nodes.CAPTURED.pop(key + "t", None), "chain": bench_nodes.CAPTURED.pop(key + "c", None),
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
            zero = m.zero if m.zero is not None else (m.values[0] if m.values else None)
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
                try:
                    r = self.run(wl, m, zero, steps)
                except BenchError as e:
                    row["error"] = str(e)
                    continue
                except Exception as e:
                    row["error"] = f"{type(e).__name__}: {_first_line(str(e))}"
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
                row.update(work=r.blocks / ref.blocks if ref.blocks else None,
                           identical=bool(torch.equal(r.latent, ref.latent)))
        for m, _, row in points:
            t = times[id(row)]
            if row.get("error") or not t["cpu"]:
                continue
            row.update(seconds=statistics.median(t["mw"]), baseline_seconds=statistics.median(t["bw"]),
                       cpu_seconds=statistics.median(t["mc"]), baseline_cpu_seconds=statistics.median(t["bc"]),
                       overhead_percent=100.0 * statistics.median(t["around"]),
                       overhead_ms_per_step=1000.0 * statistics.median(t["around"]) * statistics.median(t["bc"])
                       / steps,
                       overhead_range=[100.0 * min(t["around"]), 100.0 * max(t["around"])],
                       total_cpu_overhead_percent=100.0 * statistics.median(t["cpu"]),
                       wall_overhead_percent=100.0 * statistics.median(t["wall"]), repeats=len(t["cpu"]))
        for row in rows:
            self.log(f"[overhead] {row['method']:<44} {_fmt_overhead(row)}")
        return {"model": dict(cfg.overhead_model), "image": cfg.overhead_image, "steps": steps, "cfg": cfg.cfg,
                "sampler": cfg.sampler, "scheduler": cfg.scheduler, "baseline_seconds": ref.seconds,
                "baseline_cpu_seconds": ref.cpu_seconds, "repeats": cfg.overhead_repeats,
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


# ------------------------------------------------------------------------------- analysis ----

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


def analyse(rows: list[dict]) -> dict:
    by_method: dict[str, list] = {}
    for r in rows:
        by_method.setdefault(r["method"], []).append(r)
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
            better = equal = worse = 0
            for level in VERSUS_LEVELS:
                a, b = best_reduction(rs, level), best_reduction(prs, level)
                if a > b + 1e-9:
                    better += 1
                elif a < b - 1e-9:
                    worse += 1
                else:
                    equal += 1
            versus[m][rows_family(prs)] = {"better": better, "equal": equal, "worse": worse,
                                           "beats": worse == 0 and better > 0}
    return {"targets": targets, "target_settings": settings, "versus": versus}


def rows_family(rows: list[dict]) -> str:
    return rows[0]["family"]


# -------------------------------------------------------------------------------- report ----

def _rounds(meta: dict) -> list[tuple[int, int]]:
    reps = meta["repeats"]
    return [(s, reps[min(i, len(reps) - 1)]) for i, s in enumerate(meta["steps"])]


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _db(x) -> str:
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
        f"Workload: the pack's tiny Flux trained on 8x8 digits (Tiny Digits Model node), one image per class "
        f"(batch {len(meta['digits'])}), {meta['sampler']}/{meta['scheduler']}, cfg {meta['cfg']:g}, seed "
        f"{meta['seed']}. **Work** = transformer-block executions counted on the model, relative to the "
        f"uncached run (whole-forward skips run no block). **Speedup** = wall-clock sampling time of the uncached "
        f"run / this run (baseline and method runs alternated, each method run against the mean of the baseline "
        f"runs around it; median over " + ", ".join(f"{r} at {s} steps" for s, r in _rounds(meta)) + " rounds). "
        f"PSNR/SSIM of "
        f"the decoded images against the uncached run; k-NN = share of digits a k-NN on sklearn's digits "
        f"recognises as the prompted class (uncached: "
        + ", ".join(f"{s} steps {_pct(w['baseline']['knn_accuracy'])}" for s, w in results["digits"].items())
        + ").",
        "",
    ]
    for steps, w in results["digits"].items():
        lines += [f"## Best work reduction at a PSNR target, {steps} steps", "",
                  "Largest share of block work saved by any swept setting whose output stays at or above the "
                  "PSNR (dB). *vs EasyCache / LazyCache*: over every PSNR level 30, 31, ..., 45 dB, at how many "
                  "levels the method saves more / the same / less than ComfyUI's node; **beats** = never less "
                  "and more at least once.", ""]
        lines += targets_table(results, steps)
        lines.append("")
    lines += ["## Overhead when nothing is skipped", ""]
    lines += overhead_table(results)
    lines.append("")
    lines += tiny_overhead_table(results)
    for steps, w in results["digits"].items():
        b = w["baseline"]
        lines += [f"## Full sweep, {steps} steps", "",
                  f"Uncached: {b['seconds']:.2f} s per run, {b['forwards']} forwards, {b['blocks']} block executions, "
                  f"k-NN {_pct(b['knn_accuracy'])}.", ""]
        lines += sweep_table(w["rows"])
        lines.append("")
    if results.get("skipped"):
        lines += ["## Found but not benchmarked", ""]
        lines += [f"* `{s['node']}`: {s['why']}" for s in results["skipped"]]
        lines.append("")
    return "\n".join(lines)


def targets_table(results: dict, steps: str) -> list[str]:
    w = results["digits"][steps]
    targets, versus = w["targets"], w["versus"]
    peers = sorted({p for v in versus.values() for p in v})
    head = "| Method | " + " | ".join(f">= {t:g} dB" for t in TARGETS) + "".join(f" | vs {p}" for p in peers) + " |"
    lines = [head, "|" + "---|" * (1 + len(TARGETS) + len(peers))]
    settings = w.get("target_settings", {})
    for method, t in targets.items():
        where = settings.get(method, {})
        cells = [_pct(t[f"{x:g}"]) + (f" ({where[f'{x:g}']:g})" if where.get(f"{x:g}") is not None else "")
                 for x in TARGETS]
        for p in peers:
            v = versus.get(method, {}).get(p)
            cells.append("-" if v is None else (f"**beats** ({v['better']}/{v['equal']}/{v['worse']})" if v["beats"]
                                                else f"{v['better']}/{v['equal']}/{v['worse']}"))
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines


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
             f"CPU time the method adds around the transformer blocks (the blocks do the same work in both runs, so "
             f"their timing noise is taken out), as a share of the uncached run: median over {o['repeats']} rounds, "
             f"baseline and method runs alternated. *Total CPU* = the plain difference of the runs' CPU times, "
             f"which the machine's other load moves by a few percent either way.",
             "", "| Method | Setting | Overhead | ms per step | Total CPU (noisy) | Output identical |",
             "|---|---|---|---|---|---|"]
    for r in o["rows"]:
        if r.get("error"):
            lines.append(f"| {r['method']} | {r['setting']} | error: {r['error']} | | | |")
            continue
        lines.append(f"| {r['method']} | {r['setting']} | {r['overhead_percent']:+.2f}% | "
                     f"{r['overhead_ms_per_step']:+.2f} | {r['total_cpu_overhead_percent']:+.1f}% | "
                     f"{'yes' if r['identical'] else 'no'} |")
    return lines


def tiny_overhead_table(results: dict) -> list[str]:
    """The same measure on the digits model, from the sweep's settings that skip nothing."""
    steps_list = list(results["digits"])
    per_method: dict[str, dict] = {}
    for steps in steps_list:
        for r in results["digits"][steps]["rows"]:
            if r.get("overhead_ms_per_step") is not None:
                per_method.setdefault(r["method"], {})[steps] = r
    if not per_method:
        return []
    base = {s: results["digits"][s]["baseline"]["seconds"] * 1000 / int(s) for s in steps_list}
    lines = ["On the digits model itself, where a step takes only "
             + ", ".join(f"{base[s]:.0f} ms ({s} steps)" for s in steps_list)
             + ", the same measure from the sweep's settings that skip nothing (one round, so rougher):", "",
             "| Method | " + " | ".join(f"{s} steps" for s in steps_list) + " |",
             "|---|" + "---|" * len(steps_list)]
    for method, by_steps in per_method.items():
        cells = [f"{by_steps[s]['overhead_ms_per_step']:+.2f} ms ({by_steps[s]['overhead_percent']:+.1f}%)"
                 if s in by_steps else "-" for s in steps_list]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines + [""]


def sweep_table(rows: list[dict]) -> list[str]:
    lines = ["| Method | Setting | Work | Forwards | Speedup (wall) | Speedup (CPU) | PSNR dB | SSIM | k-NN |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("error"):
            lines.append(f"| {r['method']} | {r['setting']} | error: {r['error']} | | | | | | |")
            continue
        lines.append(f"| {r['method']} | {r['setting']} | {_pct(r['work'])} | {_pct(r['forwards'])} | "
                     f"{r['speedup']:.2f}x | {r['cpu_speedup']:.2f}x | {_db(r['psnr'])} | {r['ssim']:.4f} | "
                     f"{_pct(r['knn_accuracy'])} |")
    return lines


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


# ---------------------------------------------------------------------------------- driver ----

def run_bench(config: Config, comfy=None, log: Callable[[str], None] = print) -> dict:
    started = time.perf_counter()
    if comfy is None:
        comfy = start_comfy(config.other_packs)
    torch.set_num_threads(1)
    bench = Bench(comfy, config, log)
    methods, skipped = discover(bench.nodes, config)
    bench.log(f"bench: {len(methods)} curves: " + ", ".join(m.label for m in methods))
    for s in skipped:
        bench.log(f"bench: not benchmarked: {s['node']} ({s['why']})")
    wl = digits_workload(config)
    digits: dict = {}
    for index, steps in enumerate(config.steps):
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
        repeats = config.repeats[min(index, len(config.repeats) - 1)]
        rows = bench.sweep(wl, points, steps, ref, repeats, on_row=lambda row: bench.log(
            f"[{steps} steps] {row['method']:<44} {row['setting']:<24} {_fmt_row(row)}"))
        rows += failed
        for row in failed:
            bench.log(f"[{steps} steps] {row['method']:<44} {row['setting']:<24} {_fmt_row(row)}")
        analysis = analyse(rows)
        digits[str(steps)] = {
            "baseline": {k: ref[k] for k in ("blocks", "forwards", "evaluations", "seconds", "knn_accuracy")},
            "rows": rows, **analysis}
    overhead = None
    if config.overhead:
        overhead = bench.overhead([dataclasses.replace(m, values=[m.zero] if m.zero is not None else m.values[:1])
                                   for m in methods if _overhead_curve(m, config)])
    import comfy_harness
    results = {
        "meta": {
            "command": "python3 tools/bench.py" + (" --quick" if config.quick else ""),
            "date": datetime.date.today().isoformat(),
            "platform": f"{platform.machine()} {platform.system()}, {os.cpu_count()} CPU cores",
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "comfyui": comfy_harness.comfyui_version(comfy.path),
            "pack_commit": _pack_commit(),
            "other_packs_loaded": list(getattr(comfy, "bench_other_packs", [])),
            "steps": list(config.steps), "cfg": config.cfg, "sampler": config.sampler,
            "scheduler": config.scheduler, "seed": config.seed, "digits": config.digits, "repeats": config.repeats,
            "taylorseer_orders": list(config.taylorseer), "curves": [m.label for m in methods],
            "targets_db": list(TARGETS), "versus_levels_db": list(VERSUS_LEVELS),
        },
        "digits": digits,
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
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "interceptors", "nodes", "comfy_adapter.py",
                                "__init__.py"], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + (" +local changes" if dirty else "")) if head else None


def _overhead_curve(m: Method, config: Config) -> bool:
    """Methods measured on the heavy model: every caching node, and TaylorSeer chained to one whole-model and
    one block-level node (what it adds when nothing is skipped is storing order + 1 values per step)."""
    if m.taylorseer is None:
        return True
    return not config.quick and m.key.split("+")[0] in OVERHEAD_TAYLORSEER_ON


def _fmt_row(row: dict) -> str:
    if row.get("error"):
        return f"ERROR {row['error']}"
    work = "n/a" if row["work"] is None else f"{row['work']:.2f}"
    return (f"work {work}  PSNR {_db(row['psnr']):>15}  SSIM {row['ssim']:.4f}  "
            f"speedup {row['speedup']:.2f}x  k-NN {_pct(row['knn_accuracy'])}")


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
    if plot:
        try:
            import bench_plot
            bench_plot.pareto(results, out / "pareto.png")
            results["meta"]["plot"] = "pareto.png"
        except Exception as e:  # the numbers matter more than the picture
            results["meta"]["plot_error"] = f"{type(e).__name__}: {e}"
    text = markdown(results)
    if results["meta"].get("plot"):
        text = text.replace("## Overhead", "![PSNR against block work](pareto.png)\n\n## Overhead", 1)
    (out / "results.md").write_text(text + "\n")
    (out / "results.json").write_text(json.dumps(_json_safe(results), indent=1, allow_nan=False) + "\n")


def parse_args(argv=None) -> Config:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a 1-2 minute run: 28 steps, 3 settings per method, "
                   "TaylorSeer order 1 only, one timing pair")
    p.add_argument("--steps", help="comma-separated step counts (default 28,50)")
    p.add_argument("--repeats", help="timing rounds (baseline and method runs alternated) per step count, "
                   "comma-separated; the last one applies to further step counts (default 1)")
    p.add_argument("--taylorseer", help="TaylorSeer orders to chain, comma-separated, '' for none (default 1,2)")
    p.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2",
                   help="override a sweep, e.g. fbcache=0,0.1,0.2 (keys: " + ", ".join(SWEEPS) + ")")
    p.add_argument("--extend", type=int, help="settings a sweep may add to reach below 30 dB PSNR (default 3; "
                   "0 with --quick)")
    p.add_argument("--only", help="comma-separated method keys to run (e.g. fbcache,easycache)")
    p.add_argument("--dbcache-presets", help="DBCache presets, comma-separated (default F1B1; known: "
                   + ", ".join(DBCACHE_PRESETS) + ")")
    p.add_argument("--seed", type=int)
    p.add_argument("--no-overhead", action="store_true", help="skip the heavy-model overhead workload")
    p.add_argument("--overhead-repeats", type=int, help="timing rounds on the heavy model (default 5)")
    p.add_argument("--overhead-steps", type=int, help="steps on the heavy model (default 8)")
    p.add_argument("--no-other-packs", action="store_true",
                   help="do not load the packs in ComfyUI's custom_nodes folder (peers such as TeaCache)")
    p.add_argument("--out", help="output folder (default bench/)")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--replot", metavar="RESULTS_JSON",
                   help="only rewrite results.md and the plot from an earlier results.json (into --out)")
    a = p.parse_args(argv)
    c = Config()
    c.replot = a.replot
    if a.quick:
        c.quick = True
        c.steps = [28]
        c.repeats = [1]
        c.taylorseer = [1]
        c.sweeps = {k: list(v) for k, v in QUICK_SWEEPS.items()}
        c.overhead_repeats = 2
        c.overhead_steps = 4
        c.dbcache_presets = ["F1B1"]
        c.extend = 0
    if a.extend is not None:
        c.extend = a.extend
    if a.steps is not None:
        c.steps = [int(s) for s in a.steps.split(",") if s.strip()]
    if a.repeats is not None:
        c.repeats = [int(r) for r in a.repeats.split(",") if r.strip()] or [1]
    if a.taylorseer is not None:
        c.taylorseer = [int(s) for s in a.taylorseer.split(",") if s.strip()]
    for item in a.sweep:
        key, _, values = item.partition("=")
        c.sweeps[key.strip()] = [_number(v) for v in values.split(",") if v.strip()]
    if a.only:
        c.only = [s.strip() for s in a.only.split(",") if s.strip()]
    if a.dbcache_presets is not None:
        c.dbcache_presets = [s.strip() for s in a.dbcache_presets.split(",") if s.strip()]
    if a.seed is not None:
        c.seed = a.seed
    if a.no_overhead:
        c.overhead = False
    if a.overhead_repeats is not None:
        c.overhead_repeats = a.overhead_repeats
    if a.overhead_steps is not None:
        c.overhead_steps = a.overhead_steps
    c.other_packs = not a.no_other_packs
    if a.out:
        c.out = a.out
    c.plot = not a.no_plot
    return c


def _number(text: str):
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        return float(text)


def main(argv=None) -> int:
    config = parse_args(argv)
    if config.replot:
        results = load_results(Path(config.replot))
        results["meta"].pop("plot", None)
        for w in results["digits"].values():
            w.update(analyse(w["rows"]))
        write_outputs(results, Path(config.out), config.plot)
        print(f"bench: rewrote {config.out}/results.md" + (", pareto.png" if results["meta"].get("plot") else ""))
        return 0
    results = run_bench(config)
    print()
    print(markdown(results))
    print(f"\nbench: wrote {config.out}/results.md, results.json" + (", pareto.png" if results["meta"].get("plot")
                                                                      else "")
          + f" in {results['meta']['seconds'] / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
