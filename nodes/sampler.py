"""The Cached Sampler nodes (drop-in KSampler / KSamplerAdvanced) and Apply Interceptors."""
from __future__ import annotations

import logging

import comfy.samplers
import nodes as comfy_nodes  # ComfyUI's top-level nodes module (this package is never top-level)
from comfy_api.latest import io

from .. import adapter
from ..interceptors import InterceptorChain
from .common import CATEGORY, PREFIX, as_chain, chain_input, node_label
from .summary.report import RunReport

log = logging.getLogger("cached_sampler")

# Step counts at or below this with cfg 1 look like a Lightning/Turbo/Hyper/lightx2v distillation that
# leaves no trace on the model object: warn instead of refusing.
FEW_STEPS = 8


def safety_inputs() -> list:
    return [
        io.Boolean.Input("allow_distilled", default=False, optional=True, tooltip=(
            "Run skipping/forecasting interceptors on a step-distilled model (Flux schnell, LCM, Z-Image Turbo, "
            "...). Off by default: with so few steps every step matters and caching degrades the image.")),
        io.Boolean.Input("cache_on_cpu", default=False, optional=True, tooltip=(
            "Keep cached tensors in system RAM instead of on the GPU: saves VRAM on large video models at the "
            "cost of a copy per cached step.")),
    ]


def plot_output():
    """The tuning plot, appended after the latent (outputs are positional in saved workflows)."""
    return io.Image.Output("tuning_plot", display_name="tuning_plot", tooltip=(
        "Tuning plot: the change metric of every step against the threshold, computed and skipped steps "
        "marked. Connect a Preview Image to pick a threshold; unused otherwise."))


def ksampler_inputs(*names: str) -> list:
    """KSampler's inputs, with its names, ranges and tooltips, so saved widget values line up: all of them
    in KSampler's order, or the ones named, in the order named."""
    inputs = [
        io.Model.Input("model", tooltip="The model used for denoising the input latent."),
        io.Int.Input("seed", default=0, min=0, max=0xffffffffffffffff, control_after_generate=True,
                     tooltip="The random seed used for creating the noise."),
        io.Int.Input("steps", default=20, min=1, max=10000, tooltip="The number of steps used in the denoising process."),
        io.Float.Input("cfg", default=8.0, min=0.0, max=100.0, step=0.1, round=0.01, tooltip=(
            "The Classifier-Free Guidance scale balances creativity and adherence to the prompt.")),
        io.Combo.Input("sampler_name", options=comfy.samplers.KSampler.SAMPLERS, tooltip=(
            "The algorithm used when sampling, this can affect the quality, speed, and style of the output.")),
        io.Combo.Input("scheduler", options=comfy.samplers.KSampler.SCHEDULERS, tooltip=(
            "The scheduler controls how noise is gradually removed to form the image.")),
        io.Conditioning.Input("positive", tooltip="The conditioning describing what to include in the image."),
        io.Conditioning.Input("negative", tooltip="The conditioning describing what to exclude from the image."),
        io.Latent.Input("latent_image", tooltip="The latent image to denoise."),
    ]
    if not names:
        return inputs
    by_name = {i.id: i for i in inputs}
    return [by_name[n] for n in names]


def prepare(model, chain: InterceptorChain, node: str, allow_distilled: bool, cache_on_cpu: bool,
            steps: int | None = None, cfg: float | None = None, report: RunReport | None = None,
            schedule: tuple[int, int] | None = None):
    """The model to sample with and the report that will describe the run. Validation happens here,
    before any sampling; a refused chain leaves ``model`` untouched. Without a report (Apply
    Interceptors, whose output ComfyUI reuses across prompts) runs are only logged. ``schedule``: where the
    run's steps sit in the model's whole schedule (``adapter.schedule_of``)."""
    report = report or RunReport(node, chain, live=False)
    if chain.empty:
        return model, report
    if steps is not None and cfg is not None and steps <= FEW_STEPS and abs(cfg - 1.0) < 1e-6 and chain.alters_output:
        report.warn(f"{steps} steps at cfg 1 looks like a distilled (Lightning/Turbo/Hyper/lightx2v) setup; "
                    f"caching rarely helps there and may degrade the image.")
    try:
        hooks = dict(on_run_end=report.run_ended, on_evaluation=report.evaluation_ended) if report.live else {}
        patched = adapter.install(model, chain, allow_distilled=allow_distilled, cache_on_cpu=cache_on_cpu,
                                        schedule=schedule, **hooks)
    except ValueError as e:
        raise ValueError(f"{node}: {e}") from None
    return patched, report


def sample(display_name: str, node_id, model, interceptors, allow_distilled: bool, cache_on_cpu: bool, steps: int,
           cfg: float, **ksampler) -> io.NodeOutput:
    """What both Cached Samplers do: validate and install the chain, run ComfyUI's ``common_ksampler`` with
    the patched model (``ksampler``: its other arguments), and report the run on the node."""
    node = node_label(display_name, node_id)
    chain = as_chain(interceptors, node)
    report = RunReport(node, chain, node_id=node_id)
    schedule = adapter.schedule_of(steps, ksampler.get("denoise", 1.0), ksampler.get("start_step", 0))
    patched, report = prepare(model, chain, node, allow_distilled, cache_on_cpu, steps, cfg, report, schedule)
    (latent,) = comfy_nodes.common_ksampler(patched, steps=steps, cfg=cfg, **ksampler)
    return io.NodeOutput(latent, report.plot(), ui=report.ui())


class CachedSampler(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id=PREFIX,
            display_name="Cached Sampler",
            category=CATEGORY,
            description=("A drop-in KSampler that runs an interceptor chain (caching, forecasting) inside ComfyUI's "
                         "sampling loop. With nothing connected to 'interceptors' it is exactly KSampler."),
            inputs=[
                *ksampler_inputs(),
                io.Float.Input("denoise", default=1.0, min=0.0, max=1.0, step=0.01, tooltip=(
                    "The amount of denoising applied; lower values keep the structure of the input latent.")),
                chain_input(),
                *safety_inputs(),
            ],
            outputs=[io.Latent.Output(tooltip="The denoised latent."), plot_output()],
            hidden=[io.Hidden.unique_id],
            not_idempotent=False,
        )

    @classmethod
    def execute(cls, model, seed, steps, cfg, sampler_name, scheduler, positive, negative, latent_image,
                denoise=1.0, interceptors=None, allow_distilled=False, cache_on_cpu=False) -> io.NodeOutput:
        return sample("Cached Sampler", cls.hidden.unique_id, model, interceptors, allow_distilled, cache_on_cpu,
                      steps, cfg, seed=seed, sampler_name=sampler_name, scheduler=scheduler, positive=positive,
                      negative=negative, latent=latent_image, denoise=denoise)


class CachedSamplerAdvanced(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id=f"{PREFIX}Advanced",
            display_name="Cached Sampler (Advanced)",
            category=CATEGORY,
            description=("A drop-in KSampler (Advanced): start/end steps for two-stage workflows such as Wan 2.2 "
                         "high/low-noise models. Each segment gets its own fresh cache."),
            inputs=[
                *ksampler_inputs("model"),
                io.Combo.Input("add_noise", options=["enable", "disable"], tooltip="Whether to add noise to the latent first."),
                io.Int.Input("noise_seed", default=0, min=0, max=0xffffffffffffffff, control_after_generate=True,
                             tooltip="The random seed used for creating the noise."),
                *ksampler_inputs("steps", "cfg", "sampler_name", "scheduler", "positive", "negative",
                                 "latent_image"),
                io.Int.Input("start_at_step", default=0, min=0, max=10000, tooltip="The step to start denoising at."),
                io.Int.Input("end_at_step", default=10000, min=0, max=10000, tooltip="The step to stop denoising at."),
                io.Combo.Input("return_with_leftover_noise", options=["disable", "enable"], tooltip=(
                    "Return the latent with the remaining noise, for a second sampler to continue from.")),
                chain_input(),
                *safety_inputs(),
            ],
            outputs=[io.Latent.Output(tooltip="The denoised latent."), plot_output()],
            hidden=[io.Hidden.unique_id],
        )

    @classmethod
    def execute(cls, model, add_noise, noise_seed, steps, cfg, sampler_name, scheduler, positive, negative,
                latent_image, start_at_step, end_at_step, return_with_leftover_noise, interceptors=None,
                allow_distilled=False, cache_on_cpu=False) -> io.NodeOutput:
        return sample("Cached Sampler (Advanced)", cls.hidden.unique_id, model, interceptors, allow_distilled,
                      cache_on_cpu, steps, cfg, seed=noise_seed, sampler_name=sampler_name, scheduler=scheduler,
                      positive=positive, negative=negative, latent=latent_image, denoise=1.0,
                      disable_noise=add_noise == "disable", start_step=start_at_step, last_step=end_at_step,
                      force_full_denoise=return_with_leftover_noise != "enable")


class ApplyInterceptors(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id=f"{PREFIX}ApplyInterceptors",
            display_name="Apply Interceptors",
            category=CATEGORY,
            description=("Installs an interceptor chain on a model so that any sampler runs it (SamplerCustom"
                         "Advanced, guiders, other packs' samplers). Every sampling run still starts with a "
                         "fresh cache; stats go to the log."),
            inputs=[
                io.Model.Input("model", tooltip="The model to run the interceptors on."),
                chain_input(optional=False),
                *safety_inputs(),
            ],
            outputs=[io.Model.Output(tooltip="The model with the interceptors installed (the input is unchanged).")],
            hidden=[io.Hidden.unique_id],
        )

    @classmethod
    def execute(cls, model, interceptors, allow_distilled=False, cache_on_cpu=False) -> io.NodeOutput:
        node = node_label("Apply Interceptors", cls.hidden.unique_id)
        patched, _ = prepare(model, as_chain(interceptors, node), node, allow_distilled, cache_on_cpu)
        return io.NodeOutput(patched)


SAMPLER_NODES = [CachedSampler, CachedSamplerAdvanced, ApplyInterceptors]
