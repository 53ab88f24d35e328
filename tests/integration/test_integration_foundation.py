"""The foundation against a real ComfyUI: loading, node definitions, bit-identity, fixed cadence."""
import pytest
import torch

from cached_sampler_dev.support import graphs
from cached_sampler_dev.support import tiny_models
from cached_sampler_dev.support.tiny_nodes import CAPTURED

PACK_NODES = {"CachedSampler": "Cached Sampler", "CachedSamplerAdvanced": "Cached Sampler (Advanced)",
              "CachedSamplerApplyInterceptors": "Apply Interceptors", "CachedSamplerFixedCadence": "Fixed Cadence"}


def test_comfyui_loads_pack_from_custom_nodes_with_names_categories_tooltips(comfy):
    import nodes
    assert comfy.pack.__name__.endswith("cached-sampler"), "loaded through ComfyUI's custom node loader"
    for node_id, display in PACK_NODES.items():
        cls = nodes.NODE_CLASS_MAPPINGS[node_id]
        assert nodes.NODE_DISPLAY_NAME_MAPPINGS[node_id] == display
        info = cls.GET_NODE_INFO_V1()
        assert info["category"].startswith("sampling/cached")
        for section in ("required", "optional"):
            for name, spec in info["input"].get(section, {}).items():
                assert spec[1].get("tooltip"), f"{node_id}.{name} has no tooltip"


def test_cached_sampler_inputs_match_ksampler(comfy):
    import nodes
    ks = nodes.NODE_CLASS_MAPPINGS["KSampler"].INPUT_TYPES()["required"]
    ours = nodes.NODE_CLASS_MAPPINGS["CachedSampler"].GET_NODE_INFO_V1()["input"]["required"]
    assert list(ours) == list(ks), "same inputs in the same order (saved widget values are positional)"
    ksa = nodes.NODE_CLASS_MAPPINGS["KSamplerAdvanced"].INPUT_TYPES()["required"]
    oursa = nodes.NODE_CLASS_MAPPINGS["CachedSamplerAdvanced"].GET_NODE_INFO_V1()["input"]["required"]
    assert list(oursa) == list(ksa)


def _pair(comfy, family, node_types=("KSampler", "CachedSampler"), chain_builder=None, batch=1, **kw):
    prompt = graphs.base(family, batch=batch)
    chain = chain_builder(prompt) if chain_builder else None
    graphs.sampler(prompt, node_types[0], key="ref", node_id="ref", **kw)
    graphs.sampler(prompt, node_types[1], key="ours", node_id="ours", chain=chain, **kw)
    comfy.run(prompt)
    return CAPTURED["ref"], CAPTURED["ours"]


def _cadence(interval):
    return lambda p: graphs.config(p, "fc", "CachedSamplerFixedCadence", interval=interval,
                                   start_percent=0.0, end_percent=1.0)


SAMPLERS = None


def all_samplers():
    import comfy.samplers
    return list(comfy.samplers.KSampler.SAMPLERS)


@pytest.fixture(scope="module")
def sampler_names(comfy):
    return all_samplers()


# Chains installed on the Cached Sampler that never skip: every hook runs (wrappers, block replacements,
# deciders' signals, the estimator's bookkeeping) and the result must still be KSampler's, bit for bit.
NEVER_SKIPS = {
    "nothing connected": None,
    "Adaptive Cache at threshold 0 + TaylorSeer order 2 (whole model)": lambda p: graphs.config(
        p, "ts", "CachedSamplerTaylorSeer", order=2, upstream=graphs.config(
            p, "ad", "CachedSamplerAdaptiveCache", threshold=0.0, max_consecutive_cached=-1, start_percent=0.0,
            end_percent=1.0)),
    "DBCache F1B1 at threshold 0 (blocks)": lambda p: graphs.config(
        p, "db", "CachedSamplerDBCache", Fn=1, Bn=1, threshold=0.0, warmup=0.0, max_cached_steps=-1,
        max_consecutive_cached=-1, start_percent=0.0, end_percent=1.0),
}


@pytest.mark.slow
def test_bit_identical_to_ksampler_for_every_sampler_with_chains_that_never_skip(comfy, sampler_names):
    failures, evaluations = [], {}
    for name in sampler_names:
        for cfg in (1.0, 3.0):
            prompt = graphs.base("flux")
            graphs.sampler(prompt, "KSampler", key="ref", node_id="ref", sampler=name, cfg=cfg, steps=4)
            for i, build in enumerate(NEVER_SKIPS.values()):
                graphs.sampler(prompt, "CachedSampler", key=f"ours{i}", node_id=f"ours{i}",
                               chain=build(prompt) if build else None, sampler=name, cfg=cfg, steps=4)
            _, ui = comfy.run(prompt)
            for i, label in enumerate(NEVER_SKIPS):
                if not torch.equal(CAPTURED["ref"], CAPTURED[f"ours{i}"]):
                    failures.append((name, cfg, label))
                if i:  # the chain really ran inside the sampler: its run saw every model evaluation
                    runs = ui[f"ours{i}"]["cached_sampler"][0]["runs"]
                    evaluations[(name, cfg, label)] = sum(r["evaluations"] for r in runs), sum(
                        r["computed"] for r in runs), [n for r in runs for n in r["notes"]]
    assert not failures, f"differs from KSampler: {failures}"
    # an adaptive-step solver runs with caching off and says why; no other sampler has anything to say
    assert all(seen > 0 and computed == seen and (
        len(notes) == 1 and "error control" in notes[0] if name == "dpm_adaptive" else not notes)
        for (name, _, _), (seen, computed, notes) in evaluations.items()), evaluations


@pytest.mark.parametrize("scheduler", ["simple", "normal", "karras", "exponential", "sgm_uniform", "beta",
                                       "ddim_uniform", "linear_quadratic", "kl_optimal"])
def test_bit_identical_across_schedulers_batch_and_denoise(comfy, scheduler):
    for cfg, batch, denoise in ((1.0, 1, 1.0), (3.0, 3, 1.0), (3.0, 1, 0.6)):
        ref, ours = _pair(comfy, "flux", scheduler=scheduler, cfg=cfg, batch=batch, denoise=denoise, steps=5)
        assert torch.equal(ref, ours), (scheduler, cfg, batch, denoise)
        ref, ours = _pair(comfy, "flux", chain_builder=_cadence(1), scheduler=scheduler, cfg=cfg, batch=batch,
                          denoise=denoise, steps=5)
        assert torch.equal(ref, ours), ("chain that never skips", scheduler, cfg, batch, denoise)


@pytest.mark.parametrize("family", ["flux", "wan21", "sd3", "qwen_image", "hunyuan_video", "sdxl"])
def test_bit_identical_per_family_and_cadence_halves_work(comfy, family):
    for cfg, batch in ((1.0, 1), (3.0, 3)):
        ref, ours = _pair(comfy, family, cfg=cfg, batch=batch, steps=6)
        assert torch.equal(ref, ours), (family, cfg, batch)
        ref, ours = _pair(comfy, family, chain_builder=_cadence(1), cfg=cfg, batch=batch, steps=6)
        assert torch.equal(ref, ours), (family, "interval 1", cfg, batch)
    # interval 2 computes half the forwards and changes the result
    prompt = graphs.base(family)
    graphs.count_work(prompt, family)
    chain = _cadence(2)(prompt)
    graphs.sampler(prompt, "KSampler", key="ref", node_id="ref", model="model", steps=8)
    graphs.sampler(prompt, "CachedSampler", key="ours", node_id="ours", chain=chain, model="count", steps=8)
    comfy.run(prompt)
    work = CAPTURED["work"]
    blocks_per_forward = sum(tiny_models.block_groups(family).values())
    forwards = work["forwards"] or work["blocks"] // blocks_per_forward  # SD3 has no DIFFUSION_MODEL wrapper
    # 8 steps, cfg 3 (cond+uncond in one forward): computed at steps 0, 2, 4, 6 and the last one, 7
    assert forwards == 5, work
    assert not torch.equal(CAPTURED["ref"], CAPTURED["ours"])
    assert torch.isfinite(CAPTURED["ours"]).all()


def test_advanced_two_stage_bit_identical(comfy):
    prompt = graphs.base("wan21")
    for prefix, node_type in (("ref", "KSamplerAdvanced"), ("ours", "CachedSamplerAdvanced")):
        prompt[f"{prefix}_hi"] = {"class_type": node_type, "inputs": graphs.advanced_inputs(
            steps=8, start=0, end=4, leftover="enable")}
        prompt[f"{prefix}_lo"] = {"class_type": node_type, "inputs": graphs.advanced_inputs(
            steps=8, start=4, end=10000, add_noise="disable", latent=(f"{prefix}_hi", 0))}
        prompt[f"capture_{prefix}"] = {"class_type": "TestCaptureLatent",
                                       "inputs": {"samples": [f"{prefix}_lo", 0], "key": prefix}}
    comfy.run(prompt)
    assert torch.equal(CAPTURED["ref"], CAPTURED["ours"])


def _custom_advanced(prompt, model, key, cfg=3.0):
    prompt[f"{key}_noise"] = {"class_type": "RandomNoise", "inputs": {"noise_seed": 7}}
    prompt[f"{key}_sampler"] = {"class_type": "KSamplerSelect", "inputs": {"sampler_name": "dpmpp_2m"}}
    prompt[f"{key}_sigmas"] = {"class_type": "BasicScheduler", "inputs": {
        "model": [model, 0], "scheduler": "karras", "steps": 6, "denoise": 1.0}}
    prompt[f"{key}_guider"] = {"class_type": "CFGGuider", "inputs": {
        "model": [model, 0], "positive": ["cond", 0], "negative": ["cond", 1], "cfg": cfg}}
    prompt[key] = {"class_type": "SamplerCustomAdvanced", "inputs": {
        "noise": [f"{key}_noise", 0], "guider": [f"{key}_guider", 0], "sampler": [f"{key}_sampler", 0],
        "sigmas": [f"{key}_sigmas", 0], "latent_image": ["latent", 0]}}
    prompt[f"capture_{key}"] = {"class_type": "TestCaptureLatent", "inputs": {"samples": [key, 0], "key": key}}


def test_apply_interceptors_with_sampler_custom_advanced(comfy):
    prompt = graphs.base("flux")
    graphs.config(prompt, "fc1", "CachedSamplerFixedCadence", interval=1, start_percent=0.0, end_percent=1.0)
    graphs.config(prompt, "fc2", "CachedSamplerFixedCadence", interval=2, start_percent=0.0, end_percent=1.0)
    prompt["applied1"] = {"class_type": "CachedSamplerApplyInterceptors",
                          "inputs": {"model": ["model", 0], "interceptors": ["fc1", 0]}}
    prompt["applied2"] = {"class_type": "CachedSamplerApplyInterceptors",
                          "inputs": {"model": ["model", 0], "interceptors": ["fc2", 0]}}
    _custom_advanced(prompt, "model", "ref")
    _custom_advanced(prompt, "applied1", "never_skips")
    _custom_advanced(prompt, "applied2", "skips")
    comfy.run(prompt)
    assert torch.equal(CAPTURED["ref"], CAPTURED["never_skips"])
    assert not torch.equal(CAPTURED["ref"], CAPTURED["skips"])


def test_conflicting_chain_fails_before_sampling_naming_both_nodes(comfy):
    prompt = graphs.base("flux")
    graphs.config(prompt, "fc_a", "CachedSamplerFixedCadence", interval=2, start_percent=0.0, end_percent=1.0)
    graphs.config(prompt, "fc_b", "CachedSamplerFixedCadence", upstream="fc_a", interval=3, start_percent=0.0,
                  end_percent=1.0)
    graphs.sampler(prompt, "CachedSampler", chain="fc_b")
    _, result = comfy.run(prompt, expect_error=True)
    message = result["error"]["exception_message"]
    assert "node fc_a" in message and "node fc_b" in message
    assert result["error"]["node_id"] == "fc_b", "raised by the config node, before the sampler ran"


def test_out_of_range_widgets_are_rejected_when_the_prompt_is_validated(comfy):
    prompt = graphs.base("flux")
    graphs.config(prompt, "fc", "CachedSamplerFixedCadence", interval=0, start_percent=0.0, end_percent=1.0)
    graphs.sampler(prompt, "CachedSampler", chain="fc")
    _, result = comfy.run(prompt, expect_error=True)
    errors = result["node_errors"]["fc"]["errors"]
    assert errors[0]["type"] == "value_smaller_than_min" and errors[0]["extra_info"]["input_name"] == "interval"
