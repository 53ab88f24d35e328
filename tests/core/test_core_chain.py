"""The chain's contracts, with torch only."""
import dataclasses

import pytest
import torch

from cached_sampler_dev.devkit.pack import load_core

ic = load_core()


def test_config_is_immutable_and_chain_appends_without_mutating():
    base = ic.InterceptorChain()
    fc = ic.FixedCadence(interval=3, node="Fixed Cadence (node 4)")
    chained = base.then(fc)
    assert base.empty and len(chained) == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        fc.interval = 5


def test_duplicate_method_names_both_nodes():
    a = ic.FixedCadence(node="Fixed Cadence (node 3)")
    b = ic.FixedCadence(interval=4, node="Fixed Cadence (node 7)")
    with pytest.raises(ic.ChainError) as e:
        ic.InterceptorChain.of([a, b])
    assert "node 3" in str(e.value) and "node 7" in str(e.value)


def test_two_deciders_at_one_granularity_conflict_names_both():
    @dataclasses.dataclass(frozen=True)
    class OtherModelDecider(ic.Decider):
        declaration = ic.Decider.declaration.but(kind="other", display_name="Other", granularity=ic.Granularity.MODEL)

    with pytest.raises(ic.ChainError) as e:
        ic.InterceptorChain.of([ic.FixedCadence(node="A (node 1)"), OtherModelDecider(node="B (node 2)")])
    msg = str(e.value)
    assert "node 1" in msg and "node 2" in msg and "Keep one" in msg


@pytest.mark.parametrize("kwargs, words", [
    (dict(interval=0), "interval"),
    (dict(interval=2.5), "interval"),
    (dict(start_percent=0.6, end_percent=0.4), "start_percent"),
    (dict(start_percent=-0.1), "start_percent"),
    (dict(end_percent=1.5), "end_percent"),
])
def test_impossible_parameters_are_rejected_naming_node_and_input(kwargs, words):
    with pytest.raises(ic.InterceptorError) as e:
        ic.InterceptorChain().then(ic.FixedCadence(node="Fixed Cadence (node 9)", **kwargs))
    assert "node 9" in str(e.value) and words in str(e.value)


def test_estimator_without_decider_is_refused():
    @dataclasses.dataclass(frozen=True)
    class Forecast(ic.ReuseLast):
        declaration = ic.ReuseLast.declaration.but(kind="forecast", display_name="Forecast")

    with pytest.raises(ic.ChainError, match="nothing in the chain skips"):
        ic.InterceptorChain.of([Forecast(node="Forecast (node 5)")])


def test_model_validation_block_level_and_distilled():
    @dataclasses.dataclass(frozen=True)
    class BlockDecider(ic.Decider):
        declaration = ic.Decider.declaration.but(
            kind="blocky",
            display_name="Blocky",
            granularity=ic.Granularity.BLOCKS,
        )

    unet = ic.build_card("SDXL", "SDXL")
    chain = ic.InterceptorChain.of([BlockDecider(node="Blocky (node 2)")])
    with pytest.raises(ic.ChainError) as e:
        chain.validate_for(unet)
    assert "node 2" in str(e.value) and "SDXL" in str(e.value) and "Adaptive Cache" in str(e.value)

    flux = ic.build_card(("Flux", "BaseModel"), "Flux", group_counts={"double_blocks": 2, "single_blocks": 3})
    assert ic.Granularity.BLOCKS in flux.levels and flux.total_blocks == 5
    chain.validate_for(flux)

    schnell = ic.build_card("Flux", "FluxSchnell", group_counts={"double_blocks": 2})
    fixed = ic.InterceptorChain.of([ic.FixedCadence(node="Fixed Cadence (node 3)")])
    with pytest.raises(ic.ChainError) as e:
        fixed.validate_for(schnell)
    assert "distilled" in str(e.value) and "node 3" in str(e.value) and "allow_distilled" in str(e.value)
    fixed.validate_for(schnell, allow_distilled=True)


def test_unknown_model_gets_whole_model_card_and_subclass_inherits_family():
    card = ic.build_card(("SomethingNew", "BaseModel"))
    assert card.levels == frozenset({ic.Granularity.MODEL})
    # a subclass running Wan's own diffusion model inherits its block layout
    variant = ic.build_card(("WAN21_SomeVariant", "WAN21", "BaseModel"), group_counts={"blocks": 3},
                            diffusion=ic.DiffusionFacts(("WanModel",), (("forward", "WanModel"),)))
    assert variant.family == "wan" and ic.Granularity.BLOCKS in variant.levels


@pytest.mark.parametrize("mro,counts", [
    (("WAN21_CausalAR", "WAN21", "BaseModel"), {"blocks": 3}),           # its loop never consults the slots
    (("HiDreamO1", "BaseModel"), {"layers": 3}),                         # slots switch off its prompt K/V cache
    (("SeedVR2", "BaseModel"), {"blocks": 3}),                           # tokens packed without a batch dimension
    (("MiniMaxH3", "BaseModel"), {"blocks": 3}),                         # not verified yet
    (("Boogu", "Omnigen2", "BaseModel"), {"layers": 3}),                 # no slots
])
def test_a_family_kept_at_whole_model_level_says_why_when_a_block_method_is_refused(mro, counts):
    """Even with block lists on the model (and a carded parent), these families are offered whole-model caching
    only, and a block-level node is refused with the family's reason."""
    card = ic.build_card(mro, mro[0], group_counts=counts)
    assert card.levels == frozenset({ic.Granularity.MODEL}) and card.blocks_off
    with pytest.raises(ic.ChainError) as e:
        ic.InterceptorChain.of([ic.FirstBlockCache(node="First Block Cache (node 4)")]).validate_for(card)
    assert "node 4" in str(e.value) and card.blocks_off in str(e.value) and "Adaptive Cache" in str(e.value)


def test_typed_state_is_per_run_and_per_branch():
    @dataclasses.dataclass(frozen=True)
    class Counting(ic.FixedCadence):
        declaration = ic.FixedCadence.declaration.but(kind="counting")

        @dataclasses.dataclass
        class RunState:
            seen: int = 0

        @dataclasses.dataclass
        class BranchState:
            anchor: object = None

    decider = Counting()
    chain = ic.InterceptorChain.of([decider])
    first, second = ic.LoopState(chain, [1.0, 0.0]), ic.LoopState(chain, [1.0, 0.0])
    first.state_of(decider).seen += 1
    assert first.state_of(decider).seen == 1 and second.state_of(decider).seen == 0
    cond = ic.BranchKey(0, "c", 0, (4,), "float32")
    uncond = ic.BranchKey(1, "u", 0, (4,), "float32")
    first.branch_of(decider, cond).anchor = "cond"
    assert first.branch_of(decider, uncond).anchor is None and first.branch_of(decider, cond).anchor == "cond"


def test_state_without_a_declared_dataclass_is_refused():
    @dataclasses.dataclass(frozen=True)
    class Stateless(ic.Decider):
        declaration = ic.Decider.declaration.but(kind="stateless")

        def decide(self, run, ev, signals, measured):
            return True

    run = ic.LoopState(ic.InterceptorChain(), [1.0, 0.0])
    with pytest.raises(TypeError, match="RunState"):
        run.state_of(Stateless())


def test_a_note_is_said_once_and_reaches_the_summary(caplog):
    run = ic.LoopState(ic.InterceptorChain(), [1.0, 0.0])
    with caplog.at_level("WARNING", logger="cached_sampler"):
        run.note("block caching switched off: another patch serves the block slots")
        run.note("block caching switched off: another patch serves the block slots")
    assert len(caplog.records) == 1
    assert ic.summarize(run).notes == ("block caching switched off: another patch serves the block slots",)


def test_guidance_cache_has_its_own_level():
    """One step or block decider, TaylorSeer and the Guidance Cache compose; TaylorSeer still needs a step or block
    decider to forecast for (the Guidance Cache estimates on its own)."""
    gc = ic.GuidanceCache(interval=2, node="Guidance Cache (node 5)")
    ic.InterceptorChain.of([ic.FixedCadence(interval=3), ic.TaylorSeer(order=1), gc])
    ic.InterceptorChain.of([ic.FirstBlockCache(threshold=0.1), gc])
    with pytest.raises(ic.ChainError, match="nothing in the chain skips"):
        ic.InterceptorChain.of([gc, ic.TaylorSeer(order=1)])
    with pytest.raises(ic.ChainError, match="node 5"):
        ic.InterceptorChain.of([gc, ic.GuidanceCache(interval=3, node="Guidance Cache (node 6)")])
    with pytest.raises(ic.InterceptorError, match="estimate"):
        ic.InterceptorChain.of([ic.GuidanceCache(estimate="nonsense")])
    assert ic.GuidanceCache(interval=1).never_skips and ic.GuidanceCache(mode="adaptive", interval=9).never_skips
    assert not ic.GuidanceCache(interval=2).never_skips


def _learn(gc, run, state, eps_positive, eps_negative, sigma, x=None):
    """Hand the Guidance Cache a computed evaluation as the engine does: both predictions as epsilons and as the
    denoised images ``x - sigma * eps`` they stand for (``x`` the input, zeros unless given)."""
    x = torch.zeros_like(eps_positive) if x is None else x
    gc.learned(run, state, eps_positive, eps_negative, sigma,
               denoised=(x - sigma * eps_positive, x - sigma * eps_negative))


def test_guidance_estimates_from_the_positive_prediction_and_the_forecast_difference():
    """With a guidance difference that is linear in sigma, the forecast recovers the negative prediction exactly
    (epsilon space: the engine converts, tests/test_core_engine.py checks the conversion)."""
    import torch
    gc = ic.GuidanceCache(interval=3)
    run = ic.LoopState(ic.InterceptorChain.of([gc]), [1.0, 0.5, 0.0])
    state = run.branch_of(gc, ic.BranchKey(1, None, 0, (2, 4), "float32"))
    eps_positive = torch.randn(2, 4)

    def negative_at(s):
        return eps_positive + (0.3 + 2.0 * s)  # guidance difference 0.3 + 2 sigma

    for s in (1.0, 0.8):
        _learn(gc, run, state, eps_positive, negative_at(s), s)
    estimate = gc.estimated(state, eps_positive, 0.5)
    assert torch.allclose(estimate, negative_at(0.5), atol=1e-5)


def test_agreement_mode_skips_once_the_branches_point_the_same_way_and_checks_again():
    """Adaptive Guidance's rule: the disagreement 1 - cos(denoised positive, denoised negative) of the last computed
    step against the threshold, and a fresh check every `interval` evaluations. A cosine taken of the wrong pair (the
    negative with itself) or a missing re-check fails it."""
    gc = ic.GuidanceCache(mode="agreement", threshold=0.05, interval=3)
    run = ic.LoopState(ic.InterceptorChain.of([gc]), [1.0, 0.8, 0.6, 0.4, 0.2, 0.0])
    key = ic.BranchKey(1, None, 0, (2, 4), "float32")
    state = run.branch_of(gc, key)
    eps_positive = torch.randn(2, 4)

    def decide(index, sigma):
        run.evaluation = ev = ic.Evaluation(index, 5, ic.records.EvaluationRecord(index, 0, sigma))
        ev.place(sigma, index, index)
        return gc.decide(run, ev, {key: state}, [])

    _learn(gc, run, state, eps_positive, -eps_positive, 1.0)  # opposite: disagreement 2
    run.transfer()
    assert state.disagreement == pytest.approx(2.0) and decide(1, 0.8), "disagreeing branches must compute"
    _learn(gc, run, state, eps_positive, 2 * eps_positive + 1e-3 * torch.randn(2, 4), 0.8)  # nearly parallel
    run.transfer()
    assert state.disagreement < 1e-3
    assert not decide(2, 0.6), "agreeing branches leave the negative one out"
    gc.left_out(state, model_ran=True)
    assert not decide(3, 0.4)
    gc.left_out(state, model_ran=True)
    assert decide(4, 0.2), "every `interval` evaluations the agreement is checked again"
    assert ic.GuidanceCache(mode="agreement", threshold=0.0).never_skips


def test_agreement_is_measured_on_the_denoised_predictions_not_on_the_shared_noise():
    """At high noise both branches' epsilons are mostly the input they share: here the denoised predictions point
    opposite ways while the epsilons are nearly parallel. The branches disagree, so the negative one is computed; a
    cosine of the epsilons (about 1) would leave it out."""
    gc = ic.GuidanceCache(mode="agreement", threshold=0.05, interval=3)
    run = ic.LoopState(ic.InterceptorChain.of([gc]), [1.0, 0.8, 0.0])
    key = ic.BranchKey(1, None, 0, (2, 64), "float32")
    state = run.branch_of(gc, key)
    generator = torch.Generator().manual_seed(0)
    x = 50 * torch.randn(2, 64, generator=generator)
    image = torch.randn(2, 64, generator=generator)
    eps_positive, eps_negative = x - image, x + image  # sigma 1: denoised = x - eps = image and -image
    cosine = torch.nn.functional.cosine_similarity(eps_positive, eps_negative, dim=1)
    assert float(1 - cosine.min()) < 0.01, "the epsilons must look agreed for this test to mean anything"
    _learn(gc, run, state, eps_positive, eps_negative, 1.0, x=x)
    run.transfer()
    assert state.disagreement == pytest.approx(2.0, abs=1e-4)
    run.evaluation = ev = ic.Evaluation(1, 2, ic.records.EvaluationRecord(1, 0, 0.8))
    ev.place(0.8, 1, 1)
    assert gc.decide(run, ev, {key: state}, []), "branches whose images disagree must both be computed"


def test_released_run_keeps_no_branch_tensors():
    """What the Guidance Cache learned of a branch is reachable from the run until the run is released, and no
    tensor at all is after (test_core_engine's test_nothing_of_a_run_outlives_it does the same for step and block
    caches)."""
    import torch
    from cached_sampler_dev.support.reachable import tensors_in
    gc = ic.GuidanceCache(interval=2)
    run = ic.LoopState(ic.InterceptorChain.of([gc]), [1.0, 0.0])
    state = run.branch_of(gc, ic.BranchKey(1, None, 0, (1, 2), "float32"))
    _learn(gc, run, state, torch.zeros(1, 2), torch.ones(1, 2), 1.0)
    held = tensors_in(run)
    assert held and all(".branch_states" in path for path in held), held
    run.release_caches()
    assert tensors_in(run) == []


def test_a_method_declares_what_it_is_once():
    """The class's declaration is what the run reads, on the class and on an instance; a loose class-level flag,
    which the declaration would contradict, is refused when the class is defined."""
    dbcache, fbcache = ic.DBCache(), ic.FirstBlockCache()
    assert type(dbcache).declaration.kind == dbcache.kind == ic.DBCache.kind == "dbcache"
    assert fbcache.kind == "fbcache" and fbcache.signal is ic.Signal.PROBE_RESIDUAL  # the rest from DBCache's
    assert ic.TaylorSeer.role is ic.Role.ESTIMATOR and ic.TaylorSeer.declaration.footprint is None
    with pytest.raises(TypeError, match="compile_safe"):
        class Loose(ic.FixedCadence):
            compile_safe = False
    with pytest.raises(dataclasses.FrozenInstanceError):
        ic.FixedCadence.declaration.kind = "other"
