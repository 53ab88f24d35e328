"""Installing a chain on a ComfyUI model: the sampling wrappers, and the run each sampling run gets."""
from __future__ import annotations

import logging
import time
from typing import Callable

import torch
from comfy.patcher_extension import WrappersMP

from ..interceptors import ChainError, Granularity, InterceptorChain, LoopState, NaNWatch, summarize
from ..interceptors.kinds import LEVEL_FEATURES
from ..interceptors.distributed import RankGroup
from ..interceptors.engine import BlockPlan, guided_batch, model_forward
from ..interceptors.threads import gathers
from . import compiled_blocks, conflicts
from .blocks import adds_between_blocks, install_blocks, remove_blocks
from .cards import model_card, signal_probe
from .keys import CHAIN_KEY, STATE_KEY, WRAPPER_KEY, installed_chain

log = logging.getLogger("cached_sampler")


def install(model, chain: InterceptorChain, *, allow_distilled: bool = False, cache_on_cpu: bool = False,
            on_run_end: Callable | None = None, on_evaluation: Callable | None = None,
            schedule: tuple[int, int] | None = None, rank_group: Callable[[], RankGroup | None] | None = None):
    """A clone of ``model`` that runs ``chain`` on every sampling run. ``model`` is never modified.

    Validation against the model happens first, so a refused chain leaves nothing half-applied.
    ``on_run_end(run, summary)`` and ``on_evaluation(run, ev)`` receive what each run did. ``schedule``
    (:func:`schedule_of`) places each run's steps in the model's whole schedule when the sampling node knows
    it; without it a run counts its steps from its own start, and says so if it starts part way.
    ``rank_group()`` gives each run the ranks it shares its token sequence with under sequence parallelism
    (see interceptors/distributed.py); never guessed from torch.distributed alone, since ranks that sample
    different prompts (data parallelism) must not agree on anything.
    """
    previous = installed_chain(model)
    if previous is not None and not previous.empty:
        raise ValueError(
            "This model already runs an interceptor chain (from an Apply Interceptors node): connect the "
            "caching nodes to one place only, either Apply Interceptors or the sampler's 'interceptors' input.")
    card = model_card(model)
    chain.validate_for(card, allow_distilled=allow_distilled)
    compile_apart = compiled_blocks.will_compile_blocks(chain, card, model)
    problems = conflicts.conflicts_of(chain, model.model_options, model.wrappers, blocks_apart=compile_apart)
    if problems:
        raise ChainError("\n".join(problems))
    decider = chain.decider(Granularity.BLOCKS)
    modulated = signal_probe(card, model, decider) if decider is not None else None
    installation = Installation(chain, card, cache_on_cpu=cache_on_cpu, on_run_end=on_run_end,
                                on_evaluation=on_evaluation, schedule=schedule, rank_group=rank_group)
    installation.feature_plan, installation.feature_note = feature_blocks(chain, card, model)
    return installation.patch(model, modulated, compile_apart)


def feature_blocks(chain: InterceptorChain, card, model) -> tuple[BlockPlan | None, str | None]:
    """The block stack's plan (one segment per block group) for the chain's whole-model decider at the feature
    level, or None and why that decider works on the model output instead (said on the node when a run starts)."""
    decider = chain.decider(Granularity.MODEL)
    if decider is None or decider.level != LEVEL_FEATURES:
        return None, None
    why = None
    if not card.offers(Granularity.BLOCKS) or not card.groups:
        why = f"{card.name} exposes no transformer blocks to caching" + (f" ({card.blocks_off})" if card.blocks_off
                                                                         else "")
    elif chain.decider(Granularity.BLOCKS) is not None:
        why = f"{chain.decider(Granularity.BLOCKS).label} of the same chain works inside the blocks"
    elif conflicts.compiled(model.model_options, model.wrappers):
        why = "TorchCompileModel compiled the whole model, blocks included"
    if why is not None:
        return None, conflicts.feature_fallback(decider, why)
    return BlockPlan([(g.name, g.count) for g in card.groups], 0, 0), None


class Installation:
    """One chain installed on one model: ComfyUI's hooks, as methods, and what they share. Each sampling run gets
    a fresh :class:`LoopState` (:meth:`outer_sample`); what only the adapter counts of a run (the forwards in which
    another patch served some of the pack's block slots) is kept here per run, and dropped as the run ends."""

    def __init__(self, chain: InterceptorChain, card, *, cache_on_cpu: bool = False,
                 on_run_end: Callable | None = None, on_evaluation: Callable | None = None,
                 schedule: tuple[int, int] | None = None, rank_group: Callable[[], RankGroup | None] | None = None):
        self.chain = chain
        self.card = card
        self.cache_on_cpu = cache_on_cpu
        self.on_run_end = on_run_end
        self.schedule = schedule
        self.rank_group = rank_group
        self.guidance = chain.decider(Granularity.GUIDANCE)
        self.observers = [NaNWatch()]
        if on_evaluation is not None:
            self.observers.append(_EvaluationHook(on_evaluation))
        self.block_slots: dict = {}  # (group, index) -> position of every block slot the pack serves
        # the block stack of a whole-model decider at the feature level (feature_blocks), or why it has none
        self.feature_plan: BlockPlan | None = None
        self.feature_note: str | None = None
        self.foreign_slot_forwards: dict[LoopState, int] = {}  # run -> forwards whose slots another patch served

    def patch(self, model, modulated=None, compile_apart: bool = False):
        """A clone of ``model`` with the chain and every hook on it; with ``compile_apart``, its whole-model compile
        replaced by one compile per block (adapter/compiled_blocks.py)."""
        chain, card = self.chain, self.card
        patched = model.clone()
        if compile_apart:
            compiled_blocks.compile_blocks(patched, card)
        patched.model_options.setdefault("transformer_options", {})[CHAIN_KEY] = chain
        patched.add_wrapper_with_key(WrappersMP.OUTER_SAMPLE, WRAPPER_KEY, self.outer_sample)
        if self.guidance is not None or any(gathers(d) for d in chain.deciders):
            # the guidance level's work; a gathered decider's: count the devices' threads of native multi-GPU
            patched.add_wrapper_with_key(WrappersMP.CALC_COND_BATCH, WRAPPER_KEY, self.calc_cond_batch)
        patched.add_wrapper_with_key(WrappersMP.PREDICT_NOISE, WRAPPER_KEY, self.predict_noise)
        patched.add_wrapper_with_key(WrappersMP.APPLY_MODEL, WRAPPER_KEY, self.apply_model)
        decider = chain.decider(Granularity.BLOCKS)
        plan = (BlockPlan([(g.name, g.count) for g in card.groups], *decider.blocks()) if decider is not None
                else self.feature_plan)
        if plan is not None:
            install_blocks(patched, card, plan, modulated)
            self.block_slots.update({(group, index): position for group, index, position in card.block_positions()})
        return patched

    def outer_sample(self, executor, *args, **kwargs):
        """One sampling run: a fresh run state for it, its summary and its release."""
        chain, schedule = self.chain, self.schedule
        guider = executor.class_obj
        # EasyCache or TorchCompileModel may have been applied after Apply Interceptors: check again, before
        # anything is sampled (ComfyUI has merged every wrapper of the model into the run's options by now).
        problems = conflicts.conflicts_of(chain, guider.model_options, {},
                                          blocks_apart=compiled_blocks.blocks_compiled_apart(guider.model_options, {}))
        if problems:
            raise ChainError("\n".join(problems))
        sigmas = args[3] if len(args) > 3 else kwargs["sigmas"]
        sampler = args[2] if len(args) > 2 else kwargs.get("sampler")
        swapped = _sampling_sigmas(chain, sigmas, sampler_identity(sampler))
        if swapped is not None:  # an aligned plan's sigmas, for the run it was calibrated on
            sigmas = swapped
            args, kwargs = ((*args[:3], sigmas, *args[4:]), kwargs) if len(args) > 3 else (args, {**kwargs,
                                                                                                "sigmas": sigmas})
        sampling = guider.model_patcher.get_model_object("model_sampling")
        first_step, schedule_steps = schedule or (0, None)
        run = LoopState(chain, sigmas.tolist(), percent_to_sigma=lambda p: float(sampling.percent_to_sigma(p)),
                        cache_device="cpu" if self.cache_on_cpu else None, observers=self.observers,
                        first_step=first_step, schedule_steps=schedule_steps,
                        group=self.rank_group() if self.rank_group is not None else None,
                        sampler=sampler_identity(sampler), cfg=guider_cfg(guider), card=self.card)
        if schedule is None:
            _note_partial_run(run, chain, run.sample_sigmas, float(sampling.sigma_max))
        self.place_features(run, guider.model_options)
        if self.guidance is not None:
            conflicts.check_guider(run, self.guidance, guider)
        conflicts.note_stateful_patches(run, guider.model_options)
        options = guider.model_options.setdefault("transformer_options", {})
        if conflicts.adaptive_step(run.sampler):
            run.switch_off(f"{conflicts.sampler_name(run.sampler)} picks its own steps by error control, and skipped "
                           f"or estimated model work would defeat it (it answers with more steps, not fewer): "
                           f"caching was switched off for this run, and every evaluation was computed.")
        options[STATE_KEY] = run
        self.foreign_slot_forwards[run] = 0
        started = time.perf_counter()
        try:
            result = executor(*args, **kwargs)
            run.transfer()  # what is still to read: the last evaluation's NaN flags, a calibration's last values
            run.time_evaluations()
            return result
        finally:
            options.pop(STATE_KEY, None)
            conflicts.note_slots_taken(run, self.foreign_slot_forwards.pop(run, 0))
            summary = summarize(run, time.perf_counter() - started)
            log.info("Cached Sampler: %s", summary.text())
            if self.on_run_end is not None:
                self.on_run_end(run, summary)
            run.release_caches()

    def place_features(self, run: LoopState, model_options: dict) -> None:
        """Where the run's whole-model decider at the feature level works: in the block stack installed for it, or
        on the model output where there is none, or where TorchCompileModel was applied after the caching (its
        compiled forward would not follow the blocks' per-step pass-through)."""
        if self.feature_note is not None:
            run.note(self.feature_note)
        elif self.feature_plan is not None:
            if conflicts.compiled(model_options, {}):
                run.note(conflicts.feature_fallback(run.model_decider, "TorchCompileModel compiled the whole model, "
                                                                       "blocks included"))
            else:
                run.feature_plan = self.feature_plan

    def predict_noise(self, executor, x, timestep, model_options, seed):
        """One sampler evaluation (all CFG branches of a step)."""
        run = model_options.get("transformer_options", {}).get(STATE_KEY)
        if run is None:
            return executor(x, timestep, model_options, seed)
        if conflicts.AR_STATE_KEY in model_options["transformer_options"]:
            run.note(conflicts.AR_NOTE)  # every forward extends the sampler's KV cache: none may be skipped
            return executor(x, timestep, model_options, seed)
        if not run.off and not run.decided_ahead and conflicts.native_multigpu(model_options):
            # ComfyUI set the clones up before the run's first evaluation: nothing has been cached yet
            conflicts.share_decisions(run, model_options)
        # the sigma stays on the device until the evaluation's first transfer to the host (its decision's)
        run.begin_evaluation(timestep).from_sampler = True
        if run.decided_ahead and not run.off:
            run.decide_ahead()  # here, on the sampler's thread: the devices' threads only read the decisions
        try:
            return executor(x, timestep, model_options, seed)
        finally:
            run.end_evaluation()

    def apply_model(self, executor, x, t, c_concat=None, c_crossattn=None, control=None, transformer_options={},
                    **kw):
        """One batched forward: whole-model caching, and the forward the block replacements work in."""
        run = conflicts.active_run(transformer_options)
        if run is None or conflicts.AR_STATE_KEY in transformer_options:
            return executor(x, t, c_concat, c_crossattn, control, transformer_options, **kw)
        # a sampler's evaluation knows its sigma (None): reading ``t`` on every forward would stall the device
        ev = run.evaluation
        sigma = None if ev is not None and ev.from_sampler else float(t.flatten()[0])
        window = transformer_options.get("context_window")
        forward = run.begin_forward(sigma, x.shape[0], tuple(x.shape[1:]), x.dtype,
                                    transformer_options.get("cond_or_uncond"), transformer_options.get("uuids"),
                                    frames=_window_frames(window))
        forward.track_external = adds_between_blocks(self.card, control, transformer_options, kw)
        if self.block_slots and conflicts.slots_taken(transformer_options, self.block_slots):
            if self.feature_plan is not None:  # slots for the feature level only: from now on the model output
                if run.feature_plan is not None:
                    run.feature_plan = None
                    why = "another patch replaced some transformer-block slots from one forward on"
                    run.note(conflicts.feature_fallback(run.model_decider, why))
            else:
                forward.cacheable = False  # another patch serves some of our block slots in this call: compute it all
                if run in self.foreign_slot_forwards:  # a run this installation began (outer_sample)
                    self.foreign_slot_forwards[run] += 1
        output = None
        try:
            output = model_forward(run, forward, x, t, lambda: executor(
                x, t, c_concat, c_crossattn, control, transformer_options, **kw))
            return output
        finally:
            run.end_forward(forward, output)

    def calc_cond_batch(self, executor, model, conds, x_in, timestep, model_options):
        """The guider's conds list of one evaluation: the Guidance Cache's level, and where the devices' threads of
        native multi-GPU gather a measure, how many of them the conds start."""
        run = model_options.get("transformer_options", {}).get(STATE_KEY)
        if run is not None and not run.off and not run.decided_ahead and conflicts.native_multigpu(model_options):
            conflicts.share_decisions(run, model_options)
        if run is None or run.off or conflicts.AR_STATE_KEY in model_options["transformer_options"]:
            return executor(model, conds, x_in, timestep, model_options)

        def batch(subset):
            conflicts.expect_threads(run, subset, timestep, model_options)
            return executor(model, subset, x_in, timestep, model_options)
        if run.guidance_decider is None:
            return batch(conds)
        window = model_options["transformer_options"].get("context_window")
        return guided_batch(run, conds, x_in, timestep, batch,
                            window=tuple(window.index_list) if window is not None else None)


def _sampling_sigmas(chain: InterceptorChain, sigmas, sampler: str):
    """The sigmas the chain's deciders have this run step through instead of ``sigmas`` (a tensor like them), or
    None to keep them."""
    asked = sigmas.tolist()
    for decider in chain.deciders:
        swapped = decider.sampling_sigmas(asked, sampler)
        if swapped is not None:
            return torch.tensor(list(swapped), dtype=sigmas.dtype, device=sigmas.device)
    return None


def _window_frames(window) -> tuple[int, ...] | None:
    """The frames a ComfyUI context window covers (``transformer_options["context_window"]``), if any."""
    frames = getattr(window, "index_list", None)
    return tuple(int(i) for i in frames) if frames is not None else None


def sampler_identity(sampler) -> str:
    """What integrates a run: the sampler function's name and its options (a KSAMPLER's ``extra_options``:
    eta, s_noise, ...), e.g. ``euler_ancestral(eta=1.0, s_noise=1.0)``. Plans are keyed on it."""
    function = getattr(sampler, "sampler_function", None)
    name = getattr(function, "__name__", type(sampler).__name__ if sampler is not None else "")
    name = name[len("sample_"):] if name.startswith("sample_") else name
    options = getattr(sampler, "extra_options", None) or {}
    simple = sorted((k, v) for k, v in options.items() if isinstance(v, (bool, int, float, str)))
    return f"{name}({', '.join(f'{k}={v}' for k, v in simple)})" if simple else name


def guider_cfg(guider) -> float | None:
    cfg = getattr(guider, "cfg", None)
    return float(cfg) if isinstance(cfg, (int, float)) else None


def _note_partial_run(run: LoopState, chain: InterceptorChain, sigmas: list[float], sigma_max: float) -> None:
    """Apply Interceptors is not told where a run sits in the model's schedule: a run that starts late
    (denoise below 1, a later stage) or ends early (a first stage with leftover noise, the first half of
    SplitSigmas) has its step-counted settings stretched over its own steps. Say so."""
    counting = [d.label for d in chain.deciders if d.counts_steps]
    if not counting or not sigmas:
        return
    starts_late = sigmas[0] < sigma_max * 0.999
    ends_early = sigmas[-1] > 0
    if starts_late or ends_early:
        where = " and ".join(w for w, yes in (("starts part way into", starts_late),
                                                ("ends before the end of", ends_early)) if yes)
        run.note(f"this run {where} the model's schedule (denoise below 1, a stage of a two-stage graph or "
                 f"split sigmas), which this sampler does not tell Apply Interceptors: {', '.join(counting)} "
                 f"count steps over the run's own steps. A Cached Sampler node places them exactly.")


def uninstall(model):
    """A clone of ``model`` without the chain :func:`install` put on it (wrappers, block replacements, the chain
    itself), the block replacements it chained to put back; ``model`` itself when it runs no chain. Lets a model
    that lives on between prompts (a Raylight actor's) take a new chain in place of the old one."""
    if installed_chain(model) is None:
        return model
    clean = model.clone()
    for wrapper_type in (WrappersMP.OUTER_SAMPLE, WrappersMP.CALC_COND_BATCH, WrappersMP.PREDICT_NOISE,
                         WrappersMP.APPLY_MODEL):
        clean.remove_wrappers_with_key(wrapper_type, WRAPPER_KEY)
    options = clean.model_options["transformer_options"]
    options.pop(CHAIN_KEY, None)
    remove_blocks(options)
    return clean


class _EvaluationHook:
    def __init__(self, fn):
        self.fn = fn

    def on_forward(self, run, forward, output):
        pass

    def on_evaluation_end(self, run, ev):
        self.fn(run, ev)
