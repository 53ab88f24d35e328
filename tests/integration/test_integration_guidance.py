"""Guidance Cache through ComfyUI's executor: rows really left out at the model, and every consumer of the two
CFG predictions still right (cfg 1, several positive and area conds, CFGNorm / APG / Skip Layer Guidance,
second-order samplers, context windows, other guiders)."""
import dataclasses

import pytest
import torch

from cached_sampler_dev.support import graphs
from cached_sampler_dev.support import tiny_models
from cached_sampler_dev.support.tiny_nodes import CAPTURED

WINDOW = dict(start_percent=0.0, end_percent=1.0)
NEVER = dict(interval=1, mode="cadence", threshold=0.0, estimate="difference", **WINDOW)
MODERATE = dict(NEVER, interval=2)


def _prompt(family="flux", case=None, batch=1):
    prompt = graphs.base(family, batch=batch, latent_seed=5)
    model, positive = "model", ["cond", 0]
    if case == "multi_positive":
        prompt["cond2"] = {"class_type": "TestTinyConditioning", "inputs": {"family": family, "seed": 9, "length": 4}}
        prompt["combined"] = {"class_type": "ConditioningCombine",
                              "inputs": {"conditioning_1": ["cond", 0], "conditioning_2": ["cond2", 0]}}
        positive = ["combined", 0]
    if case == "area":
        prompt["area"] = {"class_type": "ConditioningSetArea", "inputs": {
            "conditioning": ["cond", 0], "width": 64, "height": 64, "x": 0, "y": 0, "strength": 1.0}}
        prompt["combined"] = {"class_type": "ConditioningCombine",
                              "inputs": {"conditioning_1": ["cond", 0], "conditioning_2": ["area", 0]}}
        positive = ["combined", 0]
    if case == "CFGNorm":
        prompt["patch"] = {"class_type": "CFGNorm", "inputs": {"model": ["model", 0], "strength": 1.0}}
        model = "patch"
    if case == "APG":
        prompt["patch"] = {"class_type": "APG", "inputs": {"model": ["model", 0], "eta": 1.0, "norm_threshold": 5.0,
                                                           "momentum": -0.5}}
        model = "patch"
    if case in ("SLG", "SLG simple"):
        inputs = {"model": ["model", 0], "double_layers": "1", "single_layers": "", "start_percent": 0.0,
                  "end_percent": 1.0}
        if case == "SLG":
            inputs.update(scale=3.0, rescaling_scale=0.0)
        prompt["patch"] = {"class_type": "SkipLayerGuidanceDiT" if case == "SLG" else "SkipLayerGuidanceDiTSimple",
                           "inputs": inputs}
        model = "patch"
    graphs.count_work(prompt, family, model=model)
    return prompt, positive


def _run(comfy, guidance=None, case=None, family="flux", cadence=None, steps=8, cfg=3.0, sampler="euler", batch=1):
    prompt, positive = _prompt(family, case, batch)
    chain = None
    if cadence is not None:
        chain = graphs.config(prompt, "fc", "CachedSamplerFixedCadence", interval=cadence, **WINDOW)
        chain = graphs.config(prompt, "ts", "CachedSamplerTaylorSeer", upstream=chain, order=1)
    if guidance is not None:
        chain = graphs.config(prompt, "gc", "CachedSamplerGuidanceCache", upstream=chain, **guidance)
    node = "CachedSampler" if chain else "KSampler"
    graphs.sampler(prompt, node, chain=chain, model="count", steps=steps, cfg=cfg, sampler=sampler)
    prompt["sampler"]["inputs"]["positive"] = positive
    _, ui = comfy.run(prompt)
    # what the node returns of its run: who acted, per-branch counts (computed, seen), notes
    run = ui["sampler"]["cached_sampler"][0]["runs"][0] if chain else {"acted": [], "branches": {}, "notes": []}
    return CAPTURED["out"].clone(), dict(CAPTURED["work"]), run


CASES = ["plain", "multi_positive", "area", "CFGNorm", "APG", "SLG", "heun", "dpmpp_2s_ancestral"]


@pytest.mark.parametrize("case", CASES)
def test_interval_one_is_bit_identical_and_interval_two_leaves_negative_rows_out(comfy, case):
    sampler = case if case in ("heun", "dpmpp_2s_ancestral") else "euler"
    patch = None if case in ("plain", "heun", "dpmpp_2s_ancestral") else case
    ref, ref_work, _ = _run(comfy, case=patch, sampler=sampler)
    same, same_work, _ = _run(comfy, NEVER, case=patch, sampler=sampler)
    assert torch.equal(ref, same), f"interval 1 must be bit-identical ({case})"
    assert same_work["rows"] == ref_work["rows"]
    cached, work, run = _run(comfy, MODERATE, case=patch, sampler=sampler)
    assert torch.isfinite(cached).all()
    assert work["rows"] < ref_work["rows"], f"no rows left out ({case}): {work['rows']} vs {ref_work['rows']}"
    assert sum(work["negative_rows"]) < sum(ref_work["negative_rows"])
    assert work["forwards"] == ref_work["forwards"], "every evaluation still runs the positive rows"
    assert any(a.startswith("Guidance Cache") for a in run["acted"]), run["acted"]
    done, seen = run["branches"]["uncond"]
    assert done < seen == run["branches"]["cond"][1], run["branches"]
    # The estimate was really used (the trained-model quality is measured by tools/studies/bench_guidance.py).
    assert not torch.equal(cached, ref)


def test_adaptive_threshold_zero_is_bit_identical(comfy):
    ref, _, _ = _run(comfy)
    same, _, _ = _run(comfy, dict(NEVER, interval=100, mode="adaptive", threshold=0.0))
    assert torch.equal(ref, same)
    cached, work, _ = _run(comfy, dict(NEVER, interval=100, mode="adaptive", threshold=10.0))
    assert sum(work["negative_rows"]) < sum(_run(comfy)[1]["negative_rows"])


def test_agreement_mode_leaves_out_agreeing_branches_and_threshold_zero_is_bit_identical(comfy):
    """Adaptive Guidance's cosine stop through the real sampler: threshold 0 changes nothing; a threshold every
    pair of predictions meets (1 - cos < 1.5, cos > -0.5) leaves the negative rows out between the re-checks
    (computed on evaluations 0, 4 and the last of 8: 3 of 8); one no pair meets computes them all."""
    ref, ref_work, _ = _run(comfy)
    same, same_work, _ = _run(comfy, dict(NEVER, interval=4, mode="agreement", threshold=0.0))
    assert torch.equal(ref, same) and same_work["negative_rows"] == ref_work["negative_rows"]
    loose, loose_work, _ = _run(comfy, dict(NEVER, interval=4, mode="agreement", threshold=1.5))
    assert sum(loose_work["negative_rows"]) * 8 == sum(ref_work["negative_rows"]) * 3, loose_work
    assert torch.isfinite(loose).all() and not torch.equal(loose, ref)
    tight, tight_work, _ = _run(comfy, dict(NEVER, interval=4, mode="agreement", threshold=1e-9))
    assert tight_work["negative_rows"] == ref_work["negative_rows"] and torch.equal(tight, ref)


def test_cfg_one_does_nothing_and_says_so(comfy):
    ref, ref_work, _ = _run(comfy, cfg=1.0)
    same, work, run = _run(comfy, MODERATE, cfg=1.0)
    assert torch.equal(ref, same) and work["rows"] == ref_work["rows"]
    assert any("at cfg 1 ComfyUI computes no negative branch" in n for n in run["notes"]), run["notes"]


def test_separate_branch_calls_are_computed_in_full_with_a_note(comfy):
    """Skip Layer Guidance (Simple) computes the positive and the negative branch in two calls of its own."""
    ref, ref_work, _ = _run(comfy, case="SLG simple")
    same, work, run = _run(comfy, MODERATE, case="SLG simple")
    assert torch.equal(ref, same) and work["rows"] == ref_work["rows"]
    assert any("separate calls" in n for n in run["notes"]), run["notes"]


def test_chained_with_a_step_schedule_skips_both(comfy):
    ref, ref_work, _ = _run(comfy, cadence=3, steps=12)
    cached, work, run = _run(comfy, MODERATE, cadence=3, steps=12)
    assert torch.isfinite(cached).all()
    assert work["forwards"] == ref_work["forwards"], "the step schedule is the same"
    assert sum(work["negative_rows"]) < sum(ref_work["negative_rows"])
    assert sorted(a.split(" (")[0] for a in run["acted"]) == ["Fixed Cadence", "Guidance Cache"], run["acted"]


def test_context_windows(comfy):
    prompt = graphs.base("wan21", latent_seed=5)
    prompt["latent"]["inputs"]["batch"] = 4
    prompt["windows"] = graphs.context_windows(context_schedule="standard_static")
    graphs.count_work(prompt, "wan21", model="windows")
    chain = graphs.config(prompt, "gc", "CachedSamplerGuidanceCache", **MODERATE)
    graphs.sampler(prompt, "CachedSampler", chain=chain, model="count", steps=6)
    _, ui = comfy.run(prompt)
    work = dict(CAPTURED["work"])
    assert torch.isfinite(CAPTURED["out"]).all()
    assert 0 in work["negative_rows"] and any(work["negative_rows"]), work["negative_rows"]
    assert ui["sampler"]["cached_sampler"][0]["runs"][0]["acted"] == ["Guidance Cache (node gc)"]  # what the node returns


def test_other_guider_layouts_are_left_alone_with_a_note(comfy):
    """DualCFG's conds list is [negative, middle, positive]: index 1 is not the negative branch there."""
    import comfy.sample as sample_module
    import comfy.samplers as samplers
    import comfy_extras.nodes_custom_sampler as custom
    ic, adapter = comfy.module("interceptors"), comfy.module("adapter")

    def sample(chain):
        model, summaries = tiny_models.build("flux"), []
        if chain is not None:
            model = adapter.install(model, chain, on_run_end=lambda run, summary: summaries.append(summary))
        guider = custom.Guider_DualCFG(model)
        positive, negative = tiny_models.conditioning("flux", seed=1)
        guider.set_conds(positive, negative, negative)
        guider.set_cfg(3.0, 2.0)
        latent = tiny_models.latent("flux", seed=5)["samples"]
        sigmas = samplers.calculate_sigmas(model.get_model_object("model_sampling"), "simple", 6)
        out = guider.sample(sample_module.prepare_noise(latent, 1), latent, samplers.sampler_object("euler"),
                            sigmas, seed=1)
        return out, summaries

    ref, _ = sample(None)
    same, summaries = sample(ic.InterceptorChain.of([ic.GuidanceCache(interval=2)]))
    assert torch.equal(ref, same)
    assert any("Guider_DualCFG" in note for note in summaries[0].notes), summaries[0].notes


def _sample_direct(comfy, guidance, cadence=None, steps=8):
    """Sample with the adapter and a recording post-CFG function; returns what it saw per evaluation and, per
    evaluation, whether the model computed negative rows."""
    import nodes
    ic = comfy.module("interceptors")
    adapter = comfy.module("adapter")
    model = tiny_models.build("flux")
    seen, computed_negative = [], []

    def watch(executor, *args, **kwargs):
        options = kwargs.get("transformer_options") or args[-1]
        computed_negative[-1] = computed_negative[-1] or 1 in (options.get("cond_or_uncond") or [])
        return executor(*args, **kwargs)

    def mark_evaluation(executor, *args, **kwargs):
        computed_negative.append(False)
        return executor(*args, **kwargs)

    def post_cfg(args):
        seen.append(args["uncond_denoised"].clone())
        return args["cond_denoised"]  # the trajectory follows the positive branch only, so no poison spreads

    import comfy.patcher_extension as ext
    model.add_wrapper_with_key(ext.WrappersMP.PREDICT_NOISE, "test", mark_evaluation)
    model.add_wrapper_with_key(ext.WrappersMP.DIFFUSION_MODEL, "test", watch)
    model.set_model_sampler_post_cfg_function(post_cfg)
    items = [ic.FixedCadence(interval=cadence), ic.TaylorSeer(order=1)] if cadence else []
    patched = adapter.install(model, ic.InterceptorChain.of(items + [guidance]))
    positive, negative = tiny_models.conditioning("flux", seed=1)
    nodes.common_ksampler(patched, 1, steps, 3.0, "euler", "simple", positive, negative,
                          tiny_models.latent("flux", seed=5))
    return seen, computed_negative


@pytest.mark.parametrize("cadence", [None, 3])
def test_poisoned_estimate_never_reaches_a_step_that_computed_its_own(comfy, cadence):
    ic = comfy.module("interceptors")
    POISON = 1000.0

    @dataclasses.dataclass(frozen=True)
    class Poisoned(ic.GuidanceCache):
        def estimated(self, state, eps_positive, now):  # epsilon space: POISON / sigma moves denoised by -POISON
            return super().estimated(state, eps_positive, now) + POISON / now

    seen, computed = _sample_direct(comfy, Poisoned(interval=2), cadence=cadence, steps=10)
    assert len(seen) == len(computed)
    poisoned = [bool((u.abs() > POISON / 2).all()) for u in seen]
    assert any(poisoned), "the poisoned estimate was never used: the test would prove nothing"
    for i, (has_poison, own) in enumerate(zip(poisoned, computed)):
        if own:
            assert not has_poison, f"evaluation {i} computed its negative branch but saw the cached one"
    if cadence is None:
        assert all(own or has_poison for has_poison, own in zip(poisoned, computed)), \
            "an evaluation without its own negative branch must use the estimate"


def test_a_planned_negative_branch_is_left_out_exactly_where_the_plan_says_and_nowhere_on_another_schedule(comfy):
    from comfy.samplers import calculate_sigmas
    ic = comfy.module("interceptors")
    sampling = tiny_models.build("flux").get_model_object("model_sampling")

    def sigmas_of(steps):
        return tuple(float(s) for s in calculate_sigmas(sampling, "simple", steps)[:-1])

    plan = dict(mode="planned", leave_out=(3, 6), **WINDOW)
    _, computed = _sample_direct(comfy, ic.GuidanceCache(sigmas=sigmas_of(10), **plan), steps=10)
    assert computed == [i not in (3, 6) for i in range(10)], computed
    _, computed = _sample_direct(comfy, ic.GuidanceCache(sigmas=sigmas_of(12), **plan), steps=10)
    assert all(computed), "a plan made for another schedule must leave nothing out"
    with pytest.raises(ic.InterceptorError, match="outside"):
        ic.InterceptorChain.of([ic.GuidanceCache(sigmas=sigmas_of(10), **dict(plan, leave_out=(0,)))])


def test_cfg_pp_sampler_at_cfg_one_leaves_negative_rows_out(comfy):
    """CFG++ samplers compute the negative branch even at cfg 1 (disable_cfg1_optimization), so the Guidance
    Cache works there and says nothing about cfg 1."""
    ref, ref_work, _ = _run(comfy, cfg=1.0, sampler="euler_cfg_pp")
    assert all(ref_work["negative_rows"]), "CFG++ at cfg 1 runs the negative branch on every evaluation"
    cached, work, run = _run(comfy, MODERATE, cfg=1.0, sampler="euler_cfg_pp")
    assert torch.isfinite(cached).all()
    assert sum(work["negative_rows"]) < sum(ref_work["negative_rows"]), work["negative_rows"]
    assert not any("no negative branch to skip" in n for n in run["notes"]), run["notes"]


def test_a_window_that_never_opens_leaves_the_step_cache_alone(comfy):
    """On the steps a schedule-only step cache skips, a Guidance Cache whose own window is closed must not
    stand in for the negative branch: the chain equals the same chain without it."""
    closed = dict(MODERATE, start_percent=0.99, end_percent=1.0)
    without, work_without, _ = _run(comfy, cadence=2)
    for estimate in ("difference forecast", "negative reuse"):
        with_gc, work, _ = _run(comfy, dict(closed, estimate=estimate), cadence=2)
        assert torch.equal(with_gc, without), estimate
        assert work["negative_rows"] == work_without["negative_rows"], estimate


def _ranged_prompt(comfy, guidance, switch=0.5):
    """Two negatives, each for one part of the schedule (ConditioningSetTimestepRange), and a model whose
    prediction is the conditioning's mean broadcast: exactly linear in the conditioning, constant in time."""
    prompt, positive = _prompt("flux")
    prompt["neg2"] = {"class_type": "TestTinyConditioning", "inputs": {"family": "flux", "seed": 77, "length": 4}}
    prompt["early"] = {"class_type": "ConditioningSetTimestepRange",
                       "inputs": {"conditioning": ["cond", 1], "start": 0.0, "end": switch}}
    prompt["late"] = {"class_type": "ConditioningSetTimestepRange",
                      "inputs": {"conditioning": ["neg2", 0], "start": switch, "end": 1.0}}
    prompt["negative"] = {"class_type": "ConditioningCombine",
                          "inputs": {"conditioning_1": ["early", 0], "conditioning_2": ["late", 0]}}
    chain = graphs.config(prompt, "gc", "CachedSamplerGuidanceCache", **guidance) if guidance else None
    graphs.sampler(prompt, "CachedSampler" if chain else "KSampler", chain=chain, model="count", steps=8)
    prompt["sampler"]["inputs"]["negative"] = ["negative", 0]
    _, ui = comfy.run(prompt)
    return CAPTURED["out"].clone(), dict(CAPTURED["work"]), ui


def test_a_prompt_switch_starts_a_new_history_and_counts_only_active_entries(comfy):
    """With two timestep-ranged negatives, (a) the first evaluation after the switch computes the negative
    (a forecast through two prompts is meaningless), and (b) the work saved the node reports is the work the
    model really left out: only the entry active at a skipped step counts, not both."""
    ref, ref_work, _ = _ranged_prompt(comfy, None)
    entries = ref_work["negative_entries"]  # both are active at the one evaluation on the boundary
    switches = [i for i in range(1, len(entries)) if entries[i] != entries[i - 1]]
    assert switches and len(set(entries)) >= 2, entries
    cached, work, ui = _ranged_prompt(comfy, dict(MODERATE, interval=3))
    rows = work["negative_rows"]
    assert torch.isfinite(cached).all()
    assert 0 in rows, rows
    assert all(rows[i] > 0 for i in switches), f"a change of negative (at {switches}) must compute it: {rows}"
    reported = ui["sampler"]["cached_sampler"][0]["runs"][0]["work_saved"]
    really = 1 - work["rows"] / ref_work["rows"]
    assert reported == pytest.approx(really, abs=1e-3), (reported, really)


def test_every_decider_is_credited_with_its_own_skips(comfy):
    """Fixed Cadence skips whole steps; on those steps the Guidance Cache estimates the negative too. Both
    skipped work there, so both are credited (one label per evaluation used to be overwritten by the last)."""
    prompt, positive = _prompt("flux")
    chain = graphs.config(prompt, "fc", "CachedSamplerFixedCadence", interval=2, **WINDOW)
    chain = graphs.config(prompt, "gc", "CachedSamplerGuidanceCache", upstream=chain, **dict(MODERATE, interval=100))
    graphs.sampler(prompt, "CachedSampler", chain=chain, model="count", steps=8)
    _, ui = comfy.run(prompt)
    run = ui["sampler"]["cached_sampler"][0]["runs"][0]
    assert "s" in run["decisions"], run
    assert len(run["acted"]) == 2 and any("Fixed Cadence" in a for a in run["acted"]), run["acted"]


def _windowed(comfy, monkeypatch, schedule, frames=24, steps=8, kept=None):
    """Sample tiny Wan (a batch of ``frames`` latents, windowed along it by ContextWindowsManual, 4 to a window)
    with the Guidance Cache; what each evaluation asked for and held. ``kept`` overrides how many evaluations
    without a window its history outlives."""
    from cached_sampler_dev.support.reachable import tensors_in
    state, guidance = comfy.module("interceptors.state"), comfy.module("interceptors.methods.guidance")
    if kept is not None:
        monkeypatch.setattr(guidance, "KEPT_EVALUATIONS", kept)
    asked, evaluations = [], []
    branch_of, end_evaluation = state.LoopState.branch_of, state.LoopState.end_evaluation

    def logged_branch_of(self, interceptor, key):
        asked.append((self.evaluation.index, key))
        return branch_of(self, interceptor, key)

    def logged_end_evaluation(self):
        ev, (gc,) = self.evaluation, [d for d in self.chain.deciders if d.kind == "guidance_cache"]
        held = self.caches.branch_states.get(gc.id, {})
        evaluations.append({"index": ev.index, "held": set(held), "tensors": len(tensors_in(held)),
                            "asked": {key for index, key in asked if index == ev.index}})
        return end_evaluation(self)

    monkeypatch.setattr(state.LoopState, "branch_of", logged_branch_of)
    monkeypatch.setattr(state.LoopState, "end_evaluation", logged_end_evaluation)
    prompt = graphs.base("wan21", latent_seed=5)
    prompt["latent"]["inputs"]["batch"] = frames
    prompt["windows"] = graphs.context_windows(context_schedule=schedule, context_length=4, context_overlap=0)
    graphs.count_work(prompt, "wan21", model="windows")
    chain = graphs.config(prompt, "gc", "CachedSamplerGuidanceCache", **MODERATE)
    graphs.sampler(prompt, "CachedSampler", chain=chain, model="count", steps=steps)
    _, ui = comfy.run(prompt)
    assert ui["sampler"]["cached_sampler"][0]["runs"][0]["acted"] == ["Guidance Cache (node gc)"]  # what the node returns
    return CAPTURED["out"].clone(), dict(CAPTURED["work"]), evaluations


def test_moving_context_windows_hold_a_bounded_history(comfy, monkeypatch):
    """The uniform schedules move their windows every step; the Guidance Cache keeps one history per window. The
    histories of windows gone are dropped during the run (their tensors with them): after every evaluation the
    run holds exactly the windows of that evaluation and the two before, never all the windows the run has seen."""
    out, work, evaluations = _windowed(comfy, monkeypatch, "looped_uniform")
    assert torch.isfinite(out).all() and 0 in work["negative_rows"] and any(work["negative_rows"])
    per_evaluation = max(len(e["asked"]) for e in evaluations)
    every = set().union(*(e["asked"] for e in evaluations))
    assert len(every) > 3 * per_evaluation, "the windows did not move: the test would prove nothing"
    for i, e in enumerate(evaluations):
        recent = set().union(*(r["asked"] for r in evaluations[max(i - 2, 0):i + 1]))
        assert e["held"] == recent, f"evaluation {i}: held {len(e['held'])} histories, {len(recent)} were recent"
    assert max(len(e["held"]) for e in evaluations) <= 3 * per_evaluation
    per_history = evaluations[0]["tensors"] / len(evaluations[0]["held"])
    assert per_history >= 1 and max(e["tensors"] for e in evaluations) <= 3 * per_evaluation * per_history


def test_static_context_windows_keep_every_history_and_the_same_result(comfy, monkeypatch):
    """The static schedule uses every window on every evaluation: nothing is dropped, and the result is the one
    of a run that never drops anything."""
    out, _, evaluations = _windowed(comfy, monkeypatch, "standard_static")
    assert all(e["held"] == e["asked"] == evaluations[0]["asked"] for e in evaluations)
    never, _, _ = _windowed(comfy, monkeypatch, "standard_static", kept=10 ** 6)
    assert torch.equal(out, never)
