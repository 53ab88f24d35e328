"""Tiny models for every ``comfy.supported_models.models`` config of the running ComfyUI that can be built tiny.

A config is built like a checkpoint loader builds it (``config(unet_config) -> get_model({})``), with the tiny
``unet_config`` of the closest config in its MRO that ``tiny_models`` knows (a Wan variant gets the tiny Wan 2.1
layout, an SDXL variant the tiny SDXL one), plus the config's own detection keys and the few values the variant
needs (``OVERRIDES``: wider inputs for image-conditioned variants, Vace's hint layers). Conditioning and latent are
those of that tiny family. Configs that cannot be sampled this way are named in ``UNBUILT`` with the reason.

``comfy`` is imported inside the functions only (the harness sets up ComfyUI first).
"""
from __future__ import annotations

import torch

import tiny_models

# supported_models config -> tiny_models family whose tiny unet_config, conditioning and latent it uses.
BASES = {
    "Flux": "flux", "FluxSchnell": "flux_schnell", "Flux2": "flux2", "Chroma": "chroma", "WAN21_T2V": "wan21",
    "WAN22_T2V": "wan22", "WAN22_S2V": "wan22_s2v", "HunyuanVideo": "hunyuan_video",
    "HunyuanVideo15": "hunyuan_video15", "HunyuanVideo15_SR_Distilled": "hunyuan_video15",
    "QwenImage": "qwen_image", "SD3": "sd3", "LTXV": "ltxv", "AuraFlow": "auraflow", "Kandinsky5": "kandinsky5",
    "Lumina2": "lumina2", "SDXL": "sdxl", "SD15": "sd15",
    "LongCatImage": "flux",  # its own config class, Flux's model class and diffusion model
    "SD20": "sd15",  # the SD 2 UNet: the tiny SD 1.5 layout
}

# Values a variant needs on top of its base's tiny unet_config (its image-conditioned inputs are concatenated
# to the latent, so the input layer is wider; ComfyUI fills the missing image with zeros).
OVERRIDES = {
    "SD15_instructpix2pix": {"in_channels": 8},
    "SDXL_instructpix2pix": {"in_channels": 8},
    "HunyuanVideoI2V": {"in_channels": 33},
    "HunyuanVideoSkyreelsI2V": {"in_channels": 32},
    "HunyuanVideo15_SR_Distilled": {"in_channels": 98},
    # HunyuanImage 2.1: an image model on a 64-channel latent, 2-D patches (and a 128-channel input for the refiner)
    "HunyuanImage21": {"vec_in_dim": None, "in_channels": 64, "out_channels": 64, "patch_size": [1, 1],
                       "axes_dim": [16, 16]},
    "HunyuanImage21Refiner": {"vec_in_dim": None, "in_channels": 128, "out_channels": 64, "patch_size": [1, 1, 1]},
    # Z-Image in pixel space: 3 channels in 2x2 patches, a one-block MLP decoder
    "ZImagePixelSpace": {"in_channels": 3, "decoder_hidden_size": 32, "decoder_num_res_blocks": 1,
                         "decoder_in_channels": 12},
    "WAN21_Vace": {"vace_layers": 1, "vace_in_dim": 96},
    "Kandinsky5Image": {"visual_embed_dim": 64},
    "LongCatImage": {"guidance_embed": False, "vec_in_dim": None, "txt_ids_dims": [1, 2]},
    # pixel space: a 3-channel image in 2x2 patches, decoded by a one-layer NeRF head
    "ChromaRadiance": {"in_channels": 3, "out_channels": 3, "patch_size": 2, "nerf_hidden_size": 16,
                       "nerf_mlp_ratio": 2, "nerf_depth": 1, "nerf_max_freqs": 4, "nerf_tile_size": 0,
                       "nerf_final_head_type": "linear", "nerf_embedder_dtype": None, "use_x0": False},
}
# Values given only where the running ComfyUI's parameter class has the field (newer versions added them):
# config -> (module, dataclass, values).
NEWER_FIELDS = {
    "ChromaRadiance": ("comfy.ldm.chroma_radiance.model", "ChromaRadianceParams", {"use_sequential_txt_ids": False}),
}
# Latents that differ from the base family's: (channels, frames; 0 = an image latent).
LATENTS = {"ChromaRadiance": (3, 0)}

# Configs not sampled tiny here, and why.
_AUDIO = "an audio model: its latent and conditioning are audio-shaped, which the tiny image/video families are not"
_NOT_WRITTEN = "no tiny configuration is written for model class {} yet, nor for an ancestor config of it"
UNBUILT = {
    "SD21UnclipL": "SD 2.1 unCLIP needs a CLIP-vision image embedding (its class-conditional ``y``); not written yet",
    "SD21UnclipH": "SD 2.1 unCLIP needs a CLIP-vision image embedding (its class-conditional ``y``); not written yet",
    "LotusD": "Lotus's UNet takes its own inputs beyond the SD 2 layout (a task embedding); not written yet",
    "SD_X4Upscaler": ("the x4 upscaler's UNet takes a low-resolution image and a noise level beyond the SD 2 layout; "
                      "not written yet"),
    "LTXAV": ("LTX-2 samples one latent that packs video and audio together (and needs its audio conditioning), "
              "which the tiny LTXV latent is not"),
    "StableAudio": _AUDIO, "StableAudio3": _AUDIO, "ACEStep": _AUDIO, "ACEStep15": _AUDIO,
    "MiniMaxMusic3": _AUDIO,
    "RT_DETR_v4": "a detection model, not a diffusion model: nothing to sample",
    "SAM3": "a segmentation model, not a diffusion model: nothing to sample",
    "SAM31": "a segmentation model, not a diffusion model: nothing to sample",
    "DepthAnything3": "a depth-estimation model, not a diffusion model: nothing to sample",
}


def config_class(name: str):
    import comfy.supported_models
    return next(c for c in comfy.supported_models.models if c.__name__ == name)


def config_names() -> list[str]:
    import comfy.supported_models
    return [c.__name__ for c in comfy.supported_models.models]


def base_family(name: str) -> str | None:
    """The tiny_models family a config is built from (its own or its closest ancestor config's), or None."""
    return next((BASES[c.__name__] for c in config_class(name).__mro__ if c.__name__ in BASES), None)


def why_unbuilt(name: str) -> str | None:
    """Why ``name`` is not built tiny here, or None when it is."""
    if name in UNBUILT:
        return UNBUILT[name]
    if base_family(name) is None:
        model = getattr(config_class(name).get_model, "__qualname__", "get_model")
        return _NOT_WRITTEN.format(_model_base_name(name) or model)
    return None


def _model_base_name(name: str) -> str | None:
    import inspect
    import re
    try:
        found = re.findall(r"model_base\.(\w+)\(", inspect.getsource(config_class(name).get_model))
    except (OSError, TypeError):
        return None
    return found[0] if found else None


def unet_config(name: str) -> dict:
    family = base_family(name)
    config = dict(tiny_models._SPECS[family][1])
    cls = config_class(name)
    config.update({k: v for k, v in cls.unet_config.items() if k not in config})  # its own detection keys
    config.update(OVERRIDES.get(name, {}))
    if name in NEWER_FIELDS:
        import dataclasses
        import importlib
        module, params, values = NEWER_FIELDS[name]
        fields = {f.name for f in dataclasses.fields(getattr(importlib.import_module(module), params))}
        config.update({k: v for k, v in values.items() if k in fields})
    return config


def build(name: str, seed: int = 0):
    """The tiny ``name`` config's model as a ModelPatcher on the CPU."""
    import comfy.model_patcher

    reason = why_unbuilt(name)
    if reason is not None:
        raise ValueError(f"{name}: {reason}")
    config = config_class(name)(unet_config(name))
    config.unet_config.update(tiny_models._EXTRA_OVERRIDES.get(base_family(name), {}))
    config.set_inference_dtype(torch.float32, None)
    model = config.get_model({})
    tiny_models.init_weights(model.diffusion_model, seed)
    model.eval()
    cpu = torch.device("cpu")
    return comfy.model_patcher.ModelPatcher(model, load_device=cpu, offload_device=cpu)


def conditioning(name: str, seed: int = 1):
    return tiny_models.conditioning(base_family(name), batch=1, seed=seed, length=4)


def latent(name: str, seed: int | None = None, size: int = 16):
    """A LATENT shaped as the config's latent format says (channels, image or video), with the base family's frame
    count for video; zeros when ``seed`` is None (the samplers then fit an empty latent's channels to the model)."""
    config = config_class(name)
    channels, frames = LATENTS.get(name, (None, None))
    if channels is None:
        fmt = config.latent_format()
        channels = fmt.latent_channels
        frames = (tiny_models._spec(base_family(name))[3] or 1) if fmt.latent_dimensions == 3 else 0
    shape = (1, channels, frames, size, size) if frames else (1, channels, size, size)
    if seed is None:
        return {"samples": torch.zeros(shape)}
    return {"samples": torch.randn(shape, generator=torch.Generator(device="cpu").manual_seed(int(seed)))}
