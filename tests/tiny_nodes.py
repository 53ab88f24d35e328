"""Test-only nodes: load a tiny real-architecture model, its conditioning and latent, and capture results.

Registered into ComfyUI by the test harness (never shipped to users).
"""
from __future__ import annotations

import tiny_models

CAPTURED: dict = {}


class TinyModel:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"family": (list(tiny_models.FAMILIES),), "seed": ("INT", {"default": 0})}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "load"
    CATEGORY = "testing"

    def load(self, family, seed):
        return (tiny_models.build(family, seed),)


class TinyConditioning:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"family": (list(tiny_models.FAMILIES),), "seed": ("INT", {"default": 0}),
                             "length": ("INT", {"default": 4})}}

    RETURN_TYPES = ("CONDITIONING", "CONDITIONING")
    FUNCTION = "make"
    CATEGORY = "testing"

    def make(self, family, seed, length):
        return tiny_models.conditioning(family, batch=1, seed=seed, length=length)


class TinyLatent:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"family": (list(tiny_models.FAMILIES),), "batch": ("INT", {"default": 1}),
                             "seed": ("INT", {"default": -1, "min": -1})}}

    RETURN_TYPES = ("LATENT",)
    FUNCTION = "make"
    CATEGORY = "testing"

    def make(self, family, batch, seed):
        return (tiny_models.latent(family, batch=batch, seed=None if seed < 0 else seed),)


class CaptureLatent:
    """Stores the latent under ``key`` for the test to read; re-runs on every prompt."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"samples": ("LATENT",), "key": ("STRING", {"default": "out"})}}

    RETURN_TYPES = ()
    FUNCTION = "capture"
    OUTPUT_NODE = True
    CATEGORY = "testing"

    @classmethod
    def IS_CHANGED(cls, **kwargs):
        return float("nan")

    def capture(self, samples, key):
        CAPTURED[key] = samples["samples"].clone()
        return {}


TEST_NODES = {"TestTinyModel": TinyModel, "TestTinyConditioning": TinyConditioning, "TestTinyLatent": TinyLatent,
              "TestCaptureLatent": CaptureLatent}


class CountModelWork:
    """Counts real model work: diffusion-model forwards and transformer-block executions.

    Registered on the model before any interceptor, so block counters sit under the interceptors'
    replacements (which chain to them) and only see blocks that really ran.
    """

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "family": (list(tiny_models.FAMILIES),),
                             "key": ("STRING", {"default": "work"})}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "patch"
    CATEGORY = "testing"

    @classmethod
    def IS_CHANGED(cls, **kwargs):
        return float("nan")

    def patch(self, model, family, key):
        import comfy.patcher_extension
        counts = CAPTURED.setdefault(key, {"forwards": 0, "blocks": 0})
        counts["forwards"] = counts["blocks"] = 0
        m = model.clone()

        def count_forward(executor, *args, **kwargs):
            counts["forwards"] += 1
            return executor(*args, **kwargs)

        def count_block(args, extra):
            counts["blocks"] += 1
            return extra["original_block"](args)

        m.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, "test_count", count_forward)
        for name, n in tiny_models.block_groups(family).items():
            for i in range(n):
                m.set_model_patch_replace(count_block, "dit", name, i)
        return (m,)


TEST_NODES["TestCountModelWork"] = CountModelWork
