#!/usr/bin/env python3
"""Train the tiny class-conditional Flux digits model (CPU, a few minutes).

Recipe
------
* Rectified flow (Liu et al. 2022, "Flow Straight and Fast"):
  ``x_t = (1 - t) * x0 + t * eps``; the network predicts ``eps - x0``.
  ComfyUI's FLOW model type (``comfy.model_sampling.CONST`` +
  ``ModelSamplingDiscreteFlow``) uses ``sigma = t``, ``timestep = sigma *
  multiplier`` (multiplier 1 for FluxSchnell) and ``denoised = x_t - sigma *
  output``, so this target makes ``calculate_denoised`` return ``x0``.
* ``t``: 50% logit-normal(0, 1) (Esser et al. 2024, SD3), 50% uniform.
* Class conditioning via a frozen random embedding table, 10% label dropout
  to all-zero conditioning (classifier-free guidance, Ho & Salimans 2022).
* AdamW, lr 1e-3 with linear warm-up and cosine decay, batch 64, EMA 0.995,
  a wall-clock budget (default 240 s), one CPU thread, fixed seed.
* Data: ``sklearn.datasets.load_digits()`` (bundled with scikit-learn).

ComfyUI's Flux code is written for inference: its blocks add residuals in
place (``img += ...``), which invalidates tensors autograd saved, and the
``comfy_kitchen`` RoPE op has no autograd formula.  :func:`trainable_flux`
works around both for the training forward passes only (process-local,
restored afterwards); the saved model is reloaded and sampled with the
unmodified ComfyUI code.

Writes ``assets/tiny_flux_digits.safetensors`` and
``assets/tiny_flux_digits_samples.png`` and prints the k-NN label accuracy
of 100 samples (euler, 20 steps, cfg 3).
"""

import argparse
import contextlib
import importlib
import importlib.util
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE_NAME = "cached_sampler_pack"
STANDALONE_PACKAGE = "tiny_demo_models"  # nodes/demo_models when the pack cannot be imported
ASSETS = os.path.join(ROOT, "assets")


# ------------------------------------------------------------- imports ----

def comfyui_path():
    """ComfyUI checkout: $COMFYUI_PATH, else ~/ComfyUI."""
    return os.path.abspath(os.path.expanduser(os.environ.get("COMFYUI_PATH") or "~/ComfyUI"))


def import_comfy():
    """Import ComfyUI headless in CPU mode (devkit's start-up)."""
    import torch

    torch.set_num_threads(1)
    path = comfyui_path()
    if not os.path.isdir(os.path.join(path, "comfy")):
        sys.exit(f"ComfyUI not found at {path} (set COMFYUI_PATH)")
    from ..devkit.comfy_harness import import_headless
    import_headless(Path(path))


def import_demo_model(name):
    """Import ``nodes.demo_models.<name>`` as part of the pack, or with its folder loaded as a package of its own
    (it imports nothing else of the pack)."""
    init = os.path.join(ROOT, "__init__.py")
    if os.path.isfile(init) and STANDALONE_PACKAGE not in sys.modules:
        try:
            if PACKAGE_NAME not in sys.modules:
                spec = importlib.util.spec_from_file_location(
                    PACKAGE_NAME, init, submodule_search_locations=[ROOT])
                package = importlib.util.module_from_spec(spec)
                sys.modules[PACKAGE_NAME] = package
                spec.loader.exec_module(package)
            return importlib.import_module(f"{PACKAGE_NAME}.nodes.demo_models.{name}")
        except Exception as exc:  # pack not importable yet: use the folder directly
            print(f"note: pack import failed ({exc!r}); loading the demo models standalone")
            for key in [k for k in sys.modules if k.split(".")[0] == PACKAGE_NAME]:
                del sys.modules[key]
    if STANDALONE_PACKAGE not in sys.modules:
        folder = os.path.join(ROOT, "nodes", "demo_models")
        spec = importlib.util.spec_from_file_location(
            STANDALONE_PACKAGE, os.path.join(folder, "__init__.py"), submodule_search_locations=[folder])
        package = importlib.util.module_from_spec(spec)
        sys.modules[STANDALONE_PACKAGE] = package
        spec.loader.exec_module(package)
    return importlib.import_module(f"{STANDALONE_PACKAGE}.{name}")


def import_digits_model():
    """Import the digits model (``nodes/demo_models/digits.py``)."""
    return import_demo_model("digits")


# --------------------------------------------- training-only patches ----

def _make_out_of_place_mode():
    """TorchFunctionMode turning ``a += b`` (``Tensor.add_``) into ``torch.add``.

    Python rebinds the left-hand name to whatever ``__iadd__`` returns, so
    returning a new tensor keeps the forward maths identical while leaving
    the tensors autograd saved untouched.
    """
    import torch
    from torch.overrides import TorchFunctionMode

    class OutOfPlaceAdd(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.Tensor.add_:
                return torch.add(*args, **kwargs)
            return func(*args, **kwargs)

    return OutOfPlaceAdd()


def _rope_reference(xq, xk, freqs_cis):
    """Differentiable RoPE, same maths as ComfyUI's pure-torch ``apply_rope1``."""
    def rope1(x):
        x_ = x.to(dtype=freqs_cis.dtype).reshape(*x.shape[:-1], -1, 1, 2)
        out = freqs_cis[..., 0] * x_[..., 0] + freqs_cis[..., 1] * x_[..., 1]
        return out.reshape(*x.shape).type_as(x)

    return rope1(xq), rope1(xk)


@contextlib.contextmanager
def trainable_flux():
    """Temporarily make ComfyUI's Flux forward differentiable (training only)."""
    import comfy.ldm.flux.math as flux_math

    original = flux_math.apply_rope
    flux_math.apply_rope = _rope_reference
    try:
        with _make_out_of_place_mode():
            yield
    finally:
        flux_math.apply_rope = original


# ------------------------------------------------------------ training ----

def sample_t(batch, generator):
    """Half logit-normal(0, 1) (Esser et al. 2024), half uniform on (0, 1)."""
    import torch

    logit_normal = torch.sigmoid(torch.randn(batch, generator=generator))
    uniform = torch.rand(batch, generator=generator)
    pick = torch.rand(batch, generator=generator) < 0.5
    return torch.where(pick, logit_normal, uniform)


def flow_batch(x0, t, noise):
    """Rectified-flow pair: ``x_t = (1-t) x0 + t eps`` and target ``eps - x0``."""
    tt = t.view(-1, 1, 1, 1)
    return (1.0 - tt) * x0 + tt * noise, noise - x0


def conditioning_batch(labels, tables, drop_prob, generator):
    """Class context/pooled vectors with ``drop_prob`` of rows zeroed."""
    import torch

    keep = (torch.rand(len(labels), generator=generator) >= drop_prob).float()
    context = tables["class_context"][labels] * keep.view(-1, 1, 1)
    pooled = tables["class_pooled"][labels] * keep.view(-1, 1)
    return context, pooled


def lr_at(step, total, base_lr, warmup):
    """Linear warm-up then cosine decay to zero."""
    if step < warmup:
        return base_lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return base_lr * 0.5 * (1.0 + math.cos(math.pi * progress))


def optimiser_step(out, target, opt, params, ema, ema_decay):
    """One step on the velocity MSE: clipped gradients (norm 1), the optimiser, then the EMA copy of ``params``
    moved towards them. Returns the loss."""
    import torch

    loss = torch.nn.functional.mse_loss(out, target)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    with torch.no_grad():
        for e, p in zip(ema, params):
            e.lerp_(p, 1.0 - ema_decay)
    return loss.item()


def check_patches_exact(net, x, t, context, pooled):
    """The training patches must not change the forward output."""
    import torch

    with torch.no_grad():
        reference = net(x, t, context=context, y=pooled)
        with trainable_flux():
            patched = net(x, t, context=context, y=pooled)
    err = (reference - patched).abs().max().item()
    if err > 1e-4:
        raise RuntimeError(f"training patches change the Flux forward (max err {err})")
    return err


def flux_checkpoint_names(state):
    """``state`` with Flux's RMSNorm gains under their checkpoint name ``scale``, which every supported ComfyUI
    loads (newer ones name the parameter ``weight`` and convert ``scale`` in ``process_unet_state_dict``; older ones
    know only ``scale``)."""
    suffixes = ("query_norm.weight", "key_norm.weight")
    return {(k[:-len("weight")] + "scale" if k.endswith(suffixes) else k): v for k, v in state.items()}


def train(dm, args):
    """Train and return (ema_state_dict, tables, info)."""
    import torch
    from sklearn.datasets import load_digits

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    data = load_digits()
    digits = torch.tensor(data.images, dtype=torch.float32)
    labels = torch.tensor(data.target, dtype=torch.long)
    mean, std = dm.latent_stats(digits)
    context, pooled = dm.make_class_tables(seed=args.seed + 1234)
    tables = {"class_context": context, "class_pooled": pooled,
              "latent_mean": mean, "latent_std": std}
    x0_all = dm.latent_format().process_in(dm.encode(digits, tables))

    patcher = dm.build_model(dm.DEFAULT_UNET_CONFIG)
    net = patcher.model.diffusion_model
    net.train()
    params = [p for p in net.parameters()]
    for p in params:
        p.requires_grad_(True)
    ema = [p.detach().clone() for p in params]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.99), weight_decay=0.01)

    total = args.steps or 10 ** 9
    calibrate = min(args.calibrate, args.warmup)
    start = time.time()
    losses, step, order = [], 0, torch.randperm(len(digits), generator=gen)
    cursor = 0
    while step < total:
        if cursor + args.batch > len(order):
            order, cursor = torch.randperm(len(digits), generator=gen), 0
        idx = order[cursor:cursor + args.batch]
        cursor += args.batch
        t = sample_t(len(idx), gen)
        x_t, target = flow_batch(x0_all[idx], t, torch.randn(x0_all[idx].shape, generator=gen))
        ctx, pool = conditioning_batch(labels[idx], tables, args.label_dropout, gen)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, total, args.lr, args.warmup)  # total is set before warm-up ends
        with trainable_flux():
            out = net(x_t, t, context=ctx, y=pool)  # timestep = sigma * multiplier(1)
        losses.append(optimiser_step(out, target, opt, params, ema, args.ema))
        step += 1
        elapsed = time.time() - start
        if not args.steps and step == calibrate:
            total = max(step + 1, int(args.time_budget / (elapsed / step)))
            print(f"calibrated: {elapsed / step:.3f} s/step -> {total} steps")
        if step % 100 == 0 or step == total:
            print(f"step {step}/{total} loss {sum(losses[-100:]) / len(losses[-100:]):.4f} "
                  f"lr {opt.param_groups[0]['lr']:.2e} {elapsed:.0f}s", flush=True)
        if elapsed > args.time_budget * 1.1:
            print("time budget exhausted, stopping early")
            break

    seconds = time.time() - start
    probe = torch.randn(8, 16, 8, 8, generator=gen)
    err = check_patches_exact(net, probe, torch.rand(8, generator=gen), context[:8], pooled[:8])
    print(f"patched training forward matches ComfyUI's own (max abs err {err:.1e})")
    names = [n for n, _ in net.named_parameters()]
    state = flux_checkpoint_names({n: e.contiguous() for n, e in zip(names, ema)})
    tail = losses[-100:]
    info = {"train_steps": step, "train_seconds": round(seconds, 1),
            "final_loss": round(sum(tail) / len(tail), 5)}
    return state, tables, info


# -------------------------------------------------------------- output ----

def save(path, state, tables, config, info, args, **described):
    """Write EMA weights, tables and metadata to a safetensors file: the training settings of ``args``, what
    ``info`` measured, and what ``described`` says of the model (format, config class, recipe, data; the digits
    model's by default)."""
    from safetensors.torch import save_file

    tensors = {"diffusion_model." + k: v for k, v in state.items()}
    tensors.update({k: v.contiguous() for k, v in tables.items()})
    metadata = {
        "format": "tiny_flux_digits/1",
        "model_config_class": "comfy.supported_models.FluxSchnell",
        "unet_config": json.dumps(config),
        "recipe": "rectified flow (eps - x0 target), t 50% logit-normal / 50% uniform, "
                  "10% label dropout, AdamW cosine, EMA",
        "data": "sklearn.datasets.load_digits",
        **described,
        "seed": str(args.seed), "ema": str(args.ema), "lr": str(args.lr),
        "batch": str(args.batch), "label_dropout": str(args.label_dropout),
    }
    metadata.update({k: str(v) for k, v in info.items()})
    os.makedirs(os.path.dirname(path), exist_ok=True)
    save_file(tensors, path, metadata=metadata)


def save_grid(images, path, rows, cols, pad=2):
    """Save [rows*cols, H, W, 3] images (0..1) as a PNG grid, row-major."""
    import numpy as np
    from PIL import Image

    n, h, w, _ = images.shape
    grid = np.zeros((rows * (h + pad) + pad, cols * (w + pad) + pad, 3), dtype=np.uint8)
    grid[:] = 96
    arr = (images.clamp(0, 1).numpy() * 255).round().astype(np.uint8)
    for i in range(n):
        r, c = divmod(i, cols)
        y, x = pad + r * (h + pad), pad + c * (w + pad)
        grid[y:y + h, x:x + w] = arr[i]
    Image.fromarray(grid).save(path)


def evaluate(dm, path, png_path):
    """Reload the saved file, sample 10 per class, write the grid, return accuracy."""
    model = dm.load_model(path)
    tables = dm.load_tables(path)
    labels = [c for _ in range(10) for c in range(10)]  # one column per class
    latent = dm.sample_digits(model, labels, steps=20, cfg=3.0, seed=0, tables=tables)
    save_grid(dm.decode(latent, tables), png_path, rows=10, cols=10)
    digits = dm.decode_digits(latent, tables)
    return dm.knn_label_accuracy(digits, labels), bool(latent.isfinite().all())


def parse_training_args(argv, description, weights, time_budget, batch):
    """The command line of a tiny Flux's training (digits, photos): the recipe's knobs, and where it writes
    ``weights`` (.safetensors) and its samples (.png beside it, ``_samples``)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--time-budget", type=float, default=time_budget, help="training seconds")
    p.add_argument("--steps", type=int, default=None, help="fixed step count (else from budget)")
    p.add_argument("--calibrate", type=int, default=30, help="steps used to time one step")
    p.add_argument("--batch", type=int, default=batch)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--ema", type=float, default=0.995)
    p.add_argument("--label-dropout", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=os.path.join(ASSETS, f"{weights}.safetensors"))
    p.add_argument("--png", default=os.path.join(ASSETS, f"{weights}_samples.png"))
    return p.parse_args(argv)


def parse_args(argv=None):
    return parse_training_args(argv, __doc__.split("\n")[0], "tiny_flux_digits", time_budget=240.0, batch=64)


def main(argv=None):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    args = parse_args(argv)
    import_comfy()
    dm = import_digits_model()
    state, tables, info = train(dm, args)
    save(args.out, state, tables, dm.DEFAULT_UNET_CONFIG, info, args)
    print(f"trained {info['train_steps']} steps in {info['train_seconds']} s, "
          f"final loss {info['final_loss']}")
    accuracy, finite = evaluate(dm, args.out, args.png)
    size_mb = os.path.getsize(args.out) / 2 ** 20
    print(f"wrote {os.path.relpath(args.out, ROOT)} ({size_mb:.1f} MiB) and "
          f"{os.path.relpath(args.png, ROOT)}")
    print(f"k-NN label accuracy of 100 samples (euler, 20 steps, cfg 3): {accuracy:.2f}"
          f"{'' if finite else ' (NON-FINITE OUTPUT)'}")


if __name__ == "__main__":
    main()
