"""ComfyUI nodes that watch a sampling run from outside the pack, shared by the bench and the tests: count
the model work it really did, time it, and capture its results. Never shipped to users.

Both store into ``CAPTURED[key]``. The counting node clones the model and registers its hooks *before* any
caching method sees the model, so:

* its ``patches_replace["dit"]`` block counters sit under the pack's block replacements, which chain to
  them and only call them for blocks that really run; whole-forward skips run no block at all;
* its ``OUTER_SAMPLE`` wrapper is the outermost one and times the whole sampling run; the block counters
  also time the blocks themselves, so the time spent around them (sampler, embedders, every hook) is
  known separately.

A method that puts its own ``patches_replace["dit"]`` entries over the counters (instead of chaining to them,
as some other packs' nodes do) would show no block work at all: for a forward where no counter ran, the blocks
are counted by forward hooks on the block modules themselves (held only while a sampling run lasts).
"""
from __future__ import annotations

import time

CAPTURED: dict = {}


def count_work(model, record: dict, groups: dict[str, int], copy_input: bool = False):
    """A clone of ``model`` that counts into ``record`` (reset here): ``blocks`` executed and ``block_rows``
    (block executions times the batch rows they ran on: the work metric), ``forwards`` (diffusion-model calls
    that reached the model), their batch ``rows`` and, per forward, its ``negative_rows`` (rows of the negative
    CFG branch) and ``negative_entries`` (the conditioning entries, by uuid, those rows ran), ``forward_log``
    (per forward: the sampler evaluation it belongs to, counted from 1, the context window's frames or None,
    and the blocks it ran), ``block_forwards`` (forwards whose first block ran),
    sampler ``evaluations`` and the sigma of each (``evaluation_sigmas``: where the sampler evaluated the model),
    sampling ``runs`` and their wall/CPU ``seconds``, and the time spent inside
    blocks. ``groups`` is ``{patches_replace["dit"] name: block count}``. With ``copy_input`` the diffusion
    model gets a copy of its input, as a cast to a reduced-precision model dtype makes anyway (for methods
    that write into it in place)."""
    import comfy.model_management
    import torch
    from comfy.patcher_extension import WrappersMP

    record.clear()
    record.update(blocks=0, block_rows=0, forwards=0, rows=0, negative_rows=[], negative_entries=[], forward_log=[], block_forwards=0, evaluations=0, evaluation_sigmas=[], runs=0, seconds=0.0, cpu_seconds=0.0,
                  block_seconds=0.0, block_cpu_seconds=0.0)
    m = model.clone()
    first = next(iter(groups), None)

    on_gpu = comfy.model_management.get_torch_device().type == "cuda"

    modules = {"blocks": 0, "rows": 0, "first": 0, "seconds": 0.0, "cpu_seconds": 0.0, "started": []}

    def module_hooks():
        """Forward hooks counting every block module call into ``modules`` (the fallback, see above)."""
        diffusion = getattr(getattr(m, "model", None), "diffusion_model", None)
        handles = []

        def before(module, args, kwargs, is_first=False):
            stream = kwargs.get("img", kwargs.get("x", args[0] if args else None))
            modules["blocks"] += 1
            modules["rows"] += stream.shape[0] if isinstance(stream, torch.Tensor) else 0
            modules["first"] += int(is_first)
            modules["started"].append((time.perf_counter(), time.process_time()))

        def after(module, args, output):
            if modules["started"]:
                started, cpu_started = modules["started"].pop()
                modules["seconds"] += time.perf_counter() - started
                modules["cpu_seconds"] += time.process_time() - cpu_started

        def block_list(name: str, n: int):
            """The module list of slot group ``name`` (Flux's "double_block" slots are its ``double_blocks``,
            Wan's are its ``blocks``)."""
            for attr in (name + "s", "blocks", "layers", "transformer_blocks"):
                blocks = getattr(diffusion, attr, None)
                if isinstance(blocks, torch.nn.ModuleList) and len(blocks) == n:
                    return blocks
            return None

        for name, n in groups.items():
            blocks = block_list(name, n)
            if blocks is None:
                continue
            for i, block in enumerate(blocks):
                is_first = name == first and i == 0
                handles.append(block.register_forward_pre_hook(
                    lambda mod, a, k, f=is_first: before(mod, a, k, f), with_kwargs=True))
                handles.append(block.register_forward_hook(after))
        return handles

    def timed_sample(executor, *args, **kwargs):
        # On a GPU the work is queued: CUDA events around the run time it on the device's own clock.
        events = [torch.cuda.Event(enable_timing=True) for _ in range(2)] if on_gpu else None
        if events:
            events[0].record()
        started, cpu_started = time.perf_counter(), time.process_time()
        handles = module_hooks()
        try:
            return executor(*args, **kwargs)
        finally:
            for handle in handles:
                handle.remove()
            if events:
                events[1].record()
                events[1].synchronize()
                record["seconds"] += events[0].elapsed_time(events[1]) / 1000.0
            else:
                record["seconds"] += time.perf_counter() - started
            record["cpu_seconds"] += time.process_time() - cpu_started
            record["runs"] += 1

    def count_evaluation(executor, *args, **kwargs):
        record["evaluations"] += 1
        timestep = args[1] if len(args) > 1 else kwargs["timestep"]  # predict_noise(x, timestep, ...): the sigma
        record["evaluation_sigmas"].append(float(timestep.flatten()[0]))
        return executor(*args, **kwargs)

    def count_forward(executor, x, *args, **kwargs):
        record["forwards"] += 1
        rows = (x[0] if isinstance(x, (list, tuple)) else x).shape[0]  # audio-video models get [video, audio]
        record["rows"] += rows
        options = transformer_options_of(args, kwargs)
        branches = options.get("cond_or_uncond") or [0]
        record["negative_rows"].append(rows // len(branches) * branches.count(1))
        uuids = options.get("uuids") or [None] * len(branches)
        record["negative_entries"].append(tuple(u for u, b in zip(uuids, branches) if b == 1))
        window = getattr(options.get("context_window"), "index_list", None)
        blocks_before = record["blocks"]
        seen = dict(modules)
        try:
            return executor(x.clone() if copy_input else x, *args, **kwargs)
        finally:
            if record["blocks"] == blocks_before and modules["blocks"] > seen["blocks"]:
                # no counter ran but block modules did: the method replaced the counters (see above)
                record["blocks"] += modules["blocks"] - seen["blocks"]
                record["block_rows"] += modules["rows"] - seen["rows"]
                record["block_forwards"] += modules["first"] - seen["first"]
                record["block_seconds"] += modules["seconds"] - seen["seconds"]
                record["block_cpu_seconds"] += modules["cpu_seconds"] - seen["cpu_seconds"]
            record["forward_log"].append((record["evaluations"], tuple(window) if window is not None else None,
                                          record["blocks"] - blocks_before))

    def counter(is_first):
        def count_block(args, extra):
            record["blocks"] += 1
            stream = args.get("img")
            if isinstance(stream, (list, tuple)):  # LTX-2's blocks get (video, audio)
                stream = stream[0]
            record["block_rows"] += stream.shape[0] if stream is not None else 0
            if is_first:
                record["block_forwards"] += 1
            started, cpu_started = time.perf_counter(), time.process_time()
            try:
                return extra["original_block"](args)
            finally:  # time in the block itself: what remains of a run is everything around the blocks
                record["block_seconds"] += time.perf_counter() - started
                record["block_cpu_seconds"] += time.process_time() - cpu_started
        return count_block

    m.add_wrapper_with_key(WrappersMP.OUTER_SAMPLE, "count_work", timed_sample)
    m.add_wrapper_with_key(WrappersMP.DIFFUSION_MODEL, "count_work", count_forward)
    m.add_wrapper_with_key(WrappersMP.PREDICT_NOISE, "count_work", count_evaluation)
    for name, n in groups.items():
        for i in range(n):
            m.set_model_patch_replace(counter(name == first and i == 0), "dit", name, i)
    return m


def transformer_options_of(args, kwargs) -> dict:
    """The transformer_options a diffusion model's forward was handed, by keyword or position."""
    options = kwargs.get("transformer_options")
    if isinstance(options, dict):
        return options
    return next((a for a in reversed(args) if isinstance(a, dict) and "cond_or_uncond" in a), {})


class CountWork:
    """Counts the model work of every sampling run into ``CAPTURED[key]`` (see ``count_work``); re-runs on
    every prompt, so every run starts from zero. Subclasses say where the model's blocks are (``groups``)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "key": ("STRING", {"default": "work"})},
                "optional": {"copy_input": ("BOOLEAN", {"default": False})}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "patch"
    CATEGORY = "testing"

    @classmethod
    def IS_CHANGED(cls, **kwargs):
        return float("nan")

    def groups(self, model, **inputs) -> dict[str, int]:
        raise NotImplementedError

    def patch(self, model, key, copy_input=False, **inputs):
        record = CAPTURED.setdefault(key, {})
        return (count_work(model, record, self.groups(model, **inputs), copy_input),)


def capture_node(name: str, doc: str, input_name: str, spec: tuple, keep) -> type:
    """An output node that stores ``keep(value)`` under its ``key`` input on every prompt (never cached)."""

    def capture(self, key, **inputs):
        CAPTURED[key] = keep(inputs[input_name])
        return {}

    return type(name, (), {
        "__doc__": doc,
        "INPUT_TYPES": classmethod(lambda cls: {"required": {input_name: spec,
                                                             "key": ("STRING", {"default": input_name})}}),
        "RETURN_TYPES": (), "FUNCTION": "capture", "OUTPUT_NODE": True, "CATEGORY": "testing",
        "IS_CHANGED": classmethod(lambda cls, **kwargs: float("nan")),
        "capture": capture,
    })


def _kept(samples):
    """A copy of a latent's samples; an audio-video latent (a ComfyUI NestedTensor) keeps its kind, each of its
    streams copied."""
    if getattr(samples, "is_nested", False):
        return type(samples)([t.detach().clone() for t in samples.unbind()])
    return samples.detach().clone()


CaptureLatent = capture_node("CaptureLatent", "Stores the latent under ``key``.", "samples", ("LATENT",),
                             lambda latent: _kept(latent["samples"]))
