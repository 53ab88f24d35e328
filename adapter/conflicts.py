"""What else on a model, in a run or in the sampler makes caching unsafe, told from what ComfyUI puts into the
options: other caches, a compiled model, the native multi-GPU path, a sampler that picks its own steps, a guider
with its own conds layout, other patches holding the pack's block slots."""
from __future__ import annotations

import comfy.samplers

from ..interceptors import Granularity, InterceptorChain, LoopState
from .keys import STATE_KEY


# ComfyUI core patches that conflict with a chain: (transformer_options key or wrapper key, what to call it).
OTHER_CACHES = (("easycache", "ComfyUI's EasyCache"), ("lazycache", "ComfyUI's LazyCache"),
                ("teacache", "Raylight's TeaCache"))  # Raylight's EasyCache port uses the "easycache" key too
# Caches whose state a node puts into transformer_options for the diffusion model's own forward to read:
# (key, what to call it). Kandinsky 6's forward (comfy/ldm/kandinsky6/model.py of ComfyUI v0.34-v0.38) skips its text and
# visual blocks itself when its MagCache node set "k6_magcache".
OPTION_CACHES = (("k6_magcache", "Kandinsky 6's MagCache"),)
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
    """The name of another caching patch already on the model (EasyCache, LazyCache, Raylight's TeaCache,
    Kandinsky 6's MagCache), or None."""
    options = model_options.get("transformer_options", {})
    keys = _wrapper_keys(wrappers) | _wrapper_keys(options.get("wrappers", {}))
    holder = options.get("easycache")
    if holder is not None and "lazy" in type(holder).__name__.lower():
        return "ComfyUI's LazyCache"
    for key, name in OTHER_CACHES:
        if key in keys or (key == "easycache" and holder is not None):
            return name
    for key, name in OPTION_CACHES:
        if options.get(key) is not None:
            return name
    return None


def compiled(model_options: dict, wrappers: dict) -> bool:
    """Whether ComfyUI's TorchCompileModel (or its helper set_torch_compile_wrapper) compiled the model."""
    options = model_options.get("transformer_options", {})
    keys = _wrapper_keys(wrappers) | _wrapper_keys(options.get("wrappers", {}))
    return COMPILE_WRAPPER_KEY in keys or COMPILE_OPTIONS_KEY in model_options


def conflicts_of(chain: InterceptorChain, model_options: dict, wrappers: dict) -> list[str]:
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


def active_run(transformer_options: dict) -> LoopState | None:
    """The run a forward or block may cache for, or None: no run, caching switched off for it, or a forward
    that a multi-GPU worker thread runs (never cached; switches the run off if nothing had yet)."""
    run = transformer_options.get(STATE_KEY)
    if run is None or run.off:
        return None
    if MULTIGPU_DEVICE_KEY in transformer_options:
        run.switch_off(multigpu_note({}))
        return None
    return run



ADAPTIVE_STEP_SAMPLERS = ("dpm_adaptive",)


def sampler_name(identity: str) -> str:
    """The sampler's name as ComfyUI's sampler list has it, from :func:`sampler_identity`."""
    return identity.split("(")[0].removesuffix("_function")


def adaptive_step(identity: str) -> bool:
    return sampler_name(identity) in ADAPTIVE_STEP_SAMPLERS



def check_guider(run: LoopState, guidance, guider) -> None:
    """Guidance Cache knows the standard guider's conds layout (0 positive, 1 negative) only; with any other
    (DualCFG, PerpNeg) it does nothing, and says so. At cfg 1 ComfyUI usually computes no negative branch (the
    calls then carry none, and the Guidance Cache says so when it sees them); a CFG++ sampler computes it even
    there, and the Guidance Cache works as at any cfg."""
    if type(guider).predict_noise is not comfy.samplers.CFGGuider.predict_noise:
        run.switch_off_level(Granularity.GUIDANCE,
                             f"{guidance.label} did nothing: {type(guider).__name__} arranges its conditionings its "
                             f"own way, so the negative branch cannot be told apart; every branch was computed.")



def note_slots_taken(run: LoopState, foreign_slot_forwards: int) -> None:
    """``foreign_slot_forwards`` of ``run``'s forwards had block slots another patch served (:func:`slots_taken`).
    One per step is Skip Layer Guidance's extra pass, and expected; a run in which every forward had them never
    cached a block, which must not pass silently."""
    forwards = sum(r.forwards_computed + r.forwards_skipped for r in run.records)
    if forwards and foreign_slot_forwards == forwards:
        run.note("another patch replaced the pack's transformer-block slots in every forward, so no block was ever "
                 "cached (a block-replacing node applied after Apply Interceptors?): apply that node before the "
                 "caching, where the pack chains to it")



def slots_taken(transformer_options: dict, slots: dict) -> bool:
    """True when some block slot of this forward is not served by the pack's replacement, e.g. Skip Layer
    Guidance's extra pass puts its own ``skip`` into a copy of the options for that one call. Caching such a
    forward would mix it up with the normal ones (or miss a segment's last block), so it is computed in full."""
    current = transformer_options.get("patches_replace", {}).get("dit", {})
    return any(getattr(current.get(slot), "cached_sampler_position", None) != position
               for slot, position in slots.items())

