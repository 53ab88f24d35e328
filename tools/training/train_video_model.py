#!/usr/bin/env python3
"""Train the tiny class-conditional Wan 2.1 video model on moving shapes (CPU, 8-20 minutes).

Recipe
------
* Model: ComfyUI's own ``comfy.ldm.wan.model.WanModel`` through ``comfy.supported_models.WAN21_T2V`` (FLOW,
  multiplier 1000; sampling shift 3 for the small clip), at the tiny size of ``nodes/demo_models/video.py``'s ``DEFAULT_UNET_CONFIG``.
* Data: fresh procedurally generated videos every step (``video.make_videos``: a disc or square
  moving right/left/down/up, 8 frames of 32x32 RGB), encoded by the fixed lossy decoder's projection.
* Rectified flow (Liu et al. 2022): ``x_t = (1 - t) x0 + t eps``, the network predicts ``eps - x0`` at
  ``timestep = 1000 t``, what ComfyUI's FLOW sampling expects of Wan. ``t``: a third uniform, a third
  logit-normal(0, 1) (Esser et al. 2024), a third uniform shifted by 3 as the sampler's schedule is.
* Class conditioning via a frozen random table, 10% label dropout to all-zero conditioning (classifier-free
  guidance, Ho & Salimans 2022).
* AdamW, lr 2e-3 with linear warm-up and cosine decay, batch 16, EMA 0.99, a fixed number of steps,
  one CPU thread, fixed seeds: the same torch build retrains the same weights.
* Motion (``bench/video_motion.md``): trained as above alone, the samples from pure noise move in a random
  direction, because the clip's layout is settled in the first steps, where the network's prediction is the same
  for every class. So the network also takes the prompted class's mean latent (a band travelling in the class's
  direction) as 16 more input channels, zero in the unconditional branch, as an image-to-video model takes its
  first frame (``--class-path``, on by default; ``--no-class-path`` trains without it, as the earlier model was).
  ``--position-code`` adds a fixed time/space ramp (Wan's 3-D RoPE is relative), which alone does not make the
  samples follow their direction. Both reach the network at sampling time through Wan's ``concat_latent_image``
  (``video.extra_inputs``).

ComfyUI's Wan code is written for inference: its RoPE goes through the ``comfy_kitchen`` op, which has no
autograd formula. For the training forward passes only, ``comfy.ldm.wan.model.apply_rope1`` is replaced
(process-local, restored afterwards) by the same maths in plain torch, checked to give the same output; the
saved model is reloaded and sampled with the unmodified ComfyUI code.

Writes ``assets/tiny_wan_video.safetensors`` (EMA weights, class table, latent statistics; config, training
log and the sample check in its metadata) and ``assets/tiny_wan_video_samples.png`` (one row per class:
the 8 frames of a sample at 28 euler steps, cfg 3), and prints the share of 64 samples whose shape and
direction, recovered from the decoded frames, are the prompted class's, at cfg 3 and cfg 1.
"""

import argparse
import contextlib
import json
import os
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ASSETS = os.path.join(ROOT, "assets")

from . import train_digits_model as common  # noqa: E402  (beside it: ComfyUI import, pack import, PNG grid)


def import_video_model():
    """Import the video model (``nodes/demo_models/video.py``)."""
    return common.import_demo_model("video")


# --------------------------------------------- training-only patches ----

def _rope_reference(x, freqs_cis):
    """Differentiable RoPE, the maths of ComfyUI's pure-torch ``_apply_rope1``."""
    x_ = x.to(dtype=freqs_cis.dtype).reshape(*x.shape[:-1], -1, 1, 2)
    out = freqs_cis[..., 0] * x_[..., 0] + freqs_cis[..., 1] * x_[..., 1]
    return out.reshape(*x.shape).type_as(x)


@contextlib.contextmanager
def trainable_wan():
    """Temporarily make ComfyUI's Wan forward differentiable (training only)."""
    import comfy.ldm.wan.model as wan

    original = wan.apply_rope1
    wan.apply_rope1 = _rope_reference
    try:
        yield
    finally:
        wan.apply_rope1 = original


def check_patches_exact(net, x, t, context):
    """The training patch must not change the forward output."""
    import torch

    with torch.no_grad():
        reference = net(x, t, context)
        with trainable_wan():
            patched = net(x, t, context)
    err = (reference - patched).abs().max().item()
    if err > 1e-4:
        raise RuntimeError(f"the training patch changes the Wan forward (max err {err})")
    return err


# ------------------------------------------------------------ training ----

def sample_t(batch, generator, shift=3.0):
    """A third uniform, a third logit-normal(0, 1), a third uniform shifted like the sampler's schedule."""
    import torch

    u = torch.rand(batch, generator=generator)
    logit_normal = torch.sigmoid(torch.randn(batch, generator=generator))
    shifted = shift * u / (1.0 + (shift - 1.0) * u)
    pick = torch.randint(0, 3, (batch,), generator=generator)
    return torch.where(pick == 0, u, torch.where(pick == 1, logit_normal, shifted)).clamp(1e-4, 1.0)


def train(vm, args):
    """Train and return (ema_state_dict, tables, info)."""
    import torch

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    stats_videos = vm.make_videos(torch.arange(2048) % vm.NUM_CLASSES, torch.Generator().manual_seed(args.seed + 7))
    mean, std = vm.latent_stats(stats_videos)
    tables = {"class_context": vm.make_class_table(seed=args.seed + 1234), "latent_mean": mean, "latent_std": std}
    config = model_config(vm, args)
    if args.position_code != "none":  # 16 more input channels, never noised (video.extra_inputs)
        tables["position_code"] = vm.position_code(args.position_code, args.code_amplitude)
    if args.class_path:
        tables["class_path"] = vm.class_paths(stats_videos, torch.arange(2048) % vm.NUM_CLASSES, tables)
    view = (1, -1, 1, 1, 1)

    patcher = vm.build_model(config, seed=args.seed)
    net = patcher.model.diffusion_model
    net.train()
    params = list(net.parameters())
    for p in params:
        p.requires_grad_(True)
    ema = [p.detach().clone() for p in params]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.99), weight_decay=0.01)

    start = time.time()
    losses, log = [], []
    for step in range(args.steps):
        labels = torch.randint(0, vm.NUM_CLASSES, (args.batch,), generator=gen)
        x0 = (vm.raw_latent(vm.make_videos(labels, gen)) - mean.view(view)) / std.view(view)
        t = sample_t(args.batch, gen, args.t_shift)
        noise = torch.randn(x0.shape, generator=gen)
        tt = t.view(-1, 1, 1, 1, 1)
        x_t, target = (1.0 - tt) * x0 + tt * noise, noise - x0
        keep = (torch.rand(args.batch, generator=gen) >= args.label_dropout).float().view(-1, 1, 1)
        context = tables["class_context"][labels] * keep
        for group in opt.param_groups:
            group["lr"] = common.lr_at(step, args.steps, args.lr, args.warmup)
        extra = vm.extra_inputs(tables, labels, keep.view(-1))
        net_input = x_t if extra is None else torch.cat([x_t, extra], dim=1)
        with trainable_wan():
            out = net(net_input, t * 1000.0, context)  # timestep = sigma * multiplier (1000)
        losses.append(common.optimiser_step(out, target, opt, params, ema, args.ema))
        if (step + 1) % 50 == 0 or step + 1 == args.steps:
            tail = losses[-50:]
            line = f"step {step + 1}/{args.steps} loss {sum(tail) / len(tail):.4f} {time.time() - start:.0f}s"
            log.append(line)
            print(line, flush=True)

    seconds = time.time() - start
    probe = torch.randn(4, config["in_dim"], vm.FRAMES, vm.LATENT_SIZE, vm.LATENT_SIZE, generator=gen)
    err = check_patches_exact(net, probe, torch.rand(4, generator=gen) * 1000.0, tables["class_context"][:4])
    print(f"patched training forward matches ComfyUI's own (max abs err {err:.1e})")
    names = [n for n, _ in net.named_parameters()]
    state = {n: e.contiguous() for n, e in zip(names, ema)}
    tail = losses[-100:]
    info = {"train_steps": args.steps, "train_seconds": round(seconds, 1),
            "final_loss": round(sum(tail) / len(tail), 5), "train_log": "\n".join(log)}
    return state, tables, info


def model_config(vm, args):
    """The network's config: the tiny default, 16 input channels wider where it takes a position code."""
    config = dict(vm.DEFAULT_UNET_CONFIG)
    config["in_dim"] += vm.LATENT_CHANNELS * ((args.position_code != "none") + args.class_path)
    return config


# -------------------------------------------------------------- output ----

def save(path, state, tables, config, info, args):
    """Write EMA weights, tables and metadata to a safetensors file (the digits model's writer, described as this
    model)."""
    common.save(path, state, tables, config, info, args, **{
        "format": "tiny_wan_video/1",
        "model_config_class": "comfy.supported_models.WAN21_T2V",
        "recipe": "rectified flow (eps - x0 target, timestep 1000 t), t 1/3 uniform, 1/3 logit-normal, "
                  "1/3 shift-3 uniform, 10% label dropout, AdamW cosine, EMA",
        "data": "procedural moving shapes (nodes/demo_models/video.py make_videos), 8 frames 32x32 RGB",
        "classes": json.dumps(list(CLASSES_FROM_MODULE)),
        "position_code": f"{args.position_code} {args.code_amplitude:g}", "class_path": str(args.class_path),
    })


CLASSES_FROM_MODULE = ()


def evaluate(vm, path, png_path, samples_per_class=8):
    """Reload the saved file, sample ``samples_per_class`` videos per class at cfg 3 and cfg 1 (28 euler
    steps), write one row of frames per class, and return the class checks."""
    import torch

    model = vm.load_model(path)
    tables = vm.load_tables(path)
    labels = [c for _ in range(samples_per_class) for c in range(vm.NUM_CLASSES)]
    out = {}
    for cfg in (3.0, 1.0):
        latent = vm.sample_videos(model, labels, steps=28, cfg=cfg, seed=0, tables=tables)
        videos = vm.decode_videos(latent, tables)
        accuracy, direction = vm.class_accuracy(videos, labels)
        _, shape = vm.classify_videos(videos)
        truth = torch.tensor(labels)
        out[f"cfg{cfg:g}"] = {"class_accuracy": accuracy, "direction_accuracy": direction,
                              "shape_accuracy": float((shape == truth // len(vm.DIRECTIONS)).float().mean()),
                              "colour_accuracy": float((vm.hue_classes(videos) == truth).float().mean()),
                              "mean_motion_px": round(float(vm.motion(videos).mean()), 2),
                              "finite": bool(torch.isfinite(latent).all())}
        if cfg == 3.0:
            frames = vm.decode(latent[:vm.NUM_CLASSES], tables)  # [8 classes * 8 frames, 64, 64, 3]
            common.save_grid(frames, png_path, rows=vm.NUM_CLASSES, cols=vm.FRAMES)
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=2400, help="training steps")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=40)
    p.add_argument("--ema", type=float, default=0.99)
    p.add_argument("--label-dropout", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--position-code", default="none", choices=("none", "time", "time+space"),
                   help="a fixed pattern the network takes as 16 more input channels, telling each token its frame "
                        "(and place), which Wan's relative RoPE does not (video.position_code)")
    p.add_argument("--class-path", action=argparse.BooleanOptionalAction, default=True,
                   help="(on by default) the network also takes the prompted class's mean latent (where its shape is on average in "
                        "each frame) as 16 more input channels, zero when the label is dropped (video.class_paths)")
    p.add_argument("--t-shift", type=float, default=3.0,
                   help="the shift of the third of the noise levels drawn shifted (3: the sampler's); higher trains "
                        "more where the noise is high, where the layout of a clip is decided")
    p.add_argument("--code-amplitude", type=float, default=1.0, help="the position code's largest value")
    p.add_argument("--out", default=os.path.join(ASSETS, "tiny_wan_video.safetensors"))
    p.add_argument("--png", default=os.path.join(ASSETS, "tiny_wan_video_samples.png"))
    return p.parse_args(argv)


def main(argv=None):
    global CLASSES_FROM_MODULE
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    args = parse_args(argv)
    common.import_comfy()
    vm = import_video_model()
    CLASSES_FROM_MODULE = vm.CLASS_NAMES
    state, tables, info = train(vm, args)
    save(args.out, state, tables, model_config(vm, args), info, args)
    print(f"trained {info['train_steps']} steps in {info['train_seconds']} s, final loss {info['final_loss']}")
    checks = evaluate(vm, args.out, args.png)
    info["sample_check"] = json.dumps(checks)
    save(args.out, state, tables, model_config(vm, args), info, args)  # the check goes into the metadata too
    size_mb = os.path.getsize(args.out) / 2 ** 20
    print(f"wrote {os.path.relpath(args.out, ROOT)} ({size_mb:.1f} MiB) and {os.path.relpath(args.png, ROOT)}")
    for cfg, c in checks.items():
        print(f"{cfg}: class (shape and direction) accuracy {c['class_accuracy']:.2f}, direction "
              f"{c['direction_accuracy']:.2f}, shape {c['shape_accuracy']:.2f}, colour {c['colour_accuracy']:.2f}, "
              f"mean motion {c['mean_motion_px']} px over {vm.FRAMES} frames"
              f"{'' if c['finite'] else ' (NON-FINITE OUTPUT)'}")


if __name__ == "__main__":
    main()
