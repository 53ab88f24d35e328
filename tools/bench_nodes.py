"""Bench-only ComfyUI nodes: count the model work a run really does, time it, capture its latent,
and build a heavier random-weight Flux for the overhead workload.

Registered into ComfyUI by ``tools/bench.py`` (never shipped to users). The counting node clones the
model and registers its hooks *before* any caching method sees the model, so:

* its ``patches_replace["dit"]`` block counters sit under the pack's block replacements, which chain
  to them and only call them for blocks that really run; whole-forward skips (the pack's Adaptive
  Cache and Fixed Cadence, ComfyUI's EasyCache/LazyCache) run no block at all;
* its ``OUTER_SAMPLE`` wrapper is the outermost one and times the whole sampling run; the block counters
  also time the blocks themselves, so the time spent around them (sampler, embedders, every hook) is
  known separately.
"""
from __future__ import annotations

import time

import torch

RECORDS: dict = {}
CAPTURED: dict = {}


def block_groups(model) -> dict[str, int]:
    """``{patches_replace["dit"] name: block count}`` of a ComfyUI Flux-like model."""
    diffusion = model.model.diffusion_model
    groups = {}
    for name, attribute in (("double_block", "double_blocks"), ("single_block", "single_blocks")):
        blocks = getattr(diffusion, attribute, None)
        if isinstance(blocks, torch.nn.ModuleList) and len(blocks):
            groups[name] = len(blocks)
    return groups


class BenchCountWork:
    """Counts real model work (block executions, forwards that ran, sampler evaluations) and times
    the sampling run; re-runs on every prompt so every run starts from zero."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "key": ("STRING", {"default": "work"})},
                "optional": {"copy_input": ("BOOLEAN", {"default": False})}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "patch"
    CATEGORY = "testing"

    @classmethod
    def IS_CHANGED(cls, **kwargs):
        return float("nan")

    def patch(self, model, key, copy_input=False):
        from comfy.patcher_extension import WrappersMP

        record = {"blocks": 0, "block_rows": 0, "forwards": 0, "evaluations": 0, "runs": 0, "seconds": 0.0,
                  "cpu_seconds": 0.0, "block_seconds": 0.0, "block_cpu_seconds": 0.0}
        RECORDS[key] = record
        m = model.clone()
        groups = block_groups(m)
        first = next(iter(groups), None)

        def timed_sample(executor, *args, **kwargs):
            started, cpu_started = time.perf_counter(), time.process_time()
            try:
                return executor(*args, **kwargs)
            finally:
                record["seconds"] += time.perf_counter() - started
                record["cpu_seconds"] += time.process_time() - cpu_started
                record["runs"] += 1

        def count_evaluation(executor, *args, **kwargs):
            record["evaluations"] += 1
            return executor(*args, **kwargs)

        def counter(is_first):
            def count_block(args, extra):
                record["blocks"] += 1
                record["block_rows"] += args["img"].shape[0]  # the work metric: block executions x batch rows
                if is_first:
                    record["forwards"] += 1
                started, cpu_started = time.perf_counter(), time.process_time()
                try:
                    return extra["original_block"](args)
                finally:  # time in the block itself: what remains of a run is everything around the blocks
                    record["block_seconds"] += time.perf_counter() - started
                    record["block_cpu_seconds"] += time.process_time() - cpu_started
            return count_block

        def copied_input(executor, x, *args, **kwargs):
            # Hands the diffusion model a copy of its input, as a cast to a reduced-precision model dtype
            # does; for peers that write into the input in place (see the README, "Measured results").
            return executor(x.clone(), *args, **kwargs)

        m.add_wrapper_with_key(WrappersMP.OUTER_SAMPLE, "bench_work", timed_sample)
        if copy_input:
            m.add_wrapper_with_key(WrappersMP.DIFFUSION_MODEL, "bench_work", copied_input)
        m.add_wrapper_with_key(WrappersMP.PREDICT_NOISE, "bench_work", count_evaluation)
        for name, n in groups.items():
            for i in range(n):
                m.set_model_patch_replace(counter(name == first and i == 0), "dit", name, i)
        return (m,)


def _capture_node(name: str, doc: str, input_name: str, spec: tuple, keep) -> type:
    """An output node that stores ``keep(value)`` under its ``key`` input on every prompt (never cached)."""

    def capture(self, key, **inputs):
        CAPTURED[key] = keep(inputs[input_name])
        return {}

    return type(name, (), {
        "__doc__": doc,
        "INPUT_TYPES": classmethod(lambda cls: {"required": {input_name: spec, "key": ("STRING", {"default": input_name})}}),
        "RETURN_TYPES": (), "FUNCTION": "capture", "OUTPUT_NODE": True, "CATEGORY": "testing",
        "IS_CHANGED": classmethod(lambda cls, **kwargs: float("nan")),
        "capture": capture,
    })


BenchCaptureLatent = _capture_node("BenchCaptureLatent", "Stores the latent under ``key``.", "samples", ("LATENT",),
                                   lambda latent: latent["samples"].detach().clone())
BenchCaptureText = _capture_node("BenchCaptureText", "Stores a STRING output (e.g. MagCache Calibrate's ratios).",
                                 "text", ("STRING", {"forceInput": True}), lambda text: text)
BenchCaptureChain = _capture_node("BenchCaptureChain", "Stores an interceptor chain (e.g. Auto Calibrate's plan).",
                                  "chain", ("CACHED_SAMPLER_CHAIN",), lambda chain: chain)


class BenchChain:
    """Outputs the chain stored under ``key`` by BenchCaptureChain (a plan made once, measured many times)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"key": ("STRING", {"default": "chain"})}}

    RETURN_TYPES = ("CACHED_SAMPLER_CHAIN",)
    FUNCTION = "load"
    CATEGORY = "testing"

    def load(self, key):
        return (CHAINS[key],)


CHAINS: dict = {}


class BenchRandomFlux:
    """A random-weight Flux built through ComfyUI's classes (the digits model's config class, so the
    same conditioning works), large enough that the transformer forward dominates a step."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"hidden_size": ("INT", {"default": 256, "min": 64, "max": 4096}),
                             "num_heads": ("INT", {"default": 4, "min": 1, "max": 64}),
                             "depth": ("INT", {"default": 2, "min": 1, "max": 64}),
                             "depth_single_blocks": ("INT", {"default": 4, "min": 0, "max": 128}),
                             "seed": ("INT", {"default": 0})}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "build"
    CATEGORY = "testing"

    def build(self, hidden_size, num_heads, depth, depth_single_blocks, seed):
        import importlib

        from tiny_models import init_weights
        digits_model = importlib.import_module(f"{_PACK}.nodes.digits_model")
        config = dict(digits_model.DEFAULT_UNET_CONFIG)
        head = hidden_size // num_heads
        rope = [head - 2 * (3 * head // 8), 3 * head // 8, 3 * head // 8]
        config.update(hidden_size=hidden_size, num_heads=num_heads, depth=depth,
                      depth_single_blocks=depth_single_blocks, axes_dim=rope)
        model = digits_model.build_model(config, initialise=False)
        init_weights(model.model.diffusion_model, seed)
        return (model,)


_PACK = ""  # the pack's package name as ComfyUI imported it; set by register()

BENCH_NODES = {"BenchCountWork": BenchCountWork, "BenchCaptureLatent": BenchCaptureLatent,
               "BenchCaptureText": BenchCaptureText, "BenchCaptureChain": BenchCaptureChain,
               "BenchChain": BenchChain, "BenchRandomFlux": BenchRandomFlux}


def register(nodes_module, pack_name: str) -> None:
    global _PACK
    _PACK = pack_name
    for name, cls in BENCH_NODES.items():
        nodes_module.NODE_CLASS_MAPPINGS[name] = cls
