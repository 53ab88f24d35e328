"""The feature level (a whole-model method's ``level`` "features") through ComfyUI's executor, on the tiny models:
a skipped step runs the forward with every transformer block passed by (counted on the model), the result is not
the model level's, and a family whose blocks the pack does not know works at the model level with a note."""
import pytest
import torch

from cached_sampler_dev.support import graphs
from cached_sampler_dev.support import tiny_models
from cached_sampler_dev.support.tiny_nodes import CAPTURED

WINDOW = dict(start_percent=0.0, end_percent=1.0)
STEPS = 6  # interval 3: steps 0, 3 and the last (5) computed


def run_counted(comfy, family, interval=None, level=None, estimator=True):
    """The sampled latent, the work counted on the model and the run's notes; ``interval`` None: no chain."""
    prompt = graphs.base(family, latent_seed=5)
    graphs.count_work(prompt, family)
    chain = None
    if interval is not None:
        inputs = dict(interval=interval, **WINDOW, **({"level": level} if level else {}))
        chain = graphs.config(prompt, "method", "CachedSamplerFixedCadence", **inputs)
        if estimator:
            chain = graphs.config(prompt, "forecast", "CachedSamplerTaylorSeer", upstream=chain, order=1)
    graphs.sampler(prompt, "CachedSampler", chain=chain, model="count", steps=STEPS, cfg=3.0)
    _, ui = comfy.run(prompt)
    notes = [n for r in ui["sampler"]["cached_sampler"][0]["runs"] for n in r["notes"]] if chain else []
    return tiny_models.as_tensor(CAPTURED["out"]).clone(), dict(CAPTURED["work"]), notes


def test_a_feature_level_skip_runs_the_forward_and_passes_every_block_by(comfy):
    reference, plain, _ = run_counted(comfy, "flux")
    model_level, model_work, notes = run_counted(comfy, "flux", interval=3)
    features, feature_work, feature_notes = run_counted(comfy, "flux", interval=3, level="features")
    assert not notes and not feature_notes
    # 3 of the 6 steps computed: the blocks of the others never ran, at either level
    assert feature_work["blocks"] == model_work["blocks"] == plain["blocks"] // 2
    # the model level does not run a skipped step's forward; the feature level runs it, blocks passed by
    assert model_work["forwards"] == plain["forwards"] // 2 and feature_work["forwards"] == plain["forwards"]
    assert torch.isfinite(features).all()
    assert not torch.equal(features, model_level)
    scale = reference.abs().mean()
    for cached in (model_level, features):
        error = (cached - reference).abs().mean()
        assert 0 < error < scale, (error, scale)


def test_the_feature_level_computing_every_step_is_bit_identical(comfy):
    reference, plain, _ = run_counted(comfy, "flux")
    same, work, notes = run_counted(comfy, "flux", interval=1, level="features")
    assert torch.equal(reference, same) and work["blocks"] == plain["blocks"] and not notes


def test_a_family_without_known_blocks_works_at_the_model_level_and_says_so(comfy):
    model_level, work, notes = run_counted(comfy, "sdxl", interval=3)
    features, feature_work, feature_notes = run_counted(comfy, "sdxl", interval=3, level="features")
    assert torch.equal(model_level, features) and work["forwards"] == feature_work["forwards"]
    assert not notes and any("instead of the block stack's features" in n for n in feature_notes), feature_notes


@pytest.mark.parametrize("family", ["flux", "wan21", "qwen_image"])
def test_the_feature_level_skips_blocks_on_families_with_several_streams_or_one(comfy, family):
    if not tiny_models.available(family):
        pytest.skip(f"this ComfyUI has no {family}")
    _, plain, _ = run_counted(comfy, family)
    cached, work, notes = run_counted(comfy, family, interval=3, level="features", estimator=False)
    assert torch.isfinite(cached).all() and not notes
    assert work["blocks"] == plain["blocks"] // 2 and work["forwards"] == plain["forwards"]


def test_beside_a_block_level_decider_the_feature_level_works_on_the_model_output_and_says_so(comfy):
    prompt = graphs.base("flux", latent_seed=5)
    graphs.count_work(prompt, "flux")
    blocks = graphs.config(prompt, "fb", "CachedSamplerFirstBlockCache", threshold=50.0, warmup=0.0,
                           max_cached_steps=-1, max_consecutive_cached=2, **WINDOW)
    chain = graphs.config(prompt, "method", "CachedSamplerFixedCadence", upstream=blocks, interval=3, level="features",
                          **WINDOW)
    graphs.sampler(prompt, "CachedSampler", chain=chain, model="count", steps=STEPS, cfg=3.0)
    _, ui = comfy.run(prompt)
    notes = [n for r in ui["sampler"]["cached_sampler"][0]["runs"] for n in r["notes"]]
    assert any("instead of the block stack's features" in n and "First Block Cache" in n for n in notes), notes
    assert CAPTURED["work"]["forwards"] < STEPS * 2  # the cadence skips whole forwards, as at the model level


def test_auto_calibrate_measures_and_plans_at_the_feature_level(comfy):
    """The plan's candidates are measured at the level asked for, and its chain runs there: every forward of the
    sampled run runs (embeddings and final layer), the blocks only on the steps the plan computes."""
    steps = 8
    prompt = {"digits": {"class_type": "CachedSamplerDigitsModel", "inputs": {"digits": "0123"}}}
    graphs.count_work(prompt, "flux", model="digits")
    sampling = {"steps": steps, "cfg": 3.0, "sampler_name": "euler", "scheduler": "simple", "seed": 3,
                "positive": ["digits", 1], "negative": ["digits", 2], "latent_image": ["digits", 3], "denoise": 1.0}
    prompt["calibrate"] = {"class_type": "CachedSamplerAutoCalibrate", "inputs": {
        "model": ["digits", 0], **sampling, "target": "budget", "min_psnr": 35.0, "budget": 4, "order": 1,
        "seeds": 1, "search": "greedy", "level": "features"}}
    prompt["out"] = {"class_type": "CachedSampler", "inputs": {"model": ["count", 0], **sampling,
                                                               "interceptors": ["calibrate", 0]}}
    prompt["capture_out"] = {"class_type": "TestCaptureLatent", "inputs": {"samples": ["out", 0], "key": "out"}}
    _, ui = comfy.run(prompt)
    work = CAPTURED["work"]
    assert work["forwards"] == steps and work["block_forwards"] == 4, (work, ui["calibrate"]["text"][0])
