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
import os

import torch

ASSETS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "assets")


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
