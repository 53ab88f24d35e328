"""Verified Forecast and Verified Block Cache on the bundled digits model, through ComfyUI's executor: at threshold
0 the latents equal KSampler's bit for bit, and a lower threshold never skips more (a threshold means a forecast
error, so a lower one trusts fewer forecasts)."""
import os

import pytest
import torch

from cached_sampler_dev.support.tiny_nodes import CAPTURED

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WEIGHTS = os.path.join(ROOT, "assets", "tiny_flux_digits.safetensors")
WINDOW = dict(start_percent=0.0, end_percent=1.0, max_consecutive_cached=-1)
STEPS = 12

pytestmark = pytest.mark.skipif(not os.path.isfile(WEIGHTS), reason="tiny_flux_digits.safetensors missing")


def _prompt(node: str | None, **inputs) -> dict:
    prompt = {"digits": {"class_type": "CachedSamplerDigitsModel", "inputs": {"digits": "07"}}}
    sampler_inputs = {"model": ["digits", 0], "seed": 0, "steps": STEPS, "cfg": 3.0, "sampler_name": "euler",
                      "scheduler": "simple", "positive": ["digits", 1], "negative": ["digits", 2],
                      "latent_image": ["digits", 3], "denoise": 1.0}
    if node is None:
        prompt["sampler"] = {"class_type": "KSampler", "inputs": sampler_inputs}
    else:
        prompt["method"] = {"class_type": node, "inputs": inputs}
        prompt["ts"] = {"class_type": "CachedSamplerTaylorSeer", "inputs": {"order": 1, "interceptors": ["method", 0]}}
        sampler_inputs["interceptors"] = ["ts", 0]
        prompt["sampler"] = {"class_type": "CachedSampler", "inputs": sampler_inputs}
    prompt["capture"] = {"class_type": "TestCaptureLatent", "inputs": {"samples": ["sampler", 0], "key": "out"}}
    return prompt


def _run(comfy, node, **inputs):
    _, ui = comfy.run(_prompt(node, **inputs))
    latent = CAPTURED["out"].clone()
    if node is None:
        return latent, None
    (run,) = ui["sampler"]["cached_sampler"][0]["runs"]
    return latent, run["decisions"]


@pytest.mark.parametrize("node, inputs", [
    ("CachedSamplerVerifiedForecast", {}),
    ("CachedSamplerVerifiedBlockCache", {"Fn": 1, "Bn": 1, "refresh_ratio": 2.0}),
])
def test_verified_methods_on_the_digits_model(comfy, node, inputs):
    plain, _ = _run(comfy, None)
    skips = []
    for threshold in (0.0, 0.02, 0.2):
        latent, decisions = _run(comfy, node, threshold=threshold, **inputs, **WINDOW)
        assert len(decisions) == STEPS
        if threshold == 0.0:
            assert torch.equal(latent, plain), "threshold 0 changed the output"
            assert "s" not in decisions
        assert torch.isfinite(latent).all()
        skips.append(decisions.count("s"))
    assert skips == sorted(skips) and skips[-1] > skips[1] >= 0 and skips[-1] > 0, skips


@pytest.mark.parametrize("node, inputs", [
    ("CachedSamplerVerifiedForecast", {"threshold": 10.0}),
    ("CachedSamplerVerifiedBlockCache", {"Fn": 1, "Bn": 1, "threshold": 10.0, "refresh_ratio": 2.0}),
])
def test_a_branch_in_its_own_model_call_is_said_to_be_skipped_unchecked(comfy, node, inputs):
    """The decision is taken on the first model call of a step. Prompts of different lengths come in separate calls
    (the positive first): the negative branch's forecast is never checked, and the node says so; batched together,
    both are checked and nothing is said."""
    from cached_sampler_dev.support import graphs
    notes = {}
    for split in (False, True):
        prompt = graphs.base("flux", latent_seed=5)
        if split:
            prompt["cond"] = {"class_type": "TestTinyConditioningPair",
                              "inputs": {"family": "flux", "pos_length": 4, "neg_length": 77}}
        graphs.count_work(prompt, "flux")
        last = graphs.config(prompt, "method", node, **WINDOW, **inputs)
        last = graphs.config(prompt, "ts", "CachedSamplerTaylorSeer", upstream=last, order=1)
        graphs.sampler(prompt, "CachedSampler", chain=last, model="count", steps=8)
        _, ui = comfy.run(prompt)
        (run,) = ui["sampler"]["cached_sampler"][0]["runs"]
        assert "s" in run["decisions"], (split, run)
        negative_rows = CAPTURED["work"]["negative_rows"]  # per model call that reached the model
        assert (0 in negative_rows) == split and any(negative_rows), (split, negative_rows)
        notes[split] = [n for n in run["notes"] if "was not checked" in n]
    assert not notes[False]
    assert len(notes[True]) == 1 and "forecast of uncond was not checked" in notes[True][0], notes
