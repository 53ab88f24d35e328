"""Bench-only ComfyUI nodes: count the model work a run really does and capture its results (the nodes
shared with the tests, tools/devkit/work_nodes.py), keep a planned chain, and build a heavier random-weight Flux
for the overhead workload. Registered into ComfyUI by ``tools/bench/bench.py`` (never shipped to users).
"""
from __future__ import annotations

import torch

from ..devkit.work_nodes import CaptureLatent, CountWork, capture_node


def block_groups(model) -> dict[str, int]:
    """``{patches_replace["dit"] name: block count}`` of a ComfyUI Flux-like model, or of a Wan model (its
    ``blocks`` are hooked as "double_block")."""
    diffusion = model.model.diffusion_model
    groups = {}
    for name, attribute in (("double_block", "double_blocks"), ("single_block", "single_blocks")):
        blocks = getattr(diffusion, attribute, None)
        if isinstance(blocks, torch.nn.ModuleList) and len(blocks):
            groups[name] = len(blocks)
    blocks = getattr(diffusion, "blocks", None)
    if not groups and isinstance(blocks, torch.nn.ModuleList) and len(blocks):
        groups["double_block"] = len(blocks)
    return groups


class BenchCountWork(CountWork):
    """Counts the work of a run on the bench's Flux models (blocks found on the model)."""

    def groups(self, model, **inputs) -> dict[str, int]:
        return block_groups(model)


BenchCaptureText = capture_node("BenchCaptureText", "Stores a STRING output (e.g. MagCache Calibrate's ratios).",
                                "text", ("STRING", {"forceInput": True}), lambda text: text)
BenchCaptureChain = capture_node("BenchCaptureChain", "Stores an interceptor chain (e.g. Auto Calibrate's plan).",
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

        from ..support.tiny_models import init_weights
        digits_model = importlib.import_module(f"{_PACK}.nodes.demo_models.digits")
        config = dict(digits_model.DEFAULT_UNET_CONFIG)
        head = hidden_size // num_heads
        rope = [head - 2 * (3 * head // 8), 3 * head // 8, 3 * head // 8]
        config.update(hidden_size=hidden_size, num_heads=num_heads, depth=depth,
                      depth_single_blocks=depth_single_blocks, axes_dim=rope)
        model = digits_model.build_model(config, initialise=False)
        init_weights(model.model.diffusion_model, seed)
        return (model,)


_PACK = ""  # the pack's package name as ComfyUI imported it; set by register()

BENCH_NODES = {"BenchCountWork": BenchCountWork, "BenchCaptureLatent": CaptureLatent,
               "BenchCaptureText": BenchCaptureText, "BenchCaptureChain": BenchCaptureChain,
               "BenchChain": BenchChain, "BenchRandomFlux": BenchRandomFlux}


def register(nodes_module, pack_name: str) -> None:
    global _PACK
    _PACK = pack_name
    for name, cls in BENCH_NODES.items():
        nodes_module.NODE_CLASS_MAPPINGS[name] = cls
