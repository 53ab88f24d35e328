"""Tiny class-conditional Wan 2.1 video model on procedurally generated moving shapes.

The pack's second bundled model, with motion: a small but *real* video diffusion model built from
ComfyUI's own Wan classes (``comfy.supported_models.WAN21_T2V`` -> ``comfy.model_base.WAN21`` ->
``comfy.ldm.wan.model.WanModel``, FLOW model type, multiplier 1000; shift 3 for the small clip), so that
caching is also measured on a model whose output changes between frames, not only on one smooth image
model.

* **Data** (:func:`make_videos`): 8 frames of 32x32 RGB. One coloured shape (a disc or a square of the
  same area, soft edges, its class's hue, random size) moves 2.4 pixels a frame in one of four directions
  across most of a black background, from near one edge at a random place along it. The class (8 of them)
  is the shape and the direction: ``CLASS_NAMES``.
* **"VAE"** (:func:`decode`): a fixed, lossy linear decoder. Each latent position holds 16 channels that
  are the coefficients of 16 orthonormal patterns of a 4x4 RGB patch (48 values): the 10 lowest spatial
  frequencies (2-D DCT) of the luminance and the 3 lowest of each of two colour-difference channels. Encoding
  is the orthogonal projection onto them, so high frequencies and fine colour are lost, like a real VAE's
  lossy compression. A video becomes a ``[16, 8, 8, 8]`` latent (channels, frames, height, width), which the
  model patchifies 1x2x2 into 128 tokens. The latent is standardised per channel and mapped with ComfyUI's
  Wan 2.1 ``latent_format.process_out``, so the sampler sees a Wan-shaped latent.
* **Conditioning**: a frozen random table of 4 tokens x 32 dims per class (Wan's ``text_dim`` 32);
  unconditional = zeros; 10% label dropout in training, so real classifier-free guidance works.
* **Check** (:func:`classify_videos`): the direction recovered from the decoded frames' centre of mass and
  the shape from which equal-area template (disc or square) fits the frames better.

Training: ``tools/training/train_video_model.py``. ``comfy`` is imported lazily so the module can be imported
without ComfyUI.
"""

import functools
import math

import torch
import torch.nn.functional as F

from . import loader

WEIGHTS_PATH = loader.asset_path("tiny_wan_video.safetensors")

TEXT_DIM = 32
DEFAULT_UNET_CONFIG = {
    "image_model": "wan2.1",
    "model_type": "t2v",
    "patch_size": [1, 2, 2],
    "in_dim": 16,
    "out_dim": 16,
    "dim": 128,
    "ffn_dim": 256,
    "freq_dim": 256,
    "text_dim": TEXT_DIM,
    "num_heads": 2,
    "num_layers": 4,
    "window_size": [-1, -1],
    "qk_norm": True,
    "cross_attn_norm": True,
    "eps": 1e-6,
}

SHAPES = ("square", "disc")
DIRECTIONS = ("right", "left", "down", "up")
CLASS_NAMES = tuple(f"{s} {d}" for s in SHAPES for d in DIRECTIONS)  # label = 4 * shape + direction
NUM_CLASSES = len(CLASS_NAMES)
CONTEXT_TOKENS = 4
FRAMES = 8
PIXELS = 32            # frame side in pixels
PATCH = loader.PATCH   # pixels per latent position (each side)
LATENT_CHANNELS = loader.LATENT_CHANNELS
LATENT_SIZE = PIXELS // PATCH
IMAGE_SIZE = 64        # decoded IMAGE side (nearest x2 of the 32x32 frames)
SPEED = 2.4            # pixels per frame
_STEP = {"right": (1.0, 0.0), "left": (-1.0, 0.0), "down": (0.0, 1.0), "up": (0.0, -1.0)}  # (dx, dy)


# ----------------------------------------------------------------- data ----

def _hsv_to_rgb(h, s, v):
    k = torch.stack([(5.0 + h * 6.0) % 6.0, (3.0 + h * 6.0) % 6.0, (1.0 + h * 6.0) % 6.0], dim=-1)
    return v[..., None] - v[..., None] * s[..., None] * torch.clamp(torch.minimum(k, 4.0 - k), 0.0, 1.0)


def _shape_alpha(shape_is_disc, cx, cy, radius, soft=0.5):
    """Soft masks [B, T, H, W] of discs (radius) or equal-area squares centred on (cx, cy) [B, T]."""
    coords = torch.arange(PIXELS, dtype=torch.float32) + 0.5
    dx = coords.view(1, 1, 1, -1) - cx[..., None, None]
    dy = coords.view(1, 1, -1, 1) - cy[..., None, None]
    r = radius.view(-1, 1, 1, 1)
    disc = torch.sqrt(dx * dx + dy * dy) - r
    square = torch.maximum(dx.abs(), dy.abs()) - r * (math.sqrt(math.pi) / 2.0)
    dist = torch.where(shape_is_disc.view(-1, 1, 1, 1), disc, square)
    return torch.sigmoid(-dist / soft)


def make_videos(labels, generator=None):
    """Videos [B, T, 3, 32, 32] in 0..1 of the classes ``labels`` (see ``CLASS_NAMES``)."""
    labels = torch.as_tensor(labels, dtype=torch.long)
    n = labels.shape[0]
    g = generator

    def u(lo, hi):
        return lo + (hi - lo) * torch.rand(n, generator=g)

    radius = u(4.5, 6.0)
    travel = SPEED * (FRAMES - 1)
    direction = labels % len(DIRECTIONS)
    step = torch.tensor([_STEP[d] for d in DIRECTIONS])[direction]  # [B, 2]
    margin = radius + 1.0
    # start near the frame's edge so that the whole path (most of the frame) stays inside it
    along = margin + (PIXELS - 2 * margin - travel).clamp_min(0.0) * torch.rand(n, generator=g)
    across = margin + (PIXELS - 2 * margin) * torch.rand(n, generator=g)
    horizontal = step[:, 0] != 0
    start_x = torch.where(horizontal, torch.where(step[:, 0] > 0, along, PIXELS - along), across)
    start_y = torch.where(horizontal, across, torch.where(step[:, 1] > 0, along, PIXELS - along))
    t = torch.arange(FRAMES, dtype=torch.float32).view(1, -1) * SPEED
    cx = start_x.view(-1, 1) + step[:, :1] * t
    cy = start_y.view(-1, 1) + step[:, 1:] * t
    alpha = _shape_alpha(labels // len(DIRECTIONS) == 1, cx, cy, radius)  # [B, T, H, W]
    hue = (labels.float() / NUM_CLASSES + 0.04 * (torch.rand(n, generator=g) - 0.5)) % 1.0  # a hue per class
    colour = _hsv_to_rgb(hue, u(0.7, 1.0), u(0.8, 1.0))  # [B, 3]
    return alpha[:, :, None] * colour.view(n, 1, 3, 1, 1)


# -------------------------------------------------------------- "VAE" ----

def raw_latent(videos):
    """Unstandardised latent [B, 16, T, 8, 8] of videos [B, T, 3, 32, 32] (0..1; :func:`loader.patch_latent`)."""
    b, t = videos.shape[:2]
    z = loader.patch_latent(videos.reshape(b * t, 3, PIXELS, PIXELS))  # [BT, 16, 8, 8]
    return z.reshape(b, t, LATENT_CHANNELS, LATENT_SIZE, LATENT_SIZE).transpose(1, 2).contiguous()


def raw_decode(z):
    """Videos [B, T, 3, 32, 32] (0..1, unclamped) of unstandardised latents [B, 16, T, 8, 8]."""
    b, _, t = z.shape[:3]
    frames = loader.patch_decode(z.transpose(1, 2).reshape(b * t, LATENT_CHANNELS, LATENT_SIZE, LATENT_SIZE))
    return frames.reshape(b, t, 3, PIXELS, PIXELS)


def latent_stats(videos):
    """Per-channel (mean [16], std [16]) of :func:`raw_latent` over a data set."""
    z = raw_latent(videos)
    return z.mean(dim=(0, 2, 3, 4)), z.std(dim=(0, 2, 3, 4))


def latent_format():
    """ComfyUI's Wan 2.1 latent format (its per-channel mean/std used by process_in/out)."""
    import comfy.latent_formats

    return comfy.latent_formats.Wan21()


def _stats(tables):
    return tables["latent_mean"].view(1, -1, 1, 1, 1), tables["latent_std"].view(1, -1, 1, 1, 1)


POSITION_CODES = ("none", "time", "time+space")


def position_code(kind="none", amplitude=1.0):
    """A fixed pattern [16, T, 8, 8] that tells each latent position where it is, since Wan's 3-D RoPE is
    relative: "time" ramps from -amplitude (first frame) to +amplitude (last) in every channel, the same all over
    a frame; "time+space" ramps time, x and y in every third channel each. A model trained with one
    (``train_video_model --position-code``) takes it as 16 more input channels beside the noisy latent, never
    denoised (:func:`extra_inputs`)."""
    code = torch.zeros(LATENT_CHANNELS, FRAMES, LATENT_SIZE, LATENT_SIZE)
    if kind == "none":
        return code
    if kind not in POSITION_CODES:
        raise ValueError(f"unknown position code {kind!r}; choose one of {POSITION_CODES}")
    axes = (1,) if kind == "time" else (1, 3, 2)  # the code's axes: time, then x (width), y (height)
    channel = torch.arange(LATENT_CHANNELS)
    for i, axis in enumerate(axes):
        size = code.shape[axis]
        ramp = torch.linspace(-amplitude, amplitude, size).view([size if d == axis else 1 for d in range(4)])
        code += ramp * (channel % len(axes) == i).float().view(-1, 1, 1, 1)
    return code


def class_paths(videos, labels, tables):
    """Each class's mean standardised latent [8, 16, T, 8, 8] over ``videos`` of the classes ``labels``: where its
    shape is on average in each frame, a band that travels in the class's direction."""
    labels = torch.as_tensor(labels, dtype=torch.long)
    mean, std = _stats(tables)
    z = (raw_latent(videos) - mean) / std
    return torch.stack([z[labels == c].mean(0) for c in range(NUM_CLASSES)])


def extra_inputs(tables, labels, keep=None):
    """The input channels [B, 16 k, T, 8, 8] a model takes beside the noisy latent (standardised space), or None
    for a model that takes none: the tables' ``position_code`` (:func:`position_code`), then the prompted
    class's ``class_path`` (:func:`class_paths`), zero where ``keep`` [B] is 0 (the unconditional branch)."""
    n = len(labels)
    parts = []
    if "position_code" in tables:
        parts.append(tables["position_code"].unsqueeze(0).expand(n, -1, -1, -1, -1))
    if "class_path" in tables:
        path = tables["class_path"][torch.as_tensor(labels, dtype=torch.long)]
        parts.append(path if keep is None else path * keep.view(-1, 1, 1, 1, 1))
    return torch.cat(parts, dim=1) if parts else None


def encode(videos, tables=None):
    """Encode videos [B, T, 3, 32, 32] to a ComfyUI-space latent [B, 16, T, 8, 8] (what a VAE encode gives)."""
    tables = tables or load_tables()
    mean, std = _stats(tables)
    return latent_format().process_out((raw_latent(videos) - mean) / std)


def decode_videos(latent, tables=None):
    """Decode a ComfyUI-space latent [B, 16, T, 8, 8] to videos [B, T, 3, 32, 32] in 0..1."""
    tables = tables or load_tables()
    mean, std = _stats(tables)
    z = latent_format().process_in(latent.float().cpu())
    return raw_decode(z * std + mean).clamp(0.0, 1.0)


def decode(latent, tables=None):
    """Decode to a ComfyUI IMAGE [B * T, 64, 64, 3] in 0..1: every frame of every video, in order."""
    frames = decode_videos(latent, tables).flatten(0, 1)
    big = F.interpolate(frames, scale_factor=IMAGE_SIZE // PIXELS, mode="nearest")
    return big.permute(0, 2, 3, 1).contiguous()


class VideoVAE:
    """:func:`decode` behind the method of ComfyUI's VAE that decoding nodes call, so the model can be
    connected where a VAE is expected (VAE Decode, Auto Calibrate). Decoding only: it has no encoder."""

    def decode(self, samples):
        return decode(samples)


# ---------------------------------------------------------------- model ----

SHIFT = 3.0  # the sampling shift: Wan 2.1's 8 is for 480p, a lower one suits a 32x32 clip


@functools.lru_cache(maxsize=1)
def _config_class():
    """ComfyUI's Wan 2.1 text-to-video config (its model class, latent format, state-dict conversion), with
    the sampling shift of this tiny clip instead of 480p's."""
    import comfy.supported_models

    wan = comfy.supported_models.WAN21_T2V
    return type("TinyWanVideo", (wan,), {"__doc__": "Tiny Wan 2.1 trained on moving shapes.",
                                         "sampling_settings": {**wan.sampling_settings, "shift": SHIFT}})


def init_weights(diffusion_model, std=0.02, seed=None):
    """Initialise a ComfyUI WanModel in place (ComfyUI ops skip init): Linear/Conv weights ~ N(0, std),
    biases 0, norm gains 1, and zeros for the blocks' and head's modulation tables, the time projection
    and the output projection, so that every block starts as the identity (adaLN-Zero, Peebles & Xie
    2023)."""
    g = torch.Generator().manual_seed(seed) if seed is not None else None
    with torch.no_grad():
        for name, p in diffusion_model.named_parameters():
            if name.endswith(("norm_q.weight", "norm_k.weight", "norm3.weight")):
                p.fill_(1.0)
            elif name.endswith("modulation") or name.startswith(("time_projection", "head.head")):
                p.zero_()
            elif p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * std)
            else:
                p.zero_()
    return diffusion_model


def build_model(unet_config=None, device="cpu", initialise=True, dtype=torch.float32, seed=0):
    """Build the tiny Wan model through ComfyUI's real classes: a ``ModelPatcher`` wrapping
    ``comfy.model_base.WAN21`` (a ``WAN21_T2V`` config with shift 3, FLOW) computing in ``dtype``."""
    config = dict(DEFAULT_UNET_CONFIG if unet_config is None else unet_config)
    for key in ("patch_size", "window_size"):
        config[key] = tuple(config[key])
    initialise_with_seed = (lambda net: init_weights(net, seed=seed)) if initialise else None
    return loader.build_patcher(_config_class()(config), device, dtype, initialise_with_seed)


def load_tables(path=None):
    """Frozen tables stored next to the weights: ``class_context`` [8, 4, 32], ``latent_mean`` [16],
    ``latent_std`` [16], and where the model takes them ``position_code`` [16, 8, 8, 8] and ``class_path``
    [8, 16, 8, 8, 8] (:func:`extra_inputs`)."""
    path = path or WEIGHTS_PATH
    optional = tuple(k for k in ("position_code", "class_path") if k in loader.read_cached(path)[0])
    return loader.load_tables(path, ("class_context", "latent_mean", "latent_std") + optional)


def load_model(path=None, device="cpu", dtype=torch.float32):
    """Load the committed model as a ComfyUI ModelPatcher ready to sample (:func:`loader.load_model`)."""
    return loader.load_model(path or WEIGHTS_PATH, build_model, device=device, dtype=dtype)


# --------------------------------------------------------- conditioning ----

def make_class_table(seed=1234, tokens=CONTEXT_TOKENS, dim=TEXT_DIM):
    """A fresh frozen random class embedding [8, L, dim]."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(NUM_CLASSES, tokens, dim, generator=g)


def class_conditioning(labels, tables=None):
    """ComfyUI CONDITIONING (positive, negative) for a list of class labels: positive
    ``[[context[B, 4, 32], {}]]`` from the class table, negative the same shape filled with zeros. For a model that
    takes :func:`extra_inputs`, both carry theirs (the negative without the class) as ``concat_latent_image``, in
    ComfyUI's latent space, which Wan's ``concat_cond`` maps back 16 channels at a time."""
    tables = tables or load_tables()
    labels = list(labels)
    context = tables["class_context"][torch.as_tensor(labels, dtype=torch.long)]
    branches = []
    for keep in (torch.ones(len(labels)), torch.zeros(len(labels))):
        extra = extra_inputs(tables, labels, keep)
        branches.append({} if extra is None else {"concat_latent_image": torch.cat(
            [latent_format().process_out(chunk) for chunk in extra.split(LATENT_CHANNELS, dim=1)], dim=1)})
    return [[context, branches[0]]], [[torch.zeros_like(context), branches[1]]]


def parse_classes(text, node="Tiny Video Model"):
    """Labels from a string of class digits 0-7 (``CLASS_NAMES``), e.g. "01234567"."""
    return loader.parse_classes(text, CLASS_NAMES, node)


def empty_latent(batch=1):
    """An empty video latent [B, 16, 8, 8, 8] (zeros, like ComfyUI's empty latent nodes)."""
    return torch.zeros(batch, LATENT_CHANNELS, FRAMES, LATENT_SIZE, LATENT_SIZE)


# ------------------------------------------------------------- evaluate ----

def _mass(videos):
    return videos.amax(dim=2)  # [B, T, H, W]: brightest channel, the shape's soft mask times its value


def classify_videos(videos):
    """(direction index [B], shape index [B]) recovered from videos [B, T, 3, 32, 32] (0..1):
    the direction from the displacement of the centre of mass between the first and last frames, the
    shape from which equal-area template (square or disc, at each frame's centre of mass) fits better."""
    m = _mass(videos.float())
    b, t = m.shape[:2]
    coords = torch.arange(PIXELS, dtype=torch.float32) + 0.5
    total = m.sum(dim=(2, 3)).clamp_min(1e-6)
    cx = (m.sum(dim=2) * coords).sum(-1) / total
    cy = (m.sum(dim=3) * coords).sum(-1) / total
    dx, dy = cx[:, -1] - cx[:, 0], cy[:, -1] - cy[:, 0]
    scores = torch.stack([dx, -dx, dy, -dy], dim=1)  # right, left, down, up
    direction = scores.argmax(dim=1)
    peak = m.flatten(2).amax(-1).clamp_min(1e-6)
    mask = m / peak[..., None, None]
    radius = torch.sqrt(mask.sum(dim=(2, 3)) / math.pi)
    errors = []
    for disc in (False, True):
        template = _shape_alpha(torch.full((b,), disc), cx, cy, radius.mean(1))
        errors.append(((template - mask) ** 2).sum(dim=(1, 2, 3)))
    shape = torch.stack(errors, dim=1).argmin(dim=1)
    return direction, shape


def class_accuracy(videos, labels):
    """Share of videos whose recovered (shape, direction) is the prompted class, and the share whose
    direction alone is right."""
    labels = torch.as_tensor(list(labels), dtype=torch.long)
    direction, shape = classify_videos(videos)
    right_dir = direction == labels % len(DIRECTIONS)
    right = right_dir & (shape == labels // len(DIRECTIONS))
    return float(right.float().mean()), float(right_dir.float().mean())


def learned_accuracy(videos, labels):
    """Share of videos that show their whole class: its own colour (hue), its shape and its direction of motion,
    which the shipped model learnt from its class path (``bench/video_motion.md``)."""
    labels = torch.as_tensor(list(labels), dtype=torch.long)
    direction, shape = classify_videos(videos)
    right = ((hue_classes(videos) == labels) & (shape == labels // len(DIRECTIONS))
             & (direction == labels % len(DIRECTIONS)))
    return float(right.float().mean())


def hue_classes(videos):
    """The class [B] whose hue is nearest to that of each video's brightest pixels (every class has its own)."""
    v = videos.float()
    m = _mass(v)
    bright = (m > 0.5 * m.flatten(1).amax(1).view(-1, 1, 1, 1)).float()
    rgb = (v * bright[:, :, None]).sum(dim=(1, 3, 4)) / bright.sum(dim=(1, 2, 3)).clamp_min(1.0)[:, None]
    r, g, b = rgb.unbind(-1)
    hue = torch.atan2(math.sqrt(3.0) * (g - b), 2.0 * r - g - b) / (2.0 * math.pi) % 1.0
    reference = torch.arange(NUM_CLASSES, dtype=torch.float32) / NUM_CLASSES
    return ((hue[:, None] - reference[None, :] + 0.5) % 1.0 - 0.5).abs().argmin(dim=1)


def motion(videos):
    """Mean pixel distance the centre of mass travels from the first to the last frame, per video [B]."""
    m = _mass(videos.float())
    coords = torch.arange(PIXELS, dtype=torch.float32) + 0.5
    total = m.sum(dim=(2, 3)).clamp_min(1e-6)
    cx = (m.sum(dim=2) * coords).sum(-1) / total
    cy = (m.sum(dim=3) * coords).sum(-1) / total
    return torch.sqrt((cx[:, -1] - cx[:, 0]) ** 2 + (cy[:, -1] - cy[:, 0]) ** 2)


# --------------------------------------------------------------- sample ----

def sample_videos(model, labels, steps=28, cfg=3.0, seed=0, sampler="euler", scheduler="simple", tables=None):
    """Sample one video per label through ComfyUI's KSampler code path (``nodes.common_ksampler``'s
    steps); returns the ComfyUI-space latent [B, 16, 8, 8, 8]."""
    positive, negative = class_conditioning(labels, tables)
    return loader.sample(model, positive, negative, empty_latent(len(labels)), steps, cfg, seed, sampler, scheduler)
