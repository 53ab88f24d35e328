"""How many bytes each caching method keeps between steps, from the shape of a model's block stream.

The same accounting the run itself does (``Caches.measure``), as arithmetic, so memory can be
known before a 14B video model is loaded. Per CFG branch a run keeps:

* block-level methods (DBCache, First Block Cache, TeaCache, MagCache): one residual per skippable
  segment and stream, in the model's compute dtype, ``points`` of them (1 when reusing, ``order + 1``
  with TaylorSeer, up to ``window`` with Spectrum: one per computed step until the window is full); plus
  the decider's anchor: the probe block's image-stream residual (DBCache, First Block Cache) or block 0's
  modulated input (TeaCache; for Wan its timestep embedding e0); MagCache keeps only numbers;
* whole-model methods (Fixed Cadence, Adaptive Cache, Verified Forecast): ``points`` model outputs in float32
  (ComfyUI hands the sampler float32), and the Adaptive Cache three more latent-sized tensors (its input and
  output anchors and the last input), Verified Forecast one (the input at the last computed step);
* a whole-model method at ``level`` "features": what a block cache without front or back blocks keeps, one residual
  per block group and stream, ``points`` of them;
* Verified Block Cache: what DBCache keeps, the back blocks' residual as one more segment (its full skip forecasts
  them), and its probe residual kept ``points`` times (it forecasts it);
* the Guidance Cache, for the negative branch only: its forecast's points of the guidance difference (or of the
  negative prediction), latent-sized float32 (2 with a forecast, 1 reusing), one more in adaptive mode.

With ``cache_on_cpu`` all of it goes to the CPU, the decider's anchors as well. A forward that
computes also holds one clone of each segment's input while its blocks run (transient, not counted here),
and a forecast is formed in float32, one cached quantity at a time.

Each decider declares what it keeps (``Decider.footprint``, a :class:`Footprint`); this module only counts.
"""
from __future__ import annotations

import dataclasses

from .kinds import Anchor, Cached

FLOAT32 = 4


@dataclasses.dataclass(frozen=True)
class Footprint:
    """What a decider keeps between steps, per CFG branch: ``cached`` per point in time, ``anchor`` to measure
    change against (None: only numbers); see :class:`~.kinds.Cached` and :class:`~.kinds.Anchor`."""

    cached: Cached
    anchor: Anchor | None = None
    points: int | None = None  # for Cached.NEGATIVE_BRANCH: how many tensors the history keeps


def at_features(footprint: Footprint) -> Footprint:
    """What a whole-model decider with ``footprint`` keeps at the feature level (``Decider.level``): each block
    group's residual per stream in place of its model outputs, and its anchor as before."""
    return dataclasses.replace(footprint, cached=Cached.BLOCK_STREAMS)


@dataclasses.dataclass(frozen=True)
class StreamShape:
    """One model at one resolution, as its blocks see it.

    ``layout`` says which streams the skippable segments carry: ``"joint"`` (Flux, HunyuanVideo: image and
    text streams in the double blocks, then both joined in the single blocks), ``"double"`` (Qwen-Image:
    image and text streams), ``"image"`` (Wan: the image stream only; the text enters by cross-attention).
    """

    name: str
    family: str
    layout: str
    image_tokens: int
    text_tokens: int
    hidden: int
    latent_elements: int          # the model output of one branch
    branches: int                 # CFG branches sampled: 1 for guidance-distilled models at cfg 1
    stream_bytes: int = 2         # bfloat16 blocks

    @property
    def image_stream(self) -> int:
        """Bytes of one branch's image stream: the unit the bound in the tests counts in."""
        return self.image_tokens * self.hidden * self.stream_bytes

    @property
    def segment_streams(self) -> int:
        """Bytes of one branch's residuals of every skippable segment and stream (one point in time)."""
        tokens = {"joint": 2 * (self.image_tokens + self.text_tokens),
                  "double": self.image_tokens + self.text_tokens,
                  "image": self.image_tokens}[self.layout]
        return tokens * self.hidden * self.stream_bytes

    @property
    def back_streams(self) -> int:
        """Bytes of one branch's residual of the back blocks as a segment of their own (in the last block group,
        whose streams are the image and text tokens joined, both streams, or the image stream alone)."""
        tokens = self.image_tokens if self.layout == "image" else self.image_tokens + self.text_tokens
        return tokens * self.hidden * self.stream_bytes

    def anchor(self, footprint: Footprint, points: int = 1) -> int:
        """Bytes of one branch's anchor of a decider with ``footprint`` (``points``: the estimator's)."""
        # compared by value (==), not identity: the pack may be imported twice (tools beside ComfyUI's copy)
        if footprint.anchor == Anchor.PROBE_RESIDUAL:
            return self.image_stream
        if footprint.anchor == Anchor.PROBE_POINTS:
            return points * self.image_stream
        if footprint.anchor == Anchor.MODEL_INPUT:
            return self.latent_elements * FLOAT32
        if footprint.anchor == Anchor.MODULATED_INPUT:
            return 6 * self.hidden * self.stream_bytes if self.family == "wan" else self.image_stream
        if footprint.anchor == Anchor.MODEL_ANCHORS:
            return 3 * self.latent_elements * FLOAT32
        return 0

    def cached(self, footprint: Footprint, points: int) -> int:
        """Bytes of one branch's cached quantities, ``points`` of each."""
        per_point = {Cached.BLOCK_STREAMS: self.segment_streams,
                     Cached.BLOCK_STREAMS_AND_BACK: self.segment_streams + self.back_streams,
                     }.get(footprint.cached, self.latent_elements * FLOAT32)
        return points * per_point


@dataclasses.dataclass(frozen=True)
class CacheMemory:
    on_model_device: int
    on_cpu: int

    @property
    def total(self) -> int:
        return self.on_model_device + self.on_cpu


def cache_memory(shape: StreamShape, method, order: int | None = None, cache_on_cpu: bool = False,
                 branches: int | None = None, points: int | None = None) -> CacheMemory:
    """Bytes ``method`` (a decider, or its class: what it declares as its ``footprint``) keeps for ``shape``
    (``order`` None: reuse, else TaylorSeer's order), all branches. ``points`` overrides what ``order`` implies:
    Spectrum keeps min(window, computed steps) points."""
    footprint = method.footprint
    if footprint is None:
        raise ValueError(f"{method.display_name} declares no cache footprint")
    if footprint.cached == Cached.NEGATIVE_BRANCH:  # its own history, of the negative branch only
        held = footprint.points * shape.latent_elements * FLOAT32 if shape.branches > 1 else 0
        return CacheMemory(0, held) if cache_on_cpu else CacheMemory(held, 0)
    if points is None:
        points = 1 if order is None else order + 1
    n = shape.branches if branches is None else branches
    anchor, cached = n * shape.anchor(footprint, points), n * shape.cached(footprint, points)
    # every kept tensor, anchors included, goes through the run's cache placement (LoopState.keep/to_cache)
    return CacheMemory(0, anchor + cached) if cache_on_cpu else CacheMemory(anchor + cached, 0)


def video(name: str, family: str, layout: str, frames: int, height: int, width: int, text_tokens: int,
          hidden: int, branches: int) -> StreamShape:
    """A Wan/HunyuanVideo clip: 16-channel latent, 8x smaller in space and 4x in time, patch 1x2x2."""
    latent_frames, h, w = (frames - 1) // 4 + 1, height // 8, width // 8
    return StreamShape(name, family, layout, latent_frames * (h // 2) * (w // 2), text_tokens, hidden,
                       16 * latent_frames * h * w, branches)


# Real shapes from the model cards, blocks in bfloat16. Text tokens: Flux's T5 at 512; HunyuanVideo's and
# Qwen-Image's prompts vary with the prompt, 256 taken as typical. Branches: FLUX.1-dev and HunyuanVideo are
# guidance-distilled (cfg 1, one branch); Wan and Qwen-Image sample with CFG (two).
REAL_SHAPES = (
    StreamShape("FLUX.1-dev 1024x1024", "flux", "joint", 64 * 64, 512, 3072, 16 * 128 * 128, branches=1),
    video("Wan 2.1 14B 480p, 81 frames", "wan", "image", 81, 480, 832, 0, 5120, branches=2),
    video("Wan 2.1 14B 720p, 81 frames", "wan", "image", 81, 720, 1280, 0, 5120, branches=2),
    video("HunyuanVideo 720p, 129 frames", "hunyuan_video", "joint", 129, 720, 1280, 256, 3072, branches=1),
    StreamShape("Qwen-Image 1328x1328", "qwen_image", "double", 83 * 83, 256, 3072, 16 * 166 * 166, branches=2),
)
