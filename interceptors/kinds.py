"""The core's vocabulary: where an interceptor works, what it does, which CFG branch a row belongs to, and the
errors it raises. A leaf: it imports nothing of the pack, so every other module may import it."""
from __future__ import annotations

from enum import Enum


class Granularity(str, Enum):
    """Where an interceptor works: around the whole model forward, inside the block stack, or above the model
    on the guider's conds (which CFG branches a step runs; every model has it)."""

    MODEL = "model"
    BLOCKS = "blocks"
    GUIDANCE = "guidance"


class Signal(str, Enum):
    """What the engine hands a decider's ``measure`` and ``decide`` each evaluation (``Decider.signal``)."""

    NONE = "none"                        # nothing: the schedule alone decides
    MODEL_INPUT = "model_input"          # the latent entering the model, per branch (the sampler's tensor)
    PROBE_RESIDUAL = "probe_residual"    # the residual of the front blocks, per branch
    MODULATED_INPUT = "modulated_input"  # the timestep-modulated input of block 0, per branch
    GUIDANCE = "guidance"                # the guidance level's history of one conds-list call shape


class Role(str, Enum):
    """A decider chooses whether to skip; an estimator says what to use instead of a skipped computation."""

    DECIDER = "decider"
    ESTIMATOR = "estimator"


class Cached(str, Enum):
    """What a decider keeps per CFG branch and point in time, for the memory arithmetic (``Footprint.cached``)."""

    BLOCK_STREAMS = "block_streams"      # one residual per skippable segment and stream, in the compute dtype
    BLOCK_STREAMS_AND_BACK = "block_streams_and_back"  # the same, and the back blocks' as one more segment
    MODEL_OUTPUTS = "model_outputs"      # model outputs, float32
    NEGATIVE_BRANCH = "negative_branch"  # the Guidance Cache's own history of the negative branch, float32


class Anchor(str, Enum):
    """What a decider keeps to measure change against (``Footprint.anchor``)."""

    PROBE_RESIDUAL = "probe_residual"    # the probe block's image-stream residual
    PROBE_POINTS = "probe_points"        # as many of those as the estimator keeps points (a verified probe)
    MODULATED_INPUT = "modulated_input"  # block 0's modulated input; for Wan its timestep embedding e0
    MODEL_ANCHORS = "model_anchors"      # three latent-sized float32 tensors: input and output anchors, last input
    MODEL_INPUT = "model_input"          # one latent-sized float32 tensor: the input at the last computed step


class InterceptorError(ValueError):
    """A configuration that cannot work. The message names the node, the input and what to change."""


class ChainError(InterceptorError):
    """Two interceptors that cannot be combined, or a chain the model cannot run."""


class NonFiniteOutputError(RuntimeError):
    """A model output (computed or substituted) contained NaN or Inf."""


def check_range(node: str, name: str, value: float, low: float | None = None, high: float | None = None) -> None:
    """Reject an input outside [low, high] with a message naming the node and the input."""
    if value != value:  # NaN
        raise InterceptorError(f"{node}: '{name}' is NaN.")
    if low is not None and value < low:
        raise InterceptorError(f"{node}: '{name}' must be at least {low}, got {value}.")
    if high is not None and value > high:
        raise InterceptorError(f"{node}: '{name}' must be at most {high}, got {value}.")


def check_whole(node: str, name: str, value: float, low: int, high: int | None = None, *,
                low_text: str | None = None) -> None:
    """Reject an input that is not a whole number in [low, high] (no upper bound where ``high`` is None); the
    message names the node and the input, and ``low_text`` where the lower bound is another input's."""
    if int(value) != value or not low <= value <= (value if high is None else high):
        bounds = f">= {low_text or low}" if high is None else f"from {low_text or low} to {high}"
        raise InterceptorError(f"{node}: '{name}' must be a whole number {bounds}, got {value}.")


# What a decider does on the run's last step (``Decider.last_step``): compute it whatever its rule says (the default),
# or let its rule decide, so the last step may be forecast like any other.
LAST_STEP_COMPUTE, LAST_STEP_FORECAST = "compute", "forecast"
LAST_STEP_CHOICES = (LAST_STEP_COMPUTE, LAST_STEP_FORECAST)

# Where a whole-model decider's skip is carried out (``Decider.level``): around the whole forward, forecasting the
# model output (the default), or inside the block stack, forecasting each block group's residual while the
# embeddings and the final layer run (a family whose card has no block stack falls back to the model output).
LEVEL_MODEL, LEVEL_FEATURES = "model", "features"
LEVEL_CHOICES = (LEVEL_MODEL, LEVEL_FEATURES)


# The guider's cond index of each branch in a CFG step (ComfyUI's ``cond_or_uncond``): 0 the positive
# conditioning, 1 the negative one. Engine and methods tell branches apart by these, never by display names.
POSITIVE, NEGATIVE = 0, 1
BRANCH_NAMES = {POSITIVE: "cond", NEGATIVE: "uncond"}  # how reports and messages name them
