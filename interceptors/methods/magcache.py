"""MagCache: skip the block stack while the accumulated magnitude-ratio error stays small.

Ma et al., "MagCache: Fast Video Generation with Magnitude-Aware Cache" (NeurIPS 2025,
arXiv 2506.09045; Zehong-Ma/MagCache). The ratio gamma_t = mean over tokens of |r_t| / |r_{t-1}| of the
block-stack residual r follows a model-specific curve; skipping from the last computed step costs about
|1 - prod gamma|, accumulated over consecutive skips. The curve is either a published calibration or
one recorded from a single uncached run of any model (the MagCache Calibrate node; custom ratios are
used only with model_type 'custom' and refused with any other), and is resampled to the step count of
the model's whole schedule and read at each step's position in it, so a second stage (Wan 2.2
high/low noise) or a partial denoise reads the part of the curve its steps belong to. The first
``int(retention * N)`` steps of the schedule always compute, as in the authors' code.
"""
from __future__ import annotations

import dataclasses

from ..base import Decider, RecordingDecider
from ..cards import ModelCard
from ..kinds import LAST_STEP_COMPUTE, Cached, Granularity, InterceptorError, check_range
from ..memory import Footprint
from ..spec import (Example, Input, MemoryRow, MethodSpec, Prose, Sweep, WINDOW, last_step_input, percent_inputs,
                    threshold_input)


# Calibrated ratios published with Zehong-Ma/ComfyUI-MagCache (first value 1.0 = step 0). Wan curves
# there interleave cond and uncond; the cond entries are kept.
_WAN13 = (1.0, 1.0124, 1.00166, 0.99791, 0.99682, 0.99634, 0.99567, 0.99416, 0.99578, 0.9957, 0.99511, 0.99535,
          0.99552, 0.99541, 0.9954, 0.99489, 0.99518, 0.99484, 0.99481, 0.99415, 0.99419, 0.99396, 0.99388,
          0.99349, 0.99309, 0.9927, 0.99228, 0.99171, 0.99137, 0.99068, 0.99005, 0.98944, 0.98849, 0.98758,
          0.98644, 0.98504, 0.9836, 0.98202, 0.97977, 0.97717, 0.9741, 0.97003, 0.96538, 0.9593, 0.95086,
          0.94013, 0.92402, 0.90241, 0.86821, 0.81838)
_WAN14 = (1.0, 1.02504, 1.00025, 0.9985, 0.99779, 0.9966, 0.99482, 0.99467, 0.99664, 0.99434, 0.99533, 0.99468,
          0.99438, 0.99516, 0.99384, 0.99404, 0.99517, 0.99409, 0.99428, 0.99347, 0.99418, 0.99271, 0.99313,
          0.99215, 0.99218, 0.99216, 0.99163, 0.99138, 0.98982, 0.98996, 0.9887, 0.98772, 0.98767, 0.98573,
          0.98501, 0.9838, 0.98177, 0.98037, 0.97678, 0.97546, 0.97184, 0.96711, 0.96349, 0.95629, 0.94926,
          0.93964, 0.92511, 0.90693, 0.8796, 0.86111)
RATIOS: dict[str, tuple[float, ...]] = {
    "flux": (1.0, 1.21094, 1.11719, 1.07812, 1.0625, 1.03906, 1.03125, 1.03906, 1.02344, 1.03125, 1.02344, 0.98047,
             1.01562, 1.00781, 1.0, 1.00781, 1.0, 1.00781, 1.0, 1.0, 0.99609, 0.99609, 0.98047, 0.98828, 0.96484,
             0.95703, 0.93359, 0.89062),
    "hunyuan_video": (1.0, 1.0754, 1.27807, 1.11596, 1.09504, 1.05188, 1.00844, 1.05779, 1.00657, 1.04142, 1.03101,
                      1.00679, 1.02556, 1.00908, 1.06949, 1.05438, 1.02214, 1.02321, 1.03019, 1.00779, 1.03381,
                      1.01886, 1.01161, 1.02968, 1.00544, 1.02822, 1.00689, 1.02119, 1.0105, 1.01044, 1.01572,
                      1.02972, 1.0094, 1.02368, 1.0226, 0.98965, 1.01588, 1.02146, 1.0018, 1.01687, 0.99436,
                      1.00283, 1.01139, 0.97122, 0.98251, 0.94513, 0.97656, 0.90943, 0.85703, 0.75456),
    "wan2.1_t2v_1.3B": _WAN13,
    "wan2.1_t2v_14B": _WAN14,
}
RATIOS["chroma"] = RATIOS["flux"]  # published as "assumed similar to flux"; calibrate for accuracy
MODEL_TYPES = ("auto", "custom", *RATIOS)


def resample(ratios: tuple[float, ...], steps: int) -> list[float]:
    """Nearest-neighbour resampling of a ratio curve to ``steps`` entries (MagCache's own ``nearest_interp``:
    one step takes the last ratio, otherwise index ``round(i * (n - 1) / (steps - 1))``)."""
    if steps <= 0:
        return []
    n = len(ratios)
    if steps == 1:
        return [ratios[-1]]
    return [ratios[min(n - 1, round(i * (n - 1) / (steps - 1)))] for i in range(steps)]


def parse_ratios(text: str, node: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.replace("\n", ",").split(",") if v.strip())
    except ValueError:
        raise InterceptorError(f"{node}: 'custom_ratios' must be comma-separated numbers (from MagCache Calibrate).")
    if len(values) < 2 or any(not 0 < v < 10 for v in values):
        raise InterceptorError(f"{node}: 'custom_ratios' needs at least two positive ratios, got {text[:60]!r}.")
    return values


@dataclasses.dataclass(frozen=True)
class MagCache(Decider):
    declaration = Decider.declaration.but(
        kind="magcache",
        display_name="MagCache",
        metric_name="accumulated error",
        footprint=Footprint(Cached.BLOCK_STREAMS),
        granularity=Granularity.BLOCKS,
        counts_steps=True,
    )

    threshold: float = 0.06
    max_consecutive_cached: int = 2  # the node's K: the shared limit (Decider)
    retention: float = 0.2
    model_type: str = "auto"
    ratios: tuple[float, ...] = ()

    def validate(self) -> None:
        super().validate()
        check_range(self.label, "threshold", self.threshold, 0.0)
        check_range(self.label, "K", self.max_consecutive_cached, 0)
        check_range(self.label, "retention_ratio", self.retention, 0.0, 1.0)
        if self.model_type not in MODEL_TYPES:
            raise InterceptorError(f"{self.label}: 'model_type' must be one of {', '.join(MODEL_TYPES)}.")
        if self.model_type == "custom" and len(self.ratios) < 2:
            raise InterceptorError(f"{self.label}: model_type 'custom' needs 'custom_ratios' from MagCache Calibrate.")
        if self.model_type != "custom" and self.ratios:
            raise InterceptorError(
                f"{self.label}: 'custom_ratios' is filled in but model_type is '{self.model_type}', which uses "
                f"another curve. Set model_type to 'custom' to use your ratios, or clear 'custom_ratios'.")

    def curve(self, card: "ModelCard | None") -> tuple[float, ...] | None:
        if self.ratios:
            return self.ratios
        key = self.model_type if self.model_type != "auto" else (card.magcache if card else None)
        return RATIOS.get(key) if key else None

    def check_model(self, card: ModelCard) -> list[str]:
        if self.curve(card) is None:
            measured = "".join(f" ({n})" for n in card.notes if "curves" in n)
            return [f"{self.label}: no published MagCache ratios for {card.name}{measured}. Pick a model_type "
                    f"explicitly if you know the model behaves like one of the published ones, or run the MagCache "
                    f"Calibrate node "
                    f"once and paste its ratios into 'custom_ratios' (model_type 'custom'), or use the Adaptive "
                    f"Cache node, which needs no calibration."]
        return []

    @dataclasses.dataclass
    class RunState:
        curve: list[float] | None = None  # the ratio curve resampled to the model's whole schedule
        ratio: float = 1.0                # product of the ratios since the last computed evaluation
        error: float = 0.0                # the accumulated error since then

    def retained(self, schedule_steps: int) -> int:
        """How many steps at the start of the schedule always compute: the authors' ``int(r * N)``."""
        return int(self.retention * schedule_steps)

    def decide(self, run, ev, signals, measured) -> bool:
        state = run.state_of(self)
        if state.curve is None:
            state.curve = resample(self.curve(run.card) or (1.0,), ev.schedule_steps)
        if self.threshold <= 0 or ev.position < self.retained(ev.schedule_steps):
            return True
        ratio = state.ratio * state.curve[min(ev.position, len(state.curve) - 1)]
        error = state.error + abs(1.0 - ratio)
        run.report_metric(self, error, self.threshold)
        if error < self.threshold:
            state.ratio, state.error = ratio, error
            return False
        return True

    def computed(self, run, ev, forward, signals, outputs=None) -> None:
        if self.decided_to_compute(ev):
            state = run.state_of(self)
            state.ratio, state.error = 1.0, 0.0


@dataclasses.dataclass(frozen=True)
class MagnitudeRecorder(RecordingDecider):
    """Records MagCache's magnitude ratio of the block-stack residual at every step."""

    declaration = RecordingDecider.declaration.but(
        kind="magcache_recorder",
        display_name="MagCache calibration",
        granularity=Granularity.BLOCKS,
    )

    @dataclasses.dataclass
    class RunState:
        last: dict = dataclasses.field(default_factory=dict)             # residual norms at the previous step
        ratios: dict[int, float] = dataclasses.field(default_factory=dict)  # schedule position -> ratio

    def computed(self, run, ev, forward, signals, outputs=None) -> None:
        state = run.state_of(self)
        norms = {}
        for name, parts in forward.residuals.items():
            for key, residual in parts.items():
                if key.branch in (0, None) and key.occurrence == 0:
                    norms[name] = residual.float().flatten(2).norm(dim=-1) if residual.ndim > 2 else residual.float().norm(dim=-1)
        last = state.last
        ratios = [(norms[n] / last[n].to(norms[n]).clamp_min(1e-12)).mean() for n in norms if n in last
                  and last[n].shape == norms[n].shape]
        if ratios:  # read with the run's next transfer: recording costs no sync of its own
            def record(host, position=ev.position):
                state.ratios[position] = sum(v[0] for v in host) / len(host)
            run.read_later(ratios, record)
        if norms:  # a forward without the cond branch (CFG split over forwards) leaves the last norms alone
            state.last = {n: run.to_cache(norm) for n, norm in norms.items()}


def recorded_ratios(run) -> tuple[float, ...]:
    """The recorded curve over the model's schedule, from step 0 to the last recorded step (1.0 where nothing
    was recorded: step 0, and the steps before a partial run started)."""
    recorder = next(ic for ic in run.chain if isinstance(ic, MagnitudeRecorder))
    ratios = run.state_of(recorder).ratios
    return tuple(round(ratios.get(p, 1.0), 5) for p in range(max(ratios, default=0) + 1))




def _from_widgets(threshold, K, retention_ratio, model_type, custom_ratios, start_percent, end_percent,
                  last_step=LAST_STEP_COMPUTE) -> MagCache:
    ratios = parse_ratios(custom_ratios, "MagCache") if custom_ratios.strip() else ()
    return MagCache(threshold=threshold, max_consecutive_cached=K, retention=retention_ratio, model_type=model_type,
                    ratios=ratios, start_percent=start_percent, end_percent=end_percent, last_step=last_step)


SPECS = (MethodSpec(
    "MagCache", "MagCache",
    "MagCache (arXiv 2506.09045, Zehong-Ma/MagCache): skips the transformer blocks while the error predicted from "
    "the model's magnitude-ratio curve stays small. Published curves for Flux, Chroma, HunyuanVideo and Wan 2.1; "
    "for any other model run MagCache Calibrate once and use its ratios with model_type 'custom'.",
    (threshold_input(0.06, "Accumulated |1 - ratio| error under which steps are skipped. Flux 0.1-0.25; Wan 1.3B "
                     "0.12; HunyuanVideo 0.24. 0 disables caching."),
     Input("K", "int", default=2, min=0, max=20, tooltip="At most this many steps skipped in a row."),
     Input("retention_ratio", "float", default=0.2, min=0.0, max=1.0, step=0.01, tooltip=(
         "Fraction of the steps at the start that are always computed.")),
     Input("model_type", "choice", choices=MODEL_TYPES, tooltip=(
         "Which ratio curve to use: 'auto' from the model, a published one, or 'custom' (custom_ratios).")),
     Input("custom_ratios", "text", default="", multiline=True, tooltip=(
         "For model_type 'custom': the comma-separated ratios printed by MagCache Calibrate.")),
     *percent_inputs(), last_step_input()),
    _from_widgets,
    MagCache,
    Prose(when=(
        "A block-level cache driven by the model's magnitude-ratio curve: published curves for Flux, Chroma, "
        "HunyuanVideo and Wan 2.1; for any other block-hooked model run MagCache Calibrate once and paste its "
        "ratios into `custom_ratios` with model_type `custom`. The curve is read at each step's place in the "
        "whole schedule, so a second stage uses its own part of it.",
    ), families=(
        ("Flux", "threshold 0.24, K 5, retention_ratio 0.1"),
        ("Wan 2.1 1.3B", "threshold 0.12, K 4, retention_ratio 0.2"),
        ("HunyuanVideo", "threshold 0.24, K 6, retention_ratio 0.2"),
        ("Qwen-Image (after MagCache Calibrate)", "threshold 0.1, K 2, retention_ratio 0.2"),
    )),
    sweep=Sweep("magcache", (0.0, 0.01, 0.02, 0.04, 0.06), quick=(0.0, 0.02, 0.06)),
    examples=(Example("magcache", (("MagCache", dict(threshold=100.0, K=2, retention_ratio=0.0, model_type="auto",
                                                     custom_ratios="", **WINDOW),
                                    dict(threshold=0.0, K=2, retention_ratio=0.0, model_type="auto", custom_ratios="",
                                         **WINDOW)),)),),
    memory=(MemoryRow("MagCache"),),
    summary="Magnitude-ratio error model. Published curves or your own calibration.",
),)
