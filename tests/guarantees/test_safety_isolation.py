"""Isolation: what one sampling run learns never reaches another run, whatever ComfyUI does around it.

* The interleave gate: two runs on the same patched model, driven step by step in alternation, equal the
  same two runs one after the other; an interceptor that keeps its cache in a module global fails it.
* One config node feeding several samplers, the same prompt queued again, A/B/A prompts, a changed model
  (LoRA, another model, another latent size or dtype), an interrupted prompt, and 50 prompts in a row.
"""
from __future__ import annotations

import copy
import dataclasses
import gc
import os
import re
import threading

import pytest
import torch

from cached_sampler_dev.support import graphs
from cached_sampler_dev.support import methods
from cached_sampler_dev.support import tiny_models
from cached_sampler_dev.support.tiny_nodes import CAPTURED

STEPS = 8


# ------------------------------------------------------------------------------------------- helpers --

def pack(comfy):
    return comfy.module("adapter"), comfy.module("interceptors")


def live(type_name: str) -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o).__name__ == type_name)


def execute(comfy, prompt, executor=None):
    """Run a fresh copy of ``prompt`` (as the server does: every queued prompt is a new JSON object).
    Returns (captured latents, ui outputs, progress texts, names of nodes the executor took from its cache)."""
    for key in [k for k in CAPTURED if not k.startswith("_")]:
        if torch.is_tensor(CAPTURED[key]):
            del CAPTURED[key]
    ex, ui = comfy.run(copy.deepcopy(prompt), executor=executor)
    cached = [n for event, data in ex.status_messages if event == "execution_cached" for n in data["nodes"]]
    latents = {k: v.clone() for k, v in CAPTURED.items() if torch.is_tensor(v)}
    return latents, ui, [(node, untimed(text)) for node, text in comfy.server.progress_texts], cached


def untimed(text: str) -> str:
    """A summary without its wall-clock timings (the only part that may differ between equal runs)."""
    return re.sub(r"\d+(\.\d+)? ?(s|ms)\b(?! ?steps)", "<time>", re.sub(r"took \S+ \w+", "took <time>", text))


def summary(ui, node="sampler") -> str:
    return untimed(ui[node]["text"][0])


def skipped_some(ui, node="sampler") -> bool:
    """True when a sampler's UI output says caching skipped model work in one of its runs (fewer evaluations computed
    than seen, or work saved): the numbers the node sends with its summary."""
    runs = ui[node]["cached_sampler"][0]["runs"]
    return any(r["computed"] < r["evaluations"] or r["work_saved"] > 0 for r in runs)


def dbcache(prompt, node_id="db", upstream=None, threshold=1.0):
    # threshold 1.0 with no warmup skips 5 of 8 steps on the tiny Flux (its blocks change a lot per step)
    return graphs.config(prompt, node_id, "CachedSamplerDBCache", upstream=upstream, Fn=1, Bn=0, threshold=threshold,
                         warmup=0.0, max_cached_steps=-1, max_consecutive_cached=3, start_percent=0.0,
                         end_percent=1.0)


def cadence(prompt, node_id="fc", upstream=None, interval=2):
    return graphs.config(prompt, node_id, "CachedSamplerFixedCadence", upstream=upstream, interval=interval,
                         start_percent=0.0, end_percent=1.0)


def adaptive(prompt, node_id="ad", upstream=None):
    return graphs.config(prompt, node_id, "CachedSamplerAdaptiveCache", upstream=upstream, threshold=2.0,
                         max_consecutive_cached=-1, start_percent=0.0, end_percent=1.0)


def cadence_taylor(prompt):
    return graphs.config(prompt, "ts", "CachedSamplerTaylorSeer", upstream=cadence(prompt, interval=3), order=1)


CHAINS = {"dbcache": dbcache, "fixed_cadence": cadence, "adaptive": adaptive, "cadence+taylorseer": cadence_taylor}


# ------------------------------------------------------------------------------ the interleave gate --

class Baton:
    """Cooperative scheduling of sampling threads: only the holder runs; the holder hands the baton on after
    each sampler evaluation (a PREDICT_NOISE wrapper), so runs alternate A, B, A, B, ... one step at a time
    and never execute concurrently (ComfyUI's model objects are not meant for concurrent use)."""

    def __init__(self, names):
        self.order = list(names)
        self.active = set(names)
        self.holder = self.order[0] if self.order else None
        self.cv = threading.Condition()
        self.log: list[str] = []

    def _next(self, me):
        i = self.order.index(me)
        for name in self.order[i + 1:] + self.order[:i + 1]:
            if name in self.active:
                return name
        return None

    def take(self, me):
        with self.cv:
            self.cv.wait_for(lambda: self.holder == me)

    def hand_on(self, me):
        with self.cv:
            self.holder = self._next(me)
            self.cv.notify_all()
            self.cv.wait_for(lambda: self.holder == me)

    def leave(self, me):
        with self.cv:
            self.active.discard(me)
            self.holder = self._next(me) if self.active else None
            self.cv.notify_all()

    def wrapper(self, executor, *args, **kwargs):
        me = threading.current_thread().name
        if me not in self.order:
            return executor(*args, **kwargs)
        try:
            return executor(*args, **kwargs)
        finally:
            self.log.append(me)
            self.hand_on(me)


def sample(model, seed, cfg, latent_seed):
    import nodes
    pos, neg = tiny_models.conditioning("flux")
    latent = tiny_models.latent("flux", seed=latent_seed)
    return nodes.common_ksampler(model, seed, STEPS, cfg, "euler", "simple", pos, neg, latent)[0]["samples"]


def run_jobs(model, jobs, interleave: bool):
    """Sample every job on ``model``: one after the other, or in two threads alternating step by step."""
    import comfy.patcher_extension
    import comfy.utils
    baton = Baton([name for name, _ in jobs] if interleave else [])
    gated = model.clone()
    gated.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.PREDICT_NOISE, "test_baton", baton.wrapper)
    results, errors = {}, []
    progress = comfy.utils.PROGRESS_BAR_ENABLED
    comfy.utils.PROGRESS_BAR_ENABLED = False

    def work(name, job):
        try:
            if interleave:
                baton.take(name)
            results[name] = sample(gated, **job)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append((name, e))
        finally:
            if interleave:
                baton.leave(name)

    try:
        if interleave:
            threads = [threading.Thread(target=work, name=name, args=(name, job), daemon=True) for name, job in jobs]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=120)
            assert not any(t.is_alive() for t in threads), "interleaved runs hung"
        else:
            for name, job in jobs:
                work(name, job)
    finally:
        comfy.utils.PROGRESS_BAR_ENABLED = progress
    assert not errors, errors
    return results, baton.log


JOBS = [("A", dict(seed=1, latent_seed=None)), ("B", dict(seed=2, latent_seed=7))]


def interleave_gate(model, chain, adapter, cfg):
    """(sequential results, interleaved results, alternation log, run summaries)."""
    summaries = []
    patched = adapter.install(model, chain, on_run_end=lambda run, s: summaries.append(s))
    jobs = [(name, dict(job, cfg=cfg)) for name, job in JOBS]
    sequential, _ = run_jobs(patched, jobs, interleave=False)
    interleaved, log = run_jobs(patched, jobs, interleave=True)
    return sequential, interleaved, log, summaries


@pytest.mark.parametrize("name", methods.NAMES)
@pytest.mark.parametrize("cfg", [3.0, 1.0])
def test_interleave_gate_two_runs_alternating_step_by_step_equal_sequential_runs(comfy, name, cfg):
    if cfg == 1.0 and name in methods.NEGATIVE_BRANCH_ONLY:
        pytest.skip("at cfg 1 ComfyUI runs no negative branch: this method has nothing to skip")
    adapter, ic = pack(comfy)
    model = tiny_models.build("flux")
    chain = ic.InterceptorChain.of(methods.skipping(ic)[name])
    runs = []
    patched = adapter.install(model, chain, on_run_end=lambda run, s: runs.append((run, s)))
    jobs = [(job_name, dict(job, cfg=cfg)) for job_name, job in JOBS]
    sequential, _ = run_jobs(patched, jobs, interleave=False)
    interleaved, log = run_jobs(patched, jobs, interleave=True)
    summaries = [s for _, s in runs]
    # the runs really alternated one evaluation at a time ...
    assert log[:2 * STEPS] == ["A", "B"] * STEPS, log
    # ... really cached (every one of the four runs skipped work) ...
    assert len(runs) == 4 and all(methods.skipped_work(run) for run, _ in runs), [s.text() for s in summaries]
    # ... and the two runs differ from each other, so reading the other's cache would show
    assert not torch.equal(sequential["A"], sequential["B"])
    for job in ("A", "B"):
        assert torch.equal(sequential[job], interleaved[job]), (name, cfg, job)
    assert [s.text() for s in summaries[:2]] == [s.text() for s in summaries[2:]]


_MODULE_CACHE: dict = {}  # what the deliberately broken interceptor below keeps its cache in


def module_global_reuse(ic):
    """An estimator written the wrong way: it keeps the last value in a module-level dict instead of the
    run's slot, so every run on the process shares one cache."""

    @dataclasses.dataclass(frozen=True)
    class ModuleGlobalReuse(ic.Estimator):
        declaration = ic.Estimator.declaration.but(
            kind="test_module_global_reuse",
            display_name="Module-global reuse (deliberately broken)",
        )

        @dataclasses.dataclass
        class Slot:
            seen: bool = False

        def observe(self, slot, value, sigma):
            _MODULE_CACHE["value"] = value
            slot.seen = True

        def ready(self, slot):
            return "value" in _MODULE_CACHE

        def estimate(self, slot, sigma, device):
            return _MODULE_CACHE["value"].to(device)

    return ModuleGlobalReuse()


def test_interleave_gate_fails_for_a_module_global_interceptor(comfy):
    """The gate can fail: the same check catches an interceptor that keeps state outside LoopState."""
    adapter, ic = pack(comfy)
    model = tiny_models.build("flux")
    # cfg 1: one branch per run, so the broken estimator is only wrong when runs interleave
    good = ic.InterceptorChain.of([ic.FixedCadence(interval=2)])
    bad = ic.InterceptorChain.of([ic.FixedCadence(interval=2), module_global_reuse(ic)])
    good_seq, good_inter, _, _ = interleave_gate(model, good, adapter, cfg=1.0)
    bad_seq, bad_inter, log, summaries = interleave_gate(model, bad, adapter, cfg=1.0)
    assert log[:2 * STEPS] == ["A", "B"] * STEPS
    assert all(s.evaluations_skipped > 0 for s in summaries)
    # run one after the other, the broken estimator happens to give the right answer ...
    assert torch.equal(bad_seq["A"], good_seq["A"]) and torch.equal(bad_seq["B"], good_seq["B"])
    # ... interleaved, A's skipped steps read what B computed just before, and the gate sees it (B's skipped
    # steps follow A's skipped steps, which write nothing, so B happens to read its own value)
    assert not torch.equal(bad_seq["A"], bad_inter["A"])
    assert torch.equal(good_seq["A"], good_inter["A"]) and torch.equal(good_seq["B"], good_inter["B"])


# ---------------------------------------------------------------------- one config, many samplers --

def two_family_base(prompt, family, suffix, model_seed=0):
    prompt[f"model{suffix}"] = {"class_type": "TestTinyModel", "inputs": {"family": family, "seed": model_seed}}
    prompt[f"cond{suffix}"] = {"class_type": "TestTinyConditioning", "inputs": {"family": family, "seed": 1,
                                                                                 "length": 4}}
    prompt[f"latent{suffix}"] = {"class_type": "TestTinyLatent", "inputs": {"family": family, "batch": 1,
                                                                             "seed": -1}}


def add_sampler(prompt, node_id, chain, suffix="", seed=42, steps=STEPS, cfg=3.0, node_type="CachedSampler"):
    inputs = graphs.ksampler_inputs(steps=steps, cfg=cfg, seed=seed, model=f"model{suffix}")
    inputs.update(positive=[f"cond{suffix}", 0], negative=[f"cond{suffix}", 1], latent_image=[f"latent{suffix}", 0])
    if chain is not None:
        inputs["interceptors"] = [chain, 0]
    prompt[node_id] = {"class_type": node_type, "inputs": inputs}
    prompt[f"capture_{node_id}"] = {"class_type": "TestCaptureLatent", "inputs": {"samples": [node_id, 0],
                                                                                   "key": node_id}}


SAMPLERS = {  # node id -> (family, model seed, sampler seed)
    "s_flux_a": ("flux", 0, 1),
    "s_flux_b": ("flux", 0, 2),
    "s_flux_other_weights": ("flux", 3, 1),
    "s_wan": ("wan21", 0, 1),
}


def multi_sampler_prompt(make_chain, only=None):
    prompt = {}
    chain = make_chain(prompt)
    for node_id, (family, model_seed, seed) in SAMPLERS.items():
        if only is not None and node_id != only:
            continue
        suffix = f"_{family}_{model_seed}"
        if f"model{suffix}" not in prompt:
            two_family_base(prompt, family, suffix, model_seed)
        add_sampler(prompt, node_id, chain, suffix=suffix, seed=seed)
    return prompt


def shared(name):
    """The config nodes of the shared list's method ``name`` (tests/support/methods.py), with settings that skip."""
    return lambda prompt: methods.build(prompt, name)


@pytest.mark.parametrize("chain", methods.NAMES)
def test_one_config_node_feeding_several_samplers_equals_each_run_alone(comfy, chain):
    together, ui, _, _ = execute(comfy, multi_sampler_prompt(shared(chain)), comfy.executor(cache=False))
    for node_id in SAMPLERS:
        alone, ui_alone, _, _ = execute(comfy, multi_sampler_prompt(shared(chain), only=node_id),
                                        comfy.executor(cache=False))
        assert torch.equal(together[node_id], alone[node_id]), (chain, node_id)
        assert summary(ui, node_id) == summary(ui_alone, node_id)
        assert skipped_some(ui, node_id), summary(ui, node_id)
    assert not torch.equal(together["s_flux_a"], together["s_flux_b"])


def test_one_apply_interceptors_output_feeding_two_samplers_equals_each_run_alone(comfy):
    def prompt_for(seeds):
        prompt = graphs.base("flux")
        graphs.count_work(prompt, "flux")
        prompt["applied"] = {"class_type": "CachedSamplerApplyInterceptors",
                             "inputs": {"model": ["count", 0], "interceptors": [dbcache(prompt), 0]}}
        for seed in seeds:
            graphs.sampler(prompt, "KSampler", key=f"k{seed}", node_id=f"k{seed}", model="applied", seed=seed,
                           steps=STEPS)
        return prompt

    together, _, _, _ = execute(comfy, prompt_for([1, 2]), comfy.executor(cache=False))
    for seed in (1, 2):
        alone, _, _, _ = execute(comfy, prompt_for([seed]), comfy.executor(cache=False))
        assert torch.equal(together[f"k{seed}"], alone[f"k{seed}"]), seed
        assert CAPTURED["work"]["blocks"] < 4 * STEPS, "the middle blocks were skipped on some steps"
    assert not torch.equal(together["k1"], together["k2"])


# ------------------------------------------------------------------ the same prompt, queued again --

def rerun_prompt(make_chain, seed=42, steps=STEPS):
    """A Cached Sampler whose latent passes a node that re-runs on every prompt: the sampler re-runs, while
    the model, conditioning and config nodes come from the executor's cache as in a real ComfyUI."""
    prompt = graphs.base("flux")
    chain = make_chain(prompt)
    prompt["pass"] = {"class_type": "TestPassLatent", "inputs": {"samples": ["latent", 0]}}
    graphs.sampler(prompt, "CachedSampler", chain=chain, seed=seed, steps=steps)
    prompt["sampler"]["inputs"]["latent_image"] = ["pass", 0]
    return prompt, chain


@pytest.mark.parametrize("chain", methods.NAMES)
def test_same_prompt_twice_and_a_b_a_give_identical_latents_and_decisions(comfy, chain):
    ex = comfy.executor(cache=True)
    prompt_a, config = rerun_prompt(shared(chain), seed=1)
    prompt_b, _ = rerun_prompt(shared(chain), seed=2)
    runs = []
    for prompt in (prompt_a, prompt_a, prompt_b, prompt_a):
        runs.append(execute(comfy, prompt, ex))
    (a1, ui1, steps1, _), (a2, ui2, steps2, cached2), (b, ui_b, _, cached_b), (a3, ui3, steps3, cached3) = runs
    # the config node's output was reused across prompts, and the sampler really ran again each time
    for cached in (cached2, cached_b, cached3):
        assert config in cached and "model" in cached and "sampler" not in cached, cached
    assert steps1 and steps1 == steps2 == steps3, "same per-step decisions (the node's live progress text)"
    assert summary(ui1) == summary(ui2) == summary(ui3)
    assert skipped_some(ui1), summary(ui1)
    assert torch.equal(a1["out"], a2["out"]) and torch.equal(a1["out"], a3["out"])
    assert not torch.equal(a1["out"], b["out"])
    # and the reused results equal a run on an executor that has never seen the pack
    fresh, ui_fresh, steps_fresh, _ = execute(comfy, prompt_a, comfy.executor(cache=False))
    assert torch.equal(fresh["out"], a3["out"]) and steps_fresh == steps3 and summary(ui_fresh) == summary(ui3)


# ----------------------------------------------------------------- the model changes between runs --

def variant_prompt(make_chain, variant):
    """The same sampler and config node on a changed model, latent or dtype."""
    prompt = graphs.base("wan21" if variant == "another family" else "flux")
    chain = make_chain(prompt)
    model = "model"
    if variant.startswith("lora"):
        strength = {"lora": 1.0, "lora half": 0.5, "lora on the probe": 1.0}[variant]
        target = "double_blocks.0." if variant == "lora on the probe" else "single_blocks.0."
        prompt["lora"] = {"class_type": "TestLoraPatch", "inputs": {"model": ["model", 0], "strength": strength,
                                                                   "target": target, "seed": 5}}
        model = "lora"
    elif variant == "another model":
        prompt["model"]["inputs"]["seed"] = 4
    elif variant == "bfloat16 model":
        prompt["model"] = {"class_type": "TestTinyModelDtype", "inputs": {"family": "flux", "seed": 0,
                                                                         "dtype": "bfloat16"}}
    graphs.sampler(prompt, "CachedSampler", chain=chain, model=model, steps=STEPS)
    if variant in ("bigger latent", "float64 latent"):
        prompt["sized"] = {"class_type": "TestTinyLatentSized", "inputs": {
            "family": "flux", "size": 24 if variant == "bigger latent" else 16, "batch": 1, "seed": 3,
            "dtype": "float64" if variant == "float64 latent" else "float32"}}
        prompt["sampler"]["inputs"]["latent_image"] = ["sized", 0]
    return prompt, chain


VARIANTS = ["base", "lora", "lora half", "lora on the probe", "another model", "another family", "bigger latent",
            "float64 latent", "bfloat16 model", "base"]


@pytest.mark.parametrize("chain", methods.NAMES)
def test_changing_the_model_between_runs_never_reuses_a_stale_cache(comfy, chain):
    ex = comfy.executor(cache=True)
    seen = {}
    for i, variant in enumerate(VARIANTS):
        prompt, config = variant_prompt(shared(chain), variant)
        got, ui, steps, cached = execute(comfy, prompt, ex)
        fresh, ui_fresh, steps_fresh, _ = execute(comfy, prompt, comfy.executor(cache=False))
        assert torch.equal(got["out"], fresh["out"]), (chain, variant)
        assert steps == steps_fresh and summary(ui) == summary(ui_fresh), (chain, variant)
        assert torch.isfinite(got["out"]).all()
        if variant == "base" and variant in seen:
            assert torch.equal(seen[variant], got["out"])
        if i > 0:
            assert config in cached, "the config node's output is reused across the changes"
        assert skipped_some(ui), (variant, summary(ui))
        seen[variant] = got["out"]
    # every change mattered, so a stale cache would have shown
    assert not torch.equal(seen["base"], seen["lora"]) and not torch.equal(seen["lora"], seen["lora half"])
    assert not torch.equal(seen["base"], seen["lora on the probe"])
    assert not torch.equal(seen["base"], seen["another model"])
    assert seen["bigger latent"].shape != seen["base"].shape


# ---------------------------------------------------------------------------------- interruption --

INTERRUPTS = {
    # name: (chain, forward at which to interrupt, block group, block index (-1: before the forward))
    "dbcache, inside a cached segment on a computed step": ("dbcache", 4, "single_block", 0),
    "dbcache, in the probe on a skipped step": ("dbcache", 2, "double_block", 0),
    "fixed cadence, before a forward": ("fixed_cadence", 2, "single_block", -1),
    "taylorseer, inside the last block": ("cadence+taylorseer", 3, "single_block", 1),
    # every method of the shared list: before a forward, and inside the first block of a computed forward after
    # the first (at None: found from the clean run's decisions; one batched forward per evaluation here)
    **{f"{name}, {where}": (name, at, group, block) for name in methods.NAMES
       for where, at, group, block in (("before a forward", 2, "single_block", -1),
                                        ("inside a computed forward's first block", None, "double_block", 0))},
}


def interrupt_prompt(make_chain, at=-1, group="single_block", block=-1):
    prompt = graphs.base("flux")
    chain = make_chain(prompt)
    prompt["interrupt"] = {"class_type": "TestInterruptAt", "inputs": {
        "model": ["model", 0], "family": "flux", "at": at, "group": group, "block": block}}
    graphs.sampler(prompt, "CachedSampler", chain=chain, model="interrupt", steps=STEPS)
    return prompt


@pytest.mark.parametrize("case", list(INTERRUPTS))
def test_interrupting_mid_sampling_leaves_nothing_behind(comfy, case):
    import comfy.model_management as model_management
    chain, at, group, block = INTERRUPTS[case]
    make_chain = CHAINS[chain] if chain in CHAINS else shared(chain)
    clean = interrupt_prompt(make_chain)
    reference, ui_ref, steps_ref, _ = execute(comfy, clean, comfy.executor(cache=False))
    assert skipped_some(ui_ref), summary(ui_ref)
    if at is None:
        decisions = ui_ref["sampler"]["cached_sampler"][0]["runs"][0]["decisions"]
        at = next(i for i, d in enumerate(decisions) if i > 0 and d == "c")

    ex = comfy.executor(cache=True)
    execute(comfy, clean, ex)  # the executor has run this prompt before: its nodes are cached
    states_before = live("LoopState")
    _, result = comfy.run(copy.deepcopy(interrupt_prompt(make_chain, at, group, block)), executor=ex,
                          expect_error=True)
    assert CAPTURED["interrupt_fired"], "the interrupt happened inside sampling"
    assert any(event == "execution_interrupted" for event, _ in ex.status_messages), ex.status_messages
    assert not model_management.processing_interrupted()
    assert live("LoopState") == states_before == 0, "a run's state outlived its interrupted run"

    again, ui, steps, _ = execute(comfy, clean, ex)
    assert torch.equal(again["out"], reference["out"]), case
    assert steps == steps_ref and summary(ui) == summary(ui_ref)


# ---------------------------------------------------------------------------------------- memory --

def rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


def live_tensors() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if torch.is_tensor(o))


def dbcache_taylor(prompt):
    return graphs.config(prompt, "ts", "CachedSamplerTaylorSeer", upstream=dbcache(prompt), order=2)


@pytest.mark.slow
def test_no_memory_growth_across_50_prompts_with_caching_that_skips(comfy):
    ex = comfy.executor(cache=True)
    counts, rss = [], []
    texts, skipped = set(), []
    for i in range(50):
        prompt, _ = rerun_prompt(dbcache_taylor, seed=i % 3)
        _, ui, _, _ = execute(comfy, prompt, ex)
        texts.add(summary(ui))
        skipped.append(skipped_some(ui))
        if i in (9, 29, 49):
            counts.append(live_tensors())
            rss.append(rss_bytes())
            assert live("LoopState") == 0
    assert all(skipped), texts
    assert counts[2] <= counts[0] + 8, f"live tensors grew across prompts: {counts}"
    if rss[0] is not None:
        assert rss[2] - rss[0] < 64 * 2 ** 20, f"RSS grew by {(rss[2] - rss[0]) / 2 ** 20:.1f} MiB over 40 prompts"
