"""Deciders at the edges real graphs reach, through ComfyUI's executor: conditioning that changes mid-run,
runs that are part of a longer schedule, and what a run leaves behind. Assertions are on work counted at the
model's hooks (forwards and blocks that really ran)."""
import pytest
import torch

from cached_sampler_dev.support import graphs
from cached_sampler_dev.support import methods
from cached_sampler_dev.support import tiny_models
from cached_sampler_dev.support.reachable import tensors_in
from cached_sampler_dev.support.tiny_nodes import CAPTURED

WINDOW = dict(start_percent=0.0, end_percent=1.0)


def _decisions(ui, node="sampler"):
    return [run["decisions"] for run in ui[node]["cached_sampler"][0]["runs"]]


def _count(prompt, node_id, key, family="flux", model="model"):
    graphs.count_work(prompt, family, model=model, key=key, node_id=node_id)
    return node_id


@pytest.mark.parametrize("threshold", [1.0])
def test_prompt_switch_half_way_keeps_adaptive_cache_skipping(comfy, threshold):
    """ConditioningSetTimestepRange switches the positive prompt half way, which gives the cond branch a new
    conditioning entry (a new cache key). One evaluation computes for the new branch; after it, caching goes on."""
    prompt = graphs.base("flux", latent_seed=5)
    prompt["cond2"] = {"class_type": "TestTinyConditioning", "inputs": {"family": "flux", "seed": 9, "length": 4}}
    prompt["first"] = {"class_type": "ConditioningSetTimestepRange",
                       "inputs": {"conditioning": ["cond", 0], "start": 0.0, "end": 0.5}}
    prompt["second"] = {"class_type": "ConditioningSetTimestepRange",
                        "inputs": {"conditioning": ["cond2", 0], "start": 0.5, "end": 1.0}}
    prompt["switch"] = {"class_type": "ConditioningCombine",
                        "inputs": {"conditioning_1": ["first", 0], "conditioning_2": ["second", 0]}}
    _count(prompt, "count", "work")
    chain = graphs.config(prompt, "method", "CachedSamplerAdaptiveCache", threshold=threshold,
                          max_consecutive_cached=-1, **WINDOW)
    node = graphs.sampler(prompt, "CachedSampler", chain=chain, model="count", steps=16, cfg=3.0)
    node["sampler"]["inputs"]["positive"] = ["switch", 0]
    _, ui = comfy.run(prompt)
    (decisions,) = _decisions(ui)
    assert CAPTURED["work"]["forwards"] == decisions.count("c"), (CAPTURED["work"], decisions)
    assert "s" in decisions[:8], f"no skip before the switch: the test would prove nothing ({decisions})"
    assert "s" in decisions[10:-1], f"caching stopped after the prompt switch: {decisions}"


def test_second_stage_decides_as_the_same_steps_of_one_stage(comfy):
    """MagCache's curve and retention are read at each step's place in the whole schedule: the second stage of a
    KSampler (Advanced) split (Wan 2.2 high/low noise) makes the decisions the one-stage run makes at those steps.
    MagCache's state resets on every computed step, so the split is put at a step the one-stage run computes."""
    steps, split = 10, 6
    prompt = graphs.base("flux", latent_seed=5)
    for key in ("one", "hi", "lo"):
        _count(prompt, f"count_{key}", key)
    chain = graphs.config(prompt, "method", "CachedSamplerMagCache", threshold=0.06, K=2, retention_ratio=0.2,
                          model_type="auto", custom_ratios="", **WINDOW)
    stages = {"one": dict(start=0, end=10000), "hi": dict(start=0, end=split, leftover="enable"),
              "lo": dict(start=split, end=10000, add_noise="disable", latent=("hi", 0))}
    for key, kw in stages.items():
        inputs = graphs.advanced_inputs(steps=steps, model=f"count_{key}", **kw)
        inputs["interceptors"] = [chain, 0]
        prompt[key] = {"class_type": "CachedSamplerAdvanced", "inputs": inputs}
        prompt[f"capture_{key}"] = {"class_type": "TestCaptureLatent",
                                    "inputs": {"samples": [key, 0], "key": f"latent_{key}"}}
    _, ui = comfy.run(prompt)
    (one,), (lo,) = _decisions(ui, "one"), _decisions(ui, "lo")
    blocks = sum(tiny_models.block_groups("flux").values())
    assert CAPTURED["lo"]["blocks"] == lo.count("c") * blocks, "decisions and the blocks that ran disagree"
    assert one[split] == "c" and "s" in one[split:], one
    assert lo == one[split:], f"second stage {lo} against the same steps of one stage {one[split:]}"


def _chain_of(comfy, name):
    ic = comfy.module("interceptors")
    return ic.InterceptorChain.of(methods.skipping(ic)[name])


def _sample(comfy, chain, **install):
    """Sample the tiny Flux with ``chain`` installed; returns (latent, the runs)."""
    import nodes
    adapter = comfy.module("adapter")
    runs = []
    patched = adapter.install(tiny_models.build("flux"), chain, on_run_end=lambda run, summary: runs.append(run),
                              **install)
    positive, negative = tiny_models.conditioning("flux", seed=1)
    (latent,) = nodes.common_ksampler(patched, 1, 8, 3.0, "euler", "simple", positive, negative,
                                      tiny_models.latent("flux", seed=5))
    return latent["samples"], runs


@pytest.mark.parametrize("name", methods.NAMES)
def test_nothing_of_a_run_outlives_it(comfy, name):
    """Once a run is over, no tensor is reachable from what it owned: caches, anchors, previous inputs."""
    seen = []
    chain = _chain_of(comfy, name)
    _, runs = _sample(comfy, chain, on_evaluation=lambda run, ev: seen.append(len(tensors_in(run))))
    assert max(seen) > 0, "the run held no tensor while sampling: the test would prove nothing"
    assert methods.skipped_work(runs[0]), "nothing was skipped: the test would prove nothing"
    assert tensors_in(runs[0]) == []


@pytest.mark.parametrize("name", methods.NAMES)
def test_every_kept_tensor_goes_to_the_cache_device(comfy, name, monkeypatch):
    """cache_on_cpu: every tensor a run keeps across evaluations (estimator slots, block residuals, decider anchors)
    is placed by the run's Caches.to_cache. On a CPU-only machine the cache device and the compute device are the
    same, so placement is checked by identity: at the end of every evaluation each tensor the run holds must be one
    that to_cache returned. The result must not change."""
    caches = comfy.module("interceptors.caches")
    placed = set()
    original = caches.Caches.to_cache

    def to_cache(self, value):
        out = original(self, value)
        assert self.cache_device is not None and out.device == self.cache_device
        placed.add(id(out))
        return out

    monkeypatch.setattr(caches.Caches, "to_cache", to_cache)
    strays = []

    def check(run, ev):
        # Deferred reads (the NaN watch's per-row finiteness flags, a rate's sums) are not cached values: they
        # stay on the compute device until the next transfer to the host reads them.
        strays.extend(path for path, tensor in tensors_in(run, with_values=True)
                      if id(tensor) not in placed and not path.startswith("run.lifecycle.deferred"))

    chain = _chain_of(comfy, name)
    on_cpu, runs = _sample(comfy, chain, cache_on_cpu=True, on_evaluation=check)
    assert placed and methods.skipped_work(runs[0])
    assert strays == []
    monkeypatch.setattr(caches.Caches, "to_cache", original)
    on_device, _ = _sample(comfy, chain)
    assert torch.equal(on_cpu, on_device)


def test_a_partial_run_is_placed_in_its_schedule_or_says_it_cannot_be(comfy):
    """denoise 0.5 samples the last 4 steps of an 8-step schedule. Told the schedule (as the Cached Sampler nodes
    do), the run's steps sit at positions 4..7; not told (Apply Interceptors under another sampler), it counts
    from its own first step and notes once that MagCache does."""
    import nodes
    adapter, ic = comfy.module("adapter"), comfy.module("interceptors")
    chain = ic.InterceptorChain.of([ic.MagCache(threshold=100.0, retention=0.0, **WINDOW)])
    positive, negative = tiny_models.conditioning("flux", seed=1)
    for schedule, first in ((ic.schedule_of(4, denoise=0.5), 4), (None, 0)):
        runs, positions = [], []
        patched = adapter.install(tiny_models.build("flux"), chain, schedule=schedule,
                                  on_run_end=lambda run, summary: runs.append(run),
                                  on_evaluation=lambda run, ev: positions.append(ev.position))
        nodes.common_ksampler(patched, 1, 4, 3.0, "euler", "simple", positive, negative,
                              tiny_models.latent("flux", seed=5), denoise=0.5)
        assert positions == [first + i for i in range(4)]
        notes = runs[0].notes
        assert (len(notes), "MagCache" in "".join(notes)) == ((0, False) if schedule else (1, True)), notes


def test_a_run_that_ends_early_under_apply_interceptors_says_so(comfy):
    """KSamplerAdvanced steps 0-4 of 8 with leftover noise (a Wan 2.2 high-noise stage) ends before the end of
    the schedule: not told (Apply Interceptors), its step-counted settings stretch over its own steps, and it
    must say so; told (a Cached Sampler node's schedule), it says nothing."""
    import nodes
    adapter, ic = comfy.module("adapter"), comfy.module("interceptors")
    chain = ic.InterceptorChain.of([ic.MagCache(threshold=100.0, retention=0.0, **WINDOW)])
    positive, negative = tiny_models.conditioning("flux", seed=1)
    for schedule in (ic.schedule_of(8, denoise=1.0), None):
        runs = []
        patched = adapter.install(tiny_models.build("flux"), chain, schedule=schedule,
                                  on_run_end=lambda run, summary: runs.append(run))
        nodes.common_ksampler(patched, 1, 8, 3.0, "euler", "simple", positive, negative,
                              tiny_models.latent("flux", seed=5), start_step=0, last_step=4, force_full_denoise=False)
        assert runs[0].sample_sigmas[-1] > 0, "the stage really ends with noise left"
        notes = runs[0].notes
        if schedule is None:
            assert len(notes) == 1 and "ends before the end of" in notes[0] and "MagCache" in notes[0], notes
        else:
            assert notes == [], notes


@pytest.mark.parametrize("sampler_name", ["euler", "heun"])
def test_the_last_step_forecast_skips_the_last_model_evaluation_and_changes_the_result(comfy, sampler_name):
    """Fixed Cadence with Spectrum's settings (warm-up 3, interval 2, growth 1) over 11 steps computes steps
    0, 1, 2, 4, 7 and 10, the last; with ``last_step`` forecast the last is forecast: one evaluation fewer really
    runs and the result differs. Without the input (a workflow saved before it) the last step is computed. Heun's
    last step is its last two evaluations, both at the last step's sigma (the corrector of the step before it and the
    final Euler step to sigma 0), forecast alike."""
    steps = 11
    prompt = graphs.base("flux", latent_seed=5)
    chains = {}
    for key, extra in (("forecast", {"last_step": "forecast"}), ("compute", {"last_step": "compute"}), ("saved", {})):
        chains[key] = graphs.config(prompt, f"cadence_{key}", "CachedSamplerFixedCadence", interval=2, growth=1.0,
                                    warmup_steps=3, **WINDOW, **extra)
        _count(prompt, f"count_{key}", key)
        graphs.sampler(prompt, key=f"latent_{key}", chain=chains[key], node_id=key, model=f"count_{key}", steps=steps,
                       sampler=sampler_name)
        graphs.config(prompt, f"taylorseer_{key}", "CachedSamplerTaylorSeer", upstream=f"cadence_{key}", order=1)
        prompt[key]["inputs"]["interceptors"] = [f"taylorseer_{key}", 0]
    _, ui = comfy.run(prompt)
    (forecast,), (computed,), (saved,) = (_decisions(ui, key) for key in ("forecast", "compute", "saved"))
    assert saved == computed and computed[-1] == "c", (saved, computed)
    last = 1 if sampler_name == "euler" else 2  # the evaluations at the last step's sigma
    assert forecast[-last:] == "s" * last and forecast[:-last] == computed[:-last], (forecast, computed)
    if sampler_name == "euler":
        assert [i for i, d in enumerate(forecast) if d == "c"] == [0, 1, 2, 4, 7]

    def evaluations_run(key):  # the sampler evaluations (from 1) the model really ran a forward in
        return sorted({entry[0] for entry in CAPTURED[key]["forward_log"]})

    total = CAPTURED["compute"]["evaluations"]
    assert CAPTURED["forecast"]["evaluations"] == total
    assert evaluations_run("compute")[-last:] == list(range(total - last + 1, total + 1))
    assert evaluations_run("forecast") == evaluations_run("compute")[:-last]
    assert CAPTURED["forecast"]["forwards"] < CAPTURED["compute"]["forwards"], CAPTURED
    assert not torch.equal(CAPTURED["latent_forecast"], CAPTURED["latent_compute"])
    assert torch.equal(CAPTURED["latent_saved"], CAPTURED["latent_compute"]), "the default is as before, bit for bit"
