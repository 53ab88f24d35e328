"""The three places where an interceptor chain meets the model, one per level: the guider's conds list (which
CFG branches a step runs), the whole forward, and the block stack.

All three are plain torch. The ComfyUI adapter calls :func:`guided_batch` from its ``CALC_COND_BATCH`` wrapper,
:func:`model_forward` from its ``APPLY_MODEL`` wrapper and :func:`block_call` from its ``patches_replace["dit"]``
replacements. Each level has at most one decider (the run looks them up once: ``run.guidance_decider``,
``run.model_decider``, ``run.block_decider``); the engine makes the decisions, skips what may be skipped,
stores and estimates, and tells the decider what was computed.

Whole-model caches and the guidance level keep predictions in epsilon space, ``(x - denoised) / sigma``
(:func:`to_eps`, :func:`from_eps`, the one conversion): the raw output for eps- and flow-models, and a smooth
quantity for every other parameterisation, so one cache works on every model ComfyUI can sample.

Block caches store the residual of each skippable segment (a run of blocks of one kind), measured
from a clone of the segment's input, because some models (Flux) add block outputs in place into the
tensors they pass around. What the model itself adds to the stream between blocks is measured, and left
out of the residual, in every forward the adapter marks with ``Forward.track_external``: one in which
something can add there (ControlNet residuals, a patch in transformer_options, an input the model card
names, such as VACE hints or Wan S2V's audio). On a skipped step the segment's blocks pass the stream
through, the model keeps adding this step's additions to it (computed on the passed-through stream), and
the last block adds the cached residual: each such addition is counted once, and none is stale. An
addition made outside ComfyUI's hooks, which the adapter cannot see, would stay inside the residual and be
counted twice on skipped steps.

A whole-model decider at the feature level (``Decider.level`` "features", where the adapter gave the run a block
plan of one segment per block group: ``LoopState.feature_plan``) decides in :func:`model_forward` as at the model
level, and its skip is carried out by the block stack's machinery above: the forward runs, its blocks pass the
stream through and each group's forecast residual is added, so only the embeddings and the final layer compute.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from .kinds import LEVEL_FEATURES, NEGATIVE, POSITIVE, Signal
from .records import BranchKey, Forward
from .state import LoopState


def _rows_sigma(sigma: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return sigma.reshape((sigma.shape[0],) + (1,) * (like.ndim - 1)).to(like.dtype)


def to_eps(x: torch.Tensor, denoised: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    return (x - denoised) / _rows_sigma(sigma, x)


def from_eps(x: torch.Tensor, eps: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    return x - eps * _rows_sigma(sigma, x)


# -- the guider's conds list --------------------------------------------------------------------------------
def guided_batch(run: LoopState, conds: list, x: torch.Tensor, sigma: torch.Tensor,
                 compute: Callable[[list], list], window=None) -> list:
    """One ``calc_cond_batch`` call: ``compute(conds)`` runs ComfyUI's batching over the given conds list and
    returns one prediction (denoised) per entry. With a guidance decider in the chain, the negative entries of the
    standard ``[positive, negative]`` call are left out on the evaluations its rule picks, and the negative
    prediction is estimated from its history (one per call shape: ``window`` is the context window). Anything else
    (an extra guidance pass, cfg 1, a guider with another layout) is passed through untouched."""
    decider = run.guidance_decider
    if decider is None or decider.never_skips:
        return compute(conds)
    if len(conds) == 2 and conds[POSITIVE] is not None and conds[NEGATIVE] is None and run.cfg == 1:
        run.note(f"{decider.label} did nothing: at cfg 1 ComfyUI computes no negative branch to skip.")
    elif len(conds) == 2 and (conds[POSITIVE] is None) != (conds[NEGATIVE] is None):
        run.note(f"{decider.label} computed every step in full where the positive and the negative branch came in "
                 f"separate calls (a guidance add-on such as Skip Layer Guidance (Simple) does that).")
    if len(conds) != 2 or conds[POSITIVE] is None or conds[NEGATIVE] is None or sigma.numel() != x.shape[0]:
        return compute(conds)
    ev = run.evaluation
    if ev is None or not ev.from_sampler:
        ev = run.ensure_evaluation(float(sigma.flatten()[0]))
    # A step cache that decides from the schedule alone says now whether the model runs at all. On its skipped
    # steps the negative branch is estimated here too, from the guidance history (not the step cache's), but only
    # where the guidance decider may act: outside its window (and on its first and last steps) the step cache
    # stays in charge of both branches, exactly as in the chain without it.
    model_runs = run.model_will_run()
    run.read_place()
    if not model_runs and run.forced(decider, ev):
        return compute(conds)
    # the entries of each branch active at this sigma: timestep ranges switch prompts part way
    active = tuple(_active_entries(conds[b], ev.sigma, sigma.dtype) for b in (POSITIVE, NEGATIVE))
    key = BranchKey(NEGATIVE, window, 0, tuple(x.shape), str(x.dtype))
    state = decider.history(run, ev, key, _identities(active))
    record = ev.record
    # at sigma 0 (the decisions read it with their transfer) there is no epsilon to learn or estimate
    if not state.slot.points or (model_runs and run.decide(decider, {key: state})) or ev.sigma == 0:
        out = compute(conds)
        if record.ran.get(POSITIVE) and record.ran.get(NEGATIVE) and ev.sigma != 0:  # computed, not estimated
            decider.learned(run, state, to_eps(x, out[POSITIVE], sigma), to_eps(x, out[NEGATIVE], sigma), ev.sigma,
                            denoised=(out[POSITIVE], out[NEGATIVE]))
        return out
    out = compute([conds[POSITIVE], None])
    run.skipped(decider)
    decider.left_out(state, model_ran=bool(record.ran.get(POSITIVE)))
    # only the entries active now count as saved; ComfyUI runs each on the whole (windowed) latent
    run.left_out(NEGATIVE, rows=len(active[NEGATIVE]) * x.shape[0])
    eps_negative = decider.estimated(state, to_eps(x, out[POSITIVE], sigma), ev.sigma)
    return [out[POSITIVE], from_eps(x, eps_negative, sigma)]
def _active_entries(entries: list, sigma: float, dtype: torch.dtype) -> list:
    """The conditioning entries ComfyUI's batching uses at ``sigma``: those whose timestep range holds it
    (``timestep_start`` >= sigma >= ``timestep_end``, set by ConditioningSetTimestepRange). ComfyUI compares
    the sampler's sigma tensor with the bounds, so the bounds are rounded to its dtype first (a range that
    ends on a step's sigma holds it)."""
    def bound(entry, name, default):
        value = entry.get(name)
        return default if value is None else float(torch.tensor(value, dtype=dtype))
    return [e for e in entries if bound(e, "timestep_end", -math.inf) <= sigma <= bound(e, "timestep_start", math.inf)]


def _identities(active: tuple[list, list]) -> tuple:
    return tuple(tuple(e.get("uuid", id(e)) for e in entries) for entries in active)


# -- the whole model ------------------------------------------------------------------------------------
def model_forward(run: LoopState, forward: Forward, x: torch.Tensor, sigma: torch.Tensor,
                  compute: Callable[[], torch.Tensor]) -> torch.Tensor:
    """Run (or skip) one whole-model forward. ``compute`` runs the real model and returns denoised."""
    decider = run.model_decider
    if decider is None or not forward.cacheable:
        return compute()
    if sigma.numel() != x.shape[0]:
        run.note(f"the model was called with {sigma.numel()} noise levels for {x.shape[0]} batch rows, which the "
                 f"whole-model cache cannot split by row, so such forwards were computed in full")
        return compute()
    ev = forward.evaluation
    parts = forward.split(x)
    signals = parts if decider.signal == Signal.MODEL_INPUT else None
    compute_it = run.decide(decider, signals)
    # the evaluation's sigma as the run read it with the decision (every row of a sampler's call has it); at
    # sigma 0 the decision computes, and there is no epsilon to keep
    if ev.sigma == 0:
        return compute()
    if decider.level == LEVEL_FEATURES and run.feature_plan is not None:
        return _features_forward(run, decider, forward, run.feature_plan, x, sigma, signals, compute_it, compute)
    if not compute_it and all(run.caches.has(k, "output") for k in forward.keys):
        forward.computed = False
        forward.model_skipped = True
        run.skipped(decider)
        eps = forward.join({k: run.caches.estimate(k, "output", ev.sigma, x) for k in forward.keys})
        return from_eps(x, eps, sigma)
    out = compute()
    outputs = forward.split(to_eps(x, out, sigma))
    if decider.verifies_forecast:  # what a skip would have used here, for the decider to check against the model
        forward.forecasts = {k: run.caches.estimate(k, "output", ev.sigma, eps) for k, eps in outputs.items()
                             if run.caches.has(k, "output")}
    for key, eps in outputs.items():
        run.caches.store(key, "output", eps, ev.sigma)
    run.computed(decider, forward, signals, outputs)
    return out


def _features_forward(run: LoopState, decider, forward: Forward, plan: "BlockPlan", x: torch.Tensor,
                      sigma: torch.Tensor, signals, compute_it: bool, compute: Callable[[], torch.Tensor]):
    """A whole-model decider's forward at the feature level: the forward always runs, its embeddings and final
    layer for real. On a skip every transformer block passes the stream through and the last block of each group
    adds the estimator's forecast of the group's residual (:func:`block_call`, one segment per group and stream);
    on a computed forward the blocks keep those residuals. The decider decides and learns as at the model level."""
    forward.features = True
    forward.skip_blocks = not compute_it and all(run.caches.segments_cached(key, len(plan.segments))
                                                 for key in forward.keys)
    out = compute()
    if forward.skip_blocks and forward.blocks_run < forward.blocks_total:
        forward.computed = False
        run.skipped(decider)
        return out
    # computed, or a skip the blocks could not carry out (a forward the Comfy Compiler records runs them all)
    run.computed(decider, forward, signals, forward.split(to_eps(x, out, sigma)))
    return out


# -- the block stack --------------------------------------------------------------------------------------
class BlockPlan:
    """Where the probe ends and which segments of the block stack may be skipped, for one model.

    Vocabulary (the core's words for the papers'): ``front`` blocks are DBCache's Fn (always run; the residual
    of those in the first group is the *probe*), ``back`` blocks its Bn (always run); the blocks between them
    form one skippable *segment* per block group. With ``back_tier`` the back blocks are skippable segments too
    (``back_segments``): a full skip forecasts them with the middle, and a decider's middle tier
    (:meth:`~.base.Decider.refreshes_back`) computes them on the forecast middle (X-Slim's partial refresh)."""

    def __init__(self, groups: list[tuple[str, int]], front: int, back: int, back_tier: bool = False):
        # groups: (group name, block count) in execution order
        self.total = sum(n for _, n in groups)
        self.front = min(front, self.total)
        self.back = min(back, self.total - self.front)
        first_group = groups[0][1] if groups else 0
        self.probe_end = min(self.front, first_group) - 1  # probe measured inside the first group
        self.segments: list[tuple[int, int]] = []        # (first position, last position)
        self.segment_of: dict[int, int] = {}
        self.back_segments: set[int] = set()
        spans = [(self.front, self.total - self.back, False)]
        if back_tier and self.back and self.total - self.back > self.front:  # a middle is left to forecast
            spans.append((self.total - self.back, self.total, True))
        for start, end, is_back in spans:
            pos = 0
            for _, n in groups:
                lo, hi = max(pos, start), min(pos + n, end) - 1
                if lo <= hi:
                    self.segments.append((lo, hi))
                    if is_back:
                        self.back_segments.add(len(self.segments) - 1)
                    for p in range(lo, hi + 1):
                        self.segment_of[p] = len(self.segments) - 1
                pos += n

    @property
    def skippable(self) -> bool:
        return bool(self.segments)


class BlockScratch:
    """What the block engine carries from one block of a forward to the next: the probe's input, each segment's
    input (its residual is measured against a copy of it) and, where the model adds things between blocks, the
    last block's outputs and what was added since. Made on the forward's first cached block, dropped with it."""

    def __init__(self):
        self.probe_input: torch.Tensor | None = None
        self.segment_inputs: dict[int, dict[str, torch.Tensor]] = {}
        self.previous_outputs: dict[int, dict[str, torch.Tensor]] = {}
        self.external: dict[int, dict[str, torch.Tensor]] = {}


def as_outputs(result, out_keys: tuple[str, ...]) -> dict:
    return result if isinstance(result, dict) else {out_keys[0]: result}


def residual_into(after: torch.Tensor, before: torch.Tensor) -> torch.Tensor:
    """``after - before``, written over ``before`` (a copy the engine made and owns) where the two match: one
    stream-sized allocation fewer per residual, so less transient memory on each computed step."""
    if after.shape == before.shape and after.dtype == before.dtype and after.device == before.device:
        return torch.sub(after, before, out=before)
    return after - before


def block_call(run: LoopState, plan: BlockPlan, position: int, out_keys: tuple[str, ...], args: dict,
               run_block: Callable[[dict], dict], modulated_input: Callable[[], torch.Tensor] | None = None) -> dict:
    """Run (or pass through) one transformer block at ``position`` in execution order."""
    forward = run.current_forward
    # a whole-model decider at the feature level decided this forward already (_features_forward)
    features = forward is not None and forward.features
    decider = run.model_decider if features else run.block_decider
    if forward is not None:
        forward.blocks_total += 1
    if forward is None or decider is None or not forward.cacheable or not plan.skippable:
        if forward is not None:
            forward.blocks_run += 1
        return as_outputs(run_block(args), out_keys)
    stream = out_keys[0]
    ev = forward.evaluation
    scratch = forward.scratch
    if scratch is None:
        scratch = forward.scratch = BlockScratch()

    # The probe: the front blocks always run; their residual is the change signal.
    if position == 0 and decider.signal == Signal.PROBE_RESIDUAL and plan.probe_end >= 0:
        scratch.probe_input = args[stream].clone()
    if position == 0 and decider.signal == Signal.MODULATED_INPUT and modulated_input is not None:
        forward.signals[decider.id] = forward.split(modulated_input())
    segment = plan.segment_of.get(position)
    if segment is None:
        out = as_outputs(run_block(args), out_keys)
        forward.blocks_run += 1
        if position == plan.probe_end and scratch.probe_input is not None:
            residual = residual_into(out[stream], scratch.probe_input)
            scratch.probe_input = None
            forward.signals[decider.id] = forward.split(residual)
        return out

    first, last = plan.segments[segment]
    if forward.skip_blocks is None:  # the first skippable block decides for the whole forward
        signals = forward.signals.get(decider.id)
        compute_it = run.decide(decider, signals)
        forward.skip_blocks = not compute_it and all(run.caches.segments_cached(key, len(plan.segments))
                                                     for key in forward.keys)
        if forward.skip_blocks:
            forward.computed = False
            run.skipped(decider)
            forward.refresh_back = bool(plan.back_segments) and decider.refreshes_back(run, ev)

    if forward.skip_blocks and forward.refresh_back and segment in plan.back_segments:
        # the middle tier: the back blocks run on the forecast middle; what they compute is not kept (its input
        # was forecast), so the estimator sees fully computed steps only
        forward.blocks_run += 1
        return as_outputs(run_block(args), out_keys)

    if forward.skip_blocks:
        # Pass the stream through; the model keeps adding what it adds between blocks (ControlNet, patches,
        # VACE, audio) to it, and the segment's last block adds the cached residual, which excludes them.
        if position != last:
            return {k: args[k] for k in out_keys}
        result = {}
        for k in out_keys:
            base = args.get(k)
            if base is None or not all(k in run.caches.streams(key, segment) for key in forward.keys):
                result[k] = base
                continue
            delta = forward.join({key: run.caches.estimate(key, f"{segment}.{k}", ev.sigma, base)
                                  for key in forward.keys})
            result[k] = base + delta
        return result

    if position == first:
        scratch.segment_inputs[segment] = {k: args[k].clone() for k in out_keys if args.get(k) is not None}
        scratch.external.pop(segment, None)
    elif forward.track_external and segment in scratch.previous_outputs:
        added = scratch.external.setdefault(segment, {})
        for k, before in scratch.previous_outputs.pop(segment).items():
            if args.get(k) is not None and args[k].shape == before.shape:
                change = residual_into(args[k], before)
                added[k] = added[k].add_(change) if k in added else change
    out = as_outputs(run_block(args), out_keys)
    forward.blocks_run += 1
    if position != last:
        if forward.track_external:
            scratch.previous_outputs[segment] = {k: out[k].clone() for k in out_keys if out.get(k) is not None}
        return out
    inputs = scratch.segment_inputs.pop(segment, {})
    added = scratch.external.pop(segment, {})
    for k, before in inputs.items():
        after = out.get(k)
        if after is None:
            continue  # the stream ends here (SD3's last joint block returns no text stream)
        parts = None
        if after.shape == before.shape:
            residual = residual_into(after, before)
            parts = forward.split(residual.sub_(added[k]) if k in added else residual)
        if parts is None:
            run.note(f"the '{k}' stream changed shape inside a span of blocks the cache would skip, so its residual "
                     f"could not be cached: the span runs in full when no stream of it could be cached, and a "
                     f"skipped span passes that stream through unchanged")
            continue
        for key, value in parts.items():
            run.caches.store_residual(key, segment, k, value, ev.sigma)
            forward.residuals.setdefault(f"{segment}.{k}", {})[key] = value
    if segment == len(plan.segments) - 1 and not features:  # the feature level's decider is told with the output
        run.computed(decider, forward, forward.signals.get(decider.id))
    return out
