"""Inputs: impossible parameters are refused before any sampling, naming the node and the input; a NaN/Inf
stops sampling at once, naming the step, the branch and who was in charge; a refusal leaves the model as it
was."""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from cached_sampler_dev.support import graphs
from cached_sampler_dev.support import tiny_models
from cached_sampler_dev.support.tiny_nodes import CAPTURED

STEPS = 8


def base_prompt(family="flux"):
    """graphs.base plus a work counter on the model: CAPTURED["work"]["forwards"] says whether sampling ran."""
    prompt = graphs.base(family)
    graphs.count_work(prompt, family)
    return prompt


def run_expecting_error(comfy, prompt):
    CAPTURED.pop("work", None)
    CAPTURED.pop("out", None)
    return comfy.run(copy.deepcopy(prompt), expect_error=True)[1]


def forwards_run() -> int:
    work = CAPTURED.get("work")
    return 0 if work is None else work["forwards"] + work["blocks"]


def validation_messages(result, node_id) -> str:
    errors = result["node_errors"][node_id]["errors"]
    return "\n".join(f"{e['message']}: {e['details']} [{e.get('extra_info', {}).get('input_name')}]" for e in errors)


# ---------------------------------------------------------------------- refused by prompt validation --

WIDGET_CASES = {
    # name: (config node type, inputs, input names the message must mention, words it must mention)
    "start equals end": ("CachedSamplerFixedCadence", dict(interval=2, start_percent=0.5, end_percent=0.5),
                         ("start_percent", "end_percent"), ("Fixed Cadence",)),
    "start after end": ("CachedSamplerDBCache", dict(Fn=1, Bn=0, threshold=0.1, warmup=0.1, max_cached_steps=-1,
                                                     max_consecutive_cached=3, start_percent=0.8, end_percent=0.2),
                        ("start_percent", "end_percent"), ("DBCache",)),
    "negative threshold": ("CachedSamplerDBCache", dict(Fn=1, Bn=0, threshold=-0.1, warmup=0.1, max_cached_steps=-1,
                                                        max_consecutive_cached=3, start_percent=0.0, end_percent=1.0),
                           ("threshold",), ()),
    "negative adaptive threshold": ("CachedSamplerAdaptiveCache", dict(threshold=-1.0, max_consecutive_cached=-1,
                                                                       start_percent=0.1, end_percent=0.9),
                                    ("threshold",), ()),
    "TaylorSeer order 3": ("CachedSamplerTaylorSeer", dict(order=3), ("order",), ()),
    "TaylorSeer order -1": ("CachedSamplerTaylorSeer", dict(order=-1), ("order",), ()),
    "interval 0": ("CachedSamplerFixedCadence", dict(interval=0, start_percent=0.0, end_percent=1.0),
                   ("interval",), ()),
    # within each widget's range, impossible together: the fit needs degree + 2 points
    "Spectrum window below degree + 2": ("CachedSamplerSpectrum", dict(window=5, degree=4, ridge=0.1, blend=0.5,
                                                                       order=1), ("window", "degree + 2"),
                                         ("Spectrum Forecast",)),
}


def refusal(result, node_id) -> str:
    """The message refusing ``node_id``: from prompt validation (ComfyUI's own checks, keyed by the node) or
    from the node itself when it ran (before any sampler), which then names itself by title and id."""
    if "node_errors" in result:
        assert node_id in result["node_errors"], result
        return validation_messages(result, node_id)
    error = result["error"]
    assert error is not None and error["node_id"] == node_id, error
    assert f"(node {node_id})" in error["exception_message"], error
    return error["exception_message"]


@pytest.mark.parametrize("case", list(WIDGET_CASES))
def test_impossible_widget_values_are_refused_before_sampling_naming_node_and_input(comfy, case):
    node_type, inputs, names, words = WIDGET_CASES[case]
    prompt = base_prompt()
    upstream = None
    if node_type in ("CachedSamplerTaylorSeer", "CachedSamplerSpectrum"):  # a forecast needs something that skips
        upstream = graphs.config(prompt, "fc", "CachedSamplerFixedCadence", interval=2, start_percent=0.0,
                                 end_percent=1.0)
    graphs.config(prompt, "bad", node_type, upstream=upstream, **inputs)
    graphs.sampler(prompt, "CachedSampler", chain="bad", model="count", steps=STEPS)
    message = refusal(run_expecting_error(comfy, prompt), "bad")
    for word in names + words:
        assert word in message, (case, word, message)
    assert forwards_run() == 0 and "out" not in CAPTURED


LINKED_CASES = {
    # name: (config node type, widget inputs, linked input, primitive node, value, words in the message)
    "negative threshold": ("CachedSamplerDBCache", dict(Fn=1, Bn=0, warmup=0.1, max_cached_steps=-1,
                                                        max_consecutive_cached=3, start_percent=0.0, end_percent=1.0),
                           "threshold", "PrimitiveFloat", -0.25, ("threshold", "-0.25")),
    "start after end": ("CachedSamplerFixedCadence", dict(interval=2, end_percent=0.3), "start_percent",
                        "PrimitiveFloat", 0.7, ("start_percent", "end_percent")),
    "TaylorSeer order 5": ("CachedSamplerTaylorSeer", dict(), "order", "PrimitiveInt", 5, ("order", "5")),
    "First Block Cache negative threshold": ("CachedSamplerFirstBlockCache", dict(
        warmup=0.1, max_cached_steps=-1, max_consecutive_cached=3, start_percent=0.0, end_percent=1.0),
        "threshold", "PrimitiveFloat", -1.0, ("threshold",)),
}


@pytest.mark.parametrize("case", list(LINKED_CASES))
def test_impossible_values_arriving_through_links_are_refused_before_sampling(comfy, case):
    """A value from another node skips the widget's min/max check: the config node refuses it when it runs,
    before the sampler, with its own title and id and the input's name."""
    node_type, inputs, linked, primitive, value, words = LINKED_CASES[case]
    prompt = base_prompt()
    upstream = None
    if node_type == "CachedSamplerTaylorSeer":
        upstream = graphs.config(prompt, "fc", "CachedSamplerFixedCadence", interval=2, start_percent=0.0,
                                 end_percent=1.0)
    prompt["value"] = {"class_type": primitive, "inputs": {"value": value}}
    graphs.config(prompt, "bad", node_type, upstream=upstream, **inputs, **{linked: ["value", 0]})
    graphs.sampler(prompt, "CachedSampler", chain="bad", model="count", steps=STEPS)
    message = refusal(run_expecting_error(comfy, prompt), "bad")
    assert "(node bad)" in message, message
    for word in words:
        assert word in message, (case, word, message)
    assert forwards_run() == 0 and "out" not in CAPTURED


@pytest.mark.parametrize("front,back", [(4, 0), (3, 1), (2, 2), (1, 3)])
@pytest.mark.parametrize("sampler", ["CachedSampler", "CachedSamplerApplyInterceptors"])
def test_fn_plus_bn_reaching_the_models_block_count_is_refused_before_sampling(comfy, front, back, sampler):
    prompt = base_prompt()  # the tiny Flux has 2 double + 2 single blocks
    graphs.config(prompt, "db", "CachedSamplerDBCache", Fn=front, Bn=back, threshold=0.1, warmup=0.1,
                  max_cached_steps=-1, max_consecutive_cached=3, start_percent=0.0, end_percent=1.0)
    if sampler == "CachedSampler":
        graphs.sampler(prompt, "CachedSampler", chain="db", model="count", steps=STEPS)
        refusing = "sampler"
    else:
        prompt["applied"] = {"class_type": "CachedSamplerApplyInterceptors",
                             "inputs": {"model": ["count", 0], "interceptors": ["db", 0]}}
        graphs.sampler(prompt, "KSampler", model="applied", steps=STEPS)
        refusing = "applied"
    result = run_expecting_error(comfy, prompt)
    error = result["error"]
    assert error is not None and error["node_id"] == refusing, error
    message = error["exception_message"]
    for word in ("DBCache (node db)", f"Fn ({front})", f"Bn ({back})", "4 blocks"):
        assert word in message, (word, message)
    assert forwards_run() == 0 and "out" not in CAPTURED


def test_first_block_cache_on_a_model_without_block_hooks_is_refused_naming_the_node(comfy):
    prompt = base_prompt("sdxl")
    prompt["count"]["inputs"]["family"] = "sdxl"
    graphs.config(prompt, "fb", "CachedSamplerFirstBlockCache", threshold=0.1, warmup=0.1, max_cached_steps=-1,
                  max_consecutive_cached=3, start_percent=0.0, end_percent=1.0)
    graphs.sampler(prompt, "CachedSampler", chain="fb", model="count", steps=STEPS)
    result = run_expecting_error(comfy, prompt)
    message = result["error"]["exception_message"]
    assert "First Block Cache (node fb)" in message and "transformer blocks" in message, message
    assert forwards_run() == 0


@pytest.mark.parametrize("family, module", [("flux", "img_mod"), ("flux", "img_norm1"), ("ltxv", "scale_shift_table")])
@pytest.mark.parametrize("sampler", ["CachedSampler", "CachedSamplerApplyInterceptors"])
def test_teacache_on_a_model_whose_first_block_lacks_its_signal_modules_is_refused_before_sampling(
        comfy, family, module, sampler):
    """TeaCache computes its signal from block 0's own modulation modules, ComfyUI internals a model class or
    a ComfyUI version may lay out differently: their absence is found when the chain is installed."""
    prompt = base_prompt(family)
    prompt["model"] = {"class_type": "TestTinyModelWithout", "inputs": {"family": family, "module": module}}
    graphs.config(prompt, "tc", "CachedSamplerTeaCache", threshold=0.4, model_type="auto", start_percent=0.0,
                  end_percent=1.0)
    if sampler == "CachedSampler":
        graphs.sampler(prompt, "CachedSampler", chain="tc", model="count", steps=STEPS)
    else:
        prompt["applied"] = {"class_type": sampler, "inputs": {"model": ["count", 0], "interceptors": ["tc", 0]}}
        graphs.sampler(prompt, "KSampler", model="applied", steps=STEPS)
    result = run_expecting_error(comfy, prompt)
    message = result["error"]["exception_message"]
    assert "TeaCache (node tc)" in message and module in message, message
    assert "Adaptive Cache" in message and "DBCache" in message, message
    assert result["error"]["node_id"] == ("sampler" if sampler == "CachedSampler" else "applied")
    assert forwards_run() == 0


@pytest.mark.parametrize("target", ["CachedSampler", "CachedSamplerApplyInterceptors", "CachedSamplerFixedCadence"])
def test_a_model_linked_into_interceptors_is_refused_by_type(comfy, target):
    prompt = base_prompt()
    if target == "CachedSampler":
        graphs.sampler(prompt, "CachedSampler", chain="model", model="count", steps=STEPS)
        node_id = "sampler"
    elif target == "CachedSamplerApplyInterceptors":
        prompt["applied"] = {"class_type": target, "inputs": {"model": ["count", 0], "interceptors": ["model", 0]}}
        graphs.sampler(prompt, "KSampler", model="applied", steps=STEPS)
        node_id = "applied"
    else:
        graphs.config(prompt, "fc", target, upstream="model", interval=2, start_percent=0.0, end_percent=1.0)
        graphs.sampler(prompt, "CachedSampler", chain="fc", model="count", steps=STEPS)
        node_id = "fc"
    result = run_expecting_error(comfy, prompt)
    assert node_id in result["node_errors"], result
    message = validation_messages(result, node_id)
    assert "interceptors" in message and "MODEL" in message, message
    assert forwards_run() == 0


@pytest.mark.parametrize("target", ["CachedSampler", "CachedSamplerApplyInterceptors", "CachedSamplerFixedCadence"])
def test_a_wrongly_typed_value_through_a_wildcard_is_refused_naming_node_and_input(comfy, target):
    """ComfyUI lets a '*' output reach any input: the node itself refuses what is not a chain."""
    prompt = base_prompt()
    prompt["any"] = {"class_type": "TestAnyOutput", "inputs": {"value": ["model", 0]}}
    if target == "CachedSampler":
        graphs.sampler(prompt, "CachedSampler", chain="any", model="count", steps=STEPS)
        node_id, label = "sampler", "Cached Sampler (node sampler)"
    elif target == "CachedSamplerApplyInterceptors":
        prompt["applied"] = {"class_type": target, "inputs": {"model": ["count", 0], "interceptors": ["any", 0]}}
        graphs.sampler(prompt, "KSampler", model="applied", steps=STEPS)
        node_id, label = "applied", "Apply Interceptors (node applied)"
    else:
        graphs.config(prompt, "fc", target, upstream="any", interval=2, start_percent=0.0, end_percent=1.0)
        graphs.sampler(prompt, "CachedSampler", chain="fc", model="count", steps=STEPS)
        node_id, label = "fc", "Fixed Cadence (node fc)"
    result = run_expecting_error(comfy, prompt)
    error = result["error"]
    assert error is not None and error["node_id"] == node_id, error
    assert label in error["exception_message"] and "'interceptors'" in error["exception_message"], error
    assert "ModelPatcher" in error["exception_message"]
    assert forwards_run() == 0


# ------------------------------------------------------------------------------------- NaN and Inf --

def nan_prompt(at, branch=0, chain="dbcache"):
    prompt = base_prompt()
    if chain == "dbcache":
        graphs.config(prompt, "db", "CachedSamplerDBCache", Fn=1, Bn=0, threshold=1.0, warmup=0.0,
                      max_cached_steps=-1, max_consecutive_cached=3, start_percent=0.0, end_percent=1.0)
    else:
        graphs.config(prompt, "ts", "CachedSamplerTaylorSeer", order=1, upstream=graphs.config(
            prompt, "db", "CachedSamplerDBCache", Fn=1, Bn=0, threshold=1.0, warmup=0.0, max_cached_steps=-1,
            max_consecutive_cached=3, start_percent=0.0, end_percent=1.0))
    prompt["nan"] = {"class_type": "TestNaNAt", "inputs": {"model": ["count", 0], "at": at, "branch": branch}}
    graphs.sampler(prompt, "CachedSampler", chain="ts" if chain != "dbcache" else "db", model="nan", steps=STEPS)
    return prompt


def test_decisions_the_nan_tests_rely_on(comfy):
    """DBCache at threshold 1 on the tiny Flux (the prompt's model, conditioning, latent and seed): steps 1 and 5
    computed, steps 2-4 skipped (their middle blocks; the probe block still runs)."""
    import nodes
    adapter, ic = comfy.module("adapter"), comfy.module("interceptors")
    runs = []
    chain = ic.InterceptorChain.of([ic.DBCache(threshold=1.0, warmup=0.0)])
    pos, neg = tiny_models.conditioning("flux", seed=1)
    nodes.common_ksampler(adapter.install(tiny_models.build("flux"), chain, on_run_end=lambda r, s: runs.append(r)),
                          42, STEPS, 3.0, "euler", "simple", pos, neg, tiny_models.latent("flux"))
    assert [r.skipped for r in runs[0].records][:5] == [False, True, True, True, False]


@pytest.mark.parametrize("at,branch,step,branches,in_charge", [
    (0, 0, 1, "cond", "no interceptor"),                 # a computed step, the first
    (4, 1, 5, "uncond", "no interceptor"),               # a computed step later on, the other branch
    # NaN entering a step the cache would skip reaches the probe block first: a non-finite probe is never
    # trusted to skip, so the step is computed and the model is named, not the cache
    (2, 0, 3, "cond", "no interceptor"),
    (3, -1, 4, "cond uncond", "no interceptor"),         # both branches
])
def test_nan_stops_sampling_at_that_step_naming_step_branch_and_who_was_in_charge(comfy, at, branch, step,
                                                                                  branches, in_charge):
    result = run_expecting_error(comfy, nan_prompt(at, branch))
    error = result["error"]
    assert error is not None and error["node_id"] == "sampler", error
    message = error["exception_message"]
    assert f"step {step}/{STEPS}" in message and "NaN" in message, message
    named = message.split("branch")[1].split(";")[0].replace(",", " ").split()
    assert sorted(named) == sorted(branches.split()), message
    assert in_charge in message, message
    # the flags come over with the next evaluation's transfer (its decision): sampling stops there at the latest
    assert at + 1 <= CAPTURED["work"]["forwards"] <= at + 2, "sampling went on past the next evaluation"
    assert "out" not in CAPTURED


def poisoned_estimator(ic, kind: str):
    """An estimator class whose every estimate is NaN: a substitute that must be caught and blamed right."""

    @dataclasses.dataclass(frozen=True)
    class Poisoned(ic.ReuseLast):
        declaration = ic.ReuseLast.declaration.but(display_name="Poisoned forecast")

        def estimate(self, slot, sigma, device):
            return slot.value * float("nan")

    Poisoned.kind = kind
    return Poisoned


def test_nan_on_a_substituted_block_step_names_the_decider_and_the_estimator(comfy):
    """A block-level substitution that is not finite (an estimator returning NaN) names DBCache and the
    estimator in charge of that step."""
    import nodes
    adapter, ic = comfy.module("adapter"), comfy.module("interceptors")

    Poisoned = poisoned_estimator(ic, "test_poisoned_blocks")
    chain = ic.InterceptorChain.of([ic.DBCache(threshold=1.0, warmup=0.0).with_node("DBCache (node db)"),
                                    Poisoned().with_node("Poisoned forecast (node ts)")])
    pos, neg = tiny_models.conditioning("flux", seed=1)
    with pytest.raises(ic.NonFiniteOutputError) as info:
        nodes.common_ksampler(adapter.install(tiny_models.build("flux"), chain), 42, STEPS, 3.0, "euler", "simple",
                              pos, neg, tiny_models.latent("flux"))
    message = str(info.value)
    assert "step 2/8" in message and "DBCache (node db)" in message and "Poisoned forecast (node ts)" in message


def test_nan_from_a_whole_model_substitution_is_caught(comfy):
    """At whole-model level a skipped step never calls the model: a substituted output that is not finite
    (here an estimator that returns NaN) is caught all the same, naming the decider and the estimator."""
    import nodes
    adapter, ic = comfy.module("adapter"), comfy.module("interceptors")

    Poisoned = poisoned_estimator(ic, "test_poisoned")
    model = tiny_models.build("flux")
    chain = ic.InterceptorChain.of([ic.FixedCadence(interval=2).with_node("Fixed Cadence (node 7)"),
                                    Poisoned().with_node("Poisoned forecast (node 8)")])
    pos, neg = tiny_models.conditioning("flux")
    with pytest.raises(ic.NonFiniteOutputError) as info:
        nodes.common_ksampler(adapter.install(model, chain), 1, STEPS, 3.0, "euler", "simple", pos, neg,
                              tiny_models.latent("flux"))
    message = str(info.value)
    assert "step 2/8" in message and "branch" in message and "cond" in message, message
    assert "Fixed Cadence (node 7)" in message and "Poisoned forecast (node 8)" in message, message


def test_nan_from_a_step_cache_skip_names_the_step_cache_with_the_guidance_cache_chained(comfy):
    """With the Guidance Cache chained, a poisoned step-cache substitute still names the step cache: the Guidance
    Cache also skipped work in that evaluation (the negative), but not the work that went wrong."""
    import nodes
    adapter, ic = comfy.module("adapter"), comfy.module("interceptors")

    Poisoned = poisoned_estimator(ic, "test_poisoned_gc")
    chain = ic.InterceptorChain.of([ic.FixedCadence(interval=2).with_node("Fixed Cadence (node 7)"),
                                    Poisoned().with_node("Poisoned forecast (node 8)"),
                                    ic.GuidanceCache(interval=100).with_node("Guidance Cache (node 9)")])
    pos, neg = tiny_models.conditioning("flux")
    with pytest.raises(ic.NonFiniteOutputError) as info:
        nodes.common_ksampler(adapter.install(tiny_models.build("flux"), chain), 1, STEPS, 3.0, "euler", "simple",
                              pos, neg, tiny_models.latent("flux"))
    message = str(info.value)
    assert "Fixed Cadence (node 7)" in message and "Poisoned forecast (node 8)" in message, message
    assert "Guidance Cache (node 9) skipped" not in message, message


def test_inf_is_caught_like_nan(comfy):
    import nodes
    adapter, ic = comfy.module("adapter"), comfy.module("interceptors")
    import comfy.patcher_extension as patcher_extension
    model = tiny_models.build("flux").clone()
    calls = {"n": 0}

    def overflow(executor, *args, **kwargs):
        calls["n"] += 1
        out = executor(*args, **kwargs)
        return out * float("inf") if calls["n"] == 3 else out

    model.add_wrapper_with_key(patcher_extension.WrappersMP.DIFFUSION_MODEL, "test_inf", overflow)
    chain = ic.InterceptorChain.of([ic.DBCache(threshold=1.0, warmup=0.0).with_node("DBCache (node 3)")])
    pos, neg = tiny_models.conditioning("flux")
    with pytest.raises(ic.NonFiniteOutputError) as info:
        nodes.common_ksampler(adapter.install(model, chain), 1, STEPS, 3.0, "euler", "simple", pos, neg,
                              tiny_models.latent("flux"))
    assert "NaN/Inf" in str(info.value) and "step 3/8" in str(info.value)


# ---------------------------------------------------------------- a refusal leaves the model untouched --

def describe(value, depth=0):
    """A comparable picture of nested patcher state: containers by content, everything else by identity."""
    if depth > 12:
        return "..."
    if isinstance(value, dict):
        return {repr(k): describe(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [describe(v, depth + 1) for v in value]
    if isinstance(value, (str, int, float, bool, type(None))):
        return value
    if torch.is_tensor(value):
        return ("tensor", id(value), tuple(value.shape), float(value.double().sum()))
    return (type(value).__name__, id(value))


def patcher_state(model) -> dict:
    return {
        "model_options": describe(model.model_options),
        "wrappers": describe(model.wrappers),
        "callbacks": describe(model.callbacks),
        "patches": describe(model.patches),
        "patches_uuid": model.patches_uuid,
        "object_patches": describe(model.object_patches),
        "injections": describe(model.injections),
        "attachments": describe(model.attachments),
        "additional_models": describe(model.additional_models),
        "weights": float(sum(p.double().sum() for p in model.model.diffusion_model.parameters())),
    }


@pytest.mark.parametrize("sampler", ["CachedSampler", "CachedSamplerAdvanced", "CachedSamplerApplyInterceptors"])
def test_a_refused_chain_leaves_the_input_model_untouched(comfy, sampler):
    prompt = base_prompt()
    prompt["lora"] = {"class_type": "TestLoraPatch", "inputs": {"model": ["count", 0], "strength": 1.0,
                                                               "target": "single_blocks.1.", "seed": 5}}
    prompt["seen"] = {"class_type": "TestCaptureModel", "inputs": {"model": ["lora", 0], "key": "seen_model"}}
    graphs.config(prompt, "db", "CachedSamplerDBCache", Fn=3, Bn=1, threshold=0.1, warmup=0.1,
                  max_cached_steps=-1, max_consecutive_cached=3, start_percent=0.0, end_percent=1.0)
    if sampler == "CachedSamplerApplyInterceptors":
        prompt["sampler"] = {"class_type": sampler, "inputs": {"model": ["seen", 0], "interceptors": ["db", 0]}}
        graphs.sampler(prompt, "KSampler", node_id="ks", model="sampler", steps=STEPS)
    elif sampler == "CachedSamplerAdvanced":
        inputs = graphs.advanced_inputs(steps=STEPS, model="seen")
        inputs["interceptors"] = ["db", 0]
        prompt["sampler"] = {"class_type": sampler, "inputs": inputs}
        prompt["capture"] = {"class_type": "TestCaptureLatent", "inputs": {"samples": ["sampler", 0], "key": "out"}}
    else:
        graphs.sampler(prompt, sampler, chain="db", model="seen", steps=STEPS)
    snapshots = {}
    # the model's state when the capture node hands it on, i.e. before the refusing node runs
    CAPTURED["seen_model:on_capture"] = lambda model: snapshots.update(before=patcher_state(model))
    try:
        result = run_expecting_error(comfy, prompt)
    finally:
        CAPTURED.pop("seen_model:on_capture", None)
    assert result["error"] is not None and result["error"]["node_id"] == "sampler", result
    assert "Fn (3)" in result["error"]["exception_message"]
    assert "before" in snapshots and patcher_state(CAPTURED["seen_model"]) == snapshots["before"]
    assert forwards_run() == 0


def test_the_adapter_refuses_before_touching_the_model(comfy):
    """adapter.install validates first: nothing is cloned, wrapped or registered on a refused model."""
    adapter, ic = comfy.module("adapter"), comfy.module("interceptors")
    model = tiny_models.build("flux")
    before = patcher_state(model)
    for chain in ([ic.DBCache(front=2, back=2)], [ic.DBCache(front=4, back=0)]):
        with pytest.raises(ValueError):
            adapter.install(model, ic.InterceptorChain.of(chain))
        assert patcher_state(model) == before
    distilled = tiny_models.build("flux_schnell")
    before = patcher_state(distilled)
    with pytest.raises(ValueError, match="distilled"):
        adapter.install(distilled, ic.InterceptorChain.of([ic.FixedCadence(interval=2)]))
    assert patcher_state(distilled) == before


def test_teacache_is_offered_exactly_where_the_adapters_probe_reads_its_signal(comfy):
    """The card offers TeaCache's signal from the adapter's one probe table: on every block-level tiny family whose
    card offers it, a run measures the signal on every evaluation after the first (the probe works on that model
    class); on every other block-level family TeaCache is refused when the chain is installed."""
    import nodes
    adapter, ic = comfy.module("adapter"), comfy.module("interceptors")
    offered, refused = [], []
    for family in tiny_models.FAMILIES:
        if not tiny_models.available(family) or not tiny_models.block_groups(family):
            continue
        model = tiny_models.build(family)
        card = adapter.model_card(model)
        if ic.Granularity.BLOCKS not in card.levels:
            continue
        chain = ic.InterceptorChain.of([ic.TeaCache(threshold=100.0, model_type="ltxv", start_percent=0.0,
                                                    end_percent=1.0)])
        if "modulated_input" not in card.signals:
            with pytest.raises(ic.ChainError, match="Adaptive Cache"):
                adapter.install(model, chain, allow_distilled=True)
            refused.append(family)
            continue
        runs = []
        patched = adapter.install(model, chain, allow_distilled=True, on_run_end=lambda run, summary: runs.append(run))
        pos, neg = tiny_models.conditioning(family, seed=1)
        nodes.common_ksampler(patched, 1, 3, 3.0, "euler", "simple", pos, neg, tiny_models.latent(family))
        assert all(r.metric is not None for r in runs[0].records[1:-1]), f"{family}: the signal was not measured"
        offered.append(family)
    assert {"flux", "chroma", "wan21", "hunyuan_video", "ltxv"} <= set(offered), offered
    assert {"qwen_image", "sd3"} <= set(refused), refused
