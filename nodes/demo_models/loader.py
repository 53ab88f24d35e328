"""What the bundled demo models share: where their weights live, reading them, and building a ComfyUI model
from a config class.

Every demo model is a real ComfyUI model (a ``ModelPatcher`` around a ``comfy.model_base`` class) built from a
``comfy.supported_models`` config; its weights file holds the network under ``diffusion_model.*``, its frozen
tables (class embeddings, latent statistics) under their own names, and the network's config as JSON in the
metadata (``unet_config``). ``comfy`` is imported lazily, so the training scripts can import this folder as a
package of its own before ComfyUI is on the path.
"""

import functools
import json
import math
import os

import torch

ASSETS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "assets")


# The tiny Flux of the digits and photos models (2 double and 4 single blocks, 128 wide, 16 latent channels).
TINY_FLUX_CONFIG = {
    "image_model": "flux",
    "guidance_embed": False,
    "in_channels": 16,
    "out_channels": 16,
    "vec_in_dim": 32,
    "context_in_dim": 32,
    "hidden_size": 128,
    "mlp_ratio": 4.0,
    "num_heads": 2,
    "depth": 2,
    "depth_single_blocks": 4,
    "axes_dim": [16, 24, 24],
    "theta": 10000,
    "patch_size": 2,
    "qkv_bias": True,
    "txt_ids_dims": [],
}


def asset_path(name):
    """The path of a bundled weights file in the pack's ``assets`` folder."""
    return os.path.join(ASSETS, name)


def read_file(path):
    """Return (tensors, metadata) of a safetensors file."""
    from safetensors import safe_open

    tensors = {}
    with safe_open(path, framework="pt") as f:
        metadata = f.metadata() or {}
        for key in f.keys():
            tensors[key] = f.get_tensor(key)
    return tensors, metadata


@functools.lru_cache(maxsize=8)
def _read_file_cached(path):
    return read_file(path)


def read_cached(path):
    """(tensors, metadata) of ``path``, read once per process: callers must copy a tensor they change."""
    return _read_file_cached(os.path.abspath(path))


def load_tables(path, keys):
    """Copies of the frozen tables ``keys`` stored next to the weights."""
    tensors, _ = read_cached(path)
    return {k: tensors[k].clone() for k in keys}


def build_patcher(model_config, device="cpu", dtype=torch.float32, initialise=None):
    """A ``ModelPatcher`` around the model of ``model_config`` (a ``comfy.supported_models`` config instance),
    computing in ``dtype``, in eval mode; ``initialise(diffusion_model)`` fills fresh weights (ComfyUI's ops skip
    initialisation) when given."""
    import comfy.model_patcher

    model_config.set_inference_dtype(dtype, None)
    model = model_config.get_model({})
    if initialise is not None:
        initialise(model.diffusion_model)
    model.eval()
    device = torch.device(device)
    return comfy.model_patcher.ModelPatcher(model, load_device=device, offload_device=device)


# ------------------------------------------------------------------ lossy decoder ----

PATCH = 4            # pixels per latent position (each side)
LATENT_CHANNELS = 16


@functools.lru_cache(maxsize=1)
def patch_basis():
    """The lossy decoder's patterns [48, 16]: orthonormal columns over one 4x4 RGB patch (RGB-major, then y, x):
    the 10 lowest spatial frequencies (2-D DCT) of the luminance and the 3 lowest of each of two colour-difference
    channels. Encoding is the orthogonal projection onto them, so high frequencies and fine colour are lost, like a
    real VAE's lossy compression."""
    n = torch.arange(PATCH, dtype=torch.float64)
    dct = torch.stack([torch.cos(math.pi * (n + 0.5) * k / PATCH) for k in range(PATCH)])
    dct = dct / dct.norm(dim=1, keepdim=True)  # [4 frequencies, 4 positions], orthonormal rows
    luma = torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64) / math.sqrt(3.0)
    chroma = (torch.tensor([1.0, -1.0, 0.0], dtype=torch.float64) / math.sqrt(2.0),
              torch.tensor([1.0, 1.0, -2.0], dtype=torch.float64) / math.sqrt(6.0))
    low = [(u, v) for s in range(2 * PATCH) for u in range(PATCH) for v in range(PATCH) if u + v == s]
    columns = []
    for colour, frequencies in [(luma, low[:10])] + [(c, low[:3]) for c in chroma]:
        for fu, fv in frequencies:
            spatial = torch.outer(dct[fu], dct[fv])  # [y, x]
            columns.append((colour.view(3, 1, 1) * spatial).reshape(-1))
    return torch.stack(columns, dim=1).float()


def patch_latent(images):
    """Unstandardised latent [N, 16, H/4, W/4] of images [N, 3, H, W] (in 0..1, coded as -1..1)."""
    n, _, h, w = images.shape
    x = images.float().reshape(n, 3, h // PATCH, PATCH, w // PATCH, PATCH) * 2.0 - 1.0
    patches = x.permute(0, 2, 4, 1, 3, 5).reshape(n, h // PATCH, w // PATCH, 3 * PATCH * PATCH)
    return (patches @ patch_basis()).permute(0, 3, 1, 2).contiguous()


def patch_decode(z):
    """Images [N, 3, H, W] (0..1, unclamped) of unstandardised latents [N, 16, H/4, W/4]."""
    n, _, h, w = z.shape
    patches = z.float().permute(0, 2, 3, 1) @ patch_basis().T  # [N, h, w, 48]
    x = patches.reshape(n, h, w, 3, PATCH, PATCH).permute(0, 3, 1, 4, 2, 5)
    return (x.reshape(n, 3, h * PATCH, w * PATCH) + 1.0) / 2.0


# ------------------------------------------------------------- the Flux demo models ----

_ZERO_INIT_SUFFIXES = ("_mod.lin", "modulation.lin", "adaLN_modulation.1", "final_layer.linear")


def init_flux_weights(diffusion_model, std=0.02):
    """Initialise a ComfyUI Flux network in place (ComfyUI ops skip init).

    Linear weights ~ N(0, std), biases 0, RMSNorm scales 1, and adaLN-Zero
    style zeros for every modulation layer and the final projection
    (Peebles & Xie 2023) so each block starts as the identity.
    """
    with torch.no_grad():
        for name, p in diffusion_model.named_parameters():
            if name.endswith((".scale", "_norm.weight")):  # RMSNorm gains: `scale`, `weight` in newer ComfyUI
                p.fill_(1.0)
            elif p.ndim >= 2:
                p.normal_(0.0, std)
            else:
                p.zero_()
        for name, module in diffusion_model.named_modules():
            if name.endswith(_ZERO_INIT_SUFFIXES):
                for p in module.parameters():
                    p.zero_()
    return diffusion_model


def many_step_flux_config(name, doc):
    """A Flux config class with FluxSchnell's sampling (the FLOW model type, multiplier 1, shift 1: ComfyUI's own
    settings and ``get_model``, borrowed), under its own name and not a subclass of FluxSchnell: the demo models
    are trained for many-step sampling, not step-distilled like Flux schnell, and the pack recognises a
    distilled config by its ancestry."""
    import comfy.supported_models

    return _flux_config_class(name, doc, comfy.supported_models.Flux, comfy.supported_models.FluxSchnell)


@functools.lru_cache(maxsize=None)
def _flux_config_class(name, doc, flux, flux_schnell):
    return type(name, (flux,), {"__doc__": doc, "unet_config": dict(flux_schnell.unet_config),
                                "sampling_settings": dict(flux_schnell.sampling_settings),
                                "get_model": flux_schnell.get_model})


def make_flux_class_tables(num_classes, seed=1234, tokens=4, dim=32):
    """Fresh frozen random class embeddings: (context [classes, tokens, dim], pooled [classes, dim])."""
    g = torch.Generator().manual_seed(seed)
    context = torch.randn(num_classes, tokens, dim, generator=g)
    pooled = torch.randn(num_classes, dim, generator=g)
    return context, pooled


def flux_class_conditioning(labels, tables):
    """ComfyUI CONDITIONING (positive, negative) for a list of class labels.

    positive: ``[[context[B, L, 32], {"pooled_output": pooled[B, 32]}]]`` from the frozen class tables;
    negative: the same shapes filled with zeros (the unconditional input used for label dropout in training).
    """
    idx = torch.as_tensor(list(labels), dtype=torch.long)
    context = tables["class_context"][idx]
    pooled = tables["class_pooled"][idx]
    positive = [[context, {"pooled_output": pooled}]]
    negative = [[torch.zeros_like(context), {"pooled_output": torch.zeros_like(pooled)}]]
    return positive, negative


def parse_classes(text, class_names, node):
    """Labels from a string of class digits (``"01234567"``; commas and spaces allowed), checked against
    ``class_names``."""
    allowed = "".join(str(i) for i in range(len(class_names)))
    labels = [int(c) for c in text if c.isdigit()]
    if not labels or any(c not in allowed + ", " for c in text):
        raise ValueError(f"{node}: 'classes' must list classes 0-{len(class_names) - 1} ("
                         + ", ".join(f"{i} {n}" for i, n in enumerate(class_names)) + f"); got {text!r}.")
    return labels


# ------------------------------------------------------------------------ loading ----

def load_model(path, build_model, device="cpu", dtype=torch.float32):
    """Load a bundled model as a ComfyUI ModelPatcher ready to sample.

    The network config is read from the file's metadata (``unet_config``), the network built with
    ``build_model(config, device=, initialise=False, dtype=)``, and the weights stored under ``diffusion_model.*``
    go through the running ComfyUI's own state-dict conversion for the model's config
    (``process_unet_state_dict``, which maps the names of older checkpoints, such as Flux's RMSNorm ``scale`` that
    became ``weight``) before they are loaded strictly: every weight must find its place, on every ComfyUI version.
    """
    tensors, metadata = read_cached(path)
    config = json.loads(metadata["unet_config"])
    patcher = build_model(config, device=device, initialise=False, dtype=dtype)
    prefix = "diffusion_model."
    state = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
    model = patcher.model
    model.diffusion_model.load_state_dict(model.model_config.process_unet_state_dict(state), strict=True)
    return patcher


def sample(model, positive, negative, latent, steps, cfg, seed, sampler, scheduler):
    """Sample ``latent`` through ComfyUI's KSampler code path (``nodes.common_ksampler``'s steps: channel fix,
    ``comfy.sample.prepare_noise``, ``comfy.sample.sample``); returns the ComfyUI-space latent."""
    import comfy.sample

    latent = comfy.sample.fix_empty_latent_channels(model, latent)
    noise = comfy.sample.prepare_noise(latent, seed)
    return comfy.sample.sample(model, noise, steps, cfg, sampler, scheduler, positive, negative, latent,
                               denoise=1.0, disable_pbar=True, seed=seed)
