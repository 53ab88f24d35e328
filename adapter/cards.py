"""Model cards from a loaded ComfyUI model (its classes and the blocks it really has), and the signal probes that
read a method's signal off the model's first block."""
from __future__ import annotations

import dataclasses
import os
from typing import Callable

import torch

from ..interceptors import ChainError, DiffusionFacts, ModelCard, build_card
from ..interceptors.cards import runs_blocks


def model_card(model) -> ModelCard:
    """The card of a ComfyUI ModelPatcher, from its classes and the blocks it really has."""
    base = model.model
    mro = tuple(c.__name__ for c in type(base).__mro__)
    config = getattr(base, "model_config", None)
    config_mro = tuple(c.__name__ for c in type(config).__mro__ if c is not object) if config is not None else ()
    settings = {k: v for k, v in (getattr(config, "unet_config", None) or {}).items()
                if isinstance(v, (bool, int, float, str)) or v is None}
    sampling = model.get_model_object("model_sampling")
    sampling_classes = tuple(c.__name__ for c in type(sampling).__mro__)
    diffusion = getattr(base, "diffusion_model", None)
    counts = {}
    if diffusion is not None:
        for name, child in diffusion.named_children():
            if isinstance(child, torch.nn.ModuleList):
                counts[name] = len(child)
    return build_card(mro, config_mro, sampling_classes, counts, diffusion=diffusion_facts(diffusion),
                      config_settings=settings, file_name=loaded_file_name(model), signals=SIGNAL_PROBES)


def loaded_file_name(model) -> str:
    """The file name of the checkpoint a core loader loaded ``model`` from, where the running ComfyUI records it
    (``ModelPatcher.cached_patcher_init``: the loader and its arguments, the path first), else ""."""
    init = getattr(model, "cached_patcher_init", None)
    args = init[1] if isinstance(init, tuple) and len(init) > 1 and isinstance(init[1], tuple) else ()
    return os.path.basename(args[0]) if args and isinstance(args[0], str) else ""


def diffusion_facts(diffusion) -> DiffusionFacts | None:
    """The names the card rule needs about a diffusion model: its classes (up to torch's Module) and which of
    them define a method that may run the transformer blocks."""
    if diffusion is None:
        return None
    classes = [c for c in type(diffusion).__mro__ if c not in (torch.nn.Module, object)
               and not c.__module__.startswith(("torch.", "abc"))]
    runners = tuple((name, c.__name__) for c in classes for name, value in vars(c).items()
                    if callable(value) and runs_blocks(name))
    return DiffusionFacts(tuple(c.__name__ for c in classes), runners)


def _flux_like_modules(first) -> tuple[str, ...]:
    # Chroma's blocks take their modulation as an argument (``modulation`` False) and have no img_mod
    return ("img_norm1",) if getattr(first, "modulation", True) is False else ("img_mod", "img_norm1")


def _flux_like(first):
    from comfy.ldm.flux.layers import apply_mod

    def modulated(args):
        vec = args["vec"]
        mod = first.img_mod(vec)[0] if getattr(first, "modulation", True) else vec[0][0]
        return apply_mod(first.img_norm1(args["img"]), 1 + mod.scale, mod.shift, args.get("modulation_dims_img"))
    return modulated


def _ltxv(first):
    from comfy.ldm.common_dit import rms_norm

    def modulated(args):
        x, t = args["img"], args["vec"]
        table = first.scale_shift_table
        shift, scale = (table[None, None].to(x) + t.reshape(x.shape[0], t.shape[1], table.shape[0], -1)).unbind(2)[:2]
        normed = rms_norm(x)
        return normed + normed * scale + shift
    return modulated


def _wan(first):
    # e0, the projected timestep embedding TeaCache's Wan fit uses; a copy, as deciders may keep a signal as it is
    return lambda args: args["vec"].clone()


@dataclasses.dataclass(frozen=True)
class Probe:
    """How one family's signal is read off its first block: ``modules(block)`` names the block's modules it
    uses (checked when a chain is installed), ``make(block)`` gives the function computing the signal from the
    arguments the model hands the block (before the block runs and changes them)."""

    modules: Callable[[object], tuple[str, ...]]
    make: Callable[[object], Callable[[dict], torch.Tensor]]


FLUX_LIKE = Probe(_flux_like_modules, _flux_like)
# Decider signal -> model family -> its probe: the one place that says which family offers which signal beyond
# those the engine makes itself. The cards offer exactly these (ModelCard.signals), so a method needing one is
# refused before sampling on any other family. ComfyUI internals, not an extension point.
SIGNAL_PROBES: dict[str, dict[str, Probe]] = {
    "modulated_input": {  # TeaCache's: block 0's timestep-modulated input
        "flux": FLUX_LIKE, "chroma": FLUX_LIKE, "hunyuan_video": FLUX_LIKE,
        "ltxv": Probe(lambda first: ("scale_shift_table",), _ltxv),
        "wan": Probe(lambda first: (), _wan),
    },
}


def signal_probe(card: ModelCard, model, decider):
    """The function computing ``decider``'s signal for this model from block 0's arguments, or None where the
    engine makes the signal itself. Refuses a model whose first block lacks the modules the probe reads."""
    probe = SIGNAL_PROBES.get(decider.signal, {}).get(card.family)
    if probe is None:
        return None
    first = getattr(model.model.diffusion_model, card.groups[0].attribute)[0]
    missing = [name for name in probe.modules(first) if not hasattr(first, name)]
    if missing:
        raise ChainError(
            f"{decider.label} ({decider.display_name}) computes its signal from the first block's "
            f"{', '.join(missing)}, which the first block of {card.name} ({type(first).__name__}) does not have "
            f"(a model class laid out differently, or a ComfyUI version that renamed them). Use the Adaptive "
            f"Cache or DBCache node instead, which only use ComfyUI's hooks.")
    return probe.make(first)
