"""Tiny class-conditional Flux model on 8x8 handwritten digits.

A small but *real* diffusion model built from ComfyUI's own Flux classes
(``comfy.supported_models.Flux`` with FluxSchnell's sampling -> ``comfy.model_base.Flux`` ->
``comfy.ldm.flux.model.Flux``), so that sampler caching can be measured on
genuine step-to-step behaviour instead of synthetic functions.

Recipe (see ``tools/training/train_digits_model.py``):

* rectified flow / flow matching: ``x_t = (1 - t) * x0 + t * eps`` and the
  network predicts the velocity ``eps - x0`` (Liu et al. 2022, "Flow Straight
  and Fast"; Lipman et al. 2022).  This is exactly ComfyUI's ``CONST`` /
  ``FLOW`` parameterisation: ``denoised = x_t - sigma * output`` with
  ``timestep = sigma`` (FluxSchnell uses multiplier 1 and shift 1).
* ``t`` drawn half from a logit-normal distribution (Esser et al. 2024,
  "Scaling Rectified Flow Transformers", SD3) and half uniformly.
* class conditioning through a frozen random embedding table, 10% label
  dropout (Ho & Salimans 2022) so classifier-free guidance works; the
  unconditional input is all zeros.

The "VAE" is a fixed invertible-ish linear map: an 8x8 digit (0..16) is
scaled to -1..1, bilinearly upsampled x4 to 32x32, ``pixel_unshuffle(4)``
gives a 16x8x8 latent, which is standardised per channel and finally mapped
with ComfyUI's Flux ``latent_format.process_out`` so that a plain KSampler on
an EmptyLatentImage-shaped latent (64x64 pixels -> 16x8x8) works unchanged.

``comfy`` is imported lazily so the module can be imported without ComfyUI.
"""

import functools

import torch
import torch.nn.functional as F

from . import loader

WEIGHTS_PATH = loader.asset_path("tiny_flux_digits.safetensors")

DEFAULT_UNET_CONFIG = dict(loader.TINY_FLUX_CONFIG)

NUM_CLASSES = 10
CONTEXT_TOKENS = 4
DIGIT_MAX = 16.0
UPSCALE = 4
LATENT_CHANNELS = UPSCALE * UPSCALE
LATENT_SIZE = 8
IMAGE_SIZE = 64  # decoded IMAGE side, like EmptyLatentImage(64x64)


# ---------------------------------------------------------------- model ----

def latent_format():
    """ComfyUI's Flux latent format (scale/shift used by process_in/out)."""
    import comfy.latent_formats

    return comfy.latent_formats.Flux()


def build_model(unet_config=None, device="cpu", initialise=True, dtype=torch.float32):
    """Build a tiny Flux model through ComfyUI's real classes.

    Returns a ``comfy.model_patcher.ModelPatcher`` wrapping a
    ``comfy.model_base.Flux`` (FLOW model type, FluxSchnell sampling
    settings) computing in ``dtype`` (float32 by default; bfloat16 or float16 as
    ComfyUI runs a model on a GPU that supports them).  Weights are freshly initialised unless
    ``initialise`` is False.
    """
    config = dict(DEFAULT_UNET_CONFIG if unet_config is None else unet_config)
    model_config = loader.many_step_flux_config("DigitsFlux", "Tiny many-step Flux trained on 8x8 digits.")(config)
    return loader.build_patcher(model_config, device, dtype, loader.init_flux_weights if initialise else None)


def load_tables(path=None):
    """Frozen tables stored next to the weights.

    Returns a dict with ``class_context`` [10, L, 32], ``class_pooled``
    [10, 32], ``latent_mean`` [16] and ``latent_std`` [16].
    """
    return loader.load_tables(path or WEIGHTS_PATH, ("class_context", "class_pooled", "latent_mean", "latent_std"))


def load_model(path=None, device="cpu", dtype=torch.float32):
    """Load the committed model as a ComfyUI ModelPatcher ready to sample (:func:`loader.load_model`)."""
    return loader.load_model(path or WEIGHTS_PATH, build_model, device=device, dtype=dtype)


# --------------------------------------------------------- conditioning ----

def make_class_tables(seed=1234, tokens=CONTEXT_TOKENS, dim=32):
    """Fresh frozen random class embeddings: (context [10,L,dim], pooled [10,dim])."""
    return loader.make_flux_class_tables(NUM_CLASSES, seed, tokens, dim)


def class_conditioning(labels, tables=None):
    """ComfyUI CONDITIONING (positive, negative) for a list of digit labels (:func:`loader.flux_class_conditioning`)."""
    return loader.flux_class_conditioning(labels, tables or load_tables())


# ------------------------------------------------------------ "VAE" ----

def empty_latent(batch=1):
    """What EmptyLatentImage(64x64) becomes for Flux: zeros [B, 16, 8, 8]."""
    return torch.zeros(batch, LATENT_CHANNELS, LATENT_SIZE, LATENT_SIZE)


def _upsample(pixels):
    """Bilinear x4 upsample of [B, 1, 8, 8] images."""
    return F.interpolate(pixels, scale_factor=UPSCALE, mode="bilinear", align_corners=False)


@functools.lru_cache(maxsize=1)
def _downsample_matrix():
    """Least-squares inverse [64, 1024] of the bilinear x4 upsampling."""
    n = LATENT_SIZE * LATENT_SIZE
    basis = torch.eye(n, dtype=torch.float64).reshape(n, 1, LATENT_SIZE, LATENT_SIZE)
    up = F.interpolate(basis, scale_factor=UPSCALE, mode="bilinear", align_corners=False)
    return torch.linalg.pinv(up.reshape(n, -1).T)


def raw_latent(digits):
    """Unstandardised 16x8x8 latent of [B, 8, 8] digits in 0..16."""
    pixels = digits.float().reshape(-1, 1, 8, 8) / (DIGIT_MAX / 2) - 1.0
    return F.pixel_unshuffle(_upsample(pixels), UPSCALE)


def latent_stats(digits):
    """Per-channel (mean [16], std [16]) of :func:`raw_latent` over a data set."""
    z = raw_latent(digits)
    return z.mean(dim=(0, 2, 3)), z.std(dim=(0, 2, 3))


def encode(digits, tables=None):
    """Encode [B, 8, 8] digits (0..16) to a ComfyUI-space latent [B, 16, 8, 8].

    The result is what a VAE encode node would output: the Flux latent
    format's ``process_in`` turns it into the standardised model-space data.
    """
    tables = tables or load_tables()
    mean = tables["latent_mean"].view(1, -1, 1, 1)
    std = tables["latent_std"].view(1, -1, 1, 1)
    return latent_format().process_out((raw_latent(digits) - mean) / std)


def _pixels32(latent, tables=None):
    """ComfyUI-space latent -> 32x32 image in -1..1 scale, [B, 1, 32, 32]."""
    tables = tables or load_tables()
    mean = tables["latent_mean"].view(1, -1, 1, 1)
    std = tables["latent_std"].view(1, -1, 1, 1)
    z = latent_format().process_in(latent.float().cpu())
    return F.pixel_shuffle(z * std + mean, UPSCALE)


def decode_digits(latent, tables=None):
    """Decode a ComfyUI-space latent to [B, 8, 8] digits on the 0..16 scale."""
    pixels = _pixels32(latent, tables).double().reshape(latent.shape[0], -1)
    small = pixels @ _downsample_matrix().T
    digits = (small.float() + 1.0) * (DIGIT_MAX / 2)
    return digits.clamp(0.0, DIGIT_MAX).reshape(-1, 8, 8)


def decode(latent, tables=None):
    """Decode to a ComfyUI IMAGE [B, 64, 64, 3] in 0..1 (white ink on black)."""
    pixels = ((_pixels32(latent, tables) + 1.0) / 2.0).clamp(0.0, 1.0)
    big = F.interpolate(pixels, scale_factor=IMAGE_SIZE // (LATENT_SIZE * UPSCALE), mode="nearest")
    return big.permute(0, 2, 3, 1).repeat(1, 1, 1, 3).contiguous()


class DigitsVAE:
    """:func:`decode` behind the method of ComfyUI's VAE that decoding nodes call, so the demo model can be
    connected where a VAE is expected (VAE Decode, Auto Calibrate). Decoding only: it has no encoder."""

    def decode(self, samples):
        return decode(samples)


# ------------------------------------------------------------ evaluate ----

@functools.lru_cache(maxsize=4)
def _knn(k):
    from sklearn.datasets import load_digits
    from sklearn.neighbors import KNeighborsClassifier

    data = load_digits()
    return KNeighborsClassifier(n_neighbors=k).fit(data.data, data.target)


def knn_label_accuracy(digits8x8, labels, k=5):
    """Fraction of [B, 8, 8] digits (0..16) a k-NN on sklearn digits labels as prompted."""
    x = torch.as_tensor(digits8x8).reshape(len(labels), 64).detach().cpu().numpy()
    pred = _knn(k).predict(x)
    return float((pred == torch.as_tensor(list(labels)).numpy()).mean())


# -------------------------------------------------------------- sample ----

def sample_digits(model, labels, steps=20, cfg=3.0, seed=0, sampler="euler",
                  scheduler="simple", tables=None):
    """Sample one digit per label through ComfyUI's KSampler code path.

    Mirrors ``nodes.common_ksampler`` (:func:`loader.sample`).  Returns the
    ComfyUI-space latent [B, 16, 8, 8].
    """
    positive, negative = class_conditioning(labels, tables)
    return loader.sample(model, positive, negative, empty_latent(len(labels)), steps, cfg, seed, sampler, scheduler)
