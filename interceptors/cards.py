"""Model cards: one place that says, per model family, what caching may touch.

A card lists the hook levels a family offers (whole model always; transformer blocks where ComfyUI
has block-replacement slots), its block layout in execution order, whether it is step-distilled, and
which published TeaCache/MagCache calibration applies. Cards are plain data: the ComfyUI adapter fills in block counts
from the loaded model and picks the family by class name.
"""
from __future__ import annotations

import dataclasses
from typing import Container, Mapping

from .kinds import Granularity


BLOCKS_OFF = "transformer-block caching is off"  # how a card's note that blocks are off begins


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
    # Why a level or a published curve the family has is not offered for this model (shown where a method that
    # needs it is refused, and in docs/families.md).
    notes: tuple[str, ...] = ()
    # The decider signals (Decider.signal) the adapter can read off this model's blocks beyond those the engine
    # makes itself: ``modulated_input`` where it has a probe for the family (build_card's ``signals``).
    signals: frozenset[str] = frozenset()

    @property
    def blocks_off(self) -> str | None:
        """Why transformer-block caching is off for this model, when it is off for a reason of its own."""
        return next((n for n in self.notes if n.startswith(BLOCKS_OFF)), None)

    def offers(self, level: Granularity) -> bool:
        """Whether caching may work at ``level`` on this model. The guidance level sits above the model, on the
        guider's conds, so every model offers it; ``levels`` lists what the model itself exposes."""
        return level == Granularity.GUIDANCE or level in self.levels

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
    # Families ComfyUI v0.34-v0.38 added, as read in their code (comfy/ldm/*/model.py, model_base.py) and not yet
    # run against a tree of those versions (docs/families-after-0.33.md). None runs a block loop the pack knows.
    # Qwen-Image 2.1 (model_base.QwenImage21 subclasses QwenImage, with a diffusion model of its own): its loop
    # offers ("single_block", i) slots handing over and taking back "img" (prefix and target rows), but it keeps
    # the prompt and reference rows' K/V for the whole run only while no slot is registered, as HiDream-O1 does.
    "QwenImage21": FamilySpec("qwen_image21", (), None, None, blocks_off=(
        "registering any of its block slots turns off its prompt-and-reference K/V cache (on by default), so "
        "every step would recompute the whole prompt and every reference image")),
    # Ming-Image (model_base.MingImage subclasses Lumina2): Lumina 2's NextDiT, whose layer loop only calls
    # "double_block" patches after each layer and never consults patches_replace.
    "MingImage": FamilySpec("ming_image", (), None, None, blocks_off=(
        "its block loop (Lumina 2's NextDiT) has no block-replacement slots")),
    # SenseNova-U1.5: a language model whose decoder layers (language_model.model.layers) run the image tokens
    # against the prompt's K/V prefix, never consulting patches_replace.
    "SenseNovaU15": FamilySpec("sensenova_u15", (), None, None, blocks_off=(
        "its decoder layers run the image tokens against the prompt's key/value prefix in a loop that never "
        "consults ComfyUI's block-replacement slots")),
    # Kandinsky 6 (video + audio): ("double_block", i) slots, but they hand over and take back two streams named
    # "visual" and "audio", a layout no card has been verified on; its MagCache node caches inside the forward.
    "Kandinsky6": FamilySpec("kandinsky6", (), None, None, blocks_off=(
        "its fused video-audio blocks take and return 'visual' and 'audio' streams, a block-slot layout the "
        "pack has not been verified on")),
    # Prism (audio-video, two video experts): fused and remaining blocks run without any block slot.
    "Prism": FamilySpec("prism", (), None, None, blocks_off="its forward has no block-replacement slots"),
}

# supported_models config classes that ComfyUI itself knows to be step-distilled; a config matches when one of
# these is anywhere in its MRO (ZImagePixelSpace is a ZImage).
DISTILLED_CONFIGS: dict[str, str] = {
    "FluxSchnell": "Flux schnell, a 1-4 step distilled model",
    "HunyuanVideo15_SR_Distilled": "HunyuanVideo 1.5 SR distilled",
    "ZImage": "Z-Image Turbo, an 8-step distilled model",
    # ComfyUI marks the checkpoint with ``causal_ar`` in its detected config and gives it its own config class;
    # the released Causal Forcing / Self-Forcing weights are distilled to a few steps per frame block.
    "WAN21_CausalAR_T2V": "Wan CausalAR, a Causal-Forcing / Self-Forcing model distilled to a few steps per frame",
    "PiD": "PiD, a 4-step distilled pixel-space model",
}
# (config class anywhere in the MRO, unet_config key, value) -> why: distillation ComfyUI records in the detected
# config rather than in a class of its own. Flux 2 [klein] has no guidance embedding (Flux 2 [dev] has one); its
# undistilled "base" release shares the architecture and is told apart by nothing ComfyUI keeps.
DISTILLED_SETTINGS: dict[tuple[str, str, object], str] = {
    ("Flux2", "guidance_embed", False): "Flux 2 [klein], a 4-step distilled model (no guidance embedding; for the "
                                        "undistilled klein base, which looks the same to ComfyUI, set "
                                        "allow_distilled)",
}
# model_sampling classes (set by ModelSamplingDiscrete "lcm" and friends) that mark distillation.
DISTILLED_SAMPLING: dict[str, str] = {
    "ModelSamplingDiscreteDistilled": "an LCM-distilled sampling patch",
    "LCM": "an LCM-distilled sampling patch",
}

# The diffusion-model class (comfy.ldm) whose block loop each FAMILIES entry's layout was read from. A model
# class that is not itself in FAMILIES inherits its closest ancestor's block level only when its diffusion model
# is this class, or a subclass that leaves every method running the blocks to it. An entry missing here is never
# inherited at block level (its own model class still gets it).
FAMILY_DIFFUSION: dict[str, str] = {
    "Flux": "Flux", "Flux2": "Flux", "Chroma": "Chroma", "ChromaRadiance": "ChromaRadiance",
    "HunyuanVideo": "HunyuanVideo", "HunyuanVideoI2V": "HunyuanVideo", "HunyuanVideoSkyreelsI2V": "HunyuanVideo",
    "HunyuanImage21": "HunyuanVideo", "HunyuanImage21Refiner": "HunyuanVideo", "HunyuanVideo15": "HunyuanVideo",
    "HunyuanVideo15_SR_Distilled": "HunyuanVideo",
    "WAN21": "WanModel", "WAN22": "WanModel", "WAN21_Vace": "VaceWanModel", "WAN21_Camera": "CameraWanModel",
    "WAN21_HuMo": "HumoWanModel", "WAN22_S2V": "WanModel_S2V", "WAN22_Animate": "AnimateWanModel",
    "QwenImage": "QwenImageTransformer2DModel", "SD3": "OpenAISignatureMMDITWrapper", "LTXV": "LTXVModel",
    "AuraFlow": "MMDiT", "Kandinsky5": "Kandinsky5", "Kandinsky5Image": "Kandinsky5",
}
# Published TeaCache/MagCache curves apply to the model class they were measured on (the FAMILIES entry of that
# very class). A subclass inherits them only where listed here: model class -> the FAMILIES entry whose curves
# were shown to hold for it. Empty: none has been shown so far.
INHERITED_CURVES: dict[str, str] = {}

_RUNNER_NAMES = ("forward", "_forward", "forward_orig")


def runs_blocks(method: str) -> bool:
    """Whether a diffusion-model method of this name may run the transformer blocks: the forward chain ComfyUI's
    models use (forward, _forward, forward_orig) and any method named after blocks (forward_block,
    _process_transformer_blocks, ...)."""
    return method in _RUNNER_NAMES or "block" in method


@dataclasses.dataclass(frozen=True)
class DiffusionFacts:
    """What the adapter read from a loaded diffusion model (``model.model.diffusion_model``), as names.

    ``mro``: its class and ancestors, most derived first. ``runners``: ``(method, class)`` for every method
    :func:`runs_blocks` accepts that a class of ``mro`` defines itself."""

    mro: tuple[str, ...]
    runners: tuple[tuple[str, str], ...] = ()


def block_inheritance_problem(ancestor: str, diffusion: DiffusionFacts | None) -> str | None:
    """Why a model whose closest known ancestor is the FAMILIES entry ``ancestor`` may not use that entry's block
    layout, or None when it may (its diffusion model runs the very same block loop)."""
    reference = FAMILY_DIFFUSION.get(ancestor)
    if reference is None:
        return f"the block layout of {ancestor} is not recorded against a diffusion-model class"
    if diffusion is None or not diffusion.mro:
        return "the diffusion model it runs is unknown"
    own = diffusion.mro[0]
    if own == reference:
        return None
    if reference not in diffusion.mro:
        return f"its diffusion model {own} is not {ancestor}'s {reference}"
    inherited = set(diffusion.mro[diffusion.mro.index(reference):])
    overridden = sorted({method for method, owner in diffusion.runners if owner not in inherited})
    if overridden:
        return (f"its diffusion model {own} subclasses {ancestor}'s {reference} but runs the blocks its own way "
                f"({', '.join(overridden)})")
    return None


# Words in a checkpoint's file name that mark a step-distilled release where ComfyUI's objects carry no marker of
# their own (LTX-2's distilled checkpoint loads as the same config and class as the full one).
DISTILLED_FILE_WORDS = ("distill",)


def distilled_reason(config_mro: tuple[str, ...], settings: Mapping[str, object] | None = None,
                     sampling_classes: tuple[str, ...] = (), file_name: str = "") -> str | None:
    """Why ComfyUI's own objects (or, failing them, the file the model was loaded from) mark the model as
    step-distilled, or None."""
    for cls in config_mro:
        if cls in DISTILLED_CONFIGS:
            return DISTILLED_CONFIGS[cls]
    for (cls, key, value), why in DISTILLED_SETTINGS.items():
        if cls in config_mro and settings and key in settings and settings[key] == value \
                and type(settings[key]) is type(value):
            return why
    for cls in sampling_classes:
        if cls in DISTILLED_SAMPLING:
            return DISTILLED_SAMPLING[cls]
    if any(word in file_name.lower() for word in DISTILLED_FILE_WORDS):
        return f"loaded from {file_name}, a step-distilled release by its name"
    return None


def build_card(model_class: str | tuple[str, ...], config_class: str | tuple[str, ...] = "",
               sampling_classes: tuple[str, ...] = (), group_counts: Mapping[str, int] | None = None,
               block_hooks: bool = True, diffusion: DiffusionFacts | None = None,
               config_settings: Mapping[str, object] | None = None, file_name: str = "",
               signals: Mapping[str, Container[str]] | None = None) -> ModelCard:
    """The card for a model, from the names ComfyUI gives its parts.

    ``model_class`` is the class name of ``model.model`` or its whole MRO (most derived first); ``config_class``
    the supported_models config's class name or MRO, ``config_settings`` its unet_config (plain values).
    ``group_counts`` maps a block group's attribute name to the number of blocks found on the loaded
    model; a family without counts (or without block hooks) is offered at whole-model level only.
    ``diffusion`` describes the diffusion model, which decides whether a subclass of a known family may use
    the family's block layout (:func:`block_inheritance_problem`). ``file_name`` is the checkpoint's file name
    where the loader recorded it (:data:`DISTILLED_FILE_WORDS`). ``signals`` maps each decider signal the caller
    can compute from a model's blocks to the families it can compute it for (the adapter's signal probes); the
    card offers those of its family (``ModelCard.signals``).
    """
    mro = (model_class,) if isinstance(model_class, str) else tuple(model_class)
    model_class = mro[0]
    config_mro = (config_class,) if isinstance(config_class, str) else tuple(config_class)
    config_mro = tuple(c for c in config_mro if c)
    config_name = config_mro[0] if config_mro else ""
    name = model_class if not config_name or config_name == model_class else f"{model_class} ({config_name})"
    distilled = distilled_reason(config_mro, config_settings, sampling_classes, file_name)
    # Variants ComfyUI adds later subclass a known family: the closest known ancestor names the family.
    key = next((c for c in mro if c in FAMILIES), None)
    if key is None:
        return ModelCard(name, model_class.lower(), frozenset({Granularity.MODEL}), distilled=distilled)
    spec = FAMILIES[key]
    notes = [f"{BLOCKS_OFF} for {model_class}: {spec.blocks_off}"] if spec.blocks_off else []
    counts = group_counts or {}
    groups = tuple(dataclasses.replace(g, count=int(counts.get(g.attribute, 0))) for g in spec.groups)
    groups = tuple(g for g in groups if g.count > 0)
    if key != model_class and groups:
        problem = block_inheritance_problem(key, diffusion)
        if problem is not None:
            notes.append(f"{BLOCKS_OFF} for {model_class}: it subclasses {key}, but {problem}, "
                         f"so {key}'s block layout may not hold; whole-model methods (Fixed Cadence, Adaptive Cache) "
                         f"work on it")
            groups = ()
    teacache, magcache = spec.teacache, spec.magcache
    if key != model_class and INHERITED_CURVES.get(model_class) != key:
        if teacache or magcache:
            notes.append(f"the published TeaCache/MagCache curves of {key} were measured on {key} itself, not on "
                         f"{model_class}")
        teacache = magcache = None
    levels = {Granularity.MODEL}
    if groups and block_hooks:
        levels.add(Granularity.BLOCKS)
    offered = frozenset(signal for signal, families in (signals or {}).items() if spec.family in families)
    return ModelCard(name, spec.family, frozenset(levels), groups, distilled, teacache, magcache,
                     spec.injecting_inputs, tuple(notes), offered)
