#!/usr/bin/env python3
"""Train the tiny class-conditional Flux photos model on crops of two photographs (CPU, about 15 minutes).

Recipe
------
* Model: ComfyUI's own Flux (``comfy.ldm.flux.model.Flux``, double and single blocks) through a many-step
  config with FluxSchnell's sampling (FLOW, multiplier 1, shift 1), at the size of
  ``nodes/demo_models/photos.py``'s ``DEFAULT_UNET_CONFIG``.
* Data: fresh crops every step (``photos.make_crops``: a square of a random place and scale in its class's region
  of ``china.jpg`` or ``flower.jpg``, both bundled with scikit-learn, flipped left-right half the time, resized to
  48x48 RGB), encoded by the fixed lossy decoder's projection (``loader.patch_basis``) and standardised.
* Rectified flow (Liu et al. 2022): ``x_t = (1 - t) x0 + t eps``, the network predicts ``eps - x0`` at
  ``timestep = t``; ``t`` half logit-normal(0, 1) (Esser et al. 2024), half uniform: the digits model's recipe.
* Class conditioning via a frozen random table, 10% label dropout to all-zero conditioning (classifier-free
  guidance, Ho & Salimans 2022).
* AdamW, lr 1e-3 with linear warm-up and cosine decay, batch 32, EMA 0.995, a wall-clock budget (default
  720 s), one CPU thread, fixed seed.

The training forward passes use the digits script's patches of ComfyUI's Flux (out-of-place residual adds and a
differentiable RoPE, checked to give the same output); the saved model is reloaded and sampled with the
unmodified ComfyUI code.

Writes ``assets/tiny_flux_photos.safetensors`` (EMA weights, class tables, latent statistics; config, training
log and the sample check in its metadata) and ``assets/tiny_flux_photos_samples.png`` (one row per class: training
crops through the decoder on the left, samples at 20 euler steps, cfg 3, on the right), and prints the share of 64
samples whose colour and texture statistics are nearest to their prompted class's crops, at cfg 3 and cfg 1.
"""

import json
import os
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from . import train_digits_model as common  # noqa: E402  (beside it: ComfyUI import, pack import, Flux training patches)


def train(pm, args):
    """Train and return (ema_state_dict, tables, info)."""
    import torch

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    stats_crops = pm.make_crops(torch.arange(2048) % pm.NUM_CLASSES, torch.Generator().manual_seed(args.seed + 7))
    mean, std = pm.latent_stats(stats_crops)
    context, pooled = pm.make_class_tables(seed=args.seed + 1234)
    tables = {"class_context": context, "class_pooled": pooled, "latent_mean": mean, "latent_std": std}
    view = (1, -1, 1, 1)

    patcher = pm.build_model(pm.DEFAULT_UNET_CONFIG)
    net = patcher.model.diffusion_model
    net.train()
    params = list(net.parameters())
    for p in params:
        p.requires_grad_(True)
    ema = [p.detach().clone() for p in params]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.99), weight_decay=0.01)

    total = args.steps or 10 ** 9
    calibrate = min(args.calibrate, args.warmup)
    start = time.time()
    losses, log, step = [], [], 0
    while step < total:
        labels = torch.randint(0, pm.NUM_CLASSES, (args.batch,), generator=gen)
        x0 = (pm.raw_latent(pm.make_crops(labels, gen)) - mean.view(view)) / std.view(view)
        t = common.sample_t(args.batch, gen)
        x_t, target = common.flow_batch(x0, t, torch.randn(x0.shape, generator=gen))
        ctx, pool = common.conditioning_batch(labels, tables, args.label_dropout, gen)
        for group in opt.param_groups:
            group["lr"] = common.lr_at(step, total, args.lr, args.warmup)  # total is set before warm-up ends
        with common.trainable_flux():
            out = net(x_t, t, context=ctx, y=pool)  # timestep = sigma * multiplier(1)
        losses.append(common.optimiser_step(out, target, opt, params, ema, args.ema))
        step += 1
        elapsed = time.time() - start
        if not args.steps and step == calibrate:
            total = max(step + 1, int(args.time_budget / (elapsed / step)))
            print(f"calibrated: {elapsed / step:.3f} s/step -> {total} steps")
        if step % 100 == 0 or step == total:
            tail = losses[-100:]
            line = f"step {step}/{total} loss {sum(tail) / len(tail):.4f} {elapsed:.0f}s"
            log.append(line)
            print(line, flush=True)
        if elapsed > args.time_budget * 1.1:
            print("time budget exhausted, stopping early")
            break

    seconds = time.time() - start
    probe = torch.randn(8, 16, pm.LATENT_SIZE, pm.LATENT_SIZE, generator=gen)
    err = common.check_patches_exact(net, probe, torch.rand(8, generator=gen), context, pooled)
    print(f"patched training forward matches ComfyUI's own (max abs err {err:.1e})")
    names = [n for n, _ in net.named_parameters()]
    state = common.flux_checkpoint_names({n: e.contiguous() for n, e in zip(names, ema)})
    tail = losses[-100:]
    info = {"train_steps": step, "train_seconds": round(seconds, 1),
            "final_loss": round(sum(tail) / len(tail), 5), "train_log": "\n".join(log)}
    return state, tables, info


# -------------------------------------------------------------- output ----

def save(path, state, tables, config, info, args, class_names):
    """Write EMA weights, tables and metadata to a safetensors file (the digits model's writer, described as this
    model)."""
    common.save(path, state, tables, config, info, args, **{
        "format": "tiny_flux_photos/1",
        "recipe": "rectified flow (eps - x0 target), t 50% logit-normal / 50% uniform, 10% label dropout, "
                  "AdamW cosine, EMA",
        "data": "crops of sklearn.datasets.load_sample_images (china.jpg, flower.jpg), 48x48 RGB",
        "classes": json.dumps(list(class_names)),
    })


def evaluate(pm, path, png_path, samples_per_class=8):
    """Reload the saved file, sample ``samples_per_class`` crops per class at cfg 3 and cfg 1 (20 euler steps),
    write one row per class (training crops through the decoder, then samples), and return the class checks."""
    import torch

    model = pm.load_model(path)
    tables = pm.load_tables(path)
    labels = [c for _ in range(samples_per_class) for c in range(pm.NUM_CLASSES)]
    out = {}
    for cfg in (3.0, 1.0):
        latent = pm.sample_photos(model, labels, steps=20, cfg=cfg, seed=0, tables=tables)
        images = pm.decode_images(latent, tables)
        out[f"cfg{cfg:g}"] = {"class_accuracy": pm.class_accuracy(images, labels),
                              "finite": bool(torch.isfinite(latent).all())}
        if cfg == 3.0:
            crops = pm.make_crops(torch.arange(pm.NUM_CLASSES).repeat(4), torch.Generator().manual_seed(1))
            crops = pm.decode(pm.encode(crops, tables), tables)
            samples = pm.decode(latent, tables)
            rows = torch.cat([crops.unflatten(0, (4, pm.NUM_CLASSES)),
                              samples.unflatten(0, (samples_per_class, pm.NUM_CLASSES))])
            rows = rows.transpose(0, 1).flatten(0, 1)  # class-major: crops, then samples
            common.save_grid(rows, png_path, rows=pm.NUM_CLASSES, cols=4 + samples_per_class)
    return out


def parse_args(argv=None):
    return common.parse_training_args(argv, __doc__.split("\n")[0], "tiny_flux_photos", time_budget=720.0, batch=32)


def main(argv=None):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    args = parse_args(argv)
    common.import_comfy()
    pm = common.import_demo_model("photos")
    state, tables, info = train(pm, args)
    save(args.out, state, tables, pm.DEFAULT_UNET_CONFIG, info, args, pm.CLASS_NAMES)
    print(f"trained {info['train_steps']} steps in {info['train_seconds']} s, final loss {info['final_loss']}")
    checks = evaluate(pm, args.out, args.png)
    info["sample_check"] = json.dumps(checks)
    save(args.out, state, tables, pm.DEFAULT_UNET_CONFIG, info, args, pm.CLASS_NAMES)  # the check, in the metadata too
    size_mb = os.path.getsize(args.out) / 2 ** 20
    print(f"wrote {os.path.relpath(args.out, ROOT)} ({size_mb:.1f} MiB) and {os.path.relpath(args.png, ROOT)}")
    for cfg, c in checks.items():
        print(f"{cfg}: share of samples nearest to their class's crops {c['class_accuracy']:.2f}"
              f"{'' if c['finite'] else ' (NON-FINITE OUTPUT)'}")


if __name__ == "__main__":
    main()
