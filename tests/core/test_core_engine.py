"""The engine on hand-made models: what is computed, what is reused, and whose cache is read."""
import dataclasses

import pytest
import torch

from cached_sampler_dev.devkit.pack import load_core
from cached_sampler_dev.support.reachable import tensors_in

ic = load_core()
from cached_sampler_pack.interceptors.engine import BlockPlan, block_call, from_eps, model_forward, to_eps  # noqa: E402
from cached_sampler_pack.interceptors.methods.schedule_search import growing_schedules  # noqa: E402

SIGMAS = [1.0, 0.9, 0.75, 0.6, 0.45, 0.3, 0.2, 0.1, 0.0]


def drive(run, model, x, branches=(1, 0), uuids=("u", "c")):
    """A minimal sampler: one evaluation per schedule step, one batched forward per evaluation."""
    outputs = []
    for sigma in SIGMAS[:-1]:
        run.begin_evaluation(sigma)
        batch = torch.cat([x] * len(branches))
        s = torch.full((batch.shape[0],), sigma)
        fwd = run.begin_forward(sigma, batch.shape[0], tuple(batch.shape[1:]), batch.dtype, list(branches), list(uuids))
        out = model_forward(run, fwd, batch, s, lambda: model(batch, s))
        run.end_forward(fwd, out)
        run.end_evaluation()
        outputs.append(out)
    return outputs


class CountingModel:
    def __init__(self):
        self.calls = 0

    def __call__(self, x, sigma):
        self.calls += 1
        return x * (1 - sigma.reshape(-1, 1)) + 0.1 * torch.arange(x.shape[0], dtype=x.dtype).reshape(-1, 1)


def test_fixed_cadence_interval_2_computes_half_and_reuses_in_between():
    chain = ic.InterceptorChain.of([ic.FixedCadence(interval=2)])
    run = ic.LoopState(chain, SIGMAS)
    model = CountingModel()
    drive(run, model, torch.ones(1, 3))
    # 8 steps: computed at 0, 2, 4, 6 and the last step (7) is always computed
    assert model.calls == 5
    assert [not r.skipped for r in run.records] == [True, False, True, False, True, False, True, True]
    summary = ic.summarize(run)
    assert summary.evaluations_skipped == 3 and summary.branches["cond"] == (5, 8)


def computed_evaluations(decider, steps: int) -> list[int]:
    """The evaluations ``decider`` computes over ``steps`` steps of one branch (a whole-model forward each)."""
    sigmas = [1.0 - i / steps for i in range(steps)] + [0.0]
    run = ic.LoopState(ic.InterceptorChain.of([decider]), sigmas)
    model, x = CountingModel(), torch.ones(1, 3)
    for sigma in sigmas[:-1]:
        run.begin_evaluation(sigma)
        s = torch.full((1,), sigma)
        fwd = run.begin_forward(sigma, 1, (3,), x.dtype, [0], ["c"])
        run.end_forward(fwd, model_forward(run, fwd, x, s, lambda: model(x, s)))
        run.end_evaluation()
    return [i for i, r in enumerate(run.records) if not r.skipped]


def test_growing_cadence_widens_the_gap_after_each_step_it_computes():
    # Spectrum's schedule (window_size 1, flex_window 1): gaps 1, 2, 3, 4, 5 after the first evaluation, which is
    # computed for being the first and so does not grow the gap; the last step is always computed
    assert computed_evaluations(ic.FixedCadence(interval=1, growth=1.0), 20) == [0, 1, 3, 6, 10, 15, 19]
    # the whole part of the gap is used: 2, 2, 3, 3, 4 (2 + 0.5 per computed step)
    assert computed_evaluations(ic.FixedCadence(interval=2, growth=0.5), 16) == [0, 2, 4, 7, 10, 14, 15]
    # no growth is the fixed cadence
    assert computed_evaluations(ic.FixedCadence(interval=3, growth=0.0), 10) == [0, 3, 6, 9]
    with pytest.raises(ic.InterceptorError, match="growth"):
        ic.InterceptorChain.of([ic.FixedCadence(interval=2, growth=-1.0)])


def test_spectrums_schedule_is_a_warm_up_then_growing_gaps_with_the_last_step_forecast():
    spectrum = ic.FixedCadence(interval=2, growth=1.0, warmup_steps=3, last_step="forecast")
    assert computed_evaluations(spectrum, 28) == [0, 1, 2, 4, 7, 11, 16, 22]
    # the same steps with the last step computed (the default): one more
    assert computed_evaluations(dataclasses.replace(spectrum, last_step="compute"), 28) == [
        0, 1, 2, 4, 7, 11, 16, 22, 27]


def test_warm_up_steps_are_computed_and_do_not_grow_the_gap():
    assert computed_evaluations(ic.FixedCadence(interval=3, warmup_steps=4), 12) == [0, 1, 2, 3, 6, 9, 11]
    assert computed_evaluations(ic.FixedCadence(interval=1, growth=1.0, warmup_steps=2), 12) == [0, 1, 2, 4, 7, 11]
    # a warm-up longer than the run computes everything
    assert computed_evaluations(ic.FixedCadence(interval=5, warmup_steps=20), 8) == list(range(8))


def test_a_geometric_growth_multiplies_the_gap_after_each_computed_step():
    # gaps 2, 3 (2 x 1.5), 4 (4.5), 6 (6.75), 10 (10.125): their whole parts
    assert computed_evaluations(ic.FixedCadence(interval=2, growth_ratio=1.5), 30) == [0, 2, 5, 9, 15, 25, 29]
    # both: the gap is multiplied, then grown: 1, 3 (1 x 2 + 1), 7
    assert computed_evaluations(ic.FixedCadence(interval=1, growth=1.0, growth_ratio=2.0), 12) == [0, 1, 4, 11]


def test_the_new_settings_at_their_defaults_change_nothing():
    for steps in (5, 12, 28):
        for interval, growth in ((1, 0.0), (2, 0.0), (3, 0.5), (2, 1.0)):
            plain = ic.FixedCadence(interval=interval, growth=growth)
            explicit = ic.FixedCadence(interval=interval, growth=growth, warmup_steps=0, growth_ratio=1.0,
                                       last_step="compute")
            assert computed_evaluations(plain, steps) == computed_evaluations(explicit, steps)
            assert computed_evaluations(plain, steps)[-1] == steps - 1  # the last step is computed by default
    x = torch.randn(2, 4)
    outputs = [drive(ic.LoopState(ic.InterceptorChain.of([ic.FixedCadence(interval=2, **extra),
                                                           ic.TaylorSeer(order=1)]), SIGMAS), CountingModel(), x)
               for extra in ({}, {"warmup_steps": 0, "growth_ratio": 1.0, "last_step": "compute"})]
    assert all(torch.equal(a, b) for a, b in zip(*outputs))


def test_the_last_step_forecast_skips_it_and_changes_the_result():
    x = torch.randn(2, 4)
    forecast_model, computed_model = CountingModel(), CountingModel()
    cadence = ic.FixedCadence(interval=3)
    forecast = drive(ic.LoopState(ic.InterceptorChain.of([dataclasses.replace(cadence, last_step="forecast"),
                                                          ic.TaylorSeer(order=1)]), SIGMAS), forecast_model, x)
    computed = drive(ic.LoopState(ic.InterceptorChain.of([cadence, ic.TaylorSeer(order=1)]), SIGMAS), computed_model, x)
    assert computed_model.calls == forecast_model.calls + 1
    assert torch.equal(forecast[-2], computed[-2]) and not torch.equal(forecast[-1], computed[-1])


@pytest.mark.parametrize("decider", [ic.FixedCadence(), ic.AdaptiveCache(end_percent=1.0), ic.FirstBlockCache(),
                                     ic.MagCache(), ic.TeaCache(), ic.VerifiedForecast(), ic.GuidanceCache()])
def test_every_decider_forces_the_last_step_unless_set_to_forecast_it(decider):
    for last_step, forced in (("compute", True), ("forecast", False)):
        chosen = dataclasses.replace(decider, last_step=last_step)
        run = ic.LoopState(ic.InterceptorChain.of([chosen]), SIGMAS)
        for sigma in SIGMAS[:-2]:
            run.begin_evaluation(sigma)
            run.end_evaluation()
        assert run.forced(chosen, run.begin_evaluation(SIGMAS[-2])) is forced
    # sigma 0 and the first evaluation stay forced whatever the setting
    forecast = dataclasses.replace(decider, last_step="forecast")
    run = ic.LoopState(ic.InterceptorChain.of([forecast]), [1.0, 0.5, 0.0, 0.0])
    decider = run.chain.deciders[0]
    assert run.forced(decider, run.begin_evaluation(1.0))
    run.end_evaluation()
    run.begin_evaluation(0.5)
    run.end_evaluation()
    assert run.forced(decider, run.begin_evaluation(0.0))


def test_the_last_step_is_computed_where_nothing_is_cached_to_forecast_it():
    # a one-step run: its only step is the first and the last; nothing cached, so it is computed whatever the setting
    run = ic.LoopState(ic.InterceptorChain.of([ic.FixedCadence(interval=5, last_step="forecast")]), [1.0, 0.0])
    model = CountingModel()
    run.begin_evaluation(1.0)
    x = torch.ones(1, 3)
    fwd = run.begin_forward(1.0, 1, (3,), x.dtype, [0], ["c"])
    run.end_forward(fwd, model_forward(run, fwd, x, torch.ones(1), lambda: model(x, torch.ones(1))))
    run.end_evaluation()
    assert model.calls == 1


@pytest.mark.parametrize("settings, name", [
    ({"warmup_steps": -1}, "warmup_steps"), ({"warmup_steps": 1.5}, "warmup_steps"),
    ({"growth_ratio": 0.5}, "growth_ratio"), ({"growth_ratio": 5.0}, "growth_ratio"),
    ({"last_step": "skip"}, "last_step")])
def test_bad_schedule_settings_are_refused_naming_the_node_and_the_input(settings, name):
    with pytest.raises(ic.InterceptorError, match=rf"'Fixed Cadence \(node 4\)': '{name}'"):
        ic.InterceptorChain.of([ic.FixedCadence(interval=2, node="Fixed Cadence (node 4)", **settings)])
    if name == "last_step":  # a setting of every decider
        with pytest.raises(ic.InterceptorError, match=r"'Adaptive Cache \(node 2\)': 'last_step'"):
            ic.InterceptorChain.of([ic.AdaptiveCache(node="Adaptive Cache (node 2)", **settings)])


def test_the_growing_schedules_are_what_fixed_cadence_computes():
    schedules = growing_schedules(28, 8)
    assert (0, 1, 2, 4, 7, 11, 16, 22) in schedules, "Spectrum's schedule is among the candidates of 8 of 28"
    for steps, cadence in schedules.items():
        # the last step is computed only where a gap lands on it
        assert len(steps) == 8 and cadence.last_step == "forecast"
        assert computed_evaluations(cadence, 28) == list(steps)
    # the candidates of every budget have that budget
    for b in (3, 6, 12):
        assert all(len(steps) == b for steps in growing_schedules(28, b))

    # and the step lists of settings beyond them, with the last step computed or forecast
    for settings in ({"interval": 2, "growth": 1.0, "warmup_steps": 3}, {"interval": 3, "growth_ratio": 1.5},
                     {"interval": 2, "growth": 0.5, "max_consecutive_cached": 2}):
        for last_step in ("compute", "forecast"):
            cadence = ic.FixedCadence(last_step=last_step, **settings)
            assert list(cadence.computed_steps(28)) == computed_evaluations(cadence, 28), (settings, last_step)


def test_interval_1_is_bit_identical_to_no_chain():
    x = torch.randn(2, 4)
    plain = drive(ic.LoopState(ic.InterceptorChain(), SIGMAS), CountingModel(), x)
    cadence = drive(ic.LoopState(ic.InterceptorChain.of([ic.FixedCadence(interval=1)]), SIGMAS), CountingModel(), x)
    assert all(torch.equal(a, b) for a, b in zip(plain, cadence))


def test_branch_caches_never_cross():
    """Poison the uncond branch's cache: the cond rows of a skipped step must not see it."""
    chain = ic.InterceptorChain.of([ic.FixedCadence(interval=100)])
    run = ic.LoopState(chain, SIGMAS)
    x = torch.ones(1, 3)
    run.begin_evaluation(1.0)
    batch = torch.cat([x, x])
    fwd = run.begin_forward(1.0, 2, (3,), batch.dtype, [1, 0], ["u", "c"])
    model_forward(run, fwd, batch, torch.ones(2), lambda: batch * 0.5)
    run.end_forward(fwd, None)
    run.end_evaluation()
    uncond = next(k for k in run.caches.branches if k.branch == 1)
    run.caches.branches[uncond].slots["output"].value = torch.full((1, 3), float("nan"))
    run.begin_evaluation(0.9)
    fwd = run.begin_forward(0.9, 2, (3,), batch.dtype, [1, 0], ["u", "c"])
    out = model_forward(run, fwd, batch, torch.full((2,), 0.9), lambda: batch)
    run.end_forward(fwd, None)
    assert not fwd.computed
    assert torch.isnan(out[0]).all() and torch.isfinite(out[1]).all()


def test_separate_forwards_share_one_decision_and_missing_cache_computes():
    """cond and uncond as separate forwards (memory pressure): one decision per evaluation; a branch
    with no cache yet (it was absent at the anchor) computes instead of borrowing another's."""
    chain = ic.InterceptorChain.of([ic.FixedCadence(interval=2)])
    run = ic.LoopState(chain, SIGMAS)
    x = torch.ones(1, 3)
    calls = []
    for i, sigma in enumerate(SIGMAS[:3]):
        run.begin_evaluation(sigma)
        present = [(0, "c")] if i == 0 else [(0, "c"), (1, "u")]
        for branch, uuid in present:
            fwd = run.begin_forward(sigma, 1, (3,), x.dtype, [branch], [uuid])
            model_forward(run, fwd, x, torch.full((1,), sigma), lambda: calls.append((i, branch)) or x * 0.5)
            run.end_forward(fwd, None)
        run.end_evaluation()
    # step 1 is a skip step: cond reuses, uncond has no cache and must compute
    assert (1, 0) not in calls and (1, 1) in calls
    assert run.records[1].decided_by is not None


def test_loop_states_are_independent():
    chain = ic.InterceptorChain.of([ic.FixedCadence(interval=2)])
    a, b = ic.LoopState(chain, SIGMAS), ic.LoopState(chain, SIGMAS)
    drive(a, CountingModel(), torch.ones(1, 2))
    assert not b.records and not b.caches.branches


@dataclasses.dataclass(frozen=True)
class EveryOther(ic.Decider):
    declaration = ic.Decider.declaration.but(
        kind="every_other",
        display_name="Every other",
        granularity=ic.Granularity.BLOCKS,
    )

    def decide(self, run, ev, signals, measured):
        return ev.index % 2 == 0


def test_epsilon_conversion_is_per_row_and_inverts():
    """The one conversion every epsilon-space cache uses: each row divided by its own sigma, and back."""
    x, denoised = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    sigma = torch.tensor([0.5, 2.0])
    eps = to_eps(x, denoised, sigma)
    assert torch.allclose(eps[0], (x[0] - denoised[0]) / 0.5) and torch.allclose(eps[1], (x[1] - denoised[1]) / 2.0)
    assert torch.allclose(from_eps(x, eps, sigma), denoised, atol=1e-6)


def test_block_plan_segments():
    plan = BlockPlan([("double_block", 3), ("single_block", 4)], front=1, back=1)
    assert plan.segments == [(1, 2), (3, 5)] and plan.probe_end == 0
    assert BlockPlan([("double_block", 2)], front=2, back=0).segments == []
    assert BlockPlan([("double_block", 2), ("single_block", 2)], front=3, back=0).probe_end == 1


def test_block_skip_uses_cloned_input_even_when_blocks_mutate_in_place():
    """Flux-style blocks add into their input tensor. The residual must come from a clone of the segment
    input, and a skipped step must return input + residual exactly once."""
    def make_block(weight):
        def block(args):
            img = args["img"]
            img += weight * torch.tanh(img)  # in place, like Flux's img += ...
            return {"img": img}
        return block

    blocks = [make_block(w) for w in (0.5, 0.25, 0.125)]
    plan = BlockPlan([("double_block", 3)], front=1, back=0)
    run = ic.LoopState(ic.InterceptorChain.of([EveryOther()]), SIGMAS)
    x0 = torch.randn(1, 4, 2)
    for i, sigma in enumerate(SIGMAS[:3]):
        run.begin_evaluation(sigma)
        fwd = run.begin_forward(sigma, 1, (4, 2), x0.dtype, [0], ["c"])
        img = x0.clone()
        for pos, blk in enumerate(blocks):
            img = block_call(run, plan, pos, ("img",), {"img": img}, blk)["img"]
        run.end_forward(fwd, img)
        run.end_evaluation()
        if i == 0:
            full = img.clone()
        if i == 1:
            assert not fwd.computed
            assert torch.allclose(img, full, atol=1e-6)  # same input: reused residual reproduces the result
    residual = next(iter(run.caches.branches.values())).slots["0.img"].value
    assert residual.abs().sum() > 0


def test_a_skip_the_engine_could_not_make_counts_as_computed():
    """The conditioning changes at evaluation 3 (a prompt switch): Fixed Cadence wishes to skip there, but the new
    branch has no cache, so the model runs. That evaluation is the cadence's new anchor: evaluation 4 is skipped,
    not computed because a phantom skip at 3 made the cadence think it was due."""
    chain = ic.InterceptorChain.of([ic.FixedCadence(interval=2)])
    run = ic.LoopState(chain, SIGMAS)
    x = torch.ones(1, 3)
    computed = []
    for i, sigma in enumerate(SIGMAS[:-1]):
        run.begin_evaluation(sigma)
        uuid = "a" if i < 3 else "b"
        fwd = run.begin_forward(sigma, 1, (3,), x.dtype, [0], [uuid])
        model_forward(run, fwd, x, torch.full((1,), sigma), lambda: computed.append(i) or x * 0.5)
        run.end_forward(fwd, None)
        run.end_evaluation()
    assert computed == [0, 2, 3, 5, 7]
    assert [r.decided_by is not None for r in run.records] == [not (i in computed) for i in range(8)]
    assert run.decisions_of(chain.deciders[0]).skips == 3


def test_dbcache_limits_count_only_real_skips():
    """max_cached_steps=2: a wish to skip at an evaluation whose branch has no cache yet must not use up the
    budget. Blocks really run are counted at the block."""
    plan = BlockPlan([("double_block", 3)], front=1, back=0)
    decider = ic.DBCache(front=1, back=0, threshold=1e9, warmup=0.0, max_cached_steps=2, max_consecutive_cached=-1,
                         start_percent=0.0, end_percent=1.0)
    run = ic.LoopState(ic.InterceptorChain.of([decider]), SIGMAS)
    ran = []

    def block(args):
        ran.append(1)
        return {"img": args["img"] * 0.9 + 0.5}

    for i, sigma in enumerate(SIGMAS[:-1]):
        run.begin_evaluation(sigma)
        uuids = ["a"] if i < 2 else ["b"]  # a new conditioning from evaluation 2: no cache for it there
        fwd = run.begin_forward(sigma, 1, (2,), torch.float32, [0], uuids)
        img = torch.full((1, 2), sigma)
        for pos in range(3):
            img = block_call(run, plan, pos, ("img",), {"img": img}, block)["img"]
        run.end_forward(fwd, img)
        run.end_evaluation()
    # evaluation 0 computes; 1 skips; 2 wishes to skip but has no cache for "b"; 3 and 4 skip (budget of 2 spent
    # at 1 and 3); everything after computes. 3 blocks per computed evaluation, the probe block only otherwise.
    skipped = [i for i, r in enumerate(run.records) if r.skipped]
    assert skipped == [1, 3]
    assert len(ran) == 3 * 6 + 1 * 2


def test_nothing_of_a_run_outlives_it():
    """After release_caches, no tensor is reachable from the run: estimator slots, anchors, previous inputs."""
    for decider in (ic.AdaptiveCache(threshold=100.0, start_percent=0.0, end_percent=1.0),
                    ic.FixedCadence(interval=2)):
        run = ic.LoopState(ic.InterceptorChain.of([decider, ic.TaylorSeer(order=2)]), SIGMAS)
        drive(run, CountingModel(), torch.randn(1, 3))
        assert tensors_in(run), "the test must see the run's tensors before the release"
        run.release_caches()
        assert tensors_in(run) == []


def test_a_plan_for_another_schedule_computes_everything_and_says_so():
    """A plan is keyed on the sigmas it was calibrated for. On its own schedule it skips what it names; on
    another (other steps, scheduler or denoise: other sigmas) it computes every step, and the run notes it once."""
    evaluations = SIGMAS[:-1]
    plan = dict(compute=(0, 3, 7), sigmas=tuple(evaluations), schedule=tuple(SIGMAS))
    own = ic.LoopState(ic.InterceptorChain.of([ic.PlannedSchedule(**plan)]), SIGMAS)
    model = CountingModel()
    drive(own, model, torch.ones(1, 3))
    assert model.calls == 3 and not own.notes

    denoised = [s * 0.8 for s in SIGMAS]  # the same step count, another schedule
    other = ic.LoopState(ic.InterceptorChain.of([ic.PlannedSchedule(**plan)]), denoised)
    model = CountingModel()
    for sigma in denoised[:-1]:
        other.begin_evaluation(sigma)
        fwd = other.begin_forward(sigma, 2, (3,), torch.float32, [1, 0], ["u", "c"])
        s = torch.full((2,), sigma)
        other.end_forward(fwd, model_forward(other, fwd, torch.ones(2, 3), s, lambda: model(torch.ones(2, 3), s)))
        other.end_evaluation()
    assert model.calls == 8
    assert len(other.notes) == 1 and "another schedule" in other.notes[0]


def test_a_batch_that_cannot_be_split_by_branch_is_computed_and_noted():
    """Three rows for two branches: nothing says whose rows are whose, so every such forward is computed, and
    the run says so once."""
    run = ic.LoopState(ic.InterceptorChain.of([ic.FixedCadence(interval=100)]), SIGMAS)
    model = CountingModel()
    for sigma in SIGMAS[:-1]:
        run.begin_evaluation(sigma)
        batch, s = torch.ones(3, 2), torch.full((3,), sigma)
        fwd = run.begin_forward(sigma, 3, (2,), batch.dtype, [1, 0], ["u", "c"])
        run.end_forward(fwd, model_forward(run, fwd, batch, s, lambda: model(batch, s)))
        run.end_evaluation()
    assert model.calls == len(SIGMAS) - 1
    assert len(run.notes) == 1 and "could not be split" in run.notes[0]


def test_noise_levels_that_do_not_match_the_rows_are_computed_and_noted():
    run = ic.LoopState(ic.InterceptorChain.of([ic.FixedCadence(interval=100)]), SIGMAS)
    model = CountingModel()
    for sigma in SIGMAS[:-1]:
        run.begin_evaluation(sigma)
        batch = torch.ones(2, 2)
        fwd = run.begin_forward(sigma, 2, (2,), batch.dtype, [1, 0], ["u", "c"])
        out = model_forward(run, fwd, batch, torch.full((4,), sigma), lambda: model(batch, torch.full((2,), sigma)))
        run.end_forward(fwd, out)
        run.end_evaluation()
    assert model.calls == len(SIGMAS) - 1
    assert len(run.notes) == 1 and "noise levels" in run.notes[0]


def test_a_stream_that_changes_shape_inside_a_skippable_span_is_never_skipped_and_noted():
    """Block 1 appends a token: the span 1-2 has no residual of the input's shape to cache, so its blocks run on
    every step (the decider's skips cannot happen), and the run says why."""
    ran = []

    def block(pos):
        def run_block(args):
            ran.append(pos)
            img = args["img"]
            return {"img": torch.cat([img, img[:, :1]], dim=1) if pos == 1 else img * 0.9}
        return run_block

    plan = BlockPlan([("double_block", 3)], front=1, back=0)
    run = ic.LoopState(ic.InterceptorChain.of([EveryOther()]), SIGMAS)
    for sigma in SIGMAS[:-1]:
        run.begin_evaluation(sigma)
        fwd = run.begin_forward(sigma, 1, (4, 2), torch.float32, [0], ["c"])
        img = torch.ones(1, 4, 2)
        for pos in range(3):
            img = block_call(run, plan, pos, ("img",), {"img": img}, block(pos))["img"]
        run.end_forward(fwd, img)
        run.end_evaluation()
    assert len(ran) == 3 * (len(SIGMAS) - 1)
    assert len(run.notes) == 1 and "changed shape" in run.notes[0]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_nan_watch_flags_exactly_the_rows_with_a_nan_or_inf(dtype):
    """One flag per row, false exactly where a value is NaN or +-Inf (+Inf and -Inf together too), and true for
    rows of the dtype's largest finite values, whose sum overflows the dtype itself."""
    from cached_sampler_pack.interceptors.observers import rows_finite
    top = torch.finfo(dtype).max
    rows = torch.zeros(7, 2, 4, dtype=dtype)
    rows[1, 0, 1] = float("nan")
    rows[2, 1, 3] = float("inf")
    rows[3, 0, 0] = -float("inf")
    rows[4, 0, 0], rows[4, 1, 2] = float("inf"), -float("inf")
    rows[5] = top
    rows[6, 0], rows[6, 1] = top, -top
    assert rows_finite(rows).tolist() == [True, False, False, False, False, True, True]
