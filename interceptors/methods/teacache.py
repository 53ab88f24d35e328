"""TeaCache: skip the block stack while the timestep-modulated input barely changes.

Liu et al., "Timestep Embedding Tells: It's Time to Cache for Video Diffusion Model" (CVPR 2025,
arXiv 2411.19108; ali-vilab/TeaCache). The relative L1 change of block 0's modulated input between
consecutive evaluations is rescaled by a per-model polynomial (fitted offline by the authors against
the output change) and accumulated; the blocks are skipped while the accumulation stays under the
threshold. Only models with published polynomials are accepted; everything else is pointed at the
Adaptive Cache, which needs no per-model fit.
"""
from __future__ import annotations

import dataclasses

from ..base import Decider
from ..cards import ModelCard
from ..kinds import LAST_STEP_COMPUTE, Anchor, Cached, Granularity, InterceptorError, Signal, check_range
from ..memory import Footprint
from ..metrics import relative_l1_of
from ..spec import (Example, Input, MemoryRow, MethodSpec, Prose, Sweep, WINDOW, last_step_input, percent_inputs,
                    threshold_input)


# Rescale polynomials, highest power first, as published in ali-vilab/TeaCache (TeaCache4FLUX,
# TeaCache4HunyuanVideo, TeaCache4LTX-Video, TeaCache4Wan2.1 "use_ret_steps", whose input is the
# projected timestep embedding e0 that ComfyUI hands Wan's blocks).
COEFFICIENTS: dict[str, tuple[float, ...]] = {
    "flux": (498.651651, -283.781631, 55.8554382, -3.82021401, 0.264230861),
    "hunyuan_video": (733.226126, -401.131952, 67.5869174, -3.14987800, 0.0961237896),
    "ltxv": (21.4700694, -12.8016453, 2.31279151, 0.792487521, 0.00969274326),
    "wan2.1_t2v_1.3B": (-5.21862437e04, 9.23041404e03, -5.28275948e02, 1.36987616e01, -4.99875664e-02),
    "wan2.1_t2v_14B": (-3.03318725e05, 4.90537029e04, -2.65530556e03, 5.87365115e01, -3.15583525e-01),
    "wan2.1_i2v_480p_14B": (2.57151496e05, -3.54229917e04, 1.40286849e03, -1.35890334e01, 1.32517977e-01),
}
MODEL_TYPES = ("auto", *COEFFICIENTS)


def rescale(coefficients: tuple[float, ...], x: float) -> float:
    """The polynomial with ``coefficients`` (highest power first, as numpy.poly1d) at ``x``."""
    value = 0.0
    for c in coefficients:
        value = value * x + c
    return value


@dataclasses.dataclass(frozen=True)
class TeaCache(Decider):
    declaration = Decider.declaration.but(
        kind="teacache",
        display_name="TeaCache",
        metric_name="accumulated rescaled change",
        footprint=Footprint(Cached.BLOCK_STREAMS, anchor=Anchor.MODULATED_INPUT),
        granularity=Granularity.BLOCKS,
        signal=Signal.MODULATED_INPUT,
        gathers_over_threads=True,
    )

    threshold: float = 0.4
    model_type: str = "auto"

    def validate(self) -> None:
        super().validate()
        check_range(self.label, "threshold", self.threshold, 0.0)
        if self.model_type not in MODEL_TYPES:
            raise InterceptorError(f"{self.label}: 'model_type' must be one of {', '.join(MODEL_TYPES)}.")

    def coefficients_for(self, card: "ModelCard | None") -> tuple[float, ...] | None:
        key = self.model_type if self.model_type != "auto" else (card.teacache if card else None)
        return COEFFICIENTS.get(key) if key else None

    def check_model(self, card: ModelCard) -> list[str]:
        if self.signal not in card.signals:  # no probe of the adapter reads block 0's modulated input there
            return [f"{self.label}: TeaCache needs a rescale polynomial fitted for the model, and none is published "
                    f"for {card.name}. Use the Adaptive Cache node (any model, no fitting) or DBCache instead."]
        if self.model_type == "auto" and card.teacache is None:
            measured = "".join(f" ({n})" for n in card.notes if "curves" in n)
            return [f"{self.label}: TeaCache needs a rescale polynomial fitted for the model, and none is published "
                    f"for {card.name}{measured}. Pick a model_type explicitly if you know the model behaves like one "
                    f"of the fitted ones, or use the Adaptive Cache node (any model, no fitting) or DBCache instead."]
        return []

    @dataclasses.dataclass
    class RunState:
        previous: dict = dataclasses.field(default_factory=dict)  # modulated input of the previous evaluation
        accumulated: float = 0.0

    def measure(self, run, ev, signals) -> list:
        previous = run.state_of(self).previous
        if self.threshold <= 0 or not signals or not previous or self.coefficients_for(run.card) is None:
            return []
        return [relative_l1_of(signals, previous, run.group)]

    def decide(self, run, ev, signals, measured) -> bool:
        state = run.state_of(self)
        state.previous.update(run.keep(signals, copy=False))  # computed by the adapter
        change = measured[0].value() if measured else None
        if change is None:
            return True
        state.accumulated += abs(rescale(self.coefficients_for(run.card), change))
        run.report_metric(self, state.accumulated, self.threshold)
        return state.accumulated >= self.threshold

    def computed(self, run, ev, forward, signals, outputs=None) -> None:
        # The reference moves on every computed evaluation, forced ones (first step, outside the window) included,
        # as in the authors' code; otherwise the first step back in the window compares against a stale input.
        state = run.state_of(self)
        if self.decided_to_compute(ev):
            state.accumulated = 0.0
        state.previous.update(run.keep(signals, copy=False))  # computed by the adapter


SPECS = (MethodSpec(
    "TeaCache", "TeaCache",
    "TeaCache (arXiv 2411.19108, ali-vilab/TeaCache): skips the transformer blocks while the timestep-modulated "
    "input of block 0 barely changes, rescaled by the authors' per-model polynomial. For Flux, HunyuanVideo, LTXV "
    "and Wan 2.1; other models are refused (use Adaptive Cache).",
    (threshold_input(0.4, "Accumulated rescaled change under which the blocks are skipped. Flux 0.25-0.6; "
                     "HunyuanVideo 0.1-0.15; LTXV 0.03-0.06; Wan 1.3B 0.05-0.1, 14B 0.1-0.2. 0 disables caching."),
     Input("model_type", "choice", choices=MODEL_TYPES, tooltip=(
         "Which published polynomial to use; 'auto' picks it from the model (Wan defaults to the 1.3B fit: "
         "choose the 14B one for 14B models).")),
     *percent_inputs(), last_step_input()),
    lambda threshold, model_type, start_percent, end_percent, last_step=LAST_STEP_COMPUTE: TeaCache(
        threshold=threshold, model_type=model_type, start_percent=start_percent, end_percent=end_percent,
        last_step=last_step),
    TeaCache,
    Prose(when=(
        "For the families its authors fitted (Flux, HunyuanVideo, LTXV, Wan 2.1): block 0's timestep-modulated "
        "input decides, rescaled by the published polynomial. Other models are refused with a pointer to the "
        "Adaptive Cache or DBCache. With `auto`, Wan gets the 1.3B fit: choose the 14B one for 14B models.",
    ), families=(
        ("Flux", "0.4 (0.25-0.6)"),
        ("HunyuanVideo", "0.15"),
        ("LTXV", "0.05"),
        ("Wan 2.1 1.3B", "0.08"),
        ("Wan 2.1 14B", "0.2"),
    )),
    sweep=Sweep("teacache", (0.0, 0.2, 0.3, 0.4, 0.6, 0.8), quick=(0.0, 0.3, 0.6)),
    # Wan's fitted polynomial turns the random tiny Wan's changes into values far above any threshold: the gentler
    # LTXV fit, chosen explicitly, skips on every tiny model of the prompts (the core-level tests' tiny Flux: auto)
    examples=(Example("teacache", (("TeaCache", dict(threshold=100.0, model_type="ltxv", **WINDOW),
                                    dict(threshold=0.0, model_type="auto", **WINDOW)),),
                      core=dict(model_type="auto")),),
    # no published polynomial for Qwen-Image: the node refuses the model
    memory=(MemoryRow("TeaCache", not_for=("qwen_image",)),),
    summary="Timestep-modulated input change with the published polynomials. Flux, HunyuanVideo, LTXV, Wan 2.1.",
),)
