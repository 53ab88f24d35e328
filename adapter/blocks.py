"""Block-level caching through ``patches_replace["dit"]``: one replacement per block slot, chained to any
replacement registered before, and taken out again by :func:`remove_blocks`."""
from __future__ import annotations

from ..interceptors import ChainError, LoopState, ModelCard
from ..interceptors.engine import BlockPlan, as_outputs, block_call
from .conflicts import COMPILER_NOTE, active_run, compiler_recording, feature_fallback


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



def install_blocks(model, card: ModelCard, plan: BlockPlan, modulated=None) -> None:
    """Register a block replacement for every block, chaining to any replacement already there."""
    existing = model.model_options.get("transformer_options", {}).get("patches_replace", {}).get("dit", {})
    for group_name, index, position in card.block_positions():
        group = next(g for g in card.groups if g.name == group_name)
        previous = existing.get((group_name, index))
        model.set_model_patch_replace(
            BlockSlot(plan, position, group.outputs, previous, modulated if position == 0 else None, group.packed_as),
            "dit", group_name, index)


def _first_block(run: LoopState, args: dict, stream: str) -> None:
    """What the forward's first block tells: the token shard this rank holds, whether the blocks see every branch
    of the batch (not under CFG-parallel, where each rank runs one branch), and whether the Comfy Compiler is
    recording the forward (its blocks then all run, and nothing is kept between them)."""
    forward, tokens = run.current_forward, args[stream]
    if forward is not None and forward.cacheable and compiler_recording():
        forward.cacheable = False
        if forward.features:
            _features_off(run, "ComfyUI's Comfy Compiler records the forward, and a skipped block would break it")
        else:
            run.note(COMPILER_NOTE)
    if run.group is not None and tokens.ndim >= 3:
        run.group.observe_shard(tokens.shape[1], (args.get("transformer_options") or {}).get("grid_sizes"))
    if forward is not None and forward.cacheable and forward.split(tokens) is None:
        forward.cacheable = False
        if forward.features:
            _features_off(run, "the transformer blocks see only some of the batch rows (CFG-parallel)")
        else:
            run.note(f"the transformer blocks see {tokens.shape[0]} of the {forward.rows * len(forward.keys)} batch "
                     f"rows (CFG-parallel runs one branch per rank): block caching is off; whole-model methods "
                     f"(Fixed Cadence, Adaptive Cache) work there.")


def _features_off(run: LoopState, why: str) -> None:
    """The feature level cannot work in this run's forwards: the forward at hand runs every block (computed), and the
    whole-model decider forecasts the model output from the next forward on."""
    run.feature_plan = None
    run.note(feature_fallback(run.model_decider, why))


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


class BlockSlot:
    """The pack's replacement in one block slot (ComfyUI calls it with the block's ``args`` and ``extra``): runs the
    block at ``position`` through the engine, chained to the replacement registered there before (``previous``).
    It holds only the slot's settings, never a run (each call finds its run in the options), and, as a function
    would be, it is copied as itself: ComfyUI v0.8.0 deep-copies a model's options, with their block replacements,
    on every clone."""

    def __init__(self, plan: BlockPlan, position: int, out_keys: tuple[str, ...], previous, modulated=None,
                 packed_as: str | None = None):
        self.plan = plan
        self.out_keys = out_keys
        self.modulated = modulated
        self.packed_as = packed_as
        self.cached_sampler_position = position
        self.cached_sampler_previous = previous  # what uninstalling puts back

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __call__(self, args, extra):
        position, out_keys, packed_as = self.cached_sampler_position, self.out_keys, self.packed_as
        previous, modulated = self.cached_sampler_previous, self.modulated
        original = extra["original_block"]
        if previous is not None:
            run_block = lambda a: previous(a, dict(extra, original_block=original))  # noqa: E731
        else:
            run_block = original
        run = active_run(args.get("transformer_options") or {})
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
        out = block_call(run, self.plan, position, out_keys, args, run_block, signal)
        return _packed(packed_as, out_keys, out) if packed_as is not None else out


def remove_blocks(transformer_options: dict) -> None:
    """Take the pack's block replacements out of ``transformer_options``, putting back those they chained to."""
    dit = transformer_options.get("patches_replace", {}).get("dit", {})
    for slot, replacement in list(dit.items()):
        if hasattr(replacement, "cached_sampler_position"):
            if replacement.cached_sampler_previous is None:
                del dit[slot]
            else:
                dit[slot] = replacement.cached_sampler_previous
