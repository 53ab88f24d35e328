"""GGUF-quantized models, loaded by city96's ComfyUI-GGUF (the loader most users have): block replacement and
caching work on its quantized layers.

Runs when ComfyUI-GGUF is installed in the ComfyUI under test (a folder of its custom_nodes whose name contains
"gguf"), or found at ``COMFYUI_GGUF_PATH``; otherwise it is skipped with a reason saying so. The pack never
ships or imports ComfyUI-GGUF's code: the test loads it through ComfyUI's own custom-node loader.
"""
from __future__ import annotations

import asyncio

import pytest
import torch

from cached_sampler_dev.support import graphs
from cached_sampler_dev.devkit.comfy_harness import find_gguf_nodes
from cached_sampler_dev.support import tiny_models
from cached_sampler_dev.support.tiny_nodes import CAPTURED

STEPS = 8
LOADER = "UnetLoaderGGUF"


@pytest.fixture(scope="module")
def gguf_file(comfy):
    import nodes
    if LOADER not in nodes.NODE_CLASS_MAPPINGS:
        found = find_gguf_nodes(comfy.path)
        if found is None:
            pytest.skip("!!! ComfyUI-GGUF is not installed in the ComfyUI under test (nor at COMFYUI_GGUF_PATH): "
                        "the GGUF tests are skipped !!!")
        pytest.importorskip("gguf", reason="ComfyUI-GGUF needs the 'gguf' package (pip install gguf)")
        if not asyncio.run(nodes.load_custom_node(str(found))) or LOADER not in nodes.NODE_CLASS_MAPPINGS:
            pytest.fail(f"ComfyUI could not load ComfyUI-GGUF from {found} (see the log)")
    folder = comfy.tmp / "models" / "diffusion_models"
    folder.mkdir(parents=True, exist_ok=True)
    comfy.folder_paths.add_model_folder_path("diffusion_models", str(folder))
    tiny_models.save_loadable_wan_gguf(folder / "tiny_wan_q8_0.gguf")
    return "tiny_wan_q8_0.gguf"


def prompt_for(unet_name: str) -> dict:
    return graphs.loaded_wan(LOADER, unet_name=unet_name)


def sample(comfy, prompt, threshold=None, key="out"):
    prompt = dict(prompt)
    chain = None
    if threshold is not None:
        graphs.config(prompt, "db", "CachedSamplerDBCache", Fn=1, Bn=0, threshold=threshold, warmup=0.0,
                      max_cached_steps=-1, max_consecutive_cached=3, start_percent=0.0, end_percent=1.0)
        chain = graphs.config(prompt, "ts", "CachedSamplerTaylorSeer", upstream="db", order=1)
    graphs.sampler(prompt, "KSampler" if chain is None else "CachedSampler", key=key, steps=STEPS, model="count",
                   **({} if chain is None else {"chain": chain}))
    comfy.run(prompt)
    return CAPTURED[key], CAPTURED["work"]["blocks"]


def test_block_caching_on_a_gguf_quantized_model(comfy, gguf_file):
    """A Q8_0 GGUF Wan loaded by ComfyUI-GGUF's Unet Loader: its linear layers really are quantized, caching at
    threshold 0 is bit-identical to the plain sampler, and caching that skips runs fewer blocks and stays finite
    and close to the uncached result."""
    prompt = prompt_for(gguf_file)
    plain, plain_blocks = sample(comfy, prompt)
    weight = CAPTURED["loaded"].model.diffusion_model.blocks[0].self_attn.q.weight
    assert getattr(getattr(weight, "tensor_type", None), "name", None) == "Q8_0" and weight.dtype == torch.uint8
    exact, exact_blocks = sample(comfy, prompt, threshold=0.0, key="exact")
    assert torch.equal(exact, plain) and exact_blocks == plain_blocks
    cached, blocks = sample(comfy, prompt, threshold=1.0, key="cached")
    assert blocks < plain_blocks and torch.isfinite(cached).all()
    assert float((cached - plain).abs().mean()) < float(plain.abs().mean())
