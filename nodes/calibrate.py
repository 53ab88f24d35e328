"""The calibration nodes: Auto Calibrate picks the steps to compute, MagCache Calibrate records MagCache's
curve, each from an uncached pass of the user's own prompt."""
from __future__ import annotations

import dataclasses

import nodes as comfy_nodes  # ComfyUI's top-level nodes module
import torch
from comfy_api.latest import io

from .. import adapter
from ..interceptors import (GuidanceCache, InterceptorChain, InterceptorError, MagCache, MagnitudeRecorder,
                            PlannedSchedule, Quality, Recorder, TaylorSeer, calibrate, image_quality, latent_quality,
                            recorded_ratios, recorded_trajectory, seed_margin, worst_quality)
from ..interceptors.methods.guidance import PLANNED
from ..interceptors.kinds import LEVEL_MODEL, NEGATIVE
from ..interceptors.methods.planned import Plan
from ..interceptors.methods.taylorseer import Forecast
from ..interceptors.methods.schedule_alignment import align, alignment_runs, why_not_aligned
from ..interceptors.methods.schedule_search import DAMPINGS, ORDERS, negatives_to_leave_out
from ..interceptors.methods.schedule_search import search as search_plan
from ..interceptors.quality import MIN_MARGIN, SPREAD_FACTOR
from ..interceptors.spec import level_input
from .common import CONFIG_CATEGORY, PREFIX, chain_output, node_label
from .configs import comfy_input
from .sampler import ksampler_inputs


def calibration_inputs() -> list:
    """The sampler inputs of the prompt to calibrate on (KSampler's, plus denoise)."""
    return [*ksampler_inputs(), io.Float.Input("denoise", default=1.0, min=0.0, max=1.0, step=0.01, tooltip=(
        "The amount of denoising applied, as on the sampler the chain will be used with."))]


class PromptRunner:
    """Samples the user's prompt (as KSampler would) with a chain, keeping each run's LoopState."""

    def __init__(self, model, seed, steps, cfg, sampler_name, scheduler, positive, negative, latent_image, denoise):
        self.model = model
        self.seed = seed
        self.args = (steps, cfg, sampler_name, scheduler, positive, negative, latent_image)
        self.denoise = denoise
        self.runs = []

    def __call__(self, chain: InterceptorChain, seed: int | None = None) -> dict:
        steps = self.args[0]
        patched = adapter.install(self.model, chain, on_run_end=lambda run, summary: self.runs.append(run),
                                        schedule=adapter.schedule_of(steps, self.denoise))
        (latent,) = comfy_nodes.common_ksampler(patched, self.seed if seed is None else seed, *self.args,
                                                denoise=self.denoise)
        return latent


class CalibrationNode(io.ComfyNode):
    """What both calibration nodes do first: sample the prompt given by calibration_inputs() uncached,
    watched by a recorder."""

    DISPLAY_NAME = ""

    @classmethod
    def uncached_pass(cls, model, prompt: dict, recorder) -> tuple[str, PromptRunner, dict]:
        """(the node's label for messages, the prompt's runner, the uncached latent); ``prompt``: the
        sampler inputs of calibration_inputs() but the model, by name."""
        node = node_label(cls.DISPLAY_NAME, cls.hidden.unique_id)
        sample = PromptRunner(model, **prompt)
        return node, sample, sample(InterceptorChain.of([recorder(node=node)]))


def decoded(vae, latent: dict) -> torch.Tensor:
    """The images VAE Decode would give for ``latent`` (one decode, of the final result only)."""
    samples = latent["samples"]
    return vae.decode(samples.unbind()[0] if samples.is_nested else samples)


LATENT_NOTE = (" This is latent, not image, PSNR: how it relates to image quality varies by model (on the bundled "
               "digits model it reads about 2.5 dB above the decoded images' PSNR). Connect a VAE to measure "
               "the images.")


SEARCHES = ["steps and forecast", "steps", "greedy"]
NEGATIVE_BRANCH = ["always computed", "left out where the target holds"]
MARGINS = ["auto", "none"]


ALIGN_TOOLTIP = (
    "For 'budget': after the plan is chosen, move the sigmas its computed steps run at (the skipped steps' re-spaced "
    "between them; the first and last sigma stay) where real cached runs read a higher PSNR against the uncached "
    "one: cache-aware schedule alignment, after BudCache (arXiv 2606.13496), as a coordinate search of 2 rounds, "
    f"at most 4 runs per computed step and seed ({alignment_runs(8)} at a budget of 8): about twice the "
    "calibration time. A move is kept only where it raises the worst seed's PSNR, so the plan is never worse than "
    "without it on the seeds checked. Measured at 28 steps (4 seeds, 4 held out): on held-out seeds the worst "
    "seed gained 3.1 dB at a budget of 6 on the digits model and 2.3 dB at 10 on the photos model, and moved by "
    "-0.25 to +0.5 dB at the other budgets of 6, 8 and 10 (bench/budcache.md). The chain then makes the sampler "
    "step through those sigmas, only at the steps, sampler, scheduler and denoise calibrated; any other run "
    "computes every step and says so. For samplers with one model evaluation per step.")


def computed_negative(run) -> bool:
    """Whether the model computed a negative CFG branch in ``run`` (none at cfg 1)."""
    return any(r.ran.get(NEGATIVE) for r in run.records)


class AutoCalibrate(CalibrationNode):
    DISPLAY_NAME = "Auto Calibrate"

    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id=f"{PREFIX}AutoCalibrate",
            display_name=cls.DISPLAY_NAME,
            category=CONFIG_CATEGORY,
            description=(
                "Runs your prompt once uncached, then chooses which steps to compute so that the result meets your "
                "target: 'quality' (the fewest computed steps whose result stays above a PSNR against the uncached "
                "one) or 'budget' (exactly N computed steps, placed where they matter). The other steps are "
                "forecast (TaylorSeer in sigma); by default the search also picks the forecast (reuse, order 1 or 2). "
                "Candidate plans are checked with real cached runs of the same "
                "prompt, on the decoded images when a VAE is connected, else on the final latent, and on as many "
                "seeds as 'seeds' says. Connect the chain to a Cached Sampler with the same steps and sampler."),
            inputs=[
                *calibration_inputs(),
                io.Combo.Input("target", options=["quality", "budget"], tooltip=(
                    "'quality': meet min_psnr with the fewest computed steps. 'budget': compute exactly "
                    "'budget' steps, placed for the best quality.")),
                io.Float.Input("min_psnr", default=35.0, min=10.0, max=80.0, step=0.5, tooltip=(
                    "For 'quality': the PSNR (dB) the cached result must keep against the uncached one. With a "
                    "VAE connected it is image PSNR (30 is visibly close, 35 hard to tell apart, 40+ practically "
                    "identical). Without one it is PSNR of the final latent, whose relation to image quality "
                    "varies by model: on the bundled digits model latent PSNR reads about 2.5 dB above image "
                    "PSNR, on other models the gap can be far larger.")),
                io.Int.Input("budget", default=8, min=2, max=10000, tooltip=(
                    "For 'budget': how many model evaluations to compute (the first always is; the 'greedy' search "
                    "also computes the last).")),
                io.Int.Input("order", default=1, min=0, max=2, tooltip=(
                    "Forecast order for skipped steps (0 reuses, 1 extrapolates linearly) when 'search' keeps it; "
                    "'steps and forecast' chooses the order itself.")),
                io.Vae.Input("vae", optional=True, tooltip=(
                    "Optional: the model's VAE. When connected, every plan is judged on the decoded images (PSNR "
                    "in the VAE's 0..1 range, SSIM alongside) instead of the latent. Only the final result is "
                    "decoded, once per sampling run: the uncached pass and each plan checked, on each seed (11 "
                    "decodes per seed for a 'quality' target at 28 steps). On the bundled digits model they took "
                    "under 0.2% of the calibration's time; a video VAE's decode can take as long as several "
                    "sampling steps.")),
                io.Int.Input("seeds", default=3, min=1, max=64, optional=True, tooltip=(
                    "Check every candidate plan on this many seeds (seed, seed+1, ...) and keep the worst result, "
                    "so the plan holds beyond one noise; with 'margin' auto their spread also sets the margin. Each "
                    "seed adds an uncached pass and a run per plan checked.")),
                io.Combo.Input("search", options=SEARCHES, default=SEARCHES[0], optional=True, tooltip=(
                    "'steps and forecast': a dynamic program over the recorded per-step forecast errors proposes "
                    "placements for every budget (with front-loaded and even schedules, and Fixed Cadence's growing "
                    "ones with a warm-up and the last step forecast), for reuse and TaylorSeer order 1 and 2, and "
                    "real runs pick the least work that meets the target, then the highest PSNR at that work, then "
                    "tries that plan less one step, its forecast also damped by 0.2 and 0.4 (at 28 steps and the "
                    "other defaults, 45-160 runs per seed on the bench's image models, 200-330 on its video model). "
                    "'steps': the same search with the "
                    "forecast 'order'. 'greedy': the plan search of 0.2.0 (greedy and even placements, first and last "
                    "computed; about 10 runs).")),
                io.Int.Input("candidates", default=4, min=1, max=32, optional=True, tooltip=(
                    "For the two searches: how many placements are measured per budget before it counts as not "
                    "met (more: more runs, a plan closer to the least work).")),
                io.Combo.Input("negative_branch", options=NEGATIVE_BRANCH, default=NEGATIVE_BRANCH[0], optional=True,
                               tooltip=(
                    "For 'quality' with the 'steps and forecast' search: 'left out where the target holds' also "
                    "tries computing only the positive CFG branch on each computed step (the negative estimated "
                    "from it, half a step's work), last step first, and keeps each omission the plan's bound "
                    "survives (min_psnr, plus the margin with 'margin' auto; one run per computed step). It spends "
                    "what the plan measured above that bound, so the plan may hold on fewer unseen seeds; 'always "
                    "computed' keeps both branches.")),
                io.Combo.Input("margin", options=MARGINS, default=MARGINS[0], optional=True, tooltip=(
                    "For 'quality' with 'seeds' above 1: 'auto' plans for min_psnr plus a margin that grows with "
                    "how much the plan's PSNR differs from seed to seed (1.5 times its standard deviation over the "
                    "seeds checked, at least 1 dB and at most 6 dB), so that the target also holds on seeds not "
                    "checked; 'none' plans for min_psnr itself (cheaper plans that miss it on more unseen seeds).")),
                comfy_input(level_input()),  # the plan's level: its candidates are measured there
                io.Boolean.Input("align_schedule", default=False, optional=True, tooltip=ALIGN_TOOLTIP),
            ],
            outputs=[chain_output(),
                     io.Latent.Output(display_name="uncached_latent", tooltip=(
                         "The uncached result of the calibration pass (at the first seed).")),
                     io.String.Output(display_name="plan", tooltip=(
                         "The plan chosen and the quality it measured, naming where: image or latent PSNR."))],
            hidden=[io.Hidden.unique_id],
        )

    @classmethod
    def execute(cls, model, target, min_psnr, budget, order, vae=None, seeds=3, search=None, candidates=4,
                negative_branch=None, margin=None, level=LEVEL_MODEL, align_schedule=False,
                **prompt) -> io.NodeOutput:
        search = search or SEARCHES[0]
        leave_negative_out = negative_branch == NEGATIVE_BRANCH[1]
        node, sample, reference = cls.uncached_pass(model, prompt, Recorder)
        sigmas, outputs = recorded_trajectory(sample.runs[-1])
        recorded = sample.runs[-1]
        schedule = recorded.sample_sigmas
        seed_list = [(sample.seed + k) % 2 ** 64 for k in range(seeds)]
        references = [reference] + [sample(InterceptorChain(), seed) for seed in seed_list[1:]]
        final = (lambda latent: latent["samples"]) if vae is None else (lambda latent: decoded(vae, latent))
        quality = latent_quality if vae is None else image_quality
        uncached = [final(latent) for latent in references]

        def plan_chain(compute, measured=None, forecast=order, leave_out=(), aligned=()):
            forecast = Forecast.of(forecast)
            items = [PlannedSchedule(compute=tuple(compute), sigmas=tuple(aligned[:-1] or sigmas),
                                     schedule=tuple(schedule), sampler=recorded.sampler, cfg=recorded.cfg,
                                     quality=measured, node=node, level=level, aligned=tuple(aligned)),
                     TaylorSeer(order=forecast.order, damping=forecast.damping, node=node)]
            if leave_out:
                items.append(GuidanceCache(mode=PLANNED, leave_out=tuple(leave_out), sigmas=tuple(sigmas),
                                           schedule=tuple(schedule), sampler=recorded.sampler, node=node))
            return InterceptorChain.of(items)

        measured: dict[tuple, Quality] = {}  # a plan measured by the first search is not sampled again

        def measure(compute, forecast=order, leave_out=(), aligned=()) -> Quality:
            key = (tuple(compute), forecast, tuple(leave_out), tuple(aligned))
            if key not in measured:
                chain = plan_chain(compute, forecast=forecast, leave_out=leave_out, aligned=aligned)
                measured[key] = worst_quality(quality(ref, final(sample(chain, seed)))
                                              for ref, seed in zip(uncached, seed_list))
            return measured[key]

        def find(bound: float | None) -> Plan:
            goal = {"budget": budget if target == "budget" else None, "min_psnr": bound}
            if search == "greedy":
                return calibrate(sigmas, outputs, measure, order=order, **goal)
            if goal["budget"] is not None and goal["budget"] < 2:
                raise InterceptorError("A budget below 2 computed steps leaves nothing to forecast from.")
            both = search == SEARCHES[0]  # the forecast searched too
            found = search_plan(sigmas, outputs, measure, orders=ORDERS if both else (order,), per_budget=candidates,
                                dampings=DAMPINGS if both else (), **goal)
            forecast = Forecast.of(found.order)
            return Plan(found.compute, len(sigmas), found.quality, order=forecast.order, damping=forecast.damping,
                        runs=found.runs)

        asked = min_psnr if target == "quality" else None
        try:
            plan = find(asked)
            added = seed_margin(plan.quality.per_seed) if asked is not None and margin != MARGINS[1] else 0.0
            if added > 0:
                # plan again for the target plus the seeds' spread, unless the plan found already meets that
                asked = min_psnr + added
                if plan.quality.psnr < asked:
                    plan = dataclasses.replace(find(asked), runs=len(measured))
            order = plan.forecast if plan.order is not None else order
            if leave_negative_out and target == "quality" and search == SEARCHES[0] and computed_negative(recorded):
                # the guidance level too: on which computed steps the negative branch may be estimated
                tried = []
                left_out, left_quality = negatives_to_leave_out(
                    plan.compute, len(sigmas), lambda lo: tried.append(lo) or measure(plan.compute, order, lo),
                    asked)
                if left_out:
                    plan = dataclasses.replace(plan, quality=left_quality, negative_left_out=left_out,
                                               runs=plan.runs + len(tried))
            unaligned = None
            if align_schedule:
                unaligned = why_not_aligned(target, sigmas, schedule)
                if unaligned is None:
                    found = align(schedule, plan.compute, lambda s: measure(plan.compute, order, (), s), plan.quality)
                    plan = dataclasses.replace(plan, quality=found.quality, plain_psnr=plan.quality.psnr,
                                               align_runs=found.runs, aligned=found.schedule if found.moved else ())
        except InterceptorError as e:
            raise InterceptorError(f"{node}: {e}") from None
        steps = tuple(r.step for r in recorded.records)  # how the text numbers them: steps, or evaluations of steps
        plan = dataclasses.replace(plan, steps=steps if len(steps) == len(sigmas) else ())
        text = plan.describe()
        if asked is not None and asked > min_psnr:
            text += (f"; planned for {asked:.2f} dB: the target {min_psnr} dB plus a margin of {asked - min_psnr:.2f} "
                     f"dB for seeds not checked ({SPREAD_FACTOR:g} times the spread of the PSNR over the {seeds} seeds, "
                     f"at least {MIN_MARGIN:g} dB)")
        if target == "quality" and len(plan.compute) == len(sigmas):
            text += f" (the target {min_psnr if asked == min_psnr else f'{asked:.2f}'} dB needs every step computed)"
        if unaligned is not None:
            text += f"; the sigmas were not aligned: {unaligned}"
        text += "." + (LATENT_NOTE if vae is None else "")
        chain = plan_chain(plan.compute, plan.quality, order, plan.negative_left_out, plan.aligned)
        return io.NodeOutput(chain, reference, text,
                             ui={"text": (text,)})


class MagCacheCalibrate(CalibrationNode):
    DISPLAY_NAME = "MagCache Calibrate"

    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id=f"{PREFIX}MagCacheCalibrate",
            display_name=cls.DISPLAY_NAME,
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
    def execute(cls, model, threshold, K, retention_ratio, **prompt) -> io.NodeOutput:
        node, sample, latent = cls.uncached_pass(model, prompt, MagnitudeRecorder)
        ratios = recorded_ratios(sample.runs[-1])
        text = ", ".join(f"{r:.5f}" for r in ratios)
        chain = InterceptorChain.of([MagCache(threshold=threshold, max_consecutive_cached=K, retention=retention_ratio,
                                              model_type="custom", ratios=ratios, node=node)])
        return io.NodeOutput(chain, latent, text, ui={"text": (text,)})


CALIBRATION_NODES = [AutoCalibrate, MagCacheCalibrate]
