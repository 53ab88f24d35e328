"""Weight and compute dtypes: bfloat16, float16 and fp8 weights loaded through ComfyUI's own UNETLoader, models
computing in bfloat16/float16, forecasts formed in float32, and a float16 overflow in a forecast named."""
from __future__ import annotations

import importlib

import pytest
import torch

from cached_sampler_dev.support import graphs
from cached_sampler_dev.support import tiny_models
from cached_sampler_dev.devkit.pack import load_core
from cached_sampler_dev.support.tiny_nodes import CAPTURED

ic = load_core()
memory = importlib.import_module(f"{ic.__name__}.memory")
taylorseer = importlib.import_module(f"{ic.__name__}.methods.taylorseer")
STEPS = 8
DTYPE_BYTES = {torch.float32: 4, torch.bfloat16: 2, torch.float16: 2}


def test_taylorseer_combines_half_precision_points_in_float32():
    """Extrapolating far from unevenly spaced points gives large weights of both signs; formed in bfloat16,
    each product would be rounded at its own magnitude before the terms cancel. The pack's forecast from
    bfloat16 points equals the exact combination of those points to float32 precision (the weights reach
    about 30 here)."""
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(4096, generator=gen) * 50                      # the part common to every point
    change = torch.randn(4096, generator=gen)                         # what changes from step to step
    sigmas = [1.0, 0.93, 0.9]
    points = [(s, (base + change * (1 - s) * 10).to(torch.bfloat16)) for s in sigmas]
    at = 0.6
    weights = taylorseer.lagrange_weights(sigmas, at)
    exact = sum(w * p.double() for w, (_, p) in zip(weights, points))
    forecaster = ic.TaylorSeer(order=2)
    forecast = forecaster.estimate(forecaster.Slot(points=points), at, torch.device("cpu"))
    assert forecast.dtype == torch.float32
    scale = float(sum(abs(w) * p.double().abs() for w, (_, p) in zip(weights, points)).max())
    tolerance = 4 * torch.finfo(torch.float32).eps * scale   # float32 rounding of the largest term
    assert float((forecast.double() - exact).abs().max()) <= tolerance
    # The same combination formed in bfloat16 (the pack before) misses by far more: this test can fail.
    half = points[0][1] * weights[0]
    for w, (_, p) in zip(weights[1:], points[1:]):
        half = half + p * w
    assert float((half.double() - exact).abs().max()) > 1000 * tolerance


# -- through ComfyUI's loader ---------------------------------------------------------------------------------
# The loadable tiny Wan as interceptors/memory.py sees it: 2 latent frames of 16x16, patch 1x2x2 -> 128 image
# tokens, hidden 128, cond and uncond; DBCache keeps the probe residual and the residual of blocks 1-2.
def tiny_wan(stream_bytes: int) -> "memory.StreamShape":
    return memory.StreamShape("loadable tiny Wan", "wan", "image", image_tokens=128, text_tokens=0, hidden=128,
                              latent_elements=16 * 2 * 16 * 16, branches=2, stream_bytes=stream_bytes)


@pytest.fixture(scope="module")
def wan_files(comfy):
    """The loadable tiny Wan saved in float32, bfloat16 and float16, in a diffusion_models folder ComfyUI knows."""
    folder = comfy.tmp / "models" / "diffusion_models"
    folder.mkdir(parents=True, exist_ok=True)
    comfy.folder_paths.add_model_folder_path("diffusion_models", str(folder))
    states = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        name = f"tiny_wan_{str(dtype).removeprefix('torch.')}.safetensors"
        states[name] = tiny_models.save_loadable_wan(folder / name, dtype)
    return states


def loader_prompt(unet_name: str, weight_dtype: str) -> dict:
    return graphs.loaded_wan("UNETLoader", unet_name=unet_name, weight_dtype=weight_dtype)


def run_with(comfy, prompt, chain=None, key="out", model="count"):
    """Sample ``prompt``'s ``model`` (plain KSampler when ``chain`` is None); returns (latent, blocks run, ui)."""
    prompt = dict(prompt)
    node = "KSampler" if chain is None else "CachedSampler"
    graphs.sampler(prompt, node, key=key, steps=STEPS, model=model, **({} if chain is None else {"chain": chain}))
    _, ui = comfy.run(prompt)
    return CAPTURED[key], CAPTURED["work"]["blocks"], ui.get("sampler", {})


def dbcache_taylorseer(prompt, threshold):
    graphs.config(prompt, "db", "CachedSamplerDBCache", Fn=1, Bn=0, threshold=threshold, warmup=0.0,
                  max_cached_steps=-1, max_consecutive_cached=3, start_percent=0.0, end_percent=1.0)
    return graphs.config(prompt, "ts", "CachedSamplerTaylorSeer", upstream="db", order=1)


@pytest.mark.parametrize("unet_name,weight_dtype,flag,stored", [
    ("tiny_wan_bfloat16.safetensors", "default", "bf16_unet", torch.bfloat16),
    ("tiny_wan_float16.safetensors", "default", "fp16_unet", torch.float16),
    ("tiny_wan_float32.safetensors", "fp8_e4m3fn", None, torch.float8_e4m3fn),
])
def test_models_loaded_by_unetloader_in_bf16_fp16_and_fp8_cache_and_skip(comfy, wan_files, monkeypatch, unet_name,
                                                                         weight_dtype, flag, stored):
    """ComfyUI's UNETLoader keeps the weights in bf16/fp16 (what it picks on a GPU that has them; on a CPU it
    does so when started with --bf16-unet / --fp16-unet, set here) or fp8 (weight_dtype fp8_e4m3fn), and
    computes in its manual-cast dtype (float32 on a CPU). Caching on such a model is exact when nothing is
    skipped, skips real block work when it may, stays finite, and keeps its residuals in the compute dtype."""
    if flag is not None:
        from comfy.cli_args import args
        monkeypatch.setattr(args, flag, True)
    prompt = loader_prompt(unet_name, weight_dtype)
    plain, plain_blocks, _ = run_with(comfy, prompt)
    loaded = CAPTURED["loaded"].model
    assert loaded.diffusion_model.blocks[0].self_attn.q.weight.dtype == stored
    file_state = wan_files[unet_name]
    for name, value in loaded.diffusion_model.state_dict().items():
        if name in file_state and value.dtype == stored:
            assert torch.equal(value.float(), file_state[name].to(stored).float()), name
    compute = loaded.manual_cast_dtype or stored

    exact_prompt = dict(prompt)
    exact, exact_blocks, _ = run_with(comfy, exact_prompt, dbcache_taylorseer(exact_prompt, 0.0), key="exact")
    assert torch.equal(exact, plain) and exact_blocks == plain_blocks

    skip_prompt = dict(prompt)
    cached, blocks, ui = run_with(comfy, skip_prompt, dbcache_taylorseer(skip_prompt, 1.0), key="cached")
    assert blocks < plain_blocks, "block work was skipped"
    assert torch.isfinite(cached).all()
    held = sum(ui["cached_sampler"][0]["runs"][0]["cache_peak_bytes"].values())
    assert held == memory.cache_memory(tiny_wan(DTYPE_BYTES[compute]), ic.DBCache, 1).total


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_models_computing_in_bf16_and_fp16_keep_caches_in_their_dtype(comfy, dtype):
    """A model computing in bfloat16/float16 (ComfyUI's model classes with that inference dtype, as its loaders
    set them up on a GPU): exact at threshold 0, skipping and finite when caching, and its block residuals kept
    in the model's dtype, half the bytes of float32."""
    prompt = graphs.base("flux")
    prompt["model"] = {"class_type": "TestTinyModelDtype", "inputs": {"family": "flux", "seed": 0, "dtype": dtype}}
    graphs.count_work(prompt, "flux")
    plain, plain_blocks, _ = run_with(comfy, prompt)
    exact_prompt = dict(prompt)
    exact, _, _ = run_with(comfy, exact_prompt, dbcache_taylorseer(exact_prompt, 0.0), key="exact")
    assert torch.equal(exact, plain)
    skip_prompt = dict(prompt)
    cached, blocks, ui = run_with(comfy, skip_prompt, dbcache_taylorseer(skip_prompt, 1.0), key="cached")
    assert blocks < plain_blocks and torch.isfinite(cached).all()
    shape = memory.StreamShape("tiny Flux", "flux", "joint", image_tokens=64, text_tokens=4, hidden=64,
                               latent_elements=16 * 16 * 16, branches=2, stream_bytes=2)
    held = sum(ui["cached_sampler"][0]["runs"][0]["cache_peak_bytes"].values())
    assert held == memory.cache_memory(shape, ic.DBCache, 1).total


def test_a_float16_forecast_beyond_float16s_range_is_caught_and_named(comfy):
    """A float16 model whose activations spike to 60000 at one computed step: TaylorSeer extrapolates the
    residual past float16's 65504 on the next skipped step, the stream turns Inf, and the NaN watch stops the
    run naming the decider, the estimator, the quantity and the overflow."""
    prompt = graphs.base("flux")
    prompt["model"] = {"class_type": "TestTinyModelDtype", "inputs": {"family": "flux", "seed": 0,
                                                                     "dtype": "float16"}}
    graphs.count_work(prompt, "flux")
    prompt["spike"] = {"class_type": "TestSpikeAt", "inputs": {"model": ["count", 0], "group": "single_block",
                                                              "index": 0, "at": 4, "value": 60000.0}}
    plain, _, _ = run_with(comfy, prompt, model="spike")
    assert torch.isfinite(plain).all(), "computed in full, the spike stays within float16's range"
    graphs.sampler(prompt, "CachedSampler", steps=STEPS, model="spike", chain=dbcache_taylorseer(prompt, 1.0))
    _, result = comfy.run(prompt, expect_error=True)
    message = result["error"]["exception_message"]
    assert "NaN/Inf in the model output" in message and "TaylorSeer" in message
    assert "beyond float16's range (65504)" in message and "residual of block segment" in message, message
