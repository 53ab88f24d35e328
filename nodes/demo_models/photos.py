"""Tiny class-conditional Flux model on crops of two photographs.

The pack's third bundled model, for caching measured on natural images: the digits model's 8x8 strokes are the
smoothest trajectory a diffusion model can have, and what caching does there need not hold on textured pictures.
Built like the digits model from ComfyUI's own Flux classes (a many-step config with FluxSchnell's sampling ->
``comfy.model_base.Flux`` -> ``comfy.ldm.flux.model.Flux``, double and single blocks), trained with rectified flow.

* **Data** (:func:`make_crops`): the two photographs bundled with scikit-learn
  (``sklearn.datasets.load_sample_images``: a pagoda by a lake, ``china.jpg``, and a dahlia, ``flower.jpg``; no
  download). A class is a region of one photograph (``CLASS_NAMES``); a sample is a square crop of it at a random
  place and scale, flipped left-right half the time, resized (antialiased) to 48x48 RGB.
* **"VAE"** (:func:`decode`): the fixed lossy linear decoder the video model uses (:func:`loader.patch_basis`):
  each latent position holds 16 coefficients of a 4x4 RGB patch's 48 values (the lowest spatial frequencies of
  the luminance and of two colour differences), so a 48x48 crop becomes a ``[16, 12, 12]`` latent and loses its
  finest detail, as a real VAE's lossy compression does. The latent is standardised per channel and mapped with
  ComfyUI's Flux ``latent_format.process_out``.
* **Conditioning**: a frozen random table per class (context 4 tokens x 32 dims, pooled 32), unconditional =
  zeros, 10% label dropout in training, so real classifier-free guidance works.
* **Check** (:func:`class_accuracy`): colour and texture statistics of the decoded images (:func:`features`)
  against each class's training crops: the nearest class centroid must be the prompted class.

Training: ``tools/training/train_photos_model.py``. ``comfy`` is imported lazily so the module can be imported
without ComfyUI.
"""

import functools

import torch
import torch.nn.functional as F

from . import loader

WEIGHTS_PATH = loader.asset_path("tiny_flux_photos.safetensors")

DEFAULT_UNET_CONFIG = dict(loader.TINY_FLUX_CONFIG)

# A class: (photograph index in load_sample_images: 0 china.jpg, 1 flower.jpg,
#           box of crop centres (x0, y0, x1, y1) in pixels of the 640x427 photograph, crop side range in pixels)
REGIONS = {
    "sky": (0, (400, 25, 610, 70), (40, 80)),
    "pagoda": (0, (170, 90, 240, 300), (70, 130)),
    "trees": (0, (470, 330, 610, 395), (50, 100)),
    "lake": (0, (360, 255, 540, 290), (30, 50)),
    "flower heart": (1, (290, 190, 330, 230), (50, 90)),
    "whole flower": (1, (300, 200, 320, 220), (250, 300)),
    "leaves": (1, (40, 60, 120, 360), (60, 110)),
    "bud": (1, (330, 395, 380, 405), (40, 60)),
}
CLASS_NAMES = tuple(REGIONS)
NUM_CLASSES = len(CLASS_NAMES)
CONTEXT_TOKENS = 4
PIXELS = 48                         # crop side
LATENT_CHANNELS = loader.LATENT_CHANNELS
LATENT_SIZE = PIXELS // loader.PATCH
IMAGE_SIZE = 2 * PIXELS             # decoded IMAGE side (nearest x2 of the crop)


# ------------------------------------------------------------------ data ----

@functools.lru_cache(maxsize=1)
def photographs():
    """The two photographs bundled with scikit-learn, [2, 3, 427, 640] in 0..1."""
    from sklearn.datasets import load_sample_images

    images = load_sample_images().images
    return torch.stack([torch.tensor(im).permute(2, 0, 1).float() / 255.0 for im in images])


def make_crops(labels, generator=None):
    """Crops [B, 3, 48, 48] in 0..1 of the classes ``labels`` (``CLASS_NAMES``): for each, a square of a random
    side in its class's range centred at a random place of its box (kept inside the photograph), flipped
    left-right half the time, resized with antialiasing."""
    photos = photographs()
    _, _, height, width = photos.shape
    crops = []
    for label in torch.as_tensor(labels, dtype=torch.long).tolist():
        index, (x0, y0, x1, y1), (lo, hi) = REGIONS[CLASS_NAMES[label]]
        u = torch.rand(4, generator=generator).tolist()
        side = int(round(lo + (hi - lo) * u[0]))
        cx, cy = x0 + (x1 - x0) * u[1], y0 + (y1 - y0) * u[2]
        left = min(max(int(round(cx - side / 2)), 0), width - side)
        top = min(max(int(round(cy - side / 2)), 0), height - side)
        crop = photos[index:index + 1, :, top:top + side, left:left + side]
        crop = F.interpolate(crop, size=(PIXELS, PIXELS), mode="bilinear", antialias=True, align_corners=False)
        crops.append(crop.flip(-1) if u[3] < 0.5 else crop)
    return torch.cat(crops).clamp(0.0, 1.0)


# ---------------------------------------------------------------- "VAE" ----

def raw_latent(images):
    """Unstandardised latent [B, 16, 12, 12] of images [B, 3, 48, 48] in 0..1 (:func:`loader.patch_latent`)."""
    return loader.patch_latent(images)


def latent_stats(images):
    """Per-channel (mean [16], std [16]) of :func:`raw_latent` over a data set."""
    z = raw_latent(images)
    return z.mean(dim=(0, 2, 3)), z.std(dim=(0, 2, 3))


def latent_format():
    """ComfyUI's Flux latent format (scale/shift used by process_in/out)."""
    import comfy.latent_formats

    return comfy.latent_formats.Flux()


def _stats(tables):
    return tables["latent_mean"].view(1, -1, 1, 1), tables["latent_std"].view(1, -1, 1, 1)


def encode(images, tables=None):
    """Encode images [B, 3, 48, 48] (0..1) to a ComfyUI-space latent [B, 16, 12, 12] (what a VAE encode gives)."""
    tables = tables or load_tables()
    mean, std = _stats(tables)
    return latent_format().process_out((raw_latent(images) - mean) / std)


def decode_images(latent, tables=None):
    """Decode a ComfyUI-space latent [B, 16, 12, 12] to images [B, 3, 48, 48] in 0..1."""
    tables = tables or load_tables()
    mean, std = _stats(tables)
    z = latent_format().process_in(latent.float().cpu())
    return loader.patch_decode(z * std + mean).clamp(0.0, 1.0)


def decode(latent, tables=None):
    """Decode to a ComfyUI IMAGE [B, 96, 96, 3] in 0..1 (nearest x2 of the 48x48 crops)."""
    images = F.interpolate(decode_images(latent, tables), scale_factor=IMAGE_SIZE // PIXELS, mode="nearest")
    return images.permute(0, 2, 3, 1).contiguous()


class PhotosVAE:
    """:func:`decode` behind the method of ComfyUI's VAE that decoding nodes call, so the model can be
    connected where a VAE is expected (VAE Decode, Auto Calibrate). Decoding only: it has no encoder."""

    def decode(self, samples):
        return decode(samples)


# ---------------------------------------------------------------- model ----

def build_model(unet_config=None, device="cpu", initialise=True, dtype=torch.float32):
    """Build the tiny Flux model through ComfyUI's real classes: a ``ModelPatcher`` wrapping
    ``comfy.model_base.Flux`` (FLOW model type, FluxSchnell's sampling settings) computing in ``dtype``; weights
    freshly initialised unless ``initialise`` is False."""
    config = dict(DEFAULT_UNET_CONFIG if unet_config is None else unet_config)
    config_class = loader.many_step_flux_config("PhotosFlux", "Tiny many-step Flux trained on photograph crops.")
    model_config = config_class(config)
    return loader.build_patcher(model_config, device, dtype, loader.init_flux_weights if initialise else None)


def load_tables(path=None):
    """Frozen tables stored next to the weights: ``class_context`` [8, 4, 32], ``class_pooled`` [8, 32],
    ``latent_mean`` [16], ``latent_std`` [16]."""
    return loader.load_tables(path or WEIGHTS_PATH, ("class_context", "class_pooled", "latent_mean", "latent_std"))


def load_model(path=None, device="cpu", dtype=torch.float32):
    """Load the committed model as a ComfyUI ModelPatcher ready to sample (:func:`loader.load_model`)."""
    return loader.load_model(path or WEIGHTS_PATH, build_model, device=device, dtype=dtype)


# ---------------------------------------------------------- conditioning ----

def make_class_tables(seed=1234, tokens=CONTEXT_TOKENS, dim=32):
    """Fresh frozen random class embeddings: (context [8, L, dim], pooled [8, dim])."""
    return loader.make_flux_class_tables(NUM_CLASSES, seed, tokens, dim)


def class_conditioning(labels, tables=None):
    """ComfyUI CONDITIONING (positive, negative) for a list of class labels (:func:`loader.flux_class_conditioning`)."""
    return loader.flux_class_conditioning(labels, tables or load_tables())


def parse_classes(text, node="Tiny Photos Model"):
    """Labels from a string of class digits 0-7 (``CLASS_NAMES``), e.g. "01234567"."""
    return loader.parse_classes(text, CLASS_NAMES, node)


def empty_latent(batch=1):
    """An empty latent [B, 16, 12, 12] (zeros, like ComfyUI's empty latent nodes)."""
    return torch.zeros(batch, LATENT_CHANNELS, LATENT_SIZE, LATENT_SIZE)


# -------------------------------------------------------------- evaluate ----

def features(images):
    """Colour and texture statistics [B, 9] of images [B, 3, H, W] (0..1): the mean and the spread of each colour
    channel, and the mean absolute difference of neighbouring luminance values across and down, at the crop's
    resolution and at half of it (the texture's fine and coarse grain)."""
    x = images.float()
    luma = x.mean(dim=1)
    half = F.avg_pool2d(luma[:, None], 2)[:, 0]

    def grain(y):
        return torch.stack([(y[..., :, 1:] - y[..., :, :-1]).abs().mean(dim=(1, 2)),
                            (y[..., 1:, :] - y[..., :-1, :]).abs().mean(dim=(1, 2))], dim=1)

    return torch.cat([x.mean(dim=(2, 3)), x.std(dim=(2, 3)), grain(luma).mean(1, keepdim=True),
                      grain(half)], dim=1)


@functools.lru_cache(maxsize=1)
def class_centroids(per_class=64, seed=20260):
    """(centroids [8, 9], scale [9]): each class's mean :func:`features` over ``per_class`` fresh training crops
    (passed through the lossy decoder, as samples are), and the pooled within-class spread used to weigh them."""
    labels = torch.arange(NUM_CLASSES).repeat_interleave(per_class)
    crops = loader.patch_decode(raw_latent(make_crops(labels, torch.Generator().manual_seed(seed)))).clamp(0, 1)
    f = features(crops).view(NUM_CLASSES, per_class, -1)
    centroids = f.mean(dim=1)
    scale = (f - centroids[:, None]).pow(2).mean(dim=(0, 1)).sqrt().clamp_min(1e-4)
    return centroids, scale


def class_distances(images):
    """Distances [B, 8] of each image's statistics to each class's training crops' (in within-class spreads)."""
    centroids, scale = class_centroids()
    f = features(images)
    return ((f[:, None] - centroids[None]) / scale).pow(2).sum(-1).sqrt()


def nearest_classes(images):
    """The class [B] whose training crops' statistics are nearest to each image's."""
    return class_distances(images).argmin(dim=1)


def class_accuracy(images, labels):
    """Share of images [B, 3, H, W] whose statistics are nearest to their prompted class's training crops'."""
    labels = torch.as_tensor(list(labels), dtype=torch.long)
    return float((nearest_classes(images) == labels).float().mean())


# ---------------------------------------------------------------- sample ----

def sample_photos(model, labels, steps=20, cfg=3.0, seed=0, sampler="euler", scheduler="simple", tables=None):
    """Sample one crop per label through ComfyUI's KSampler code path (:func:`loader.sample`); returns the
    ComfyUI-space latent [B, 16, 12, 12]."""
    positive, negative = class_conditioning(labels, tables)
    return loader.sample(model, positive, negative, empty_latent(len(labels)), steps, cfg, seed, sampler, scheduler)
