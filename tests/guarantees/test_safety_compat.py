"""Compatibility with what else ComfyUI puts on a model: LoRA weight patches, ControlNet residuals added
between blocks, torch.compile, Skip Layer Guidance (and any block replacement registered before the
pack's), and ComfyUI's own EasyCache/LazyCache."""
from __future__ import annotations

import copy
import dataclasses
import os

import pytest
import torch

from cached_sampler_dev.support import graphs
from cached_sampler_dev.support import tiny_models
from cached_sampler_dev.support.tiny_nodes import CAPTURED

STEPS = 8
FLUX_BLOCKS = 4  # the tiny Flux: 2 double + 2 single blocks


def run(comfy, prompt, key="out"):
    CAPTURED.pop(key, None)
    _, ui = comfy.run(copy.deepcopy(prompt))
    return CAPTURED[key].clone(), ui


def run_error(comfy, prompt):
    CAPTURED.pop("out", None)
    CAPTURED.pop("work", None)
    return comfy.run(copy.deepcopy(prompt), expect_error=True)[1]["error"]


def dbcache(prompt, threshold=1.0, node_id="db", front=1, back=0):
    return graphs.config(prompt, node_id, "CachedSamplerDBCache", Fn=front, Bn=back, threshold=threshold, warmup=0.0,
                         max_cached_steps=-1, max_consecutive_cached=3, start_percent=0.0, end_percent=1.0)


def cadence(prompt, interval=2, node_id="fc"):
    return graphs.config(prompt, node_id, "CachedSamplerFixedCadence", interval=interval, start_percent=0.0,
                         end_percent=1.0)


def adaptive(prompt, node_id="ad"):
    return graphs.config(prompt, node_id, "CachedSamplerAdaptiveCache", threshold=2.0, max_consecutive_cached=-1,
                         start_percent=0.0, end_percent=1.0)


def computed_fraction(ui, node="sampler") -> tuple[int, int]:
    """(evaluations computed, evaluations seen) of the sampler's first run, as its UI output carries them."""
    run = ui[node]["cached_sampler"][0]["runs"][0]
    return run["computed"], run["evaluations"]


def sampled(comfy, *, model_patch=None, chain=None, sampler="CachedSampler", conditioning=None, family="flux"):
    """Run one sampler on the tiny model; ``model_patch(prompt, model_id) -> model_id`` adds patches to the
    model, ``chain(prompt) -> node id`` builds the chain, ``conditioning(prompt) -> (pos, neg)`` node refs."""
    prompt = graphs.base(family)
    model = model_patch(prompt, "model") if model_patch else "model"
    chain_id = chain(prompt) if chain else None
    graphs.sampler(prompt, sampler, chain=chain_id, model=model, steps=STEPS)
    if conditioning:
        pos, neg = conditioning(prompt)
        prompt["sampler"]["inputs"].update(positive=pos, negative=neg)
    return run(comfy, prompt)


# ---------------------------------------------------------------------------------------- LoRA --

def lora(target="single_blocks.0.", strength=1.0, node_id="lora"):
    def patch(prompt, model):
        prompt[node_id] = {"class_type": "TestLoraPatch", "inputs": {"model": [model, 0], "strength": strength,
                                                                    "target": target, "seed": 5}}
        return node_id
    return patch


@pytest.mark.parametrize("target", ["double_blocks.0.", "single_blocks.0.", "final_layer."])
def test_lora_with_caching_that_never_skips_is_bit_identical(comfy, target):
    plain, _ = sampled(comfy, model_patch=lora(target), sampler="KSampler")
    unpatched, _ = sampled(comfy, sampler="KSampler")
    assert not torch.equal(plain, unpatched), "the LoRA changes the result"
    for chain in (lambda p: dbcache(p, threshold=0.0), lambda p: cadence(p, interval=1)):
        ours, _ = sampled(comfy, model_patch=lora(target), chain=chain)
        assert torch.equal(plain, ours), target


@pytest.mark.parametrize("chain", ["dbcache", "fixed_cadence"])
def test_lora_with_skipping_keeps_the_lora_and_is_independent_of_patch_order(comfy, chain):
    make = {"dbcache": dbcache, "fixed_cadence": cadence}[chain]
    with_lora, ui = sampled(comfy, model_patch=lora(), chain=make)
    without, _ = sampled(comfy, chain=make)
    assert computed_fraction(ui)[0] < STEPS
    assert torch.isfinite(with_lora).all() and not torch.equal(with_lora, without)
    # a LoRA applied after Apply Interceptors gives the same as one applied before the Cached Sampler
    prompt = graphs.base("flux")
    chain_id = make(prompt)
    prompt["applied"] = {"class_type": "CachedSamplerApplyInterceptors",
                         "inputs": {"model": ["model", 0], "interceptors": [chain_id, 0]}}
    lora()(prompt, "applied")
    graphs.sampler(prompt, "KSampler", model="lora", steps=STEPS)
    after, _ = run(comfy, prompt)
    assert torch.equal(after, with_lora)


# ---------------------------------------------------------------------------------- ControlNet --

def controlnet(start=0.0, end=1.0, strength=1.0):
    """ComfyUI's ControlNetApplyAdvanced with a real (tiny) Flux ControlNet: its residuals are added to the
    image stream after every double and single block, inside the span DBCache skips."""
    def conditioning(prompt):
        prompt["cn"] = {"class_type": "TestTinyFluxControlNet", "inputs": {"seed": 11}}
        prompt["hint"] = {"class_type": "TestHintImage", "inputs": {"size": 128, "seed": 2}}
        prompt["apply_cn"] = {"class_type": "ControlNetApplyAdvanced", "inputs": {
            "positive": ["cond", 0], "negative": ["cond", 1], "control_net": ["cn", 0], "image": ["hint", 0],
            "strength": strength, "start_percent": start, "end_percent": end}}
        return ["apply_cn", 0], ["apply_cn", 1]
    return conditioning


@pytest.mark.parametrize("window", [(0.0, 1.0), (0.0, 0.5), (0.3, 1.0)])
def test_controlnet_residuals_between_blocks_threshold_zero_is_bit_identical(comfy, window):
    exact, _ = sampled(comfy, sampler="KSampler", conditioning=controlnet(*window))
    no_control, _ = sampled(comfy, sampler="KSampler")
    assert not torch.equal(exact, no_control), "the ControlNet changes the result"
    for chain in (lambda p: dbcache(p, threshold=0.0), lambda p: dbcache(p, threshold=0.0, front=2, back=1),
                  lambda p: cadence(p, interval=1)):
        ours, _ = sampled(comfy, chain=chain, conditioning=controlnet(*window))
        assert torch.equal(exact, ours), window


@pytest.mark.parametrize("chain", ["dbcache", "dbcache Fn2 Bn1", "fixed_cadence"])
def test_controlnet_with_skipping_stays_finite_and_keeps_the_control(comfy, chain):
    make = {"dbcache": dbcache, "dbcache Fn2 Bn1": lambda p: dbcache(p, front=2, back=1),
            "fixed_cadence": cadence}[chain]
    exact, _ = sampled(comfy, sampler="KSampler", conditioning=controlnet())
    exact_plain, _ = sampled(comfy, sampler="KSampler")
    cached, ui = sampled(comfy, chain=make, conditioning=controlnet())
    cached_plain, _ = sampled(comfy, chain=make)
    assert computed_fraction(ui)[0] < STEPS, ui
    assert torch.isfinite(cached).all()
    # the control's contribution survives caching: the cached run is much nearer the exact ControlNet run than
    # to the same caching without the ControlNet, and caching costs no more error than it does without it
    assert (cached - exact).norm() < 0.5 * (cached - cached_plain).norm()
    assert (cached - exact).norm() < 1.5 * (cached_plain - exact_plain).norm()


# ------------------------------------------------------- other additions between blocks --

def injecting_model(family):
    """The tiny ``family`` with pass-through blocks after the probe block, and with what makes it add to the
    stream between blocks: ComfyUI's DiffSynth ControlNet patch on Qwen-Image, the audio conditioning (which
    the tiny conditioning always carries) on Wan S2V."""
    def patch(prompt, model):
        prompt[model] = {"class_type": "TestTinyModelIdentityBlocks",
                         "inputs": {"family": family, "seed": 0, "identity_from": 1}}
        if family != "qwen_image":
            return model
        prompt["hint"] = {"class_type": "TestHintImage", "inputs": {"size": 128, "seed": 2}}
        prompt["diffsynth"] = {"class_type": "TestTinyQwenDiffsynthControlNet", "inputs": {
            "model": [model, 0], "image": ["hint", 0], "strength": 1.0, "seed": 13}}
        return "diffsynth"
    return patch


def counted(family, patch):
    def with_counter(prompt, model):
        graphs.count_work(prompt, family, model=patch(prompt, model))
        return "count"
    return with_counter


@pytest.mark.parametrize("family", ["qwen_image", "wan22_s2v"])
def test_an_addition_between_blocks_is_counted_once_on_skipped_steps(comfy, family):
    """Blocks 1-2 pass their input through exactly, so the only thing in DBCache's skipped span is what the
    model adds after block 1 (the ControlNet patch, the audio injector): a cache that counts it once gives
    the uncached result on every skipped step, while one that also replays it inside the cached residual
    adds it twice."""
    exact, _ = sampled(comfy, sampler="KSampler", model_patch=injecting_model(family), family=family)
    cached, ui = sampled(comfy, model_patch=counted(family, injecting_model(family)), family=family,
                         chain=lambda p: dbcache(p, threshold=100.0))
    work = CAPTURED["work"]
    assert work["forwards"] == STEPS and work["blocks"] < STEPS * 3, work  # steps were really skipped
    assert torch.allclose(cached, exact, rtol=0, atol=1e-4), (cached - exact).abs().max()
    assert notes(ui) == []
    # the addition is there and matters: the same model without it ends elsewhere
    plain = graphs.base(family)
    plain["model"] = {"class_type": "TestTinyModelIdentityBlocks", "inputs": {"family": family, "seed": 0,
                                                                              "identity_from": 1}}
    if family == "wan22_s2v":
        plain["cond"] = {"class_type": "TestTinyConditioningWithout", "inputs": {"family": family,
                                                                                "drop": "audio_embed"}}
    graphs.sampler(plain, "KSampler", steps=STEPS)
    without, _ = run(comfy, plain)
    assert (exact - without).abs().max() > 0.1


# ------------------------------------------------------------------------------- torch.compile --

def test_on_a_compiled_model_exactly_the_block_level_and_compile_unsafe_interceptors_are_refused(comfy):
    """Every interceptor the pack ships, alone (an estimator behind Fixed Cadence), plus one that declares
    itself unsafe to compile: the compile check refuses exactly those working inside the blocks or declaring
    ``compile_safe = False``, naming their node, and lets every other one through."""
    ic = comfy.module("interceptors")

    @dataclasses.dataclass(frozen=True)
    class CompileUnsafe(ic.FixedCadence):
        declaration = ic.FixedCadence.declaration.but(kind="compile_unsafe", compile_safe=False)

    classes = [obj for obj in vars(ic).values() if isinstance(obj, type) and issubclass(obj, ic.Interceptor)
               and obj not in (ic.Interceptor, ic.Decider, ic.Estimator)] + [CompileUnsafe]
    needs = {ic.PlannedSchedule: dict(compute=(0,), sigmas=(1.0,))}  # an empty plan is refused
    refused = set()
    for cls in classes:
        item = cls(**needs.get(cls, {})).with_node("X (node 9)")
        chain = ic.InterceptorChain.of([ic.FixedCadence(), item] if item.role == ic.Role.ESTIMATOR else [item])
        problems = chain.compile_problems("TorchCompileModel")
        if problems:
            refused.add(cls)
            assert "X (node 9)" in problems[0] and "TorchCompileModel" in problems[0], cls
    must_refuse = {cls for cls in classes if cls.granularity == ic.Granularity.BLOCKS or not cls.compile_safe}
    assert refused == must_refuse
    assert {ic.DBCache, ic.FirstBlockCache, ic.TeaCache, ic.MagCache, CompileUnsafe} <= refused
    assert {ic.FixedCadence, ic.AdaptiveCache, ic.TaylorSeer, ic.ReuseLast}.isdisjoint(refused)


def compile_node(backend):
    def patch(prompt, model):
        if backend == "inductor":  # ComfyUI's own node; only offers inductor and cudagraphs
            prompt["compile"] = {"class_type": "TorchCompileModel", "inputs": {"model": [model, 0],
                                                                             "backend": "inductor"}}
        else:  # the same helper the node calls, with a backend that needs no C++ toolchain
            prompt["compile"] = {"class_type": "TestTorchCompileBackend", "inputs": {"model": [model, 0],
                                                                                   "backend": backend}}
        return "compile"
    return patch


@pytest.fixture
def dynamo_reset():
    yield
    torch._dynamo.reset()


def first_block_cache(prompt):
    return graphs.config(prompt, "fb", "CachedSamplerFirstBlockCache", threshold=1.0, warmup=0.0,
                         max_cached_steps=-1, max_consecutive_cached=3, start_percent=0.0, end_percent=1.0)


BLOCK_CHAINS = {"dbcache": dbcache, "first_block_cache": first_block_cache,
                "first_block_cache+taylorseer": lambda p: graphs.config(p, "ts", "CachedSamplerTaylorSeer", order=1,
                                                                         upstream=first_block_cache(p))}


def _compiled_and_plain(comfy, chain, backend):
    """The same chain sampled on the model compiled with ``backend`` and uncompiled: both outputs and both runs."""
    plain, ui_plain = sampled(comfy, chain=chain)
    compiled, ui = sampled(comfy, chain=chain, model_patch=compile_node(backend))
    return (compiled, plain, ui["sampler"]["cached_sampler"][0]["runs"][0],
            ui_plain["sampler"]["cached_sampler"][0]["runs"][0])


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("chain", list(BLOCK_CHAINS))
def test_block_level_caching_on_a_torch_compiled_model_compiles_the_blocks_apart(comfy, dynamo_reset, backend,
                                                                                  chain):
    """TorchCompileModel compiles the whole diffusion model, whose guards skip transformer_options: the block
    replacements inside it would not follow the per-step decisions. The pack compiles the blocks one by one instead,
    with the node's settings, and decides between them: the same decisions and the same work as the uncompiled
    cached run, the same output within the compiler's tolerance (exactly, with the eager backend)."""
    compiled, reference, run, run_ref = _compiled_and_plain(comfy, BLOCK_CHAINS[chain], backend)
    assert "s" in run["decisions"] and run["decisions"] == run_ref["decisions"], (run, run_ref)
    assert run["work_saved"] == run_ref["work_saved"] and not run["notes"], run
    assert torch.allclose(compiled, reference, rtol=1e-4, atol=1e-4), (compiled - reference).abs().max()
    if backend == "eager":
        assert torch.equal(compiled, reference)


@pytest.mark.skipif(not os.environ.get("CACHED_SAMPLER_SLOW_TESTS"),
                    reason="SLOW: inductor compiles the tiny Flux's blocks for minutes on a CPU; set CACHED_SAMPLER_SLOW_TESTS=1")
def test_block_caching_through_the_real_torch_compile_node_with_inductor(comfy, dynamo_reset):
    compiled, reference, run, run_ref = _compiled_and_plain(comfy, first_block_cache, "inductor")
    assert "s" in run["decisions"] and run["decisions"] == run_ref["decisions"], (run, run_ref)
    assert torch.allclose(compiled, reference, rtol=1e-3, atol=1e-3), (compiled - reference).abs().max()


def test_compiled_blocks_compile_in_the_first_evaluation_and_never_again(comfy, dynamo_reset):
    """The block graphs do not depend on the decisions: every graph is compiled while the first evaluation runs
    every block, none after it, and a second run with other noise and other skips compiles nothing (dynamo would
    fall back to eager after 8 recompilations of a block)."""
    import nodes
    from comfy_api.torch_helpers import set_torch_compile_wrapper
    adapter, ic = comfy.module("adapter"), comfy.module("interceptors")
    evaluations, compiled_at = [], []

    def counting(graph_module, example_inputs):  # a backend that records when dynamo hands it a graph
        compiled_at.append(len(evaluations))
        return graph_module.forward

    model = tiny_models.build("flux")
    set_torch_compile_wrapper(model, backend=counting)
    chain = ic.InterceptorChain.of([ic.FirstBlockCache(threshold=50.0, warmup=0.0, max_consecutive_cached=2)])
    skips = []
    patched = adapter.install(model, chain, on_evaluation=lambda run, ev: evaluations.append(ev.index),
                              on_run_end=lambda run, summary: skips.append(summary.evaluations_skipped))
    positive, negative = tiny_models.conditioning("flux", seed=1)
    for seed in (5, 6):
        nodes.common_ksampler(patched, seed, STEPS, 3.0, "euler", "simple", positive, negative,
                              tiny_models.latent("flux", seed=seed))
    assert compiled_at and set(compiled_at) == {0}, compiled_at
    assert all(skips), skips


def test_compiling_after_apply_interceptors_is_refused_when_the_run_starts(comfy):
    prompt = graphs.base("flux")
    graphs.count_work(prompt, "flux")
    prompt["applied"] = {"class_type": "CachedSamplerApplyInterceptors",
                         "inputs": {"model": ["count", 0], "interceptors": [dbcache(prompt), 0]}}
    compile_node("inductor")(prompt, "applied")
    graphs.sampler(prompt, "KSampler", model="compile", steps=STEPS)
    error = run_error(comfy, prompt)
    assert error is not None and error["node_id"] == "sampler", error
    assert "DBCache (node db)" in error["exception_message"] and "TorchCompileModel" in error["exception_message"]
    assert CAPTURED["work"]["forwards"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("chain", ["fixed_cadence", "adaptive", "cadence+taylorseer"])
def test_whole_model_caching_on_a_compiled_model_equals_the_uncompiled_run(comfy, dynamo_reset, backend, chain):
    make = {"fixed_cadence": cadence, "adaptive": adaptive,
            "cadence+taylorseer": lambda p: graphs.config(p, "ts", "CachedSamplerTaylorSeer", order=1,
                                                          upstream=cadence(p, interval=3))}[chain]
    compiled, reference, run, run_ref = _compiled_and_plain(comfy, make, backend)
    assert run["computed"] < STEPS
    assert (run["computed"], run["evaluations"]) == (run_ref["computed"], run_ref["evaluations"])
    assert torch.allclose(compiled, reference, rtol=1e-4, atol=1e-4), (compiled - reference).abs().max()
    if backend == "eager":
        assert torch.equal(compiled, reference)


@pytest.mark.skipif(not os.environ.get("CACHED_SAMPLER_SLOW_TESTS"),
                    reason="SLOW: inductor compiles the tiny Flux in ~80 s on a CPU; set CACHED_SAMPLER_SLOW_TESTS=1")
def test_whole_model_caching_through_the_real_torch_compile_node_with_inductor(comfy, dynamo_reset):
    reference, _ = sampled(comfy, chain=cadence)
    compiled, ui = sampled(comfy, chain=cadence, model_patch=compile_node("inductor"))
    assert computed_fraction(ui)[0] < STEPS
    assert torch.allclose(compiled, reference, rtol=1e-3, atol=1e-3), (compiled - reference).abs().max()


# -------------------------------------------------------------- Skip Layer Guidance, block slots --

def slg(kind="SkipLayerGuidanceDiT", double="1", single="", start=0.0, end=1.0):
    def patch(prompt, model):
        inputs = {"model": [model, 0], "double_layers": double, "single_layers": single, "start_percent": start,
                  "end_percent": end}
        if kind == "SkipLayerGuidanceDiT":
            inputs.update(scale=3.0, rescaling_scale=0.0)
        prompt["slg"] = {"class_type": kind, "inputs": inputs}
        return "slg"
    return patch


SLG_CASES = {
    "SLG, a middle layer": dict(kind="SkipLayerGuidanceDiT", double="1"),
    "SLG, the probe layer": dict(kind="SkipLayerGuidanceDiT", double="0"),
    "SLG, last layer of a segment": dict(kind="SkipLayerGuidanceDiT", double="", single="1"),
    "SLG simple, early window": dict(kind="SkipLayerGuidanceDiTSimple", double="0", single="0", start=0.0, end=0.5),
    "SLG simple, late window": dict(kind="SkipLayerGuidanceDiTSimple", double="0", single="0", start=0.5, end=1.0),
    "SLG simple, late window, middle": dict(kind="SkipLayerGuidanceDiTSimple", double="1", start=0.5, end=1.0),
}


@pytest.mark.parametrize("case", list(SLG_CASES))
def test_skip_layer_guidance_with_dbcache_threshold_zero_is_bit_identical(comfy, case):
    plain, _ = sampled(comfy, sampler="KSampler", model_patch=slg(**SLG_CASES[case]))
    without, _ = sampled(comfy, sampler="KSampler")
    assert not torch.equal(plain, without), "SLG changes the result"
    ours, _ = sampled(comfy, model_patch=slg(**SLG_CASES[case]), chain=lambda p: dbcache(p, threshold=0.0))
    assert torch.equal(plain, ours), case


@pytest.mark.parametrize("case", list(SLG_CASES))
def test_skip_layer_guidance_passes_are_computed_in_full_while_normal_passes_are_cached(comfy, case):
    """SLG puts its own ``skip`` into some block slots for its extra pass only. Such a forward must run every
    block SLG does not skip: caching it would mix it with the normal passes' cache, or (when SLG takes the
    last block of a skipped span) drop that span's residual altogether."""
    spec = SLG_CASES[case]
    skipped_layers = sum(len([x for x in spec.get(k, "").split(",") if x.strip()]) for k in ("double", "single"))

    def patch(prompt, model):
        prompt["log"] = {"class_type": "TestBlockLog", "inputs": {"model": [model, 0], "family": "flux",
                                                                 "key": "blocklog"}}
        return slg(**spec)(prompt, "log")

    out, ui = sampled(comfy, model_patch=patch, chain=dbcache)
    log = CAPTURED["blocklog"]
    slg_passes = [f for f in log if f["foreign"]]
    normal = [f for f in log if not f["foreign"]]
    assert slg_passes and normal
    assert all(f["blocks"] == FLUX_BLOCKS - skipped_layers for f in slg_passes), slg_passes
    assert any(f["blocks"] < FLUX_BLOCKS for f in normal), "the normal passes were cached"
    assert torch.isfinite(out).all() and computed_fraction(ui)[0] < STEPS
    assert notes(ui) == [], "an extra pass per step is expected, not a switch-off"


def notes(ui, node="sampler") -> list[str]:
    return [n for run in ui[node]["cached_sampler"][0]["runs"] for n in run["notes"]]


def test_a_patch_that_takes_the_block_slots_of_every_forward_is_noted(comfy, caplog):
    """A block replacement registered after Apply Interceptors serves one of the pack's slots in every forward:
    no forward can be block-cached. Every block runs, and the run says so once in the log."""
    prompt = graphs.base("flux")
    prompt["log"] = {"class_type": "TestBlockLog", "inputs": {"model": ["model", 0], "family": "flux",
                                                             "key": "blocklog"}}
    prompt["applied"] = {"class_type": "CachedSamplerApplyInterceptors",
                         "inputs": {"model": ["log", 0], "interceptors": [dbcache(prompt), 0]}}
    prompt["replace"] = {"class_type": "TestBlockReplace", "inputs": {
        "model": ["applied", 0], "group": "double_block", "index": 1, "mode": "scale", "factor": 0.5}}
    graphs.sampler(prompt, "KSampler", model="replace", steps=STEPS)
    with caplog.at_level("WARNING", logger="cached_sampler"):
        run(comfy, prompt)
    # the replaced slot's counter went with the pack's replacement: the other three blocks ran in every forward
    assert [f["blocks"] for f in CAPTURED["blocklog"]] == [FLUX_BLOCKS - 1] * STEPS
    said = [r.getMessage() for r in caplog.records if "no block was ever cached" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("mode,group,index", [("scale", "double_block", 1), ("skip", "double_block", 1),
                                              ("scale", "single_block", 1), ("scale", "double_block", 0)])
def test_a_block_replacement_registered_before_the_pack_is_chained_not_overwritten(comfy, mode, group, index):
    def patch(prompt, model):
        prompt["replace"] = {"class_type": "TestBlockReplace", "inputs": {
            "model": [model, 0], "group": group, "index": index, "mode": mode, "factor": 0.5}}
        return "replace"

    plain, _ = sampled(comfy, sampler="KSampler", model_patch=patch)
    without, _ = sampled(comfy, sampler="KSampler")
    assert not torch.equal(plain, without)
    ours, _ = sampled(comfy, model_patch=patch, chain=lambda p: dbcache(p, threshold=0.0))
    assert torch.equal(plain, ours)
    # Apply Interceptors on top of the patched model: same thing
    prompt = graphs.base("flux")
    patch(prompt, "model")
    prompt["applied"] = {"class_type": "CachedSamplerApplyInterceptors",
                         "inputs": {"model": ["replace", 0], "interceptors": [dbcache(prompt, threshold=0.0), 0]}}
    graphs.sampler(prompt, "KSampler", model="applied", steps=STEPS)
    applied, _ = run(comfy, prompt)
    assert torch.equal(plain, applied)


# ----------------------------------------------------------------------- ComfyUI's EasyCache --

def core_cache(kind="EasyCache"):
    def patch(prompt, model):
        prompt["core_cache"] = {"class_type": kind, "inputs": {"model": [model, 0], "reuse_threshold": 0.2,
                                                              "start_percent": 0.15, "end_percent": 0.95,
                                                              "verbose": False}}
        return "core_cache"
    return patch


@pytest.mark.parametrize("kind", ["EasyCache", "LazyCache"])
@pytest.mark.parametrize("chain", ["fixed_cadence", "dbcache"])
def test_core_easycache_on_the_same_model_is_refused_with_a_message(comfy, kind, chain):
    make = {"fixed_cadence": cadence, "dbcache": dbcache}[chain]
    node = "Fixed Cadence (node fc)" if chain == "fixed_cadence" else "DBCache (node db)"

    def patch(prompt, model):
        graphs.count_work(prompt, "flux", model=model)
        return core_cache(kind)(prompt, "count")

    # EasyCache before the Cached Sampler: refused when the sampler validates its chain
    prompt = graphs.base("flux")
    graphs.sampler(prompt, "CachedSampler", chain=make(prompt), model=patch(prompt, "model"), steps=STEPS)
    error = run_error(comfy, prompt)
    assert error is not None and error["node_id"] == "sampler", error
    assert kind in error["exception_message"] and node in error["exception_message"], error["exception_message"]
    assert CAPTURED["work"]["forwards"] == 0

    # EasyCache after Apply Interceptors: refused when the run starts
    prompt = graphs.base("flux")
    prompt["applied"] = {"class_type": "CachedSamplerApplyInterceptors",
                         "inputs": {"model": ["model", 0], "interceptors": [make(prompt), 0]}}
    graphs.sampler(prompt, "KSampler", model=patch(prompt, "applied"), steps=STEPS)
    error = run_error(comfy, prompt)
    assert error is not None and error["node_id"] == "sampler", error
    assert kind in error["exception_message"] and node in error["exception_message"], error["exception_message"]
    assert CAPTURED["work"]["forwards"] == 0


def test_a_cache_the_forward_runs_itself_from_the_options_is_refused_with_a_message(comfy):
    """Kandinsky 6's MagCache node (ComfyUI v0.34-v0.38) puts its state under transformer_options["k6_magcache"] and
    the diffusion model's forward skips its own blocks with it: a chain on the same model would cache it a second
    time. Refused when the chain is installed and again when a run starts with the key in its options; a model
    without the key is left alone."""
    from cached_sampler_dev.support import tiny_configs
    ic, adapter = comfy.module("interceptors"), comfy.module("adapter")
    model = tiny_configs.build("Flux")
    chain = ic.InterceptorChain.of([ic.FixedCadence(interval=2, node="Fixed Cadence (node fc)")])
    adapter.install(model, chain)  # no other cache: installed
    cached = model.clone()
    cached.model_options.setdefault("transformer_options", {})["k6_magcache"] = object()
    with pytest.raises(ic.ChainError) as e:
        adapter.install(cached, chain)
    assert "Kandinsky 6's MagCache" in str(e.value) and "Fixed Cadence (node fc)" in str(e.value)
    assert "k6_magcache" not in model.model_options.get("transformer_options", {})
    # what the OUTER_SAMPLE wrapper checks when a run starts (the guider's options, every patch merged)
    problems = adapter.conflicts.conflicts_of(chain, cached.model_options, {})
    assert len(problems) == 1 and "Kandinsky 6's MagCache" in problems[0]
    assert adapter.conflicts.conflicts_of(chain, model.model_options, {}) == []


def test_core_easycache_alone_through_the_cached_sampler_is_left_alone(comfy):
    """With nothing connected to 'interceptors' the Cached Sampler is KSampler, EasyCache included."""
    ks, _ = sampled(comfy, sampler="KSampler", model_patch=core_cache())
    ours, _ = sampled(comfy, model_patch=core_cache())
    assert torch.equal(ks, ours)


@pytest.mark.parametrize("window", [(0.0, 0.5), (0.4, 1.0)])
def test_controlnet_window_that_opens_or_closes_mid_run_is_not_replayed_stale(comfy, window):
    """Residuals the model adds between blocks are kept out of the block cache: when the control switches
    off (or on) mid-run, skipped steps follow the current control, not the one of the last computed step."""
    exact, _ = sampled(comfy, sampler="KSampler", conditioning=controlnet(*window))
    exact_plain, _ = sampled(comfy, sampler="KSampler")
    cached, ui = sampled(comfy, chain=dbcache, conditioning=controlnet(*window))
    cached_plain, _ = sampled(comfy, chain=dbcache)
    assert computed_fraction(ui)[0] < STEPS, ui
    assert (cached - exact).norm() < 1.2 * (cached_plain - exact_plain).norm()


# ------------------------------------------------- what else runs to go fast: attention overrides, the compiler --

def _direct(comfy, chain=None, options=None, skips=True):
    """The tiny Flux sampled through ComfyUI's KSampler path with ``chain`` installed (None: plain), counted at the
    model; ``options`` go into its transformer_options first. (output, work, the run's summary or None)."""
    import nodes
    from cached_sampler_dev.devkit.work_nodes import count_work
    adapter = comfy.module("adapter")
    model = tiny_models.build("flux")
    model.model_options.setdefault("transformer_options", {}).update(options or {})
    work: dict = {}
    model = count_work(model, work, tiny_models.block_groups("flux"))
    summaries = []
    if chain is not None:
        model = adapter.install(model, chain, on_run_end=lambda run, summary: summaries.append(summary))
    positive, negative = tiny_models.conditioning("flux", seed=1)
    (out,) = nodes.common_ksampler(model, 3, STEPS, 3.0, "euler", "simple", positive, negative,
                                   tiny_models.latent("flux", seed=5))
    return out["samples"], work, summaries[0] if summaries else None


def _skipping(ic, threshold=50.0):
    return ic.InterceptorChain.of([ic.FirstBlockCache(threshold=threshold, warmup=0.0, start_percent=0.0,
                                                      end_percent=1.0, max_consecutive_cached=2)])


def test_an_attention_override_installed_before_the_pack_runs_in_every_block_that_runs(comfy):
    """Another node's attention override (core's Model Sparse Attention installs one, stacked on any before it) is
    left where it is: with nothing skipped the cached run equals KSampler's with the override, and when blocks are
    skipped it is called by exactly the blocks that ran."""
    ic = comfy.module("interceptors")
    calls = []

    def halving(func, *args, **kwargs):  # changes the output, so taking it off would show
        calls.append(1)
        return func(*args, **kwargs) * 0.5

    plain, plain_work, _ = _direct(comfy, options={"optimized_attention_override": halving})
    plain_calls = len(calls)
    without, _, _ = _direct(comfy)
    assert plain_calls > 0 and not torch.equal(plain, without), "the override must act for the test to mean anything"
    calls.clear()
    same, _, _ = _direct(comfy, _skipping(ic, threshold=0.0), options={"optimized_attention_override": halving})
    assert torch.equal(same, plain) and len(calls) == plain_calls
    calls.clear()
    cached, work, summary = _direct(comfy, _skipping(ic), options={"optimized_attention_override": halving})
    assert work["blocks"] < plain_work["blocks"] and summary.acted, (work, plain_work)
    assert len(calls) * plain_work["blocks"] == plain_calls * work["blocks"], (len(calls), plain_calls, work)


@pytest.mark.parametrize("recording", [True, False])
def test_a_forward_the_comfy_compiler_records_runs_every_block_and_says_so(comfy, monkeypatch, recording):
    """ComfyUI's Comfy Compiler (v0.34 and later) records a forward's allocations and block sequence and replays
    them: a recorded forward runs every block, keeps nothing between them and is bit-identical to the plain run, and
    the node says why; when its graph is not active (a ComfyUI without the compiler, or started with
    --disable-comfy-compiler), blocks are skipped as before. The compiler's state is given as comfy/model_prefetch.py
    of those versions keeps it: a graph per thread, active while it records."""
    import importlib
    import threading
    import types
    ic = comfy.module("interceptors")
    try:
        prefetch = importlib.import_module("comfy.model_prefetch")
    except ImportError:
        pytest.skip("this ComfyUI has no comfy/model_prefetch.py (added after v0.8.0)")
    graph = types.SimpleNamespace(_comfy_active=recording)
    monkeypatch.setattr(prefetch, "MALLOC_GRAPHS", {threading.get_ident(): graph}, raising=False)
    plain, plain_work, _ = _direct(comfy)
    cached, work, summary = _direct(comfy, _skipping(ic))
    noted = any("Comfy Compiler" in n for n in summary.notes)
    if recording:
        assert torch.equal(cached, plain) and work["blocks"] == plain_work["blocks"] and noted, summary.notes
    else:
        assert work["blocks"] < plain_work["blocks"] and not noted, (work, summary.notes)


def test_a_block_patch_that_keeps_state_between_calls_is_noted_where_steps_are_skipped(comfy):
    """Core's Model Sparse Attention (v0.38) replaces MiniMax-H3's blocks with ones that start from the previous
    call's attention statistics: after skipped steps those are the last computed step's, and the node says so. Its
    block patch is stood in for by one from a module of that name (the node is newer than the ComfyUI run here);
    a chain that skips nothing, or a plain block patch, says nothing."""
    ic = comfy.module("interceptors")

    def stateful(args, extra):
        return extra["original_block"](args)
    stateful.__module__ = "comfy_extras.nodes_sparse_attention"

    def plain(args, extra):
        return extra["original_block"](args)

    for patch, chain, noted in ((stateful, _skipping(ic), True), (plain, _skipping(ic), False),
                                (stateful, ic.InterceptorChain.of([ic.GuidanceCache(interval=2)]), False)):
        model = tiny_models.build("flux")
        model.set_model_patch_replace(patch, "dit", "double_block", 1)
        summaries = []
        import nodes
        adapter = comfy.module("adapter")
        patched = adapter.install(model, chain, on_run_end=lambda run, summary: summaries.append(summary))
        positive, negative = tiny_models.conditioning("flux", seed=1)
        nodes.common_ksampler(patched, 3, STEPS, 3.0, "euler", "simple", positive, negative,
                              tiny_models.latent("flux", seed=5))
        said = [n for n in summaries[0].notes if "Model Sparse Attention" in n]
        assert bool(said) == noted, (patch.__module__, chain, summaries[0].notes)
