"""Ranks on CPU (gloo) sampling ComfyUI's tiny Wan or Flux with its tokens split between them, as under xDiT's USP.

Each rank is a process started by torch.multiprocessing: it loads ComfyUI's code and the pack through ComfyUI's
own custom-node loader, builds the same tiny model (tests/support/tiny_models.py), and samples it with
``nodes.common_ksampler`` through the pack's real wrappers and block replacements.

The sequence parallelism is the test's: a ``DIFFUSION_MODEL`` wrapper runs the model's forward with the image
tokens padded to a multiple of the ranks and split between them (as xDiT USP does, and Raylight's Wan forward,
which also records ``grid_sizes``), an attention override that gathers every rank's keys and values (a real
all_gather, padding dropped), and an all_gather of the output after the head. Flux's text tokens stay whole on
every rank, as xDiT keeps them when the text does not divide between the ranks (Raylight's Flux forward pads and
splits the text too, and re-splits the joint stream before the single blocks): the double blocks see the text
and this rank's image shard, the single blocks their concatenation. Every collective a rank issues, the model's
and the pack's, is logged in order.
"""
from __future__ import annotations

import asyncio
import json
import math
import os
import socket
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[2]
STEPS = 10


def run_ranks(world: int, scenarios: list[dict], sync: bool = True, timeout_s: int = 60,
              deadline_s: float | None = None, env: dict | None = None) -> list[dict]:
    """Run ``scenarios`` on ``world`` ranks; what each rank saw, by rank. A rank that failed has ``error``.

    ``timeout_s`` is the process group's own timeout (what a collective waits before torch gives up); each rank
    is given four times that to end, and all of them together at most ``deadline_s`` when it is set: a rank
    still running then is killed, and its result says so. ``env``: environment variables set in every rank."""
    deadline = time.monotonic() + deadline_s if deadline_s is not None else math.inf
    with tempfile.TemporaryDirectory(prefix="cached-sampler-ranks-") as tmp:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        ctx = mp.start_processes(_rank_main, args=(world, port, scenarios, sync, timeout_s, tmp, env or {}),
                                 nprocs=world, join=False, start_method="spawn")
        killed = set()
        for rank, process in enumerate(ctx.processes):  # each rank, failed or not, writes what it saw before it ends
            process.join(max(min(timeout_s * 4, deadline - time.monotonic()), 0.1))
            if process.is_alive():
                process.kill()
                process.join()
                killed.add(rank)
        results = []
        for rank in range(world):
            path = Path(tmp) / f"rank{rank}.pt"
            if rank in killed and not path.exists():
                results.append({"error": "rank wrote nothing: still running when its time was up, so killed (it "
                                         "hung?)", "killed": True})
            else:
                results.append(torch.load(path) if path.exists() else {"error": "rank wrote nothing"})
        return results


def _rank_main(rank, world, port, scenarios, sync, timeout_s, out_dir, env):
    torch.set_num_threads(1)
    os.environ.update(env)
    result = {"rank": rank, "collectives": [], "runs": {}}
    try:
        adapter, ic, nodes, tiny_models = _load(rank, world, port, timeout_s, out_dir)
        _log_collectives(result["collectives"])
        def sample(name, scenario, rank, world):
            start = len(result["collectives"])
            run = result["runs"][name] = _sample(adapter, ic, nodes, tiny_models, scenario, rank, world, sync)
            run["collectives"] = result["collectives"][start:]

        for scenario in scenarios:
            sample(scenario["name"], scenario, rank, world)
            if scenario.get("reference") and rank == 0:  # the same model in one process, on the whole sequence
                sample(scenario["name"] + "/single", scenario, 0, 1)
    except Exception:
        result["error"] = traceback.format_exc()
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    if "error" in result and any(s.get("fail_at", {}).get("rank") == rank for s in scenarios):
        # A rank that failed on purpose lives on, as a Raylight actor does after its prompt failed: its
        # connections stay open, so the others learn nothing from a closed one, until they have finished.
        others = [Path(out_dir) / f"rank{r}.pt" for r in range(world) if r != rank]
        give_up = time.monotonic() + timeout_s * 4
        while not all(p.exists() for p in others) and time.monotonic() < give_up:
            time.sleep(0.2)
    if "error" in result:
        os._exit(1)  # leave the peers' collectives with a closed connection instead of a hang


def _load(rank, world, port, timeout_s, out_dir):
    from ..devkit.comfy_harness import import_headless
    import_headless()
    import nodes
    from . import tiny_models
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    custom = Path(out_dir) / f"rank{rank}" / "custom_nodes"  # removed with the run's folder
    custom.mkdir(parents=True)
    (custom / "cached-sampler").symlink_to(ROOT, target_is_directory=True)
    pack_path = str(custom / "cached-sampler")
    if not asyncio.run(nodes.load_custom_node(pack_path)):
        raise RuntimeError("ComfyUI could not load the pack")
    import importlib
    name = pack_path.replace(".", "_x_")
    return (importlib.import_module(f"{name}.adapter"), importlib.import_module(f"{name}.interceptors"),
            nodes, tiny_models)


def _log_collectives(log: list) -> None:
    """Log every collective this process issues, in order (the model's and the pack's), by wrapping
    torch.distributed's functions; the arguments say what was exchanged."""
    def logged(name, fn):
        def call(tensor_or_list, *args, **kwargs):
            first = tensor_or_list[0] if isinstance(tensor_or_list, list) else tensor_or_list
            op = kwargs.get("op", args[0] if args and not isinstance(args[0], torch.Tensor) else None)
            log.append(f"{name}{tuple(first.shape)}{first.dtype}{'' if op is None else f' {op}'}")
            return fn(tensor_or_list, *args, **kwargs)
        return call
    for name in ("all_reduce", "all_gather"):
        setattr(dist, name, logged(name, getattr(dist, name)))


def chain_of(ic, scenario):
    kind, params = scenario["chain"]
    return ic.InterceptorChain.of([getattr(ic, kind)(**params)])


def _sample(adapter, ic, nodes, tiny_models, scenario, rank, world, sync):
    evaluations, counts = [], {"blocks": 0}
    family = scenario.get("model", "wan21")
    latent_shape, sequence_parallel = MODELS[family]
    model = tiny_models.build(family, seed=0)
    model.add_wrapper_with_key("diffusion_model", "test_sequence_parallel",
                               _cfg_parallel(rank, world) if scenario.get("cfg_parallel") and world > 1 else
                               sequence_parallel(rank, world, counts, scenario.get("concentrate", 0.0)))
    group = (lambda: ic.distributed.group_of()) if sync and world > 1 else None
    fail_at = scenario.get("fail_at")
    if fail_at and fail_at["rank"] == rank:
        model.add_wrapper_with_key("predict_noise", "test_fail", _failing_evaluation(rank, fail_at["evaluation"]))

    def on_evaluation(run, ev):
        evaluations.append({"index": ev.index, "decisions": dict(ev.decisions), "metric": ev.record.metric,
                            "blocks_run": ev.record.blocks_run})

    notes = []
    patched = adapter.install(model, chain_of(ic, scenario), on_evaluation=on_evaluation, rank_group=group,
                              on_run_end=lambda run, summary: notes.extend(run.notes))
    positive, negative = tiny_models.conditioning(family, seed=1)
    gen = torch.Generator().manual_seed(3)
    latent = {"samples": torch.randn(latent_shape, generator=gen)}
    out = nodes.common_ksampler(patched, 7, STEPS, 4.0, "euler", "simple", positive, negative, latent)[0]["samples"]
    return {"evaluations": evaluations, "blocks": counts["blocks"], "output": out, "notes": notes}


def _failing_evaluation(rank, at):
    """A PREDICT_NOISE wrapper (outside the pack's) that raises at this rank's evaluation ``at``, before the model
    runs: the other ranks go on to that evaluation's agreement, which this rank never reaches."""
    count = {"evaluations": 0}

    def predict_noise(executor, *args, **kwargs):
        count["evaluations"] += 1
        if count["evaluations"] - 1 == at:
            raise RuntimeError(f"rank {rank} fails at evaluation {at} (the test's)")
        return executor(*args, **kwargs)
    return predict_noise


def _shard(tensor, rank, world, dim=1):
    """This rank's part of ``tensor``'s token axis ``dim``, zero-padded to a multiple of the ranks first."""
    pad = (-tensor.shape[dim]) % world
    if pad:
        shape = list(tensor.shape)
        shape[dim] = pad
        tensor = torch.cat([tensor, tensor.new_zeros(shape)], dim=dim)
    return tensor.chunk(world, dim=dim)[rank]


def _gather(tensor, total, world, dim=1):
    """Every rank's shard of the token axis ``dim``, in rank order, the padding (past ``total``) dropped."""
    tensor = tensor.contiguous()
    parts = [torch.empty_like(tensor) for _ in range(world)]
    dist.all_gather(parts, tensor)
    return torch.cat(parts, dim=dim).narrow(dim, 0, total)


def _swirl(tokens, timestep, amount):
    """``tokens`` with a step-dependent swirl added to the first rank's shard only (of two), so that the change
    between steps is concentrated in one shard (part of the model: the one-process run has it too)."""
    first_shard = -(-tokens.shape[1] // 2)
    swirl = torch.sin(timestep.float().reshape(-1, 1, 1) * 0.37 + torch.arange(tokens.shape[2]) * 0.5)
    return torch.cat([tokens[:, :first_shard] + amount * swirl.to(tokens), tokens[:, first_shard:]], dim=1)


def _cfg_parallel(rank, world):
    """A DIFFUSION_MODEL wrapper as Raylight's CFG-parallel one: each rank runs its chunk of the batch (one CFG
    branch) through the whole model, and the outputs are gathered."""
    def forward(executor, x, timestep, context, *args, **kwargs):
        rows = x.shape[0] // world
        mine = slice(rank * rows, (rank + 1) * rows)
        out = executor(x[mine], timestep[mine], context[mine], *args, **kwargs).contiguous()
        parts = [torch.empty_like(out) for _ in range(world)]
        dist.all_gather(parts, out)
        return torch.cat(parts)
    return forward


def _wan_sequence_parallel(rank, world, counts, concentrate):
    """A DIFFUSION_MODEL wrapper: ComfyUI's Wan forward (``WanModel._forward`` / ``forward_orig``), run on this
    rank's token shard. ``concentrate`` swirls the first rank's tokens (:func:`_swirl`)."""
    import comfy.ldm.common_dit
    from comfy.ldm.wan.model import sinusoidal_embedding_1d

    def forward(executor, x, timestep, context, clip_fea=None, time_dim_concat=None, transformer_options={}, **kw):
        m = executor.class_obj
        _, _, t, h, w = x.shape
        x = comfy.ldm.common_dit.pad_to_patch_size(x, m.patch_size)
        freqs = m.rope_encode(t, h, w, device=x.device, dtype=x.dtype, transformer_options=transformer_options)
        x = m.patch_embedding(x.float()).to(x.dtype)
        grid_sizes = x.shape[2:]
        x = x.flatten(2).transpose(1, 2)
        total = x.shape[1]
        if concentrate:
            x = _swirl(x, timestep, concentrate)
        e = m.time_embedding(sinusoidal_embedding_1d(m.freq_dim, timestep.flatten()).to(dtype=x[0].dtype))
        e0 = m.time_projection(e.reshape(timestep.shape[0], -1, e.shape[-1])).unflatten(2, (6, m.dim))
        context = m.text_embedding(context)
        options = transformer_options
        if world > 1:
            x, freqs = _shard(x, rank, world), _shard(freqs, rank, world)
            shard_tokens = x.shape[1]

            def attention(func, q, k, v, *args, **kwargs):
                if k.shape[1] == shard_tokens and k.shape[1] != context.shape[1]:  # self-attention: every token
                    k, v = _gather(k, total, world), _gather(v, total, world)
                return func(q, k, v, *args, **kwargs)
            options = dict(transformer_options, grid_sizes=tuple(grid_sizes), optimized_attention_override=attention)
        blocks_replace = options.get("patches_replace", {}).get("dit", {})
        for i, block in enumerate(m.blocks):
            def block_wrap(args, block=block):
                counts["blocks"] += 1
                return {"img": block(args["img"], context=args["txt"], e=args["vec"], freqs=args["pe"],
                                     transformer_options=args["transformer_options"])}
            args = {"img": x, "txt": context, "vec": e0, "pe": freqs, "transformer_options": options}
            replace = blocks_replace.get(("double_block", i))
            x = (replace(args, {"original_block": block_wrap}) if replace else block_wrap(args))["img"]
        x = m.head(x, e.reshape(timestep.shape[0], -1, e.shape[-1]))
        if world > 1:
            x = _gather(x, total, world)
        return m.unpatchify(x, grid_sizes)[:, :, :t, :h, :w]
    return forward


def _flux_sequence_parallel(rank, world, counts, concentrate):
    """A DIFFUSION_MODEL wrapper: ComfyUI's Flux forward (``Flux._forward`` / ``forward_orig``, Flux.1 without
    reference latents or ControlNet), its image tokens and their rope split between the ranks, the text whole on
    every rank. Joint attention (text + image) takes every rank's image keys and values. ``concentrate`` swirls
    the first rank's image tokens (:func:`_swirl`, on Flux's timestep in Wan's units)."""
    from einops import rearrange
    from comfy.ldm.flux.layers import timestep_embedding

    def forward(executor, x, timestep, context, y=None, guidance=None, ref_latents=None, control=None,
                transformer_options={}, **kw):
        m = executor.class_obj
        assert ref_latents is None and control is None and not m.params.global_modulation
        bs, _, h, w = x.shape
        patch = m.patch_size
        h_len, w_len = (h + patch // 2) // patch, (w + patch // 2) // patch
        img, img_ids = m.process_img(x, transformer_options=transformer_options)
        txt_ids = torch.zeros((bs, context.shape[1], len(m.params.axes_dim)), dtype=torch.float32)
        for i in m.params.txt_ids_dims:
            txt_ids[:, :, i] = torch.linspace(0, context.shape[1] - 1, steps=context.shape[1])
        img = m.img_in(img)
        vec = m.time_in(timestep_embedding(timestep, 256).to(img.dtype))
        if m.params.guidance_embed and guidance is not None:
            vec = vec + m.guidance_in(timestep_embedding(guidance, 256).to(img.dtype))
        if m.vector_in is not None:
            vec = vec + m.vector_in(y[:, :m.params.vec_in_dim])
        txt = m.txt_in(m.txt_norm(context) if m.txt_norm is not None else context)
        pe = m.pe_embedder(torch.cat((txt_ids, img_ids), dim=1))  # [rows, 1, tokens, ...]: text first
        text, total = txt.shape[1], img.shape[1]
        if concentrate:
            img = _swirl(img, timestep * 1000, concentrate)
        options = transformer_options
        if world > 1:
            img = _shard(img, rank, world)
            pe = torch.cat([pe[:, :, :text], _shard(pe[:, :, text:], rank, world, dim=2)], dim=2)

            def attention(func, q, k, v, *args, **kwargs):  # [rows, heads, text + image shard, head dim]
                k, v = (torch.cat([t[:, :, :text], _gather(t[:, :, text:], total, world, dim=2)], dim=2)
                        for t in (k, v))
                return func(q, k, v, *args, **kwargs)
            options = dict(transformer_options, grid_sizes=(h_len, w_len), optimized_attention_override=attention)
        blocks_replace = options.get("patches_replace", {}).get("dit", {})
        for i, block in enumerate(m.double_blocks):
            def double_wrap(args, block=block):
                counts["blocks"] += 1
                img, txt = block(img=args["img"], txt=args["txt"], vec=args["vec"], pe=args["pe"],
                                 attn_mask=args.get("attn_mask"), transformer_options=args.get("transformer_options"))
                return {"img": img, "txt": txt}
            args = {"img": img, "txt": txt, "vec": vec, "pe": pe, "attn_mask": None, "transformer_options": options}
            replace = blocks_replace.get(("double_block", i))
            out = replace(args, {"original_block": double_wrap}) if replace else double_wrap(args)
            img, txt = out["img"], out["txt"]
        img = torch.cat((txt, img), dim=1)
        for i, block in enumerate(m.single_blocks):
            def single_wrap(args, block=block):
                counts["blocks"] += 1
                return {"img": block(args["img"], vec=args["vec"], pe=args["pe"], attn_mask=args.get("attn_mask"),
                                     transformer_options=args.get("transformer_options"))}
            args = {"img": img, "vec": vec, "pe": pe, "attn_mask": None, "transformer_options": options}
            replace = blocks_replace.get(("single_block", i))
            img = (replace(args, {"original_block": single_wrap}) if replace else single_wrap(args))["img"]
        img = m.final_layer(img[:, text:], vec)
        if world > 1:
            img = _gather(img, total, world)
        return rearrange(img, "b (h w) (c ph pw) -> b c (h ph) (w pw)", h=h_len, w=w_len, ph=patch,
                         pw=patch)[:, :, :h, :w]
    return forward


# family -> (latent shape, sequence-parallel forward). Both latents make 5 x 5 patches: 25 image tokens, so two
# ranks hold 13 + 12 and 1 padding.
MODELS = {"wan21": ((1, 16, 1, 10, 10), _wan_sequence_parallel), "flux": ((1, 16, 10, 10), _flux_sequence_parallel)}


def as_json(results) -> str:
    """The decisions and counts of ``results`` (no tensors), for a readable assertion message."""
    return json.dumps([{name: {k: v for k, v in run.items() if k != "output"} for name, run in r.get("runs", {}).items()}
                       for r in results], default=str)[:4000]
