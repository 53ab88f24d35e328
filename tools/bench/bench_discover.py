"""The bench's methods: which caching nodes ComfyUI has loaded right now (the pack's, ComfyUI's own
EasyCache/LazyCache, other installed packs' such as TeaCache), each as a curve to sweep, and the bench's
settings (``Config``)."""
from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import re
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]

PACK_PREFIX = "CachedSampler"
CHAIN_TYPE = "CACHED_SAMPLER_CHAIN"
TAYLORSEER = "CachedSamplerTaylorSeer"
CORE_PEERS = ("EasyCache", "LazyCache")
# Node ids of other installed packs that look like caching methods (TeaCache, MagCache, WaveSpeed's FBCache...).
PEER_PATTERNS = ("teacache", "magcache", "fbcache", "firstblockcache", "applyfbcacheonmodel", "taylorseer",
                 "easycache", "lazycache", "dbcache", "blockcache", "cachedit", "spectrum")
# The pack's Spectrum Forecast: an estimator like TaylorSeer, chained (at its defaults) after each pack decider.
SPECTRUM = "CachedSamplerSpectrum"
# Other packs' Spectrum-style compute schedules (the Spectrum reference's inputs, kept by its ComfyUI ports such as
# judian17/ComfyUI-Spectrum's "Spectrum" and xmarre/ComfyUI-Spectrum-Proper's "SpectrumApplyFlux"): compute the
# first warmup_steps steps, then every int(window_size)-th step, the window growing by flex_window after each
# computed step. A peer without a threshold input but with window_size and flex_window is swept over this grid
# (every combination; "schedule.<input>=V1,V2" overrides one input's values); window_size 1 with flex_window 0
# computes every step (the curve's anchor), None keeps the node's default.
SCHEDULE_GRID: dict[str, list] = {
    "warmup_steps": [None, 1, 2],
    "window_size": [1.0, 2.0, 3.0],
    "flex_window": [0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0],
    "tail_actual_steps": [None, 0],  # xmarre's port: the last steps always computed (default 3)
}
SCHEDULE_OFF = {"window_size": 1.0, "flex_window": 0.0}
# The Guidance Cache chained after the growing cadence + TaylorSeer o1: the negative branch left out of every
# other computed step in the last 40% of the schedule. Chosen on the video model's seeds 1-5, not the bench's
# seed 0 (tools/studies/guidance_on_cadence.py, bench/guidance_on_cadence.md).
GUIDANCE = "CachedSamplerGuidanceCache"
GUIDANCE_ON_CADENCE = {"interval": 2, "mode": "cadence", "start_percent": 0.6}


def _method_specs() -> tuple:
    """The pack's config nodes as its methods declare them (interceptors/methods/)."""
    from ..devkit.pack import load
    return load("interceptors.methods").SPECS


# Sweeps per method key: each pack method's from its declaration, then the bench's own curves (MagCache on a
# calibrated curve, Auto Calibrate's targets, ComfyUI's EasyCache and LazyCache). The first value turns caching
# off (bit-identical output): it anchors each curve.
SWEEPS: dict[str, list] = {
    **{spec.sweep.key: list(spec.sweep.values) for spec in _method_specs() if spec.sweep},
    "magcache_calibrated": [0.0, 0.01, 0.02, 0.04, 0.06],
    # as dense as the other methods' sweeps: a target between the floors can meet the next floor with less work
    # (at 28 steps on the digits model the 37.5 dB plan computes 6 steps and reads 40.15 dB at the bench's seed)
    "autocalibrate": [30.0, 32.5, 35.0, 37.5, 40.0, 42.5, 45.0, 47.5],
    "easycache": [0.0, 0.005, 0.01, 0.02],
    "easycache_copy": [0.0, 0.005, 0.01, 0.02, 0.04, 0.07, 0.1, 0.2],
    "lazycache": [0.0, 0.005, 0.01, 0.02, 0.04],
}
QUICK_SWEEPS: dict[str, list] = {
    **{spec.sweep.key: list(spec.sweep.quick) for spec in _method_specs() if spec.sweep and spec.sweep.quick},
    "magcache_calibrated": [0.0, 0.02, 0.06],
    "easycache": [0.0, 0.01, 0.04],
    "easycache_copy": [0.0, 0.01, 0.04],
    "lazycache": [0.0, 0.01, 0.04],
    "autocalibrate": [35.0],
    "schedule.warmup_steps": [None],
    "schedule.window_size": [1.0, 2.0],
    "schedule.flex_window": [0.0, 0.75, 2.0],
}
# Pack nodes with a known role (their sweep's key); any other pack config node with a 'threshold' or 'interval'
# input is benchmarked too (sweeping that input around its default).
PACK_KEYS = {"CachedSamplerAutoCalibrate": "autocalibrate",
             **{PACK_PREFIX + spec.name: spec.sweep.key for spec in _method_specs() if spec.sweep}}
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


@dataclasses.dataclass
class Config:
    steps: list = dataclasses.field(default_factory=lambda: [28, 50])
    cfg: float = 3.0
    sampler: str = "euler"
    scheduler: str = "simple"
    seed: int = 0
    seeds: int = 1                       # seeds seed, seed + 1, ...: each reduction read as median and worst over them
    # the uncached sampler at fewer steps with ComfyUI's multistep samplers too (one model evaluation a step, as euler)
    fewer_steps_samplers: list = dataclasses.field(default_factory=lambda: ["dpmpp_2m", "uni_pc", "deis"])
    digits: str = "0123456789"
    model: str = "digits"                # "digits" (the tiny Flux), "video" (the tiny Wan 2.1) or "photos" (Flux)
    classes: str = "01234567"            # the video or photos model's classes, one video or picture each
    repeats: list = dataclasses.field(default_factory=lambda: [1])  # timing rounds per step count (last repeats)
    taylorseer: list = dataclasses.field(default_factory=lambda: [1, 2])
    spectrum: bool = True                # also chain the pack's Spectrum Forecast after each pack decider
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
    device: str = "cpu"                  # "cuda": ComfyUI samples on the GPU; runs timed with CUDA events
    out: str | None = str(ROOT / "bench")
    plot: bool = True
    quick: bool = False
    verbose: bool = True
    replot: str | None = None
    merge: list | None = None            # results.json of one command's runs at other seeds, to join into one
    extend: int = 3                      # settings a sweep may add to reach below EXTEND_BELOW_DB
    command: str | None = None           # the command line recorded in the results (None: from the settings)
    # the levels measured of every node with a 'level' input (a whole-model method's: "model", "features")
    levels: list = dataclasses.field(default_factory=lambda: ["model"])


@dataclasses.dataclass
class Method:
    """One curve: a caching node (plus TaylorSeer) swept over one input."""

    key: str
    label: str
    family: str
    source: str
    node: str | None                     # node id; None for the uncached baseline
    param: str | None                    # the swept input ("schedule": each value a dict of several inputs)
    values: list
    fixed: dict = dataclasses.field(default_factory=dict)
    taylorseer: int | None = None
    kind: str = "chain"                  # "chain" (pack: Cached Sampler + chain), "model" (MODEL -> MODEL patch)
                                         # or "planned" (a planning node's chain, made once per setting)
    zero: object = None                  # the value that turns caching off, if known
    copy_input: bool = False             # hand the diffusion model a copy of its input (see BenchCountWork)
    param_max: float | None = None       # the swept input's maximum, as the node declares it
    calibrate: str | None = None         # node that records this method's model curve first (MagCache Calibrate)
    estimator: tuple | None = None       # (node id, inputs) of a pack estimator other than TaylorSeer, chained after
                                         # the decider (Spectrum Forecast)
    guidance: dict | None = None         # inputs of a Guidance Cache chained last, after the estimator

    @property
    def skips_nothing(self):
        """The setting at which the method skips nothing (the overhead's), or None where it has none."""
        return self.zero if self.zero is not None else (self.values[0] if self.values else None)

    def describe(self, value) -> str:
        if self.param is None:
            return "defaults"
        if isinstance(value, dict):
            return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in value.items())
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


def start_comfy(other_packs: bool = True, device: str = "cpu"):
    """A headless ComfyUI (devkit.comfy_harness.start) on ``device`` with the bench nodes and, optionally, the
    caching packs installed in that ComfyUI's own custom_nodes folder."""
    from ..devkit.comfy_harness import start
    quiet = _Quiet()
    root = logging.getLogger()
    root.addFilter(quiet)  # ComfyUI logs import failures on the root logger
    try:
        comfy = start(cpu=device == "cpu")
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
        if entry.is_dir() and any((entry / "nodes" / f).exists() for f in ("demo_models", "digits_model.py")):
            continue  # another copy of this pack (or an older one)
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


def return_types(cls) -> tuple:
    return tuple(getattr(cls, "RETURN_TYPES", ()) or ())


def widget_defaults(cls, skip=(), prefer: str | None = None) -> tuple[dict, list[str]]:
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


def schedule_grid(cls, knobs: list[str], config: Config) -> list[dict]:
    """A Spectrum-style peer's settings (see SCHEDULE_GRID): first the one that computes every step, then every
    other combination of the grid's values within the node's ranges."""
    inputs = _inputs(cls)

    def cast(k, v):
        spec = inputs[k][1]
        return int(v) if spec[0] == "INT" else float(v)

    axes = {}
    for k in knobs:
        spec = inputs[k][1]
        options = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
        lo, hi = options.get("min", -math.inf), options.get("max", math.inf)
        values = [cast(k, _default(spec) if v is None else v)
                  for v in config.sweeps.get(f"schedule.{k}", SCHEDULE_GRID[k])]
        axes[k] = list(dict.fromkeys(v for v in values if lo <= v <= hi)) or [cast(k, _default(spec))]
    off = {k: cast(k, SCHEDULE_OFF[k]) if k in SCHEDULE_OFF else values[0] for k, values in axes.items()}
    grid = [off]
    for combo in itertools.product(*axes.values()):
        setting = dict(zip(axes, combo))
        if any(setting[k] != off[k] for k in SCHEDULE_OFF):  # the rest compute every step: the anchor already
            grid.append(setting)
    return grid


def growing_grid(config: Config) -> list[dict]:
    """Fixed Cadence's growing schedule swept as the Spectrum ports are (SCHEDULE_GRID's window_size as
    ``interval``, its flex_window as ``growth``): first interval 1 without growth (every step computed). The
    sweeps ``growing.warmup_steps`` and ``growing.last_step`` add those inputs to every setting (Spectrum's
    schedule: warmup_steps 3, growth 1, last_step forecast); without them the node's defaults apply."""
    windows = config.sweeps.get("schedule.window_size", SCHEDULE_GRID["window_size"])
    growths = config.sweeps.get("schedule.flex_window", SCHEDULE_GRID["flex_window"])
    warmups = config.sweeps.get("growing.warmup_steps", [None])
    last_steps = config.sweeps.get("growing.last_step", [None])
    grid = [{"interval": 1, "growth": 0.0}]
    for window, growth, warmup, last_step in itertools.product(windows, growths, warmups, last_steps):
        setting = {"interval": max(1, int(window)), "growth": float(growth),
                   **({"warmup_steps": int(warmup)} if warmup is not None else {}),
                   **({"last_step": str(last_step)} if last_step is not None else {})}
        if setting not in grid:
            grid.append(setting)
    return grid


def discover(nodes_module, config: Config) -> tuple[list[Method], list[dict]]:
    """The methods to benchmark, from the node ids ComfyUI has loaded right now; and what was found
    but cannot be benchmarked (with why)."""
    mappings = nodes_module.NODE_CLASS_MAPPINGS
    names = nodes_module.NODE_DISPLAY_NAME_MAPPINGS
    methods: list[Method] = []
    skipped: list[dict] = []
    has_ts = TAYLORSEER in mappings
    spectrum = None
    if SPECTRUM in mappings and config.spectrum:
        spectrum = (SPECTRUM, widget_defaults(mappings[SPECTRUM])[0])

    def sweep(key, cls, param):
        if key in config.sweeps:
            return list(config.sweeps[key])
        return _sweep_for(cls, param, config.quick)

    def add_with_taylorseer(m: Method):
        """``m`` at each level measured (a node without a 'level' input: as it is), each with its estimators."""
        if "level" not in _inputs(mappings[m.node]):
            return add_at_level(m)
        for level in config.levels:
            add_at_level(m if level == "model" else dataclasses.replace(
                m, key=f"{m.key}@{level}", label=f"{m.label} at level {level}", fixed={**m.fixed, "level": level}))

    def add_at_level(m: Method):
        methods.append(m)
        if not has_ts:
            return
        for order in config.taylorseer:
            values = [v for v in m.values if v != m.zero] or list(m.values)
            methods.append(dataclasses.replace(m, key=f"{m.key}+ts{order}", label=f"{m.label} + TaylorSeer o{order}",
                                               values=values, taylorseer=order))
        if spectrum is not None:
            values = [v for v in m.values if v != m.zero] or list(m.values)
            methods.append(dataclasses.replace(m, key=f"{m.key}+spectrum",
                                               label=f"{m.label} + {names.get(SPECTRUM, SPECTRUM)}", values=values,
                                               estimator=spectrum))

    for node_id in sorted(mappings):
        cls = mappings[node_id]
        if (not node_id.startswith(PACK_PREFIX) or node_id in (TAYLORSEER, SPECTRUM)
                or CHAIN_TYPE not in return_types(cls)):
            continue
        inputs = _inputs(cls)
        param = "interval" if "interval" in inputs else "threshold" if "threshold" in inputs else None
        if node_id in CALIBRATORS:
            continue
        if node_id in PLANNERS:
            param, extra = PLANNERS[node_id]
            key = PACK_KEYS.get(node_id, node_id[len(PACK_PREFIX):].lower())
            fixed, links = widget_defaults(cls, skip=(param,))
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
        fixed, links = widget_defaults(cls, skip=(param,))
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
        if key == "fixed_cadence" and "growth" in inputs:  # Spectrum's growing schedule, on the peers' grid
            values = growing_grid(config)
            fixed, _ = widget_defaults(cls, skip=("interval", "growth"))
            name = f"{label} (growing)"
            add_with_taylorseer(Method("fixed_cadence_growing", name, name, "pack", node_id, "schedule", values,
                                       fixed, zero=values[0]))
            if has_ts and 1 in config.taylorseer and GUIDANCE in mappings:
                guidance, _ = widget_defaults(mappings[GUIDANCE])
                guidance.update(GUIDANCE_ON_CADENCE)
                gname = (f"{name} + TaylorSeer o1 + {names.get(GUIDANCE, GUIDANCE)} "
                         f"{GUIDANCE_ON_CADENCE['interval']} from {GUIDANCE_ON_CADENCE['start_percent']:g}")
                methods.append(Method("fixed_cadence_growing+ts1+guidance", gname, gname, "pack", node_id,
                                      "schedule", values[1:], fixed, taylorseer=1, zero=values[0],
                                      guidance=guidance))
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
        fixed, _ = widget_defaults(cls, skip=("reuse_threshold",))
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
        if "model" not in inputs or "MODEL" not in return_types(cls)[:1]:
            skipped.append({"node": node_id, "source": source, "why": "not a MODEL -> MODEL patch"})
            continue
        params = [n for n, (_, s) in inputs.items() if s[0] == "FLOAT" and "thresh" in n.lower()]
        param = params[0] if params else None
        knobs = [k for k in SCHEDULE_GRID if k in inputs]
        schedule = param is None and all(k in knobs for k in SCHEDULE_OFF)
        fixed, links = widget_defaults(cls, skip=(param, "model", *(knobs if schedule else ())), prefer="flux")
        links = [n for n in links if n != "model"]  # the bench's models are Flux: "flux" preferred in lists
        if links:
            skipped.append({"node": node_id, "source": source, "why": f"needs linked inputs {links}"})
            continue
        label = f"{names.get(node_id, node_id)} ({source})"
        if schedule:
            values = schedule_grid(cls, knobs, config)
            methods.append(Method(f"peer:{node_id}", label, node_id, source, node_id, "schedule", values, fixed,
                                  kind="model", zero=values[0]))
            continue
        values = sweep(node_id.lower(), cls, param) if param else [None]
        methods.append(Method(f"peer:{node_id}", label, node_id, source,
                              node_id, param, values, fixed, kind="model", zero=0.0 if param else None))

    for m in methods:
        spec = _inputs(mappings[m.node]).get(m.param) if m.param else None
        if spec is not None and len(spec[1]) > 1 and isinstance(spec[1][1], dict):
            m.param_max = spec[1][1].get("max")
    if config.only:
        wanted = set(config.only)
        # a key names its method at every level measured ("fixed_cadence+ts1": "fixed_cadence@features+ts1" too)
        names = (lambda key: {key, key.split("+")[0]})
        methods = [m for m in methods if (names(m.key) | names(re.sub(r"@\w+", "", m.key))) & wanted]
    return methods, skipped
