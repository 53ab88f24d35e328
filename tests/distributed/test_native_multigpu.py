"""ComfyUI's native multi-GPU path (its MultiGPU CFG Split node, comfy/multigpu.py): the conds of one evaluation
run on several devices at once, each from a thread of ComfyUI's MultiGPUThreadPool with a model clone of its own,
and every thread reaches the pack's wrappers and block replacements with the same run. Chains whose deciders
decide from the schedule alone decide each evaluation on the sampler's thread before the devices' threads run,
and the threads share the decision; DBCache, First Block Cache and TeaCache are decided by the threads together,
on the measures of all their rows: the same decisions, work and output as on one device, for every method of the
pack. A chain with a decider whose measures the threads cannot join is switched off with a note, and the output is
the uncached multi-GPU run's; so is a run whose threads cannot all meet.

A CPU has one device, so the tests give ComfyUI a second one: ``get_all_torch_devices`` answers ``cpu`` and
``cpu:0``, distinct devices to ComfyUI (dictionary keys, load devices), on which torch computes alike. Everything
else is ComfyUI's own: the MultiGPU CFG Split node deep-clones the model through its loader factory, the sampler
builds the clones and the thread pool, and ``_calc_cond_batch_multigpu`` runs each device's conds from its
thread. What the model computed is counted at the model, per device, under a lock.
"""
from __future__ import annotations

import gc
import logging
import math
import threading

import pytest
import torch

from cached_sampler_dev.support import graphs
from cached_sampler_dev.support import methods
from cached_sampler_dev.support import tiny_models
from cached_sampler_dev.support import tiny_nodes
from cached_sampler_dev.support.tiny_nodes import CAPTURED

FAMILY = "flux"
STEPS = 8
WINDOW = dict(start_percent=0.0, end_percent=1.0)
NOTE = "native multi-GPU"


def _fixed_cadence(prompt):
    chain = graphs.config(prompt, "fc", "CachedSamplerFixedCadence", interval=2, **WINDOW)
    return graphs.config(prompt, "ts", "CachedSamplerTaylorSeer", upstream=chain, order=1)


# Every method of the shared list (tests/support/methods.py), at every level the pack caches at: whole model (APPLY_MODEL),
# blocks (patches_replace), CFG branch (CALC_COND_BATCH).
CHAINS = {name: (lambda prompt, name=name: methods.build(prompt, name)) for name in methods.NAMES}


class ReloadableTinyModel(tiny_nodes.TinyModel):
    """The tiny model with the loader factory ComfyUI's core loaders register (``cached_patcher_init``), from
    which its multi-GPU deep clones load a model of their own."""

    def load(self, family, seed):
        (model,) = super().load(family, seed)
        model.cached_patcher_init = (tiny_models.build, (family, seed))
        return (model,)


class DeviceLog:
    """Logs into ``CAPTURED[key]`` every diffusion-model forward (device, thread, branches) and every block that
    ran (device, batch rows), under a lock: the devices' threads run at once. Registered before any caching, so
    the pack's block replacements chain to its block counters and call them only for blocks that really run."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "key": ("STRING", {"default": "devices"})}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "patch"
    CATEGORY = "testing"

    @classmethod
    def IS_CHANGED(cls, **kwargs):
        return float("nan")

    def patch(self, model, key):
        from comfy.patcher_extension import WrappersMP
        from cached_sampler_dev.devkit.work_nodes import transformer_options_of
        log = CAPTURED[key] = {"forwards": [], "blocks": []}
        lock = threading.Lock()
        m = model.clone()

        def forward(executor, x, *args, **kwargs):
            options = transformer_options_of(args, kwargs)
            with lock:
                log["forwards"].append((str(options.get("multigpu_thread_device")),
                                        threading.current_thread().name, tuple(options.get("cond_or_uncond") or ())))
            return executor(x, *args, **kwargs)

        def block(args, extra):
            device = (args.get("transformer_options") or {}).get("multigpu_thread_device")
            with lock:
                log["blocks"].append((str(device), args["img"].shape[0]))
            return extra["original_block"](args)

        m.add_wrapper_with_key(WrappersMP.DIFFUSION_MODEL, "device_log", forward)
        for name, n in tiny_models.block_groups(FAMILY).items():
            for i in range(n):
                m.set_model_patch_replace(block, "dit", name, i)
        return (m,)


@pytest.fixture
def multigpu(comfy, monkeypatch):
    """The running ComfyUI with a second device for its native multi-GPU path (skipped where it has none)."""
    import comfy.model_management as mm
    import nodes
    if "MultiGPU_WorkUnits" not in nodes.NODE_CLASS_MAPPINGS or not hasattr(mm, "get_all_torch_devices"):
        pytest.skip("this ComfyUI has no native multi-GPU path (comfy/multigpu.py, the MultiGPU CFG Split node)")
    devices = [torch.device("cpu"), torch.device("cpu", 0)]
    monkeypatch.setattr(mm, "get_all_torch_devices", lambda exclude_current=False: list(devices))
    nodes.NODE_CLASS_MAPPINGS["TestReloadableTinyModel"] = ReloadableTinyModel
    nodes.NODE_CLASS_MAPPINGS["TestDeviceLog"] = DeviceLog
    # the change metric each decision compared with its threshold, by evaluation: what the decisions were made on
    decisions = comfy.module("interceptors.decisions").Decisions
    report_metric = decisions.report_metric
    metrics = CAPTURED["metrics"] = []

    def reported(self, decider, ev, value, threshold):
        metrics.append((ev.index, float(value)))
        return report_metric(self, decider, ev, value, threshold)
    monkeypatch.setattr(decisions, "report_metric", reported)
    return comfy


def _prompt(chain=None, order="sampler", multi=True):
    """A prompt sampling the tiny model under MultiGPU CFG Split (``multi``), with ``chain`` on the Cached Sampler
    (``order`` "sampler") or on Apply Interceptors before the MultiGPU node ("apply first")."""
    prompt = graphs.base(FAMILY, latent_seed=5)
    prompt["model"] = {"class_type": "TestReloadableTinyModel", "inputs": {"family": FAMILY, "seed": 0}}
    prompt["log"] = {"class_type": "TestDeviceLog", "inputs": {"model": ["model", 0], "key": "devices"}}
    model = "log"
    node_chain = chain(prompt) if chain is not None else None
    if node_chain is not None and order == "apply first":
        prompt["applied"] = {"class_type": "CachedSamplerApplyInterceptors",
                             "inputs": {"model": [model, 0], "interceptors": [node_chain, 0]}}
        model, node_chain = "applied", None
    if multi:
        prompt["multi"] = {"class_type": "MultiGPU_WorkUnits", "inputs": {"model": [model, 0], "max_gpus": 2}}
        model = "multi"
    graphs.sampler(prompt, "CachedSampler" if node_chain else "KSampler", chain=node_chain, model=model,
                   steps=STEPS)
    return prompt


def _forget_dead_models():
    """Drop ComfyUI's loaded-model entries whose ModelPatcher is gone. MultiGPU CFG Split looks for a clone to
    reuse among ``loaded_models()`` and reads ``.model`` of each, which is None for such an entry (the tests
    build and drop many models): the node would fail for reasons that have nothing to do with the pack. Garbage
    is collected first, so no patcher of an earlier prompt dies during the next one."""
    import comfy.model_management as mm
    gc.collect()
    mm.current_loaded_models[:] = [m for m in mm.current_loaded_models if m.model is not None]


def _sample(comfy, prompt, caplog):
    _forget_dead_models()
    caplog.clear()
    CAPTURED["metrics"].clear()
    with caplog.at_level(logging.WARNING, logger="cached_sampler"):
        _, ui = comfy.run(prompt)
    notes = [r.getMessage() for r in caplog.records if NOTE in r.getMessage()]
    runs = ui.get("sampler", {}).get("cached_sampler", [{}])[0].get("runs", [])
    shown = [n for run in runs for n in run["notes"]]
    log = CAPTURED["devices"]
    work = {"forwards": sorted(log["forwards"]), "blocks": sorted(log["blocks"]),
            "decisions": [run["decisions"] for run in runs], "metrics": sorted(CAPTURED["metrics"])}
    return CAPTURED["out"].clone(), work, notes, shown


def _without_threads(work):
    return {"forwards": sorted((d, b) for d, _, b in work["forwards"]), "blocks": work["blocks"]}


def _scheduled(comfy, name) -> bool:
    """Whether every decider of ``name``'s chain decides from the schedule alone (or is the guidance level's)."""
    ic = comfy.module("interceptors")
    return all(d.signal in (ic.Signal.NONE, ic.Signal.GUIDANCE) for d in ic.InterceptorChain.of(
        methods.skipping(ic)[name]).deciders)


SCHEDULED = ["fixed cadence", "fixed cadence at features + taylorseer", "fixed cadence + taylorseer",
             "fixed cadence + spectrum", "growing cadence + spectrum", "magcache", "guidance cache",
             "guidance cache + fixed cadence", "guidance agreement", "fixed cadence + partial last step + taylorseer"]
# Deciders that measure what the model computes, each device's thread its rows, one decision from all of them
GATHERED = ["dbcache", "dbcache + taylorseer", "fbcache", "teacache", "adaptive", "adaptive at features",
            "verified forecast + taylorseer", "verified blocks + taylorseer"]
SHARED = SCHEDULED + GATHERED


def _problems(comfy, caplog, chain, order, shared=False) -> list[str]:
    """What is wrong with ``chain`` under native multi-GPU. Switched off (``shared`` False): anything the model
    computed differently from the uncached multi-GPU run, a failed prompt, or a missing note. Shared decisions:
    anything that differs from the same chain on one device (decisions, work, output beyond what the devices
    themselves change), or a note. Empty when the pack behaves."""
    reference, ref_work, _, _ = _sample(comfy, _prompt(), caplog)
    # the path really ran: each device computed from a pool thread of its own, one branch each
    threads = {(d, t) for d, t, _ in ref_work["forwards"]}
    assert {d for d, _ in threads} == {"cpu", "cpu:0"} and "MainThread" not in {t for _, t in threads}, threads
    assert len(ref_work["forwards"]) == 2 * STEPS and all(len(b) == 1 for _, _, b in ref_work["forwards"])
    try:
        cached, work, notes, shown = _sample(comfy, _prompt(chain, order), caplog)
    except AssertionError as e:  # the prompt failed
        return [f"the prompt failed: {str(e).splitlines()[0]}"]
    problems = []
    if shared:
        single_ref, _, _, _ = _sample(comfy, _prompt(multi=False), caplog)
        single, single_work, _, _ = _sample(comfy, _prompt(chain, order, multi=False), caplog)
        # ComfyUI's devices compute one branch each where one device batches both: the plain runs already differ
        # in the last bits, and so may the cached ones, within the same order; the decisions may not
        if not torch.allclose(cached, single, rtol=1e-4, atol=1e-4):
            problems.append(f"output differs from the same chain on one device by {(cached - single).abs().max():.3g}"
                            f" (the plain runs: {(reference - single_ref).abs().max():.3g})")
        if work["decisions"] != single_work["decisions"]:
            problems.append(f"decisions {work['decisions']}, on one device {single_work['decisions']}")
        # the measures the decisions were made on: those of all rows (the devices' rows differ in the last bits)
        if [i for i, _ in work["metrics"]] != [i for i, _ in single_work["metrics"]] or not all(
                math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6)
                for (_, a), (_, b) in zip(work["metrics"], single_work["metrics"])):
            problems.append(f"metrics {work['metrics']}, on one device {single_work['metrics']}")
        rows = sum(r for _, r in work["blocks"]), sum(r for _, r in single_work["blocks"])
        if rows[0] != rows[1]:
            problems.append(f"the model ran {rows[0]} block rows, on one device {rows[1]}")
        if rows[0] >= sum(r for _, r in ref_work["blocks"]):
            problems.append("nothing was skipped")
        if notes or (order == "sampler" and shown):
            problems.append(f"notes: {notes} {shown}")
        return problems
    if not torch.equal(cached, reference):
        problems.append(f"output differs from the uncached multi-GPU run by {(cached - reference).abs().max():.3g}")
    if _without_threads(work) != _without_threads(ref_work):
        problems.append(f"the model computed {len(work['forwards'])} forwards and {len(work['blocks'])} blocks, "
                        f"the uncached run {len(ref_work['forwards'])} and {len(ref_work['blocks'])}")
    if len(notes) != 1:
        problems.append(f"the switch-off was logged {len(notes)} times, not once")
    if order == "sampler" and len(shown) != 1:
        problems.append(f"the node shows {len(shown)} multi-GPU notes, not one: {shown}")
    return problems


@pytest.mark.parametrize("order", ["sampler", "apply first"])
@pytest.mark.parametrize("name", list(CHAINS))
def test_caching_under_native_multigpu_shares_the_one_device_decisions(multigpu, caplog, name, order):
    """Every method of the shared list, on the Cached Sampler after MultiGPU CFG Split and on Apply Interceptors
    before it (so ComfyUI's deep clones carry the pack's wrappers). Schedule-decided chains, and those whose measures
    the devices' threads gather (every measuring one), cache: the decisions are taken on the measures of the
    one-device run, the model runs what it runs on one device, and the output is the one-device run's (as far as
    the devices themselves differ)."""
    assert _scheduled(multigpu, name) == (name in SCHEDULED), name
    assert _problems(multigpu, caplog, CHAINS[name], order, shared=name in SHARED) == []


@pytest.mark.parametrize("name", SHARED)
def test_shared_decisions_that_never_skip_are_bit_identical_to_the_uncached_multigpu_run(multigpu, caplog, name):
    reference, ref_work, _, _ = _sample(multigpu, _prompt(), caplog)
    exact, work, notes, shown = _sample(multigpu, _prompt(lambda p: methods.build(p, name, skips=False)), caplog)
    assert torch.equal(exact, reference) and _without_threads(work) == _without_threads(ref_work)
    assert not notes and not shown and work["decisions"] and "s" not in work["decisions"][0]


def test_every_method_of_the_pack_caches_under_native_multigpu():
    assert sorted(SHARED) == sorted(CHAINS)


def _not_gathered(comfy, monkeypatch, name):
    """``name``'s measuring deciders declared as measuring in a way the devices' threads cannot join."""
    ic = comfy.module("interceptors")
    for decider in ic.InterceptorChain.of(methods.skipping(ic)[name]).deciders:
        if decider.signal not in (ic.Signal.NONE, ic.Signal.GUIDANCE):
            cls = type(decider)
            monkeypatch.setattr(cls, "declaration", cls.declaration.but(gathers_over_threads=False))


@pytest.mark.parametrize("order", ["sampler", "apply first"])
@pytest.mark.parametrize("name", ["adaptive", "verified blocks + taylorseer"])
def test_a_measuring_decider_the_threads_cannot_join_switches_the_run_off(multigpu, caplog, monkeypatch, name,
                                                                        order):
    """A decider that does not declare ``gathers_over_threads`` would decide on one device's branch: the run is
    switched off at its first evaluation, with the uncached multi-GPU run's forwards, blocks and latent, said once."""
    _not_gathered(multigpu, monkeypatch, name)
    assert _problems(multigpu, caplog, CHAINS[name], order) == []


@pytest.mark.parametrize("name", ["fixed cadence", "adaptive", "verified forecast + taylorseer"])
def test_a_forward_from_a_device_thread_switches_the_run_off_by_itself(multigpu, caplog, monkeypatch, name):
    """The second line of defence: with the sampler-side detection taken out, the first forward that a device's
    thread runs (``multigpu_thread_device`` in its options) switches the run off, the threads racing to do it
    under the run's lock, before anything was cached: the same equality, and the note said once."""
    monkeypatch.setattr(multigpu.module("adapter.conflicts"), "native_multigpu", lambda model_options: False)
    assert _problems(multigpu, caplog, CHAINS[name], "sampler") == []


@pytest.mark.parametrize("name", list(CHAINS))
def test_the_same_chains_skip_on_one_device(multigpu, caplog, name):
    """Without MultiGPU CFG Split the same chains do skip model work and change the output: the equality above is
    the switch-off's doing, not chains too mild to act."""
    reference, ref_work, _, _ = _sample(multigpu, _prompt(multi=False), caplog)
    cached, work, notes, _ = _sample(multigpu, _prompt(CHAINS[name], multi=False), caplog)
    assert not notes
    assert sum(rows for _, rows in work["blocks"]) < sum(rows for _, rows in ref_work["blocks"])
    assert not torch.equal(cached, reference)


def test_the_check_fails_when_the_decisions_are_not_shared(multigpu, caplog, monkeypatch):
    """The shared check can fail: with the sharing taken out of the adapter, the devices' threads switch the run off
    (the pack of before), and the check finds the notes and nothing skipped."""
    monkeypatch.setattr(multigpu.module("adapter.conflicts"), "share_decisions", lambda run, model_options: None)
    problems = _problems(multigpu, caplog, _fixed_cadence, "sampler", shared=True)
    assert any("notes" in p for p in problems) and any("nothing was skipped" in p for p in problems), problems


@pytest.mark.parametrize("miscount", ["one thread too many", "unknown"])
@pytest.mark.parametrize("name", GATHERED)
def test_a_device_thread_missing_from_the_gathering_computes_in_full_with_a_note(multigpu, caplog, monkeypatch,
                                                                                 name, miscount):
    """No hang where the devices' threads of a step cannot all meet: told one thread more than ComfyUI starts (the
    one missing never comes), the threads wait their bound, then the run is switched off at its first measured
    decision, before anything was skipped; told nothing (a count that cannot be known), it is switched off there
    at once. Either way every forward and block of the uncached multi-GPU run, the latent bit-identical, said once."""
    conflicts = multigpu.module("adapter.conflicts")
    counted = conflicts.multigpu_threads
    monkeypatch.setenv("CACHED_SAMPLER_THREAD_WAIT", "0.5")
    monkeypatch.setattr(conflicts, "multigpu_threads", (lambda *args: counted(*args) + 1) if miscount != "unknown"
                        else (lambda *args: None))
    assert _problems(multigpu, caplog, CHAINS[name], "sampler") == []


# The Verified Forecast decides on the model input's change alone, the same latent in every CFG branch: one
# branch's measure is all rows' (what it learns after a computed step is checked by the test after this one)
@pytest.mark.parametrize("name", [n for n in GATHERED if n != "verified forecast + taylorseer"])
def test_the_gathered_check_fails_where_each_thread_decides_on_its_own_rows(multigpu, caplog, monkeypatch, name):
    """The shared check can fail for the measuring deciders too: told that every step runs on one device's thread,
    each thread decides from its own branch, whichever comes first (the other follows it), and the measures
    the decisions were made on differ from the one-device run's."""
    monkeypatch.setattr(multigpu.module("adapter.conflicts"), "multigpu_threads", lambda *args: 1)
    problems = _problems(multigpu, caplog, CHAINS[name], "sampler", shared=True)
    assert any(p.startswith("metrics") for p in problems), problems


@pytest.mark.parametrize("name", ["adaptive", "verified forecast + taylorseer"])
def test_the_gathered_check_fails_where_one_thread_learns_from_a_computed_step(multigpu, caplog, monkeypatch, name):
    """Adaptive Cache's rate and the Verified Forecast's error are learnt after a computed step, on one device by its
    first forward: with only the first forward of each evaluation measuring there (one device's branch, the pack
    of before), the measures the decisions were made on differ from the one-device run's."""
    after = multigpu.module("interceptors.threads").AfterComputed

    def first_forward_only(self, run, ev_index):
        if self.index == ev_index:
            return False
        self.index, self.parts = ev_index, []
        return True
    monkeypatch.setattr(after, "admit", first_forward_only)
    problems = _problems(multigpu, caplog, CHAINS[name], "sampler", shared=True)
    assert any(p.startswith("metrics") for p in problems), problems


def _two_positive_entries(prompt):
    """The positive made of two conditioning entries (ConditioningCombine): three entries a step, which ComfyUI's
    scheduler puts two on one device and one on the other."""
    prompt["cond2"] = {"class_type": "TestTinyConditioning", "inputs": {"family": FAMILY, "seed": 2, "length": 4}}
    prompt["combined"] = {"class_type": "ConditioningCombine",
                          "inputs": {"conditioning_1": ["cond", 0], "conditioning_2": ["cond2", 0]}}
    prompt["sampler"]["inputs"]["positive"] = ["combined", 0]
    return prompt


@pytest.mark.parametrize("name", ["dbcache", "teacache", "adaptive", "verified blocks + taylorseer"])
def test_uneven_rows_per_device_gather_into_the_one_device_decisions(multigpu, caplog, name):
    """Three conditioning entries on two devices (two rows on one, one on the other): the pack counts the threads
    the way ComfyUI schedules them (a miscount would wait and switch off with a note), and the decisions are taken
    on the measure of all three rows, as on one device."""
    _, ref_work, _, _ = _sample(multigpu, _two_positive_entries(_prompt()), caplog)
    assert sorted((d, len(b)) for d, _, b in ref_work["forwards"]) == [("cpu", 2)] * STEPS + [("cpu:0", 1)] * STEPS
    cached, work, notes, shown = _sample(multigpu, _two_positive_entries(_prompt(CHAINS[name])), caplog)
    single, single_work, _, _ = _sample(multigpu, _two_positive_entries(_prompt(CHAINS[name], multi=False)), caplog)
    assert not notes and not shown
    assert work["decisions"] == single_work["decisions"] and "s" in work["decisions"][0]
    pairs = list(zip(work["metrics"], single_work["metrics"]))
    assert [i for i, _ in work["metrics"]] == [i for i, _ in single_work["metrics"]] and all(
        math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6) for (_, a), (_, b) in pairs)
    assert sum(r for _, r in work["blocks"]) == sum(r for _, r in single_work["blocks"])
    assert torch.allclose(cached, single, rtol=1e-4, atol=1e-4)
