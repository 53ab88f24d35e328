"""Model cards: one place that says, per model family, what caching may touch.

A card lists the hook levels a family offers (whole model always; transformer blocks where ComfyUI
has block-replacement slots), its block layout in execution order, whether it is step-distilled, and
which published TeaCache/MagCache calibration applies. Cards are plain data: the ComfyUI adapter fills in block counts
from the loaded model and picks the family by class name.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

from .base import Granularity


@dataclasses.dataclass(frozen=True)
class BlockGroup:
    """One run of blocks that share a ``patches_replace["dit"]`` name, e.g. Flux's 19 ``double_block``s.

    ``attribute`` is the module list on the diffusion model, ``outputs`` the keys the replacement must
    return (the first one is the image stream the probe measures). ``packed_as`` is set where the model hands
    its blocks several streams as one tuple under that key (LTX-2's ``img`` = (video, audio)): the adapter
    shows the engine one stream per ``outputs`` name, in the tuple's order, so each keeps its own residual.
    """

    name: str
    attribute: str
    outputs: tuple[str, ...]
    count: int = 0
    packed_as: str | None = None


@dataclasses.dataclass(frozen=True)
class FamilySpec:
    family: str
    groups: tuple[BlockGroup, ...] = ()
    teacache: str | None = None      # key into the TeaCache coefficient table
    magcache: str | None = None      # key into the MagCache ratio table
    # Model inputs whose presence makes the forward add to the image stream between blocks, besides what any
    # family can get that way (ControlNet's ``control``, patches in transformer_options): VACE hints, S2V's
    # audio injector, Animate's face adapter.
    injecting_inputs: tuple[str, ...] = ()
    # Why a family with block slots is offered at whole-model level only (shown when a block-level node is
    # refused on it); None where the family's blocks are cached.
    blocks_off: str | None = None


@dataclasses.dataclass(frozen=True)
class ModelCard:
    name: str                         # what messages call the model, e.g. "Flux (FluxSchnell)"
    family: str
    levels: frozenset[Granularity]
    groups: tuple[BlockGroup, ...] = ()
    distilled: str | None = None      # why the model counts as step-distilled, or None
    teacache: str | None = None
    magcache: str | None = None
    injecting_inputs: tuple[str, ...] = ()
    blocks_off: str | None = None

    @property
    def total_blocks(self) -> int:
        return sum(g.count for g in self.groups)

    def block_positions(self) -> list[tuple[str, int, int]]:
        """(group name, index within group, position in execution order) for every block."""
        out, pos = [], 0
        for g in self.groups:
            for i in range(g.count):
                out.append((g.name, i, pos))
                pos += 1
        return out


def _dit(double_attr="double_blocks", single_attr=None, double_out=("img", "txt"), single_out=("img",)):
    groups = [BlockGroup("double_block", double_attr, double_out)]
    if single_attr:
        groups.append(BlockGroup("single_block", single_attr, single_out))
    return tuple(groups)


# Keyed by the class name of ``model.model`` (comfy.model_base). Block layouts follow the loops in
# comfy/ldm/*/model.py of ComfyUI v0.8.0 that consult patches_replace["dit"].
FAMILIES: dict[str, FamilySpec] = {
    "Flux": FamilySpec("flux", _dit("double_blocks", "single_blocks"), "flux", "flux"),
    "Flux2": FamilySpec("flux2", _dit("double_blocks", "single_blocks"), None, None),
    "Chroma": FamilySpec("chroma", _dit("double_blocks", "single_blocks"), None, "chroma"),
    "ChromaRadiance": FamilySpec("chroma", _dit("double_blocks", "single_blocks"), None, None),
    "HunyuanVideo": FamilySpec("hunyuan_video", _dit("double_blocks", "single_blocks"), "hunyuan_video",
                               "hunyuan_video"),
    "HunyuanVideoI2V": FamilySpec("hunyuan_video", _dit("double_blocks", "single_blocks"), "hunyuan_video", None),
    "HunyuanVideoSkyreelsI2V": FamilySpec("hunyuan_video", _dit("double_blocks", "single_blocks"), None, None),
    "HunyuanImage21": FamilySpec("hunyuan_image", _dit("double_blocks", "single_blocks"), None, None),
    "HunyuanImage21Refiner": FamilySpec("hunyuan_image", _dit("double_blocks", "single_blocks"), None, None),
    "HunyuanVideo15": FamilySpec("hunyuan_video15", _dit("double_blocks", "single_blocks"), None, None),
    "HunyuanVideo15_SR_Distilled": FamilySpec("hunyuan_video15", _dit("double_blocks", "single_blocks"), None,
                                              None),
    "WAN21": FamilySpec("wan", _dit("blocks", double_out=("img",)), "wan2.1_t2v_1.3B", "wan2.1_t2v_1.3B"),
    "WAN22": FamilySpec("wan", _dit("blocks", double_out=("img",)), None, None),
    "WAN21_Vace": FamilySpec("wan", _dit("blocks", double_out=("img",)), None, None,
                             injecting_inputs=("vace_context",)),
    "WAN21_Camera": FamilySpec("wan", _dit("blocks", double_out=("img",)), None, None),
    "WAN21_HuMo": FamilySpec("wan", _dit("blocks", double_out=("img",)), None, None),
    "WAN22_S2V": FamilySpec("wan", _dit("blocks", double_out=("img",)), None, None,
                            injecting_inputs=("audio_embed",)),
    "WAN22_Animate": FamilySpec("wan", _dit("blocks", double_out=("img",)), None, None,
                                injecting_inputs=("face_pixel_values",)),
    "QwenImage": FamilySpec("qwen_image", _dit("transformer_blocks"), None, None),
    "SD3": FamilySpec("sd3", _dit("joint_blocks"), None, None),
    "LTXV": FamilySpec("ltxv", _dit("transformer_blocks", double_out=("img",)), "ltxv", None),
    "AuraFlow": FamilySpec("auraflow", _dit("double_layers", "single_layers"), None, None),
    # Kandinsky 5 has block slots, but in ComfyUI v0.8.0 its block_wrap calls the block with a keyword the
    # block does not accept (``x=``), so any replacement crashes: whole-model level only.
    "Kandinsky5": FamilySpec("kandinsky5", (), None, None),
    "Kandinsky5Image": FamilySpec("kandinsky5", (), None, None),
    # Families ComfyUI v0.33 added (comfy/ldm/*/model.py there). Published TeaCache/MagCache curves are fitted to
    # one model each, so none is claimed for these.
    # LTX-2 hands its blocks video and audio as one tuple, ``img`` = (vx, ax), and gets both back: two streams,
    # each with its own residual. The skip decision follows the video stream's probe (the first stream) and
    # covers both streams, which the blocks compute together (audio-video cross-attention).
    "LTXAV": FamilySpec("ltxav", (BlockGroup("double_block", "transformer_blocks", ("video", "audio"),
                                             packed_as="img"),), None, None),
    # Wan variants whose forward runs Wan's block loop: WanDancer's music injector adds to the stream after the
    # blocks in its inject layers when the conditioning carries music features (``audio_embed``).
    "WAN22_WanDancer": FamilySpec("wan", _dit("blocks", double_out=("img",)), None, None,
                                  injecting_inputs=("audio_embed",)),
    # Animate 2: the pose branch runs beside every block (outside its slot) and hands the block its keys and
    # values; nothing is added to the stream between blocks.
    "WAN_Animate2": FamilySpec("wan", _dit("blocks", double_out=("img",)), None, None),
    # SCAIL (and SCAIL-2, the same loop): pose tokens ride in the stream itself, concatenated before the blocks.
    "WAN21_SCAIL": FamilySpec("wan", _dit("blocks", double_out=("img",)), None, None),
    "WAN21_SCAIL2": FamilySpec("wan", _dit("blocks", double_out=("img",)), None, None),
    # FlowRVS runs Wan 2.1's own WanModel.
    "WAN21_FlowRVS": FamilySpec("wan", _dit("blocks", double_out=("img",)), None, None),
    # Causal (autoregressive) Wan runs its blocks itself, frame block by frame block with a K/V cache, and never
    # consults patches_replace: no block can be cached.
    "WAN21_CausalAR": FamilySpec("wan", (), None, None, blocks_off=(
        "its causal block loop never consults ComfyUI's block-replacement slots")),
    # Flux and Qwen-Image subclasses: LongCat-Image runs Flux's own model; MageFlow has Qwen-Image's loop.
    "LongCatImage": FamilySpec("flux", _dit("double_blocks", "single_blocks"), None, None),
    "MageFlow": FamilySpec("mage_flow", _dit("transformer_blocks"), None, None),
    # Dual-stream MMDiTs with one block kind: image and text streams in, both out.
    "JoyImage": FamilySpec("joyimage", _dit("double_blocks"), None, None),
    "Lens": FamilySpec("lens", _dit("transformer_blocks"), None, None),
    # HiDream-O1 serves its slots only on its cold path, and registering any slot turns off its prompt-prefix
    # K/V cache, so every layer would recompute the whole prompt on every step: block caching would cost more
    # than it saves. Its layers are nested (language_model.layers) as well.
    "HiDreamO1": FamilySpec("hidream_o1", (), None, None, blocks_off=(
        "its blocks are served by ComfyUI's replacement slots only when its own prompt K/V cache is off, so "
        "caching them would make every step recompute the whole prompt")),
    # SeedVR2 (NaDiT) packs the batch's video tokens into one sequence without a batch dimension: a residual
    # cannot be told apart by conditioning branch.
    "SeedVR2": FamilySpec("seedvr2", (), None, None, blocks_off=(
        "its blocks carry the whole batch packed into one token sequence, which cannot be split by "
        "conditioning branch")),
    # MiniMax H3 runs text, audio and video tokens as one joint sequence through its blocks; not verified with
    # a model built through ComfyUI's classes yet, so not offered at block level.
    "MiniMaxH3": FamilySpec("minimax_h3", (), None, None, blocks_off=(
        "its block caching has not been verified yet")),
    # Boogu (an Omnigen2) has no block slots.
    "Boogu": FamilySpec("boogu", (), None, None, blocks_off="its forward has no block-replacement slots"),
}

# supported_models config classes that ComfyUI itself knows to be step-distilled.
DISTILLED_CONFIGS: dict[str, str] = {
    "FluxSchnell": "Flux schnell, a 1-4 step distilled model",
    "HunyuanVideo15_SR_Distilled": "HunyuanVideo 1.5 SR distilled",
    "ZImage": "Z-Image Turbo, an 8-step distilled model",
}
# model_sampling classes (set by ModelSamplingDiscrete "lcm" and friends) that mark distillation.
DISTILLED_SAMPLING: dict[str, str] = {
    "ModelSamplingDiscreteDistilled": "an LCM-distilled sampling patch",
    "LCM": "an LCM-distilled sampling patch",
}


def build_card(model_class: str | tuple[str, ...], config_class: str = "", sampling_classes: tuple[str, ...] = (),
               group_counts: Mapping[str, int] | None = None, block_hooks: bool = True) -> ModelCard:
    """The card for a model, from the names ComfyUI gives its parts.

    ``model_class`` is the class name of ``model.model`` or its whole MRO (most derived first).
    ``group_counts`` maps a block group's attribute name to the number of blocks found on the loaded
    model; a family without counts (or without block hooks) is offered at whole-model level only.
    """
    mro = (model_class,) if isinstance(model_class, str) else tuple(model_class)
    model_class = mro[0]
    # Variants ComfyUI adds later subclass a known family: use the closest known ancestor.
    spec = next((FAMILIES[c] for c in mro if c in FAMILIES), None)
    name = model_class if not config_class or config_class == model_class else f"{model_class} ({config_class})"
    distilled = DISTILLED_CONFIGS.get(config_class)
    for cls in sampling_classes:
        distilled = distilled or DISTILLED_SAMPLING.get(cls)
    if spec is None:
        return ModelCard(name, model_class.lower(), frozenset({Granularity.MODEL}), distilled=distilled)
    counts = group_counts or {}
    groups = tuple(dataclasses.replace(g, count=int(counts.get(g.attribute, 0))) for g in spec.groups)
    groups = tuple(g for g in groups if g.count > 0)
    levels = {Granularity.MODEL}
    if groups and block_hooks:
        levels.add(Granularity.BLOCKS)
    return ModelCard(name, spec.family, frozenset(levels), groups, distilled, spec.teacache, spec.magcache,
                     spec.injecting_inputs, spec.blocks_off)
