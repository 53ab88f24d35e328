"""What else on a model, in a run or in the sampler makes caching unsafe, told from what ComfyUI puts into the
options: other caches, a compiled model, the native multi-GPU path, a sampler that picks its own steps, a guider
with its own conds layout, other patches holding the pack's block slots."""
from __future__ import annotations

import math
import sys
import threading

import comfy.samplers

from ..interceptors import Granularity, InterceptorChain, LoopState, Signal
from ..interceptors.kinds import LEVEL_MODEL
from ..interceptors.threads import gathers
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


def conflicts_of(chain: InterceptorChain, model_options: dict, wrappers: dict, blocks_apart: bool = False) -> list[str]:
    """What else on the model makes this chain unsafe to run (empty when nothing does). ``blocks_apart``: a compiled
    model's blocks are (or will be) compiled one by one (adapter/compiled_blocks.py), outside which the decisions run."""
    problems = []
    other = other_cache(model_options, wrappers)
    if other is not None:
        names = ", ".join(ic.label for ic in chain)
        problems.append(
            f"{other} is already caching this model, and {names} would cache it a second time: each cache would "
            f"skip work the other relies on. Remove the {other.split()[-1]} node or the caching nodes of this "
            f"chain.")
    if compiled(model_options, wrappers):
        problems.extend(chain.compile_problems("TorchCompileModel", blocks_apart=blocks_apart))
    return problems


# What ComfyUI's native multi-GPU path puts into the options (comfy/samplers.py, _calc_cond_batch_multigpu).
MULTIGPU_CLONES_KEY = "multigpu_clones"           # model_options: device -> the model clone that runs there
MULTIGPU_POOL_KEY = "multigpu_thread_pool"        # model_options: the threads, one per device (else the caller's)
MULTIGPU_DEVICE_KEY = "multigpu_thread_device"    # transformer_options of a forward run by a device's thread


def native_multigpu(model_options: dict) -> bool:
    """Whether ComfyUI spreads this evaluation's conds over several devices (its native multi-GPU path, which
    runs them concurrently from a thread pool). The same test ComfyUI's own cond batching makes."""
    return MULTIGPU_CLONES_KEY in model_options


def multigpu_note(model_options: dict, deciders=()) -> str:
    devices = model_options.get(MULTIGPU_CLONES_KEY) or {}
    where = f" ({', '.join(str(d) for d in devices)})" if devices else ""
    count = len(devices) or "several"
    why = (f": {', '.join(d.label for d in deciders)} measure{'s' if len(deciders) == 1 else ''} what the model "
           f"computes in a way the devices' threads cannot add up" if deciders else "")
    return (f"ComfyUI's native multi-GPU (MultiGPU CFG Split) ran this run's conditionings on {count} devices{where}"
            f" at once, one thread each{why}: caching was switched off for the run, every step was "
            f"computed in full and the output is plain sampling's. Every caching node of Cached Sampler caches "
            f"there; or sample on one device.")


def share_decisions(run: LoopState, model_options: dict) -> None:
    """Under the native multi-GPU path, the devices' threads run the branches of an evaluation at once, and share
    each decision, as the branches of one batched forward do. Deciders that decide from the schedule alone decide
    each evaluation before them, on the sampler's thread; those whose measures the threads can join (every
    measuring decider of the pack) are decided by the threads together, each measuring its rows
    (``threads.gathers``, counted by :func:`expect_threads`); any other measuring decider would decide on one
    device's branch, whichever came first: the run is switched off then."""
    measuring = [d for d in run.chain.deciders if d.signal not in (Signal.NONE, Signal.GUIDANCE)]
    apart = [d for d in measuring if not gathers(d)]
    if apart:
        run.switch_off(multigpu_note(model_options, apart))
        return
    if measuring:
        run.gather_device_threads()
    run.decided_ahead = True


def multigpu_threads(conds: list, timestep, model_options: dict) -> int | None:
    """How many devices' threads ComfyUI's ``_calc_cond_batch_multigpu`` runs for ``conds``: its scheduler fills
    the devices in order, ``ceil(entries / devices)`` conditioning entries each, so ``entries`` fill
    ``ceil(entries / per_device)`` of them. An entry whose timestep range excludes this step runs nowhere, as
    there. None where it cannot be told here: default conds (ComfyUI adds them to the hooked ones itself), or no
    thread pool (the devices' work then runs one after another on the calling thread)."""
    devices = len(model_options.get(MULTIGPU_CLONES_KEY) or ())
    if model_options.get(MULTIGPU_POOL_KEY) is None:
        return None
    entries = 0
    sigma = timestep.reshape(-1)[0]
    for entry in (e for cond in conds if cond is not None for e in cond):
        if "default" in entry:
            return None
        # compared as ComfyUI compares them: the tensor with the bound, in the tensor's dtype
        if ("timestep_start" in entry and bool(sigma > entry["timestep_start"])) or \
                ("timestep_end" in entry and bool(sigma < entry["timestep_end"])):
            continue
        entries += 1
    if devices == 0 or entries == 0:
        return None if devices == 0 else 0
    return math.ceil(entries / max(1, math.ceil(entries / devices)))


def expect_threads(run: LoopState, conds: list, timestep, model_options: dict) -> None:
    """Tell the run's device threads how many of them the current evaluation's conds batching starts (called on
    the sampler's thread, before it starts them)."""
    if run.threads is not None and run.evaluation is not None and native_multigpu(model_options):
        run.threads.expect(run.evaluation.index, multigpu_threads(conds, timestep, model_options))


def compiler_recording() -> bool:
    """Whether ComfyUI's Comfy Compiler (v0.34 and later, comfy/model_prefetch.py) is recording this thread's model
    forward now. It records a forward's allocations and its block sequence once and replays them on the next
    forward; a forward that skips blocks, or allocates caches between them, breaks the recording (a peer's step
    cache crashed there). Read as core's own ``pause_malloc_graph`` reads it; False on a ComfyUI without it."""
    prefetch = sys.modules.get("comfy.model_prefetch")
    graphs = getattr(prefetch, "MALLOC_GRAPHS", None)
    graph = graphs.get(threading.get_ident()) if isinstance(graphs, dict) else None
    return graph is not None and bool(getattr(graph, "_comfy_active", False))


COMPILER_NOTE = ("ComfyUI's Comfy Compiler recorded this model's forward (it replays each step's allocations and "
                 "block sequence), so the transformer blocks were computed in full there: skipping them would break "
                 "its recording. Whole-model methods (Fixed Cadence, Adaptive Cache, Auto Calibrate) skip outside "
                 "it and work; or start ComfyUI with --disable-comfy-compiler for block caching.")


def feature_fallback(decider, why: str) -> str:
    """The note of a run whose whole-model decider at the feature level (``Decider.level``) works on the model output
    instead, and why."""
    return (f"{decider.label} forecast the model output (level {LEVEL_MODEL}) instead of the block stack's features: "
            f"{why}.")


def active_run(transformer_options: dict) -> LoopState | None:
    """The run a forward or block may cache for, or None: no run, caching switched off for it, or a forward
    that a multi-GPU worker thread runs in a run whose decisions are not shared (:func:`share_decisions`; the
    first such forward switches the run off, before anything is cached)."""
    run = transformer_options.get(STATE_KEY)
    if run is None or run.off:
        return None
    if MULTIGPU_DEVICE_KEY in transformer_options and not run.decided_ahead:
        run.switch_off(multigpu_note({}))
        return None
    return run



ADAPTIVE_STEP_SAMPLERS = ("dpm_adaptive",)


def sampler_name(identity: str) -> str:
    """The sampler's name as ComfyUI's sampler list has it, from :func:`sampler_identity`."""
    return identity.split("(")[0].removesuffix("_function")


def adaptive_step(identity: str) -> bool:
    return sampler_name(identity) in ADAPTIVE_STEP_SAMPLERS



# Patches that keep state from the model's previous call, by the module that makes them: (module suffix, name).
# Core's Model Sparse Attention (comfy_extras/nodes_sparse_attention.py, v0.38) replaces MiniMax-H3's blocks with
# ones that start each block's sparse selection from its attention statistics of the previous call.
STATEFUL_PATCHES = (("nodes_sparse_attention", "Model Sparse Attention"),)


def note_stateful_patches(run: LoopState, model_options: dict) -> None:
    """A patch that carries state from one model call to the next sees, after skipped steps, the state of the last
    computed one: say so (their result is close to the exact one, not equal, as with a ControlNet window)."""
    if not (run.model_decider or run.block_decider):
        return
    options = model_options.get("transformer_options", {})
    patches = []
    for patch in options.get("patches_replace", {}).get("dit", {}).values():
        while patch is not None:  # the pack's replacement chains to the one it found in the slot
            patches.append(patch)
            patch = getattr(patch, "cached_sampler_previous", None)
    for suffix, name in STATEFUL_PATCHES:
        if any(getattr(p, "__module__", "").endswith(suffix) for p in patches):
            run.note(f"{name} keeps each block's attention statistics from the model's previous call: after steps "
                     f"the cache skipped, the next computed step starts from those of the last computed step, not "
                     f"of the step before it")


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

