"""The calibration nodes through ComfyUI's executor."""
import math

import torch

from cached_sampler_dev.support import graphs, tiny_models
from cached_sampler_dev.support.tiny_nodes import CAPTURED


def _digits_prompt(steps=12):
    prompt = {"digits": {"class_type": "CachedSamplerDigitsModel", "inputs": {"digits": "0123456789"}}}
    graphs.count_work(prompt, "flux", model="digits")
    sampling = {"seed": 3, "steps": steps, "cfg": 3.0, "sampler_name": "euler", "scheduler": "simple",
                "positive": ["digits", 1], "negative": ["digits", 2], "latent_image": ["digits", 3]}
    return prompt, sampling


def test_auto_calibrate_budget_plan_runs_in_the_cached_sampler(comfy):
    prompt, sampling = _digits_prompt()
    prompt["calibrate"] = {"class_type": "CachedSamplerAutoCalibrate", "inputs": {
        "model": ["digits", 0], **sampling, "denoise": 1.0, "target": "budget", "min_psnr": 35.0, "budget": 5,
        "order": 1, "seeds": 1}}
    prompt["sampler"] = {"class_type": "CachedSampler", "inputs": {
        "model": ["count", 0], **sampling, "denoise": 1.0, "interceptors": ["calibrate", 0]}}
    prompt["capture_out"] = {"class_type": "TestCaptureLatent", "inputs": {"samples": ["sampler", 0], "key": "out"}}
    prompt["capture_ref"] = {"class_type": "TestCaptureLatent", "inputs": {"samples": ["calibrate", 1], "key": "ref"}}
    _, ui = comfy.run(prompt)
    assert CAPTURED["work"]["forwards"] == 5, "exactly the budget is computed"
    assert "compute 5/12 steps" in ui["calibrate"]["text"][0]
    ic = comfy.module("interceptors")
    text = ui["calibrate"]["text"][0]
    assert abs(ic.latent_psnr(CAPTURED["ref"], CAPTURED["out"]) - _reported(text, "latent")) < 0.01
    assert "not image, PSNR" in text, "without a VAE the text says plainly what was measured"
    # the sampler's summary carries the quality the plan was measured at, as the sampler really reached it
    hint = [line for line in ui["sampler"]["text"][0].splitlines() if line.startswith("quality: ")]
    assert len(hint) == 1 and abs(_reported(hint[0], "latent") - _reported(text, "latent")) < 0.01, hint


def test_a_plan_on_a_sampler_with_two_evaluations_per_step_names_evaluations_and_the_steps_they_belong_to(comfy):
    """heun, 8 steps: 15 model evaluations (the last step is one). The plan text counts evaluations and names
    exactly the evaluations the model ran, as the node's summary counts them."""
    prompt, sampling = _digits_prompt(steps=8)
    sampling["sampler_name"] = "heun"
    prompt["calibrate"] = {"class_type": "CachedSamplerAutoCalibrate", "inputs": {
        "model": ["digits", 0], **sampling, "denoise": 1.0, "target": "budget", "min_psnr": 35.0, "budget": 6,
        "order": 1}}
    prompt["sampler"] = {"class_type": "CachedSampler", "inputs": {
        "model": ["count", 0], **sampling, "denoise": 1.0, "interceptors": ["calibrate", 0]}}
    prompt["capture_out"] = {"class_type": "TestCaptureLatent", "inputs": {"samples": ["sampler", 0], "key": "out"}}
    _, ui = comfy.run(prompt)
    text = ui["calibrate"]["text"][0]
    assert "compute 6/15 model evaluations (8 steps) (evaluations " in text, text
    named = [int(e) for e in text.split("(evaluations ")[1].split(")")[0].split(", ")]
    ran = sorted({evaluation for evaluation, _, _ in CAPTURED["work"]["forward_log"]})
    assert named == ran and max(named) <= 15, (text, ran)
    summary = ui["sampler"]["text"][0]
    assert "computed 6/15 model evaluations (8 steps)" in summary, summary


def _reported(text, space):
    return float(text.split(f"{space} PSNR ")[1].split(" dB")[0])


def _calibrate_and_sample(comfy, sample_seeds=(3,), **calibration):
    """Auto Calibrate (budget 5) on the digits prompt at sample_seeds[0]; its chain and no chain sampled at
    every one of sample_seeds, the latents captured as out<seed> and ref<seed>."""
    prompt, sampling = _digits_prompt()
    prompt["calibrate"] = {"class_type": "CachedSamplerAutoCalibrate", "inputs": {
        "model": ["digits", 0], **sampling, "seed": sample_seeds[0], "denoise": 1.0, "target": "budget",
        "min_psnr": 35.0, "budget": 5, "order": 1, "seeds": 1, **calibration}}
    for seed in sample_seeds:
        for key, chain in (("out", {"interceptors": ["calibrate", 0]}), ("ref", {})):
            prompt[f"{key}{seed}"] = {"class_type": "CachedSampler", "inputs": {
                "model": ["digits", 0], **sampling, "seed": seed, "denoise": 1.0, **chain}}
            prompt[f"capture_{key}{seed}"] = {"class_type": "TestCaptureLatent", "inputs": {
                "samples": [f"{key}{seed}", 0], "key": f"{key}{seed}"}}
    _, ui = comfy.run(prompt)
    return ui["calibrate"]["text"][0]


def test_with_a_vae_the_reported_psnr_is_that_of_the_decoded_images(comfy):
    text = _calibrate_and_sample(comfy, vae=["digits", 4])
    vae = comfy.module("nodes.demo_models.digits").DigitsVAE()
    decode = comfy.nodes.VAEDecode().decode
    (out,), (ref,) = decode(vae, {"samples": CAPTURED["out3"]}), decode(vae, {"samples": CAPTURED["ref3"]})
    image_psnr = 10 * math.log10(1.0 / float((out.double() - ref.double()).pow(2).mean()))
    assert abs(_reported(text, "image") - image_psnr) < 0.01
    assert "SSIM" in text and "latent PSNR" not in text
    latent_psnr = comfy.module("interceptors").latent_psnr(CAPTURED["ref3"], CAPTURED["out3"])
    assert abs(latent_psnr - image_psnr) > 0.5, "the two spaces really differ here, so the test tells them apart"


def test_with_two_seeds_the_reported_psnr_is_the_worse_seed(comfy):
    text = _calibrate_and_sample(comfy, sample_seeds=(2, 3), seeds=2, search="greedy")  # a plan whose seeds differ
    psnr = comfy.module("interceptors").latent_psnr
    per_seed = [psnr(CAPTURED[f"ref{seed}"], CAPTURED[f"out{seed}"]) for seed in (2, 3)]
    assert abs(_reported(text, "latent") - min(per_seed)) < 0.01 and "worst of 2 seeds" in text
    assert per_seed[1] < per_seed[0] - 0.5, "the second seed is the worse here: looking at the first alone fails"


def test_plan_for_another_step_count_computes_everything(comfy):
    prompt, sampling = _digits_prompt()
    prompt["calibrate"] = {"class_type": "CachedSamplerAutoCalibrate", "inputs": {
        "model": ["digits", 0], **sampling, "denoise": 1.0, "target": "budget", "min_psnr": 35.0, "budget": 4,
        "order": 1}}
    prompt["sampler"] = {"class_type": "CachedSampler", "inputs": {
        "model": ["count", 0], **dict(sampling, steps=9), "denoise": 1.0, "interceptors": ["calibrate", 0]}}
    prompt["capture_out"] = {"class_type": "TestCaptureLatent", "inputs": {"samples": ["sampler", 0], "key": "out"}}
    comfy.run(prompt)
    assert CAPTURED["work"]["forwards"] == 9, "a plan for 12 steps is never applied to 9"


def _plan_used_elsewhere(comfy, **elsewhere):
    """A budget-4 plan calibrated with euler at cfg 3, used by a Cached Sampler with ``elsewhere`` changed."""
    prompt, sampling = _digits_prompt()
    prompt["calibrate"] = {"class_type": "CachedSamplerAutoCalibrate", "inputs": {
        "model": ["digits", 0], **sampling, "denoise": 1.0, "target": "budget", "min_psnr": 35.0, "budget": 4,
        "order": 1}}
    prompt["sampler"] = {"class_type": "CachedSampler", "inputs": {
        "model": ["count", 0], **dict(sampling, **elsewhere), "denoise": 1.0, "interceptors": ["calibrate", 0]}}
    prompt["capture_out"] = {"class_type": "TestCaptureLatent", "inputs": {"samples": ["sampler", 0], "key": "out"}}
    _, ui = comfy.run(prompt)
    return CAPTURED["work"]["forwards"], ui["sampler"]["cached_sampler"][0]["runs"][0]["notes"]


def test_plan_for_another_sampler_computes_everything_and_says_so(comfy):
    """Every one-evaluation-per-step sampler evaluates at the same sigmas: the plan must be keyed on the
    sampler too, or a plan measured with euler runs unmeasured with another one."""
    assert _plan_used_elsewhere(comfy)[0] == 4, "with the sampler it was made for, the plan is followed"
    for sampler in ("euler_ancestral", "dpmpp_2m"):
        forwards, notes = _plan_used_elsewhere(comfy, sampler_name=sampler)
        assert forwards == 12, (sampler, forwards)
        assert any("calibrated for another schedule or sampler" in n for n in notes), notes


def test_plan_at_another_cfg_says_its_quality_was_measured_elsewhere(comfy):
    forwards, notes = _plan_used_elsewhere(comfy, cfg=7.0)
    assert forwards == 4
    assert any("measured at cfg 3" in n and "cfg 7" in n for n in notes), notes
    assert not any("measured at cfg" in n for n in _plan_used_elsewhere(comfy)[1])


def test_magcache_calibrate_makes_magcache_work_on_a_model_without_published_ratios(comfy):
    prompt = graphs.base("qwen_image", latent_seed=5)
    inputs = graphs.ksampler_inputs(steps=8)
    prompt["calibrate"] = {"class_type": "CachedSamplerMagCacheCalibrate", "inputs": {
        **inputs, "threshold": 100.0, "K": 2, "retention_ratio": 0.0}}
    graphs.count_work(prompt, "qwen_image")
    graphs.sampler(prompt, "CachedSampler", chain="calibrate", model="count", steps=8)
    _, ui = comfy.run(prompt)
    ratios = [float(v) for v in ui["calibrate"]["text"][0].split(",")]
    assert len(ratios) == 8 and ratios[0] == 1.0 and all(r > 0 for r in ratios)
    blocks = sum(tiny_models.block_groups("qwen_image").values())
    assert CAPTURED["work"]["blocks"] < 8 * 2 * blocks, "the calibrated MagCache skipped blocks"
    assert torch.isfinite(CAPTURED["out"]).all()


def _aligned_calibration(prompt, sampling, node_id="calibrate", **inputs):
    prompt[node_id] = {"class_type": "CachedSamplerAutoCalibrate", "inputs": {
        "model": ["digits", 0], **sampling, "denoise": 1.0, "target": "budget", "min_psnr": 35.0, "budget": 4,
        "order": 1, "seeds": 1, **inputs}}


def _sampled(prompt, sampling, node_id, chain, key, **elsewhere):
    """A Cached Sampler ``node_id`` of the digits model, its work counted into CAPTURED[key] and its latent too."""
    count = graphs.count_work(prompt, "flux", model="digits", key=key, node_id=f"count_{node_id}")
    prompt[node_id] = {"class_type": "CachedSampler", "inputs": {
        "model": [count, 0], **dict(sampling, **elsewhere), "denoise": 1.0, "interceptors": [chain, 0]}}
    prompt[f"capture_{node_id}"] = {"class_type": "TestCaptureLatent", "inputs": {
        "samples": [node_id, 0], "key": key + "_latent"}}


def test_an_aligned_budget_plan_makes_the_sampler_step_through_its_sigmas_and_off_changes_nothing(comfy):
    """Auto Calibrate with align_schedule: the model is evaluated at sigmas other than the scheduler's (the first
    kept, decreasing), exactly the budget is computed, and the result is the one the plan's PSNR was measured on.
    With align_schedule off the chain and plan are those of a node without the input (saved workflows)."""
    prompt, sampling = _digits_prompt()
    del prompt["count"]
    _aligned_calibration(prompt, sampling, "calibrate", align_schedule=True)
    _aligned_calibration(prompt, sampling, "calibrate_off", align_schedule=False)
    _aligned_calibration(prompt, sampling, "calibrate_before")
    for chain in ("calibrate", "calibrate_off", "calibrate_before"):
        _sampled(prompt, sampling, f"sampler_{chain}", chain, chain)
    prompt["ref"] = {"class_type": "KSampler", "inputs": {"model": ["digits", 0], **sampling, "denoise": 1.0}}
    prompt["capture_ref"] = {"class_type": "TestCaptureLatent", "inputs": {"samples": ["ref", 0], "key": "ref"}}
    # the model-patch path: Apply Interceptors, then ComfyUI's own KSampler
    count = graphs.count_work(prompt, "flux", model="digits", key="patched", node_id="count_patched")
    prompt["apply"] = {"class_type": "CachedSamplerApplyInterceptors", "inputs": {
        "model": [count, 0], "interceptors": ["calibrate", 0]}}
    prompt["patched"] = {"class_type": "KSampler", "inputs": {"model": ["apply", 0], **sampling, "denoise": 1.0}}
    prompt["capture_patched"] = {"class_type": "TestCaptureLatent", "inputs": {"samples": ["patched", 0],
                                                                               "key": "patched_latent"}}
    _, ui = comfy.run(prompt)
    text, plain_text = ui["calibrate"]["text"][0], ui["calibrate_off"]["text"][0]
    plain = CAPTURED["calibrate_off"]["evaluation_sigmas"]
    aligned = CAPTURED["calibrate"]["evaluation_sigmas"]
    assert "aligned to the plan raised it from" in text, text
    assert len(aligned) == len(plain) == 12 and aligned[0] == plain[0]
    assert all(b < a for a, b in zip(aligned, aligned[1:])), aligned
    assert max(abs(a - b) for a, b in zip(aligned, plain)) > 1e-3, "the sampler stepped through other sigmas"
    assert CAPTURED["patched"]["evaluation_sigmas"] == aligned, "Apply Interceptors swaps the same sigmas in"
    assert CAPTURED["calibrate"]["forwards"] == CAPTURED["patched"]["forwards"] == 4, "exactly the budget computed"
    ic = comfy.module("interceptors")
    measured = ic.latent_psnr(CAPTURED["ref"], CAPTURED["calibrate_latent"])
    assert abs(measured - _reported(text, "latent")) < 0.01, "the result is the one the aligned plan measured"
    assert _reported(text, "latent") > float(text.split("raised it from ")[1].split(" dB")[0])
    assert torch.equal(CAPTURED["patched_latent"], CAPTURED["calibrate_latent"])
    # off: what the node did before the input existed, to the bit
    assert plain_text == ui["calibrate_before"]["text"][0] and "aligned" not in plain_text
    assert torch.equal(CAPTURED["calibrate_off_latent"], CAPTURED["calibrate_before_latent"])
    assert CAPTURED["calibrate_off"]["evaluation_sigmas"] == CAPTURED["calibrate_before"]["evaluation_sigmas"]


def test_an_aligned_plan_on_another_run_keeps_that_runs_sigmas_computes_every_step_and_says_so(comfy):
    prompt, sampling = _digits_prompt()
    del prompt["count"]
    _aligned_calibration(prompt, sampling, "calibrate", align_schedule=True)
    _sampled(prompt, sampling, "same", "calibrate", "same")
    _sampled(prompt, sampling, "steps", "calibrate", "steps", steps=9)
    _sampled(prompt, sampling, "sampler", "calibrate", "sampler", sampler_name="euler_ancestral")
    _, ui = comfy.run(prompt)
    assert "aligned to the plan" in ui["calibrate"]["text"][0]
    assert CAPTURED["same"]["forwards"] == 4
    for node, steps in (("steps", 9), ("sampler", 12)):
        assert CAPTURED[node]["forwards"] == steps, (node, CAPTURED[node]["forwards"])
        notes = ui[node]["cached_sampler"][0]["runs"][0]["notes"]
        assert any("not the plan's aligned ones" in n for n in notes), notes
    # the scheduler's own sigmas: the 12-step run with euler_ancestral at those of a plain 12-step run
    prompt, sampling = _digits_prompt()
    prompt["ref"] = {"class_type": "KSampler", "inputs": {"model": ["count", 0], **sampling, "denoise": 1.0}}
    prompt["capture_ref"] = {"class_type": "TestCaptureLatent", "inputs": {"samples": ["ref", 0], "key": "ref"}}
    comfy.run(prompt)
    assert CAPTURED["sampler"]["evaluation_sigmas"] == CAPTURED["work"]["evaluation_sigmas"]
    assert CAPTURED["same"]["evaluation_sigmas"] != CAPTURED["work"]["evaluation_sigmas"]


def test_alignment_is_refused_with_a_reason_where_it_does_not_apply(comfy):
    prompt, sampling = _digits_prompt(steps=8)
    sampling["sampler_name"] = "heun"
    _aligned_calibration(prompt, sampling, "calibrate", align_schedule=True, budget=6)
    prompt["capture_ref"] = {"class_type": "TestCaptureLatent", "inputs": {"samples": ["calibrate", 1], "key": "ref"}}
    _, ui = comfy.run(prompt)
    assert "not aligned: this sampler evaluates the model other than once per step" in ui["calibrate"]["text"][0]
