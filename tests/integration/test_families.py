"""Whole-model caching on every model the running ComfyUI can sample, one tiny model per supported_models config,
through ComfyUI's executor; the cards those models get; the autoregressive video sampler on Wan CausalAR.

Random weights: these check plumbing (bit-identity at interval 1 / threshold 0, fewer real forwards counted at the
diffusion model, finite output), not quality.
"""
from __future__ import annotations

import pytest
import torch

from cached_sampler_dev.support import graphs
from cached_sampler_dev.support import tiny_configs
from cached_sampler_dev.support import tiny_models
from cached_sampler_dev.support.tiny_nodes import CAPTURED

try:
    from cached_sampler_dev.devkit import comfy_harness
    _PATH = comfy_harness.find_comfyui()
except Exception:  # pragma: no cover
    _PATH = None


def _config_names() -> list[str]:
    """Every config of the ComfyUI the tests run against, read from its source without importing it (the
    parametrisation happens before the ``comfy`` fixture starts ComfyUI)."""
    if _PATH is None:
        return []
    import ast
    tree = ast.parse((_PATH / "comfy" / "supported_models.py").read_text())
    names = []
    for node in tree.body:  # ``models = [...]``, then possibly ``models += [...]``
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "models" for t in node.targets):
            names = [e.id for e in node.value.elts if isinstance(e, ast.Name)]
        elif isinstance(node, ast.AugAssign) and getattr(node.target, "id", None) == "models":
            names += [e.id for e in getattr(node.value, "elts", ()) if isinstance(e, ast.Name)]
    return names


CONFIGS = _config_names()
# A handful always run; the rest are marked slow (together they take over a minute on one thread).
QUICK = {"Flux", "WAN21_T2V", "SD3", "SDXL", "LongCatImage", "ZImage", "WAN21_SCAIL", "HunyuanImage21"}
WINDOW = dict(start_percent=0.0, end_percent=1.0)
METHODS = {
    "cadence": ("CachedSamplerFixedCadence", dict(interval=1, **WINDOW), dict(interval=3, **WINDOW)),
    "adaptive": ("CachedSamplerAdaptiveCache", dict(threshold=0.0, max_consecutive_cached=-1, **WINDOW),
                 dict(threshold=100.0, max_consecutive_cached=2, **WINDOW)),
}


def _params():
    out = []
    for name in CONFIGS:
        for method in METHODS:
            marks = [] if name in QUICK else [pytest.mark.slow]
            out.append(pytest.param(name, method, marks=marks, id=f"{name}-{method}"))
    return out


def _run(comfy, config, method=None, inputs=None, steps=4):
    prompt = {
        "model": {"class_type": "TestTinyConfigModel", "inputs": {"config": config, "seed": 0}},
        "count": {"class_type": "TestCountForwards", "inputs": {"model": ["model", 0], "key": "forwards"}},
        "cond": {"class_type": "TestTinyConfigConditioning", "inputs": {"config": config}},
        "latent": {"class_type": "TestTinyConfigLatent", "inputs": {"config": config}},
    }
    chain = None
    if method is not None:
        chain = graphs.config(prompt, "method", METHODS[method][0], **inputs)
    graphs.sampler(prompt, "CachedSampler", chain=chain, model="count", steps=steps, cfg=3.0)
    prompt["sampler"]["inputs"]["allow_distilled"] = True  # distilled configs are refused otherwise (tested below)
    _, ui = comfy.run(prompt)
    return tiny_models.as_tensor(CAPTURED["out"]).clone(), dict(CAPTURED["forwards"]), ui


def _skip_unbuilt(config):
    reason = tiny_configs.why_unbuilt(config)
    if reason is not None:
        pytest.skip(f"{config} is not built tiny: {reason}")


@pytest.mark.parametrize("config, method", _params())
def test_whole_model_caching_on_every_config(comfy, config, method):
    _skip_unbuilt(config)
    ref, ref_count, _ = _run(comfy, config)
    assert ref_count["runs"] == 1 and ref_count["forwards"] > 0
    same, _, _ = _run(comfy, config, method, METHODS[method][1])
    assert torch.equal(ref, same), f"{method} that never skips must be bit-identical to KSampler on {config}"
    cached, count, ui = _run(comfy, config, method, METHODS[method][2])
    assert torch.isfinite(cached).all()
    assert count["forwards"] < ref_count["forwards"], f"{method} skipped no forward on {config}: {count} {ref_count}"
    run = ui["sampler"]["cached_sampler"][0]["runs"][0]
    assert run["skipped"] > 0 and not run["notes"]


@pytest.mark.slow
def test_every_tiny_config_builds_the_same_weights_every_time(comfy):
    """A build must not depend on what memory it is given: a buffer a constructor leaves as ``torch.empty`` (a
    checkpoint would fill it) either feeds the model garbage or, holding non-finite garbage, is redrawn by
    init_weights and shifts every weight drawn after it; both make a run's reference differ from the next run's.
    Freed NaN-filled memory between the two builds makes such garbage show."""
    differing = {}
    for config in CONFIGS:
        if tiny_configs.why_unbuilt(config) is not None:
            continue
        first = {k: v.clone() for k, v in tiny_configs.build(config).model.state_dict().items()}
        for _ in range(4):
            del_me = torch.full((1 << 22,), float("nan"))
            del del_me
        second = tiny_configs.build(config).model.state_dict()
        bad = [k for k, v in first.items() if not torch.equal(v, second[k]) and not (v.isnan().all() and
                                                                                   second[k].isnan().all())]
        if bad:
            differing[config] = bad[:3]
    assert not differing, f"tiny configs whose weights differ between builds: {differing}"


def test_the_parametrisation_covers_every_config_of_the_running_comfyui(comfy):
    assert CONFIGS == tiny_configs.config_names()


def _card(comfy, config):
    adapter = comfy.module("adapter")
    return adapter.model_card(tiny_configs.build(config))


@pytest.mark.parametrize("config, ancestor", [("WAN21_CausalAR_T2V", "WAN21"), ("WAN21_SCAIL2", "WAN21"),
                                              ("MageFlow", "QwenImage")])
def test_subclass_with_its_own_forward_is_offered_whole_model_only(comfy, config, ancestor):
    if config not in CONFIGS:
        pytest.skip(f"this ComfyUI has no {config} config")
    _skip_unbuilt(config)
    card = _card(comfy, config)
    if card.groups:  # an explicit FAMILIES entry for the model class itself gives its own block layout
        return
    note = " ".join(card.notes)
    assert [lv.value for lv in card.levels] == ["model"] and "transformer-block caching is off" in note
    assert ancestor in note


@pytest.mark.parametrize("config", ["WAN21_FlowRVS", "LongCatImage", "WAN21_I2V", "FluxInpaint"])
def test_subclass_running_the_ancestors_diffusion_model_keeps_its_blocks(comfy, config):
    if config not in CONFIGS:
        pytest.skip(f"this ComfyUI has no {config} config")
    _skip_unbuilt(config)
    card = _card(comfy, config)
    assert any(lv.value == "blocks" for lv in card.levels) and card.total_blocks > 0


def test_published_curves_stay_with_the_class_they_were_measured_on(comfy):
    assert _card(comfy, "Flux").teacache == "flux" and _card(comfy, "WAN21_T2V").magcache == "wan2.1_t2v_1.3B"
    for config in ("LongCatImage", "WAN21_FlowRVS", "WAN21_SCAIL", "WAN22_WanDancer"):
        if config in CONFIGS and tiny_configs.why_unbuilt(config) is None:
            card = _card(comfy, config)
            assert card.teacache is None and card.magcache is None, config


@pytest.mark.parametrize("config", ["FluxSchnell", "ZImage", "ZImagePixelSpace", "WAN21_CausalAR_T2V",
                                    "HunyuanVideo15_SR_Distilled"])
def test_distilled_configs_are_refused_by_name(comfy, config):
    if config not in CONFIGS:
        pytest.skip(f"this ComfyUI has no {config} config")
    _skip_unbuilt(config)
    prompt = {
        "model": {"class_type": "TestTinyConfigModel", "inputs": {"config": config, "seed": 0}},
        "cond": {"class_type": "TestTinyConfigConditioning", "inputs": {"config": config}},
        "latent": {"class_type": "TestTinyConfigLatent", "inputs": {"config": config}},
    }
    chain = graphs.config(prompt, "method", "CachedSamplerFixedCadence", **METHODS["cadence"][2])
    graphs.sampler(prompt, "CachedSampler", chain=chain, steps=4)
    _, result = comfy.run(prompt, expect_error=True)
    message = result["error"]["exception_message"]
    assert "step-distilled" in message and "allow_distilled" in message and config in message


@pytest.mark.parametrize("config", ["LTXAV", "LTXV"])
def test_a_checkpoint_named_distilled_is_refused_naming_the_file(comfy, config):
    """LTX-2's distilled checkpoint loads as the same config and class as the full one; ComfyUI's core loaders
    record the file they loaded (cached_patcher_init), and its name says what it is."""
    if config not in CONFIGS:
        pytest.skip(f"this ComfyUI has no {config} config")
    _skip_unbuilt(config)
    ic = comfy.module("interceptors")
    model = tiny_configs.build(config)
    chain = ic.InterceptorChain.of([ic.FixedCadence(interval=2, node="Fixed Cadence (node 5)")])
    chain.validate_for(comfy.module("adapter").model_card(model))  # the full release: not refused
    model.cached_patcher_init = (lambda *a, **k: None, ("diffusion_models/ltx-2-19b-distilled-fp8.safetensors", {}))
    card = comfy.module("adapter").model_card(model)
    with pytest.raises(ic.ChainError) as e:
        chain.validate_for(card)
    assert "ltx-2-19b-distilled-fp8.safetensors" in str(e.value) and "allow_distilled" in str(e.value)
    chain.validate_for(card, allow_distilled=True)


def test_autoregressive_video_sampler_on_causal_wan_never_crashes_and_computes_every_forward(comfy):
    if "WAN21_CausalAR_T2V" not in CONFIGS or "SamplerARVideo" not in comfy.nodes.NODE_CLASS_MAPPINGS:
        pytest.skip("this ComfyUI has no Wan CausalAR config or no SamplerARVideo")

    def run(method=None):
        config = "WAN21_CausalAR_T2V"
        prompt = {
            "model": {"class_type": "TestTinyConfigModel", "inputs": {"config": config, "seed": 0}},
            "count": {"class_type": "TestCountForwards", "inputs": {"model": ["model", 0], "key": "forwards"}},
            "cond": {"class_type": "TestTinyConfigConditioning", "inputs": {"config": config}},
            "latent": {"class_type": "TestTinyConfigLatent", "inputs": {"config": config}},
            "sampler_ar": graphs.core_node("SamplerARVideo", num_frame_per_block=1),
            "sigmas": graphs.core_node("BasicScheduler", model=["count", 0], scheduler="simple", steps=3,
                                       denoise=1.0),
            "noise": graphs.core_node("RandomNoise", noise_seed=3),
            "guider": graphs.core_node("CFGGuider", model=["patched", 0], positive=["cond", 0],
                                       negative=["cond", 1], cfg=1.0),
            "sample": graphs.core_node("SamplerCustomAdvanced", noise=["noise", 0], guider=["guider", 0],
                                       sampler=["sampler_ar", 0], sigmas=["sigmas", 0], latent_image=["latent", 0]),
            "capture_out": {"class_type": "TestCaptureLatent", "inputs": {"samples": ["sample", 0], "key": "out"}},
        }
        if method is None:
            prompt["guider"]["inputs"]["model"] = ["count", 0]
        else:
            chain = graphs.config(prompt, "method", METHODS[method][0], **METHODS[method][2])
            prompt["patched"] = {"class_type": "CachedSamplerApplyInterceptors",
                                 "inputs": {"model": ["count", 0], "interceptors": [chain, 0], "allow_distilled": True}}
        comfy.run(prompt)
        return CAPTURED["out"].clone(), dict(CAPTURED["forwards"])

    ref, ref_count = run()
    assert ref_count["forwards"] > 3  # every frame block: its steps and the KV-cache commit
    for method in METHODS:
        out, count = run(method)
        assert torch.equal(out, ref), f"{method} under the AR sampler must compute every forward"
        assert count["forwards"] == ref_count["forwards"]


def test_families_doc_is_what_the_generator_writes_for_this_comfyui(comfy):
    from cached_sampler_dev.generate import families_table
    committed = families_table.DOC.read_text()
    documented = [line.split(" | ")[0].strip("| ") for line in committed.splitlines()[6:] if line.startswith("| ")]
    if documented != tiny_configs.config_names():
        pytest.skip("docs/families.md is written for the newest ComfyUI, whose configs differ from this one's")
    assert committed == families_table.render(comfy.module("adapter"), comfy.version), (
        "docs/families.md is out of date: run python3 -m cached_sampler_dev.generate.families_table")


def test_minimax_h3_forwards_that_run_get_the_samplers_whole_schedule(comfy, monkeypatch):
    """From ComfyUI v0.34 MiniMax-H3's final layer takes ``sigma, sample_sigmas, shifts``: a checkpoint with a bank of
    output heads picks them by where the forward's sigma sits in ``transformer_options["sample_sigmas"]`` (the entry
    nearest to it and the one after) and fails without it. Whatever the pack skips, every forward it lets run must
    reach the diffusion model as in plain sampling: the sampler's whole schedule in its options and a sigma that is
    one of its entries (docs/families-after-0.33.md)."""
    if "MiniMaxH3" not in CONFIGS:
        pytest.skip("this ComfyUI has no MiniMaxH3 config")
    _skip_unbuilt("MiniMaxH3")
    import comfy.ldm.minimax.model as minimax
    seen = []
    original = minimax.MiniMaxH3Model._forward

    def recording(self, x, timestep, context, transformer_options={}, **kwargs):
        schedule = transformer_options.get("sample_sigmas")
        seen.append((float(timestep.flatten()[0]) / 1000.0,
                     None if schedule is None else tuple(float(s) for s in schedule)))
        return original(self, x, timestep, context, transformer_options, **kwargs)

    monkeypatch.setattr(minimax.MiniMaxH3Model, "_forward", recording)

    def forwards(chain_node=None, **inputs):
        seen.clear()
        prompt = {
            "model": {"class_type": "TestTinyConfigModel", "inputs": {"config": "MiniMaxH3", "seed": 0}},
            "cond": {"class_type": "TestTinyConfigConditioning", "inputs": {"config": "MiniMaxH3"}},
            "latent": {"class_type": "TestTinyConfigLatent", "inputs": {"config": "MiniMaxH3"}},
        }
        chain = graphs.config(prompt, "method", chain_node, **inputs) if chain_node else None
        graphs.sampler(prompt, "CachedSampler" if chain else "KSampler", chain=chain, steps=6, cfg=3.0)
        _, ui = comfy.run(prompt)
        if chain:  # the Guidance Cache leaves the negative branch out of some evaluations, skipping no step
            assert ui["sampler"]["cached_sampler"][0]["runs"][0]["work_saved"] > 0, chain_node
        return list(seen)

    plain = forwards()
    schedule = plain[0][1]
    assert schedule is not None and len(schedule) == 7 and all(s == schedule for _, s in plain)
    guidance = dict(interval=2, mode="cadence", threshold=0.0, estimate="difference", **WINDOW)
    for node, inputs in [(METHODS["cadence"][0], METHODS["cadence"][2]), (METHODS["adaptive"][0],
                                                                           METHODS["adaptive"][2]),
                         ("CachedSamplerGuidanceCache", guidance)]:
        cached = forwards(node, **inputs)
        assert 0 < len(cached) < len(plain), node
        for sigma, given in cached:
            assert given == schedule, f"{node} ran a forward without the sampler's schedule: {given}"
            assert min(abs(sigma - s) for s in schedule) <= 1e-4 * max(sigma, 1e-3), (node, sigma, schedule)
