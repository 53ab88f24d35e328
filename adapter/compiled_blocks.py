"""Block caching on a model compiled by TorchCompileModel: the transformer blocks compiled one by one (regional
compilation), the diffusion model's own loop and the pack's decisions between the blocks left to Python.

TorchCompileModel (``comfy_api.torch_helpers.set_torch_compile_wrapper``) compiles the whole diffusion model: the
block replacements the pack serves through ``patches_replace`` would run inside that graph, whose guards skip
transformer_options, so the per-step decisions would be traced once and then frozen. Compiled block by block, each
block is a graph the pack either calls or passes by, as cache-dit compiles FLUX's blocks; the graphs do not depend
on the decisions, so they compile once. The user's compile settings (backend, mode, options) are kept; only the
regions change, on the pack's own clone of the model.
"""
from __future__ import annotations

import importlib

from comfy.patcher_extension import WrappersMP

from ..interceptors import Granularity, InterceptorChain, ModelCard
from .conflicts import COMPILE_OPTIONS_KEY, COMPILE_WRAPPER_KEY, compiled

REGIONAL_KEY = "cached_sampler_compiled_blocks"  # model_options: the compile wrapper the pack installed


def _helpers():
    try:
        return importlib.import_module("comfy_api.torch_helpers")
    except ImportError:  # a ComfyUI without the helper has no TorchCompileModel of this kind either
        return None


def block_keys(card: ModelCard) -> list[str]:
    """The model object of every transformer block the card knows, as ``set_torch_compile_wrapper`` names them."""
    return [f"diffusion_model.{group.attribute}.{i}" for group in card.groups for i in range(group.count)]


def will_compile_blocks(chain: InterceptorChain, card: ModelCard, model) -> bool:
    """Whether the chain caches inside the blocks of a whole compiled model whose blocks the pack can compile apart."""
    return (compiled(model.model_options, model.wrappers) and chain.decider(Granularity.BLOCKS) is not None
            and Granularity.BLOCKS in card.levels and bool(block_keys(card)) and _helpers() is not None)


def compile_blocks(patched, card: ModelCard) -> None:
    """Replace ``patched``'s (the pack's clone) whole-model compile by one compile per block, with the same settings."""
    settings = dict(patched.model_options.get(COMPILE_OPTIONS_KEY) or {})
    _helpers().set_torch_compile_wrapper(patched, keys=block_keys(card), **settings)
    patched.model_options[REGIONAL_KEY] = patched.get_wrappers(WrappersMP.APPLY_MODEL, COMPILE_WRAPPER_KEY)[-1]


def blocks_compiled_apart(model_options: dict, wrappers: dict) -> bool:
    """Whether the compile wrapper on the model is the pack's block-by-block one (a TorchCompileModel applied after
    the pack would have replaced it by a whole-model one)."""
    ours = model_options.get(REGIONAL_KEY)
    if ours is None:
        return False
    found = [w for source in ((wrappers or {}).get(WrappersMP.APPLY_MODEL, {}),
                              model_options.get("transformer_options", {}).get("wrappers", {}).get(WrappersMP.APPLY_MODEL, {}))
             for w in (source or {}).get(COMPILE_WRAPPER_KEY, [])]
    return bool(found) and all(w is ours for w in found)
