"""Maps ComfyUI's official sampling hooks onto an :class:`InterceptorChain`.

The only module besides ``nodes/`` that imports ComfyUI. Everything it changes goes through ComfyUI's
public extension points, and the model's own code computes every forward and every block that runs.
A few things read what ComfyUI does not offer as an interface, each checked where it is read:

* TeaCache's signal is computed from the first block's modulation modules (``MODULATION_MODULES``), which
  a ComfyUI update or another model class may rename; they are probed when the chain is installed, and a
  model without them is refused before anything is sampled;
* the model card comes from class names (``model.model``, its config, its diffusion model and which of
  its methods run the blocks: :func:`model_card`); an unknown class gets whole-model caching only;
* the Guidance Cache works with the standard guider only, told by ``CFGGuider.predict_noise`` being the
  guider's own (:func:`_check_guider`);
* other caches are told by their wrapper keys (EasyCache, LazyCache) and a compiled model by the key
  ``comfy_api``'s TorchCompileModel uses (:func:`other_cache`, :func:`compiled`);
* a context window's frames (``transformer_options["context_window"].index_list``), the sampler's
  function name (:func:`sampler_identity`) and Wan CausalAR's KV-cache state (``AR_STATE_KEY``).
The hooks:

* ``OUTER_SAMPLE`` wrapper: creates a fresh :class:`LoopState` for every sampling run and drops it
  afterwards (``guider.model_options`` is already a per-run copy, restored by ComfyUI when the run
  ends);
* ``PREDICT_NOISE`` wrapper: one sampler evaluation (all CFG branches of a step) per call;
* ``CALC_COND_BATCH`` wrapper (Guidance Cache only): the guider's conds list of one evaluation, of which it
  may compute the positive entries only;
* ``APPLY_MODEL`` wrapper: one batched forward, whole-model caching (fires for every model family,
  SD3 included);
* ``patches_replace["dit"]`` block replacements: block-level caching. A replacement someone else
  registered earlier is chained to, never overwritten; a forward in which another patch replaced the pack's
  block slots for that one call (Skip Layer Guidance's extra pass) is computed in full and never cached, and
  a run in which that happened to every forward says so in a note.

Under ComfyUI's native multi-GPU path (``model_options["multigpu_clones"]``, set by its MultiGPU CFG Split node)
the conds of one evaluation run on several devices at once, each from a thread of its own, and every thread
reaches these wrappers and block replacements with the same run state. The pack does not cache there: the
run is switched off at its first evaluation with a note, and every hook hands its work straight to the model
(:func:`native_multigpu`).

A chain is refused, before anything is sampled, where it could not be right: on a model that ComfyUI's
EasyCache/LazyCache already caches, and, for interceptors that work inside the transformer blocks, on a
model compiled by TorchCompileModel (whose compile wrapper drops the guards on transformer_options, so the
compiled blocks would ignore or freeze the per-step decisions). Both are checked when the chain is installed
and again when each run starts, since either patch can be applied after Apply Interceptors.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Callable

import torch

import comfy.samplers
from comfy.patcher_extension import WrappersMP

from .interceptors import (ChainError, DiffusionFacts, Granularity, InterceptorChain, LoopState, ModelCard, NaNWatch,
                           build_card, summarize)
from .interceptors.cards import runs_blocks
from .interceptors.distributed import RankGroup
from .interceptors.engine import BlockPlan, as_outputs, block_call, guided_batch, model_forward
from .interceptors.state import schedule_of  # noqa: F401  (the sampling nodes place their runs with it)

log = logging.getLogger("cached_sampler")

WRAPPER_KEY = "cached_sampler"
STATE_KEY = "cached_sampler_state"
CHAIN_KEY = "cached_sampler_chain"


def model_card(model) -> ModelCard:
    """The card of a ComfyUI ModelPatcher, from its classes and the blocks it really has."""
    base = model.model
    mro = tuple(c.__name__ for c in type(base).__mro__)
    config = getattr(base, "model_config", None)
    config_mro = tuple(c.__name__ for c in type(config).__mro__ if c is not object) if config is not None else ()
    settings = {k: v for k, v in (getattr(config, "unet_config", None) or {}).items()
                if isinstance(v, (bool, int, float, str)) or v is None}
    sampling = model.get_model_object("model_sampling")
    sampling_classes = tuple(c.__name__ for c in type(sampling).__mro__)
    diffusion = getattr(base, "diffusion_model", None)
    counts = {}
    if diffusion is not None:
        for name, child in diffusion.named_children():
            if isinstance(child, torch.nn.ModuleList):
                counts[name] = len(child)
    return build_card(mro, config_mro, sampling_classes, counts, diffusion=diffusion_facts(diffusion),
                      config_settings=settings, file_name=loaded_file_name(model))


def loaded_file_name(model) -> str:
    """The file name of the checkpoint a core loader loaded ``model`` from, where the running ComfyUI records it
    (``ModelPatcher.cached_patcher_init``: the loader and its arguments, the path first), else ""."""
    init = getattr(model, "cached_patcher_init", None)
    args = init[1] if isinstance(init, tuple) and len(init) > 1 and isinstance(init[1], tuple) else ()
    return os.path.basename(args[0]) if args and isinstance(args[0], str) else ""


def diffusion_facts(diffusion) -> DiffusionFacts | None:
    """The names the card rule needs about a diffusion model: its classes (up to torch's Module) and which of
    them define a method that may run the transformer blocks."""
    if diffusion is None:
        return None
    classes = [c for c in type(diffusion).__mro__ if c not in (torch.nn.Module, object)
               and not c.__module__.startswith(("torch.", "abc"))]
    runners = tuple((name, c.__name__) for c in classes for name, value in vars(c).items()
                    if callable(value) and runs_blocks(name))
    return DiffusionFacts(tuple(c.__name__ for c in classes), runners)


def installed_chain(model) -> InterceptorChain | None:
    """The chain an Apply Interceptors node already put on this model, if any."""
    return model.model_options.get("transformer_options", {}).get(CHAIN_KEY)


# ComfyUI core patches that conflict with a chain: (transformer_options key or wrapper key, what to call it).
OTHER_CACHES = (("easycache", "ComfyUI's EasyCache"), ("lazycache", "ComfyUI's LazyCache"),
                ("teacache", "Raylight's TeaCache"))  # Raylight's EasyCache port uses the "easycache" key too
# The autoregressive video sampler (comfy_extras SamplerARVideo, ``sample_ar_video``) puts its KV caches here for
# the length of a run. Every forward appends the frame block's keys and values to them and the sampler rolls them
# back after every step, whether the forward ran or not: a skipped forward would leave them short (and attention
# fails on an empty cache). Such forwards are always computed.
AR_STATE_KEY = "ar_state"
AR_NOTE = ("the autoregressive video sampler keeps a KV cache that every model forward must extend, so caching was "
           "off for this run: every step was computed")
COMPILE_WRAPPER_KEY = "torch.compile"          # comfy_api.torch_helpers.torch_compile.COMPILE_KEY
COMPILE_OPTIONS_KEY = "torch_compile_kwargs"   # ... .TORCH_COMPILE_KWARGS


def _wrapper_keys(wrappers: dict) -> set:
    return {key for by_key in (wrappers or {}).values() for key in (by_key or {})}


def other_cache(model_options: dict, wrappers: dict) -> str | None:
    """The name of a core caching patch already on the model (EasyCache, LazyCache), or None."""
    options = model_options.get("transformer_options", {})
    keys = _wrapper_keys(wrappers) | _wrapper_keys(options.get("wrappers", {}))
    holder = options.get("easycache")
    if holder is not None and "lazy" in type(holder).__name__.lower():
        return "ComfyUI's LazyCache"
    for key, name in OTHER_CACHES:
        if key in keys or (key == "easycache" and holder is not None):
            return name
    return None


def compiled(model_options: dict, wrappers: dict) -> bool:
    """Whether ComfyUI's TorchCompileModel (or its helper set_torch_compile_wrapper) compiled the model."""
    options = model_options.get("transformer_options", {})
    keys = _wrapper_keys(wrappers) | _wrapper_keys(options.get("wrappers", {}))
    return COMPILE_WRAPPER_KEY in keys or COMPILE_OPTIONS_KEY in model_options


def conflicts(chain: InterceptorChain, model_options: dict, wrappers: dict) -> list[str]:
    """What else on the model makes this chain unsafe to run (empty when nothing does)."""
    problems = []
    other = other_cache(model_options, wrappers)
    if other is not None:
        names = ", ".join(ic.label for ic in chain)
        problems.append(
            f"{other} is already caching this model, and {names} would cache it a second time: each cache would "
            f"skip work the other relies on. Remove the {other.split()[-1]} node or the caching nodes of this "
            f"chain.")
    if compiled(model_options, wrappers):
        problems.extend(chain.compile_problems("TorchCompileModel"))
    return problems


# What ComfyUI's native multi-GPU path puts into the options (comfy/samplers.py, _calc_cond_batch_multigpu).
MULTIGPU_CLONES_KEY = "multigpu_clones"           # model_options: device -> the model clone that runs there
MULTIGPU_DEVICE_KEY = "multigpu_thread_device"    # transformer_options of a forward run by a device's thread


def native_multigpu(model_options: dict) -> bool:
    """Whether ComfyUI spreads this evaluation's conds over several devices (its native multi-GPU path, which
    runs them concurrently from a thread pool). The same test ComfyUI's own cond batching makes."""
    return MULTIGPU_CLONES_KEY in model_options


def multigpu_note(model_options: dict) -> str:
    devices = model_options.get(MULTIGPU_CLONES_KEY) or {}
    where = f" ({', '.join(str(d) for d in devices)})" if devices else ""
    count = len(devices) or "several"
    return (f"ComfyUI's native multi-GPU (MultiGPU CFG Split) ran this run's conditionings on {count} devices{where}"
            f" at once, one thread each: caching was switched off for the run, every step was "
            f"computed in full and the output is plain sampling's. To cache, sample on one device (without "
            f"MultiGPU CFG Split).")


def _active_run(transformer_options: dict) -> LoopState | None:
    """The run a forward or block may cache for, or None: no run, caching switched off for it, or a forward
    that a multi-GPU worker thread runs (never cached; switches the run off if nothing had yet)."""
    run = transformer_options.get(STATE_KEY)
    if run is None or run.off:
        return None
    if MULTIGPU_DEVICE_KEY in transformer_options:
        run.switch_off(multigpu_note({}))
        return None
    return run


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
    problems = conflicts(chain, model.model_options, model.wrappers)
    if problems:
        raise ChainError("\n".join(problems))
    decider = chain.decider(Granularity.BLOCKS)
    modulated = _modulated_input(card, model, decider) if decider and decider.signal == "modulated_input" else None
    patched = model.clone()
    patched.model_options.setdefault("transformer_options", {})[CHAIN_KEY] = chain
    observers = [NaNWatch()]
    block_slots: dict = {}  # (group, index) -> position of every block slot the pack serves
    guidance = chain.decider(Granularity.GUIDANCE)
    if on_evaluation is not None:
        observers.append(_EvaluationHook(on_evaluation))

    def outer_sample(executor, *args, **kwargs):
        guider = executor.class_obj
        # EasyCache or TorchCompileModel may have been applied after Apply Interceptors: check again, before
        # anything is sampled (ComfyUI has merged every wrapper of the model into the run's options by now).
        problems = conflicts(chain, guider.model_options, {})
        if problems:
            raise ChainError("\n".join(problems))
        sigmas = args[3] if len(args) > 3 else kwargs["sigmas"]
        sampler = args[2] if len(args) > 2 else kwargs.get("sampler")
        sampling = guider.model_patcher.get_model_object("model_sampling")
        first_step, schedule_steps = schedule or (0, None)
        run = LoopState(chain, sigmas.tolist(), percent_to_sigma=lambda p: float(sampling.percent_to_sigma(p)),
                        cache_device="cpu" if cache_on_cpu else None, observers=observers,
                        first_step=first_step, schedule_steps=schedule_steps,
                        group=rank_group() if rank_group is not None else None,
                        sampler=sampler_identity(sampler), cfg=guider_cfg(guider))
        run.card = card
        if schedule is None:
            _note_partial_run(run, chain, run.sample_sigmas, float(sampling.sigma_max))
        if guidance is not None:
            _check_guider(run, guidance, guider)
        options = guider.model_options.setdefault("transformer_options", {})
        if adaptive_step(run.sampler):
            run.switch_off(f"{sampler_name(run.sampler)} picks its own steps by error control, and skipped or "
                           f"estimated model work would defeat it (it answers with more steps, not fewer): caching "
                           f"was switched off for this run, and every evaluation was computed.")
        options[STATE_KEY] = run
        started = time.perf_counter()
        try:
            result = executor(*args, **kwargs)
            run.transfer()  # what is still to read: the last evaluation's NaN flags, a calibration's last values
            return result
        finally:
            options.pop(STATE_KEY, None)
            _note_slots_taken(run)
            summary = summarize(run, time.perf_counter() - started)
            log.info("Cached Sampler: %s", summary.text())
            if on_run_end is not None:
                on_run_end(run, summary)
            run.release_caches()

    def predict_noise(executor, x, timestep, model_options, seed):
        run = model_options.get("transformer_options", {}).get(STATE_KEY)
        if run is None:
            return executor(x, timestep, model_options, seed)
        if AR_STATE_KEY in model_options["transformer_options"]:
            run.note(AR_NOTE)  # every forward extends the sampler's KV cache: none may be skipped
            return executor(x, timestep, model_options, seed)
        if not run.off and native_multigpu(model_options):
            # ComfyUI set the clones up before the run's first evaluation: nothing has been cached yet. The
            # evaluation is still recorded here, on the sampler's thread; the devices' threads touch nothing.
            run.switch_off(multigpu_note(model_options))
        # the sigma stays on the device until the evaluation's first transfer to the host (its decision's)
        run.begin_evaluation(timestep).from_sampler = True
        try:
            return executor(x, timestep, model_options, seed)
        finally:
            run.end_evaluation()

    def apply_model(executor, x, t, c_concat=None, c_crossattn=None, control=None, transformer_options={}, **kw):
        run = _active_run(transformer_options)
        if run is None or AR_STATE_KEY in transformer_options:
            return executor(x, t, c_concat, c_crossattn, control, transformer_options, **kw)
        # a sampler's evaluation knows its sigma (None): reading ``t`` on every forward would stall the device
        ev = run.evaluation
        sigma = None if ev is not None and ev.from_sampler else float(t.flatten()[0])
        window = transformer_options.get("context_window")
        forward = run.begin_forward(sigma, x.shape[0], tuple(x.shape[1:]), x.dtype,
                                    transformer_options.get("cond_or_uncond"), transformer_options.get("uuids"),
                                    frames=_window_frames(window))
        forward.track_external = adds_between_blocks(card, control, transformer_options, kw)
        if block_slots and _slots_taken(transformer_options, block_slots):
            forward.cacheable = False  # another patch serves some of our block slots in this call: compute it all
            run.foreign_slot_forwards += 1
        output = None
        try:
            output = model_forward(run, forward, x, t, lambda: executor(
                x, t, c_concat, c_crossattn, control, transformer_options, **kw))
            return output
        finally:
            run.end_forward(forward, output)

    def calc_cond_batch(executor, model, conds, x_in, timestep, model_options):
        run = model_options.get("transformer_options", {}).get(STATE_KEY)
        if run is not None and not run.off and native_multigpu(model_options):
            run.switch_off(multigpu_note(model_options))
        if run is None or run.off or AR_STATE_KEY in model_options["transformer_options"]:
            return executor(model, conds, x_in, timestep, model_options)
        window = model_options["transformer_options"].get("context_window")
        return guided_batch(run, conds, x_in, timestep,
                            lambda subset: executor(model, subset, x_in, timestep, model_options),
                            window=tuple(window.index_list) if window is not None else None)

    patched.add_wrapper_with_key(WrappersMP.OUTER_SAMPLE, WRAPPER_KEY, outer_sample)
    if guidance is not None:
        patched.add_wrapper_with_key(WrappersMP.CALC_COND_BATCH, WRAPPER_KEY, calc_cond_batch)
    patched.add_wrapper_with_key(WrappersMP.PREDICT_NOISE, WRAPPER_KEY, predict_noise)
    patched.add_wrapper_with_key(WrappersMP.APPLY_MODEL, WRAPPER_KEY, apply_model)
    if decider is not None:
        _install_blocks(patched, card, BlockPlan([(g.name, g.count) for g in card.groups], *decider.blocks()),
                        modulated)
        block_slots.update({(group, index): position for group, index, position in card.block_positions()})
    return patched


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


# Samplers that choose their own steps from an error estimate (ComfyUI names its function this way).
ADAPTIVE_STEP_SAMPLERS = ("dpm_adaptive",)


def sampler_name(identity: str) -> str:
    """The sampler's name as ComfyUI's sampler list has it, from :func:`sampler_identity`."""
    return identity.split("(")[0].removesuffix("_function")


def adaptive_step(identity: str) -> bool:
    return sampler_name(identity) in ADAPTIVE_STEP_SAMPLERS


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


def _check_guider(run: LoopState, guidance, guider) -> None:
    """Guidance Cache knows the standard guider's conds layout (0 positive, 1 negative) only; with any other
    (DualCFG, PerpNeg) it does nothing, and says so. At cfg 1 ComfyUI usually computes no negative branch (the
    calls then carry none, and the Guidance Cache says so when it sees them); a CFG++ sampler computes it even
    there, and the Guidance Cache works as at any cfg."""
    if type(guider).predict_noise is not comfy.samplers.CFGGuider.predict_noise:
        run.switch_off_level(Granularity.GUIDANCE,
                             f"{guidance.label} did nothing: {type(guider).__name__} arranges its conditionings its "
                             f"own way, so the negative branch cannot be told apart; every branch was computed.")


def adds_between_blocks(card: ModelCard, control, transformer_options: dict, inputs: dict) -> bool:
    """Whether something in this forward may add to the stream between blocks, so the block cache must measure
    it and keep it out of the cached residuals: ControlNet residuals (``control``), any patch in
    ``transformer_options["patches"]`` (Qwen-Image calls its ``double_block`` patches after every block: the
    DiffSynth / model-patch ControlNets), or an input the model card names (VACE hints, S2V audio, Animate
    face motion). Any patch counts, known or not: measuring costs a copy of the stream per block, a small price
    against counting an addition twice on every skipped step."""
    if control is not None:
        return True
    if any(transformer_options.get("patches", {}).values()):
        return True
    return any(inputs.get(name) is not None for name in card.injecting_inputs)


def _note_slots_taken(run: LoopState) -> None:
    """One forward per step with foreign block slots is Skip Layer Guidance's extra pass, and expected; a run in
    which every forward had them never cached a block, which must not pass silently."""
    forwards = sum(r.forwards_computed + r.forwards_skipped for r in run.records)
    if forwards and run.foreign_slot_forwards == forwards:
        run.note("another patch replaced the pack's transformer-block slots in every forward, so no block was ever "
                 "cached (a block-replacing node applied after Apply Interceptors?): apply that node before the "
                 "caching, where the pack chains to it")


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
    dit = options.get("patches_replace", {}).get("dit", {})
    for slot, replacement in list(dit.items()):
        if hasattr(replacement, "cached_sampler_position"):
            if replacement.cached_sampler_previous is None:
                del dit[slot]
            else:
                dit[slot] = replacement.cached_sampler_previous
    return clean


def _slots_taken(transformer_options: dict, slots: dict) -> bool:
    """True when some block slot of this forward is not served by the pack's replacement, e.g. Skip Layer
    Guidance's extra pass puts its own ``skip`` into a copy of the options for that one call. Caching such a
    forward would mix it up with the normal ones (or miss a segment's last block), so it is computed in full."""
    current = transformer_options.get("patches_replace", {}).get("dit", {})
    return any(getattr(current.get(slot), "cached_sampler_position", None) != position
               for slot, position in slots.items())


class _EvaluationHook:
    def __init__(self, fn):
        self.fn = fn

    def on_forward(self, run, forward, output):
        pass

    def on_evaluation_end(self, run, ev):
        self.fn(run, ev)


# The modules of block 0 each family's modulated input is computed from (ComfyUI internals, not an extension
# point: probed when a chain is installed, so a model laid out differently is refused before sampling).
MODULATION_MODULES = {"flux": ("img_mod", "img_norm1"), "chroma": ("img_mod", "img_norm1"),
                      "hunyuan_video": ("img_mod", "img_norm1"), "ltxv": ("scale_shift_table",)}


def _modulated_input(card: ModelCard, model, decider):
    """TeaCache's signal for this family: block 0's timestep-modulated input, computed from the block's own
    modules on the arguments the model hands the block (before the block runs and changes them)."""
    first = getattr(model.model.diffusion_model, card.groups[0].attribute)[0]
    needed = MODULATION_MODULES.get(card.family, ())
    if getattr(first, "modulation", True) is False:  # Chroma's blocks take their modulation as an argument
        needed = tuple(n for n in needed if n != "img_mod")
    missing = [name for name in needed if not hasattr(first, name)]
    if missing:
        raise ChainError(
            f"{decider.label} ({decider.display_name}) computes its signal from the first block's "
            f"{', '.join(missing)}, which the first block of {card.name} ({type(first).__name__}) does not have "
            f"(a model class laid out differently, or a ComfyUI version that renamed them). Use the Adaptive "
            f"Cache or DBCache node instead, which only use ComfyUI's hooks.")
    if card.family in ("flux", "chroma", "hunyuan_video"):
        from comfy.ldm.flux.layers import apply_mod

        def flux_like(args):
            vec = args["vec"]
            mod = first.img_mod(vec)[0] if getattr(first, "modulation", True) else vec[0][0]
            return apply_mod(first.img_norm1(args["img"]), 1 + mod.scale, mod.shift, args.get("modulation_dims_img"))
        return flux_like
    if card.family == "ltxv":
        from comfy.ldm.common_dit import rms_norm

        def ltxv(args):
            x, t = args["img"], args["vec"]
            table = first.scale_shift_table
            shift, scale = (table[None, None].to(x) + t.reshape(x.shape[0], t.shape[1], table.shape[0], -1)).unbind(2)[:2]
            normed = rms_norm(x)
            return normed + normed * scale + shift
        return ltxv
    if card.family == "wan":
        return lambda args: args["vec"].clone()  # e0, the projected timestep embedding TeaCache's Wan fit uses;
                                                 # a copy, as deciders may keep a signal as it is
    return None


def _install_blocks(model, card: ModelCard, plan: BlockPlan, modulated=None) -> None:
    """Register a block replacement for every block, chaining to any replacement already there."""
    existing = model.model_options.get("transformer_options", {}).get("patches_replace", {}).get("dit", {})
    for group_name, index, position in card.block_positions():
        group = next(g for g in card.groups if g.name == group_name)
        previous = existing.get((group_name, index))
        model.set_model_patch_replace(
            _block_replacement(plan, position, group.outputs, previous, modulated if position == 0 else None,
                               group.packed_as),
            "dit", group_name, index)


def _first_block(run: LoopState, args: dict, stream: str) -> None:
    """What the forward's first block tells about parallelism: the token shard this rank holds, and whether
    the blocks see every branch of the batch (not under CFG-parallel, where each rank runs one branch)."""
    forward, tokens = run.current_forward, args[stream]
    if run.group is not None and tokens.ndim >= 3:
        run.group.observe_shard(tokens.shape[1], (args.get("transformer_options") or {}).get("grid_sizes"))
    if forward is not None and forward.cacheable and forward.split(tokens) is None:
        forward.cacheable = False
        run.note(f"the transformer blocks see {tokens.shape[0]} of the {forward.rows * len(forward.keys)} batch "
                 f"rows (CFG-parallel runs one branch per rank): block caching is off; whole-model methods (Fixed "
                 f"Cadence, Adaptive Cache) work there.")


def _unpacked(packed_as: str, names: tuple[str, ...], values: dict) -> dict:
    """``values`` with the tuple under ``packed_as`` shown as one entry per stream name, in the tuple's order."""
    streams = values[packed_as]
    if not isinstance(streams, (tuple, list)) or len(streams) != len(names):
        raise ChainError(f"the blocks hand over '{packed_as}' as {type(streams).__name__} of "
                         f"{len(streams) if isinstance(streams, (tuple, list)) else 1} streams where the model card "
                         f"expects {len(names)} ({', '.join(names)}): a ComfyUI version that changed this model's "
                         f"block layout. Use a whole-model method (Adaptive Cache, Fixed Cadence) instead.")
    out = {k: v for k, v in values.items() if k != packed_as}
    out.update(zip(names, streams))
    return out


def _packed(packed_as: str, names: tuple[str, ...], values: dict) -> dict:
    """The inverse of :func:`_unpacked`: the streams put back into one tuple under ``packed_as``."""
    out = {k: v for k, v in values.items() if k not in names}
    out[packed_as] = tuple(values[k] for k in names)
    return out


def _block_replacement(plan: BlockPlan, position: int, out_keys: tuple[str, ...], previous, modulated=None,
                       packed_as: str | None = None):
    def replacement(args, extra):
        original = extra["original_block"]
        if previous is not None:
            run_block = lambda a: previous(a, dict(extra, original_block=original))  # noqa: E731
        else:
            run_block = original
        run = _active_run(args.get("transformer_options") or {})
        if run is None:
            return run_block(args) if packed_as else as_outputs(run_block(args), out_keys)
        if packed_as is not None:
            # The model passes several streams as one tuple (LTX-2's (video, audio)): the engine sees one stream
            # per name, so each is measured, cached and restored on its own, and the block gets its tuple back.
            packed_block = run_block

            def run_block(a):  # noqa: F811
                return _unpacked(packed_as, out_keys, packed_block(_packed(packed_as, out_keys, a)))
            args = _unpacked(packed_as, out_keys, args)
        if position == 0:
            _first_block(run, args, out_keys[0])
        signal = (lambda: modulated(args)) if modulated is not None else None
        out = block_call(run, plan, position, out_keys, args, run_block, signal)
        return _packed(packed_as, out_keys, out) if packed_as is not None else out
    replacement.cached_sampler_position = position
    replacement.cached_sampler_previous = previous  # what uninstalling puts back
    return replacement
