"""Every caching method on tiny models of every family, through ComfyUI's executor.

Random-weight models change a lot from step to step, so "skips" here use thresholds far above what a
real model needs: these tests check plumbing (bit-identity at threshold 0, work really skipped at the
hooks, finite output, refusals), not quality. Quality is measured on the trained digits model.
"""
import pytest
import torch

from cached_sampler_dev.support import graphs
from cached_sampler_dev.support import tiny_models
from cached_sampler_dev.support.tiny_nodes import CAPTURED

# Step-distilled models are refused without allow_distilled (tests/guarantees/test_safety_compat.py, tests/integration/test_families.py)
DISTILLED = ("flux_schnell", "wan_causal")
BLOCK_FAMILIES = [f for f in tiny_models.FAMILIES if tiny_models.block_groups(f) and f not in DISTILLED]
ALL_FAMILIES = [f for f in tiny_models.FAMILIES if f not in DISTILLED]
WINDOW = dict(start_percent=0.0, end_percent=1.0)

# name: (node type, inputs that never skip, inputs that skip on random weights, families)
METHODS = {
    "dbcache": ("CachedSamplerDBCache",
                dict(Fn=1, Bn=1, threshold=0.0, warmup=0.0, max_cached_steps=-1, max_consecutive_cached=-1, **WINDOW),
                dict(Fn=1, Bn=1, threshold=50.0, warmup=0.0, max_cached_steps=-1, max_consecutive_cached=2, **WINDOW),
                BLOCK_FAMILIES),
    "fbcache": ("CachedSamplerFirstBlockCache",
                dict(threshold=0.0, warmup=0.0, max_cached_steps=-1, max_consecutive_cached=-1, **WINDOW),
                dict(threshold=50.0, warmup=0.0, max_cached_steps=-1, max_consecutive_cached=2, **WINDOW),
                BLOCK_FAMILIES),
    "teacache": ("CachedSamplerTeaCache", dict(threshold=0.0, model_type="auto", **WINDOW),
                 dict(threshold=100.0, model_type="auto", **WINDOW), ["flux", "hunyuan_video", "ltxv", "wan21"]),
    "magcache": ("CachedSamplerMagCache",
                 dict(threshold=0.0, K=2, retention_ratio=0.0, model_type="auto", custom_ratios="", **WINDOW),
                 dict(threshold=100.0, K=2, retention_ratio=0.0, model_type="auto", custom_ratios="", **WINDOW),
                 ["flux", "chroma", "hunyuan_video", "wan21"]),
    "adaptive": ("CachedSamplerAdaptiveCache", dict(threshold=0.0, max_consecutive_cached=-1, **WINDOW),
                 dict(threshold=100.0, max_consecutive_cached=2, **WINDOW), ALL_FAMILIES),
    "cadence_taylor": ("CachedSamplerFixedCadence", dict(interval=1, **WINDOW), dict(interval=3, **WINDOW),
                       ALL_FAMILIES),
    # Spectrum Forecast (window 4, degree 1) after Fixed Cadence: at 6 steps and interval 2 the Chebyshev fit takes
    # part in the last forecast (3 computed steps)
    "cadence_spectrum": ("CachedSamplerFixedCadence", dict(interval=1, **WINDOW), dict(interval=2, **WINDOW),
                         ["flux", "sdxl", "wan21"]),
}
CASES = [(m, f) for m, spec in METHODS.items() for f in spec[3]]


def _chain(prompt, method, inputs):
    node_type = METHODS[method][0]
    last = graphs.config(prompt, "method", node_type, **inputs)
    if method == "cadence_taylor":
        last = graphs.config(prompt, "forecast", "CachedSamplerTaylorSeer", upstream=last, order=1)
    if method == "cadence_spectrum":
        last = graphs.config(prompt, "forecast", "CachedSamplerSpectrum", upstream=last, window=4, degree=1,
                             ridge=0.1, blend=0.5, order=1)
    return last


def _run_counted(comfy, family, method=None, inputs=None, steps=6, cfg=3.0, batch=1, **kw):
    if not tiny_models.available(family):
        pytest.skip(f"this ComfyUI has no {tiny_models._spec(family)[0]} (added after v0.8.0)")
    prompt = graphs.base(family, batch=batch, latent_seed=5)
    graphs.count_work(prompt, family)
    chain = _chain(prompt, method, inputs) if method else None
    graphs.sampler(prompt, "CachedSampler", chain=chain, model="count", steps=steps, cfg=cfg, **kw)
    _, ui = comfy.run(prompt)
    return tiny_models.as_tensor(CAPTURED["out"]).clone(), dict(CAPTURED["work"]), ui


@pytest.mark.parametrize("method, family", CASES)
def test_threshold_zero_is_bit_identical_and_caching_skips_work(comfy, method, family):
    node_type, never, skips, _ = METHODS[method]
    ref, ref_work, _ = _run_counted(comfy, family)
    same, _, _ = _run_counted(comfy, family, method, never)
    assert torch.equal(ref, same), f"{method} at threshold 0 must be bit-identical on {family}"
    if method == "teacache" and family == "wan21":
        # Wan's fitted polynomial turns the random model's large e0 changes into values far above any
        # threshold; the gentler LTXV fit (chosen explicitly) exercises the same Wan signal path.
        skips = dict(skips, model_type="ltxv")
    cached, work, ui = _run_counted(comfy, family, method, skips)
    assert torch.isfinite(cached).all()
    assert not [n for r in ui["sampler"]["cached_sampler"][0]["runs"] for n in r["notes"]], "nothing was switched off"
    measure = "blocks" if tiny_models.block_groups(family) else "forwards"
    assert work[measure] < ref_work[measure], f"{method} skipped no work on {family}: {work} vs {ref_work}"


@pytest.mark.parametrize("method, family", [("dbcache", "lumina2"), ("fbcache", "sdxl"), ("teacache", "qwen_image"),
                                            ("teacache", "sd15"), ("magcache", "sd3"), ("dbcache", "kandinsky5")])
def test_methods_refuse_models_they_cannot_run_on(comfy, method, family):
    prompt = graphs.base(family)
    chain = _chain(prompt, method, METHODS[method][2])
    graphs.sampler(prompt, "CachedSampler", chain=chain)
    _, result = comfy.run(prompt, expect_error=True)
    message = result["error"]["exception_message"]
    assert "node method" in message
    assert any(word in message for word in ("Adaptive Cache", "MagCache Calibrate")), message


def _batching_prompt(case):
    family = "flux"
    prompt = graphs.base(family, batch=3 if case == "batch3" else 1, latent_seed=5)
    kw = dict(steps=6, cfg=3.0)
    if case == "cfg1":
        kw["cfg"] = 1.0
    if case == "split":
        prompt["cond"] = {"class_type": "TestTinyConditioningPair",
                          "inputs": {"family": family, "pos_length": 4, "neg_length": 77}}
    if case == "multi_positive":
        prompt["cond2"] = {"class_type": "TestTinyConditioning", "inputs": {"family": family, "seed": 9, "length": 4}}
        prompt["combined"] = {"class_type": "ConditioningCombine",
                              "inputs": {"conditioning_1": ["cond", 0], "conditioning_2": ["cond2", 0]}}
    if case == "area":
        prompt["area"] = {"class_type": "ConditioningSetArea", "inputs": {
            "conditioning": ["cond", 0], "width": 64, "height": 64, "x": 0, "y": 0, "strength": 1.0}}
        prompt["combined"] = {"class_type": "ConditioningCombine",
                              "inputs": {"conditioning_1": ["cond", 0], "conditioning_2": ["area", 0]}}
    if case in ("heun", "dpm_2", "dpmpp_sde", "dpmpp_2s_ancestral"):
        kw["sampler"] = case
    if case == "denoise":
        prompt["latent"]["inputs"]["seed"] = 3
        kw["denoise"] = 0.6
    return family, prompt, kw


BATCHING = ["cfg1", "split", "multi_positive", "area", "batch3", "heun", "dpm_2", "dpmpp_sde", "dpmpp_2s_ancestral",
            "denoise"]


def _work(comfy, prompt, sampler_inputs, model, chain=None, **kw):
    """Run ``prompt`` with a Cached Sampler on ``model`` counted; returns the work that really ran."""
    prompt = dict(prompt)
    graphs.count_work(prompt, kw.pop("family"), model=model)
    node = graphs.sampler(prompt, "CachedSampler", chain=chain, model="count", **kw)
    node["sampler"]["inputs"].update(sampler_inputs)
    comfy.run(prompt)
    assert torch.isfinite(CAPTURED["out"]).all()
    return dict(CAPTURED["work"])


def _skipped_work(cached: dict, uncached: dict, family: str) -> bool:
    measure = "blocks" if tiny_models.block_groups(family) else "forwards"
    return cached[measure] < uncached[measure]


@pytest.mark.parametrize("method", ["dbcache", "adaptive", "cadence_taylor"])
@pytest.mark.parametrize("case", BATCHING)
def test_batching_cases_run_and_skip(comfy, case, method):
    family, prompt, kw = _batching_prompt(case)
    inputs = {"positive": ["combined", 0]} if case in ("multi_positive", "area") else {}
    uncached = _work(comfy, prompt, inputs, "model", family=family, **kw)
    chain = _chain(prompt, method, METHODS[method][2])
    cached = _work(comfy, prompt, inputs, "model", chain=chain, family=family, **kw)
    assert _skipped_work(cached, uncached, family), (cached, uncached)


def test_context_windows_run_and_skip(comfy):
    import nodes
    options = nodes.NODE_CLASS_MAPPINGS["ContextWindowsManual"].GET_NODE_INFO_V1()["input"]["required"]
    schedule = "standard_static"
    assert schedule in options["context_schedule"][1]["options"]
    prompt = graphs.base("wan21", latent_seed=5)
    prompt["latent"]["inputs"]["batch"] = 4
    prompt["windows"] = graphs.context_windows(context_schedule=schedule)
    uncached = _work(comfy, prompt, {}, "windows", family="wan21", steps=6)
    chain = _chain(prompt, "adaptive", METHODS["adaptive"][2])
    cached = _work(comfy, prompt, {}, "windows", chain=chain, family="wan21", steps=6)
    assert cached["forwards"] < uncached["forwards"], (cached, uncached)


def _context_schedules():
    import nodes
    options = nodes.NODE_CLASS_MAPPINGS["ContextWindowsManual"].INPUT_TYPES()["required"]["context_schedule"]
    return list(options[0]) if isinstance(options[0], list) else list(options[1]["options"])


MOVING_WINDOW_CHAINS = {
    "whole model": ("CachedSamplerFixedCadence", dict(interval=2, **WINDOW)),
    "blocks": ("CachedSamplerFirstBlockCache", METHODS["fbcache"][2]),
}


@pytest.mark.parametrize("level", list(MOVING_WINDOW_CHAINS))
def test_context_windows_reuse_only_what_was_computed_for_the_same_frames(comfy, level):
    """Every context schedule ComfyUI offers, 9 frames in windows of 3: the uniform schedules move their windows
    every step and change their number. A forward whose frames were never computed before must run in full (all
    its blocks); reuse is for the same frames only. Static windows still skip."""
    node_type, inputs = MOVING_WINDOW_CHAINS[level]
    blocks = sum(tiny_models.block_groups("wan21").values())
    schedules = _context_schedules()
    assert {"standard_static", "standard_uniform", "looped_uniform"} <= set(schedules), schedules
    skipped_somewhere = {}
    for schedule in schedules:
        prompt = graphs.base("wan21", latent_seed=5)
        prompt["latent"]["inputs"]["batch"] = 9
        prompt["windows"] = graphs.context_windows(context_schedule=schedule, context_length=3, context_overlap=1)
        prompt[node_type] = {"class_type": node_type, "inputs": dict(inputs)}
        work = _work(comfy, prompt, {}, "windows", chain=node_type, family="wan21", steps=6)
        computed_before: set = set()
        skipped = 0
        for evaluation in sorted({e for e, _, _ in work["forward_log"]}):
            now = [(frames, ran) for e, frames, ran in work["forward_log"] if e == evaluation]
            for frames, ran in now:
                assert frames is not None, "every forward covers a window"
                if frames not in computed_before:
                    assert ran == blocks, (schedule, evaluation, frames, ran, "never computed before, yet skipped")
                skipped += ran < blocks
            computed_before |= {frames for frames, ran in now if ran == blocks}
        if level == "whole model":  # a whole-model skip reaches no block: count the forwards that ran instead
            reached = len(work["forward_log"])
            uncached = _work(comfy, {k: v for k, v in prompt.items() if k != node_type}, {}, "windows",
                             family="wan21", steps=6)
            skipped = len(uncached["forward_log"]) - reached
        skipped_somewhere[schedule] = skipped
    assert skipped_somewhere["standard_static"] > 0, skipped_somewhere


@pytest.mark.parametrize("schedule", ["standard_static", "standard_uniform"])
def test_work_saved_on_the_node_is_the_work_counted_at_the_model_under_context_windows(comfy, schedule):
    """The work a run saved is counted forward by forward: under moving windows the one window new to the run runs
    every block while the others skip theirs, and with the Guidance Cache some forwards carry one branch. The share
    the node shows is the share of block rows (blocks times the batch rows they ran on) the model did not run."""
    def block_rows(chain=None):
        prompt = graphs.base("wan21", latent_seed=5)
        prompt["latent"]["inputs"]["batch"] = 9
        prompt["windows"] = graphs.context_windows(context_schedule=schedule, context_length=3, context_overlap=1)
        graphs.count_work(prompt, "wan21", model="windows")
        if chain:
            last = graphs.config(prompt, "method", METHODS["fbcache"][0], **METHODS["fbcache"][2])
            last = graphs.config(prompt, "guidance", "CachedSamplerGuidanceCache", upstream=last, interval=2,
                                 mode="cadence", threshold=0.0, estimate="difference forecast", **WINDOW)
        graphs.sampler(prompt, "CachedSampler", chain=last if chain else None, model="count", steps=8)
        _, ui = comfy.run(prompt)
        return CAPTURED["work"]["block_rows"], ui["sampler"]["cached_sampler"][0]

    uncached, _ = block_rows()
    cached, data = block_rows(chain=True)
    run = data["runs"][0]
    assert run["acted"] and cached < uncached, run
    assert run["work_saved"] == pytest.approx(1 - cached / uncached, abs=1e-4), (run["work_saved"], cached, uncached)


@pytest.mark.parametrize("decider", ["cadence", "dbcache"])
@pytest.mark.parametrize("split", [False, True])
def test_poisoned_branch_cache_never_reaches_the_other_branch(comfy, decider, split):
    """Poison every cached value of the uncond branch. Against the same run without poison, the cond
    predictions must be identical at every step and the uncond ones must differ (so the poison was read)."""
    import dataclasses
    import nodes
    ic = comfy.module("interceptors")
    adapter = comfy.module("adapter")

    @dataclasses.dataclass(frozen=True)
    class PoisonUncond(ic.ReuseLast):
        declaration = ic.ReuseLast.declaration.but(kind="poison", display_name="Poison")

        @dataclasses.dataclass
        class Slot(ic.ReuseLast.Slot):
            branch: int | None = None

        def observe(self, slot, value, sigma):
            slot.value = value * 7.0 + 3.0 if slot.branch == 1 else value

    def tag_branches(run, ev):
        for key, cache in run.caches.branches.items():
            for slot in cache.slots.values():
                slot.branch = key.branch

    def run(estimator):
        first = (ic.FixedCadence(interval=2) if decider == "cadence" else
                 ic.DBCache(front=1, back=1, threshold=50.0, warmup=0.0, max_consecutive_cached=1))
        model = tiny_models.build("flux")
        seen = []

        def cfg_function(args):
            seen.append((args["cond_denoised"].clone(), args["uncond_denoised"].clone()))
            return args["cond"]  # the trajectory depends on the cond branch only

        model.set_model_sampler_cfg_function(cfg_function)
        patched = adapter.install(model, ic.InterceptorChain.of([first, estimator]), on_evaluation=tag_branches)
        if split:
            positive = tiny_models.conditioning("flux", seed=1, length=4)[0]
            negative = tiny_models.conditioning("flux", seed=2, length=77)[1]
        else:
            positive, negative = tiny_models.conditioning("flux", seed=1)
        nodes.common_ksampler(patched, 1, 8, 3.0, "euler", "simple", positive, negative,
                              tiny_models.latent("flux", seed=5))
        return seen

    clean, poisoned = run(ic.ReuseLast()), run(PoisonUncond())
    assert len(clean) == len(poisoned)
    assert all(torch.equal(c[0], p[0]) for c, p in zip(clean, poisoned)), "cond saw the uncond branch's cache"
    assert any(not torch.equal(c[1], p[1]) for c, p in zip(clean, poisoned)), \
        "the poisoned uncond cache was never read: the test would prove nothing"


def test_an_adaptive_step_solver_runs_uncached_and_says_so(comfy):
    """dpm_adaptive picks its steps by error control: skipped work makes it take more steps (the model ran more
    block work while the node claimed a speedup). Caching is switched off for such a run, the output is the
    plain sampler's, and the node says so."""
    prompt = graphs.base("flux", latent_seed=5)
    _work(comfy, prompt, {"sampler_name": "dpm_adaptive"}, "model", family="flux", steps=6)
    reference = CAPTURED["out"].clone()
    prompt = graphs.base("flux", latent_seed=5)
    chain = _chain(prompt, "fbcache", METHODS["fbcache"][2])
    graphs.sampler(prompt, "CachedSampler", chain=chain, steps=6, sampler="dpm_adaptive")
    _, ui = comfy.run(prompt)
    assert torch.equal(CAPTURED["out"], reference)
    run = ui["sampler"]["cached_sampler"][0]["runs"][0]
    assert any("error control" in n for n in run["notes"]), run
    assert run["work_saved"] == 0 and run["computed"] == run["evaluations"] > 0, run


@pytest.mark.parametrize("schedule", ["standard_uniform", "standard_static"])
def test_caches_of_windows_that_moved_away_are_dropped_during_the_run(comfy, schedule):
    """Moving windows cover new frames every step: what was kept for frames no window covered in the last two
    evaluations is dropped while the run goes on (bounded memory over a long video); static windows keep all."""
    import nodes
    adapter, ic = comfy.module("adapter"), comfy.module("interceptors")
    spec = graphs.context_windows(context_schedule=schedule, context_length=3, context_overlap=1)
    windows = nodes.NODE_CLASS_MAPPINGS["ContextWindowsManual"]
    inputs = dict(spec["inputs"], model=tiny_models.build("wan21"))
    model = windows.execute(**inputs)[0] if hasattr(windows, "execute") else windows().patch(**inputs)[0]
    held, used = [], []
    chain = ic.InterceptorChain.of([ic.FixedCadence(interval=2), ic.TaylorSeer(order=1)])
    patched = adapter.install(model, chain, on_evaluation=lambda run, ev: (
        held.append({k.frames for k in run.caches.branches}), used.append({ident[-1] for ident in ev.occurrences})))
    positive, negative = tiny_models.conditioning("wan21", seed=1)
    latent = tiny_models.latent("wan21", seed=5)
    latent = {"samples": latent["samples"].repeat(9, *[1] * (latent["samples"].ndim - 1))}
    nodes.common_ksampler(patched, 1, 8, 3.0, "euler", "simple", positive, negative, latent)
    assert all(None not in f for f in held + used), "every forward belongs to a window"
    for i, cached in enumerate(held):  # kept: only the frames of this evaluation's windows and the two before
        assert cached <= set().union(*used[max(0, i - 2):i + 1]), (i, cached, used[max(0, i - 2):i + 1])
    moved = set().union(*used) != used[0]
    assert moved == (schedule != "standard_static"), used
    if moved:
        assert len(held[-1]) < len(set().union(*held)), "nothing was dropped"


def test_taylorseer_damping_through_the_node_spans_the_published_forecast_to_reuse(comfy):
    """The TaylorSeer node's ``damping`` reaches the forecast: 0 (and a workflow saved without the input) is
    TaylorSeer as published, 1 is order 0's reuse bit for bit, and a damping between gives neither. A node that
    dropped the input, or applied it to the wrong term, fails one of the three."""
    def run(**forecast):
        prompt = graphs.base("flux", latent_seed=5)
        last = graphs.config(prompt, "method", "CachedSamplerFixedCadence", interval=3, **WINDOW)
        last = graphs.config(prompt, "forecast", "CachedSamplerTaylorSeer", upstream=last, **forecast)
        graphs.sampler(prompt, "CachedSampler", chain=last, steps=8)
        comfy.run(prompt)
        return CAPTURED["out"].clone()

    published, reuse = run(order=1), run(order=0)
    assert torch.equal(run(order=1, damping=0.0), published)
    assert torch.equal(run(order=1, damping=1.0), reuse)
    assert torch.equal(run(order=2, damping=1.0), reuse)
    half = run(order=1, damping=0.5)
    assert not torch.equal(half, published) and not torch.equal(half, reuse)
