"""Auto Calibrate: pick the steps to compute from one uncached pass of the user's own prompt."""
from __future__ import annotations

import nodes as comfy_nodes  # ComfyUI's top-level nodes module
from comfy_api.latest import io

from .. import comfy_adapter
from ..interceptors import (InterceptorChain, InterceptorError, MagCache, MagnitudeRecorder, PlannedSchedule,
                            Recorder, TaylorSeer, calibrate, latent_psnr, recorded_ratios, recorded_trajectory)
from .common import CONFIG_CATEGORY, PREFIX, chain_output, node_label
from .sampler import ksampler_inputs


def calibration_inputs() -> list:
    """The sampler inputs of the prompt to calibrate on (KSampler's, plus denoise)."""
    return [*ksampler_inputs(), io.Float.Input("denoise", default=1.0, min=0.0, max=1.0, step=0.01, tooltip=(
        "The amount of denoising applied, as on the sampler the chain will be used with."))]


class PromptRunner:
    """Samples the user's prompt (as KSampler would) with a chain, keeping each run's LoopState."""

    def __init__(self, model, seed, steps, cfg, sampler_name, scheduler, positive, negative, latent_image, denoise):
        self.model = model
        self.args = (seed, steps, cfg, sampler_name, scheduler, positive, negative, latent_image)
        self.denoise = denoise
        self.runs = []

    def __call__(self, chain: InterceptorChain) -> dict:
        steps, denoise = self.args[1], self.denoise
        patched = comfy_adapter.install(self.model, chain, on_run_end=lambda run, summary: self.runs.append(run),
                                        schedule=comfy_adapter.schedule_of(steps, denoise))
        (latent,) = comfy_nodes.common_ksampler(patched, *self.args, denoise=self.denoise)
        return latent


class AutoCalibrate(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id=f"{PREFIX}AutoCalibrate",
            display_name="Auto Calibrate",
            category=CONFIG_CATEGORY,
            description=(
                "Runs your prompt once uncached, then chooses which steps to compute so that the result meets your "
                "target: 'quality' (the fewest computed steps whose result stays above a PSNR against the uncached "
                "one) or 'budget' (exactly N computed steps, placed where they matter). The other steps are "
                "forecast (TaylorSeer in sigma). Candidate plans are checked with real cached runs of the same "
                "prompt. Connect the chain to a Cached Sampler with the same steps and sampler."),
            inputs=[
                *calibration_inputs(),
                io.Combo.Input("target", options=["quality", "budget"], tooltip=(
                    "'quality': meet min_psnr with the fewest computed steps. 'budget': compute exactly "
                    "'budget' steps, placed for the best quality.")),
                io.Float.Input("min_psnr", default=35.0, min=10.0, max=80.0, step=0.5, tooltip=(
                    "For 'quality': PSNR (dB) of the cached final latent against the uncached one. 30 is "
                    "visibly close, 35 hard to tell apart, 40+ practically identical.")),
                io.Int.Input("budget", default=8, min=2, max=10000, tooltip=(
                    "For 'budget': how many model evaluations to compute (the first and the last always are).")),
                io.Int.Input("order", default=1, min=0, max=2, tooltip=(
                    "Forecast order for skipped steps: 0 reuses, 1 extrapolates linearly (recommended).")),
            ],
            outputs=[chain_output(),
                     io.Latent.Output(display_name="uncached_latent", tooltip="The uncached result of the calibration pass."),
                     io.String.Output(display_name="plan", tooltip="The plan chosen and the quality it measured.")],
            hidden=[io.Hidden.unique_id],
        )

    @classmethod
    def execute(cls, model, seed, steps, cfg, sampler_name, scheduler, positive, negative, latent_image,
                denoise, target, min_psnr, budget, order) -> io.NodeOutput:
        node = node_label("Auto Calibrate", cls.hidden.unique_id)
        sample = PromptRunner(model, seed, steps, cfg, sampler_name, scheduler, positive, negative, latent_image,
                              denoise)
        reference = sample(InterceptorChain.of([Recorder(node=node)]))
        sigmas, outputs = recorded_trajectory(sample.runs[-1])
        schedule = sample.runs[-1].sample_sigmas

        def plan_chain(compute, psnr=float("inf")):
            return InterceptorChain.of([
                PlannedSchedule(compute=tuple(compute), sigmas=tuple(sigmas), schedule=tuple(schedule), psnr=psnr,
                                node=node),
                TaylorSeer(order=order, node=node)])

        def measure(compute) -> float:
            return latent_psnr(reference["samples"], sample(plan_chain(compute))["samples"])

        try:
            plan = calibrate(sigmas, outputs, measure, order=order, budget=budget if target == "budget" else None,
                             min_psnr=min_psnr if target == "quality" else None)
        except InterceptorError as e:
            raise InterceptorError(f"{node}: {e}") from None
        text = plan.describe()
        if target == "quality" and plan.psnr < min_psnr:
            text += f" (the target {min_psnr} dB needs every step computed)"
        return io.NodeOutput(plan_chain(plan.compute, plan.psnr), reference, text, ui={"text": (text,)})


class MagCacheCalibrate(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id=f"{PREFIX}MagCacheCalibrate",
            display_name="MagCache Calibrate",
            category=CONFIG_CATEGORY,
            description=("Runs your prompt once uncached and records MagCache's magnitude-ratio curve for this model "
                         "and step count, so MagCache works on models without a published curve. Outputs a MagCache "
                         "chain using it and the ratios as text (paste them into MagCache's custom_ratios to reuse)."),
            inputs=[
                *calibration_inputs(),
                io.Float.Input("threshold", default=0.06, min=0.0, max=100.0, step=0.01, tooltip=(
                    "MagCache threshold for the output chain.")),
                io.Int.Input("K", default=2, min=0, max=20, tooltip="At most this many steps skipped in a row."),
                io.Float.Input("retention_ratio", default=0.2, min=0.0, max=1.0, step=0.01, tooltip=(
                    "Fraction of the steps at the start that are always computed.")),
            ],
            outputs=[chain_output(),
                     io.Latent.Output(display_name="uncached_latent", tooltip="The uncached result of the calibration pass."),
                     io.String.Output(display_name="ratios", tooltip="The recorded ratios, comma-separated.")],
            hidden=[io.Hidden.unique_id],
        )

    @classmethod
    def execute(cls, model, seed, steps, cfg, sampler_name, scheduler, positive, negative, latent_image,
                denoise, threshold, K, retention_ratio) -> io.NodeOutput:
        node = node_label("MagCache Calibrate", cls.hidden.unique_id)
        sample = PromptRunner(model, seed, steps, cfg, sampler_name, scheduler, positive, negative, latent_image,
                              denoise)
        latent = sample(InterceptorChain.of([MagnitudeRecorder(node=node)]))
        ratios = recorded_ratios(sample.runs[-1])
        text = ", ".join(f"{r:.5f}" for r in ratios)
        chain = InterceptorChain.of([MagCache(threshold=threshold, max_skips=K, retention=retention_ratio,
                                              model_type="custom", ratios=ratios, node=node)])
        return io.NodeOutput(chain, latent, text, ui={"text": (text,)})


CALIBRATION_NODES = [AutoCalibrate, MagCacheCalibrate]
