"""Partial Last Step on hand-made blocks: which blocks run on which step, and what the last step returns."""
import pytest
import torch

from cached_sampler_dev.devkit.pack import load_core

ic = load_core()
from cached_sampler_pack.interceptors.engine import BlockPlan, block_call, model_forward  # noqa: E402

SIGMAS = [1.0, 0.9, 0.75, 0.6, 0.45, 0.3, 0.2, 0.1, 0.0]


def block(weight):
    def run_block(args):
        img = args["img"]
        return {"img": img + weight * torch.sin(img * (1.0 + weight))}
    return run_block


BLOCKS = [block(w) for w in (0.5, 0.3, 0.2)]


def sample(chain_items, x0):
    """Every step's output and how many blocks ran at each, Cached Sampler-style: a whole-model decision first, the
    blocks inside it. The input moves with sigma so that the blocks' residuals change from step to step."""
    chain = ic.InterceptorChain.of(chain_items)
    run = ic.LoopState(chain, SIGMAS)
    front, back = chain.decider(ic.Granularity.BLOCKS).blocks() if chain.decider(ic.Granularity.BLOCKS) else (1, 0)
    plan = BlockPlan([("double_block", len(BLOCKS))], front=front, back=back)
    outputs, ran = [], []
    for sigma in SIGMAS[:-1]:
        run.begin_evaluation(sigma)
        x = x0 * (1.0 + sigma)
        fwd = run.begin_forward(sigma, 1, tuple(x.shape[1:]), x.dtype, [0], ["c"])
        counted = []

        def compute():
            img = x.clone()
            for pos, blk in enumerate(BLOCKS):
                img = block_call(run, plan, pos, ("img",), {"img": img},
                                 lambda a, b=blk: counted.append(1) or b(a))["img"]
            return img

        out = model_forward(run, fwd, x, torch.full((1,), sigma), compute)
        run.end_forward(fwd, out)
        run.end_evaluation()
        outputs.append(out)
        ran.append(len(counted))
    return outputs, ran


def test_only_the_last_step_runs_its_front_blocks_and_the_rest_is_forecast_from_the_computed_steps():
    x0 = torch.randn(1, 5)
    cadence = ic.FixedCadence(interval=2)
    full, full_ran = sample([cadence, ic.TaylorSeer(order=1)], x0)
    outputs, ran = sample([cadence, ic.PartialLastStep(last_steps=1, front=1), ic.TaylorSeer(order=1)], x0)
    assert full_ran == [3, 0, 3, 0, 3, 0, 3, 3]
    assert ran == [3, 0, 3, 0, 3, 0, 3, 1]
    assert all(torch.equal(a, b) for a, b in zip(outputs[:-1], full[:-1]))
    # the last step: the front block on the real input, then blocks 2-3's residual extrapolated to order 1 in sigma
    # from the two steps computed before (6 at sigma 0.2, 4 at 0.45)
    def middle_residual(step):
        x = x0 * (1.0 + SIGMAS[step])
        after_front = BLOCKS[0]({"img": x})["img"]
        return BLOCKS[2](BLOCKS[1]({"img": after_front}))["img"] - after_front
    r6, r4 = middle_residual(6), middle_residual(4)
    forecast = r6 + (r6 - r4) / (SIGMAS[6] - SIGMAS[4]) * (SIGMAS[7] - SIGMAS[6])
    x7 = x0 * (1.0 + SIGMAS[7])
    expected = BLOCKS[0]({"img": x7})["img"] + forecast
    assert torch.allclose(outputs[-1], expected, atol=1e-6)
    assert not torch.allclose(outputs[-1], full[-1], atol=1e-4)  # it did not compute the last step whole


def test_last_steps_0_is_bit_identical_and_2_takes_the_last_two():
    x0 = torch.randn(1, 5)
    plain, plain_ran = sample([ic.FixedCadence(interval=1)], x0)
    off, off_ran = sample([ic.FixedCadence(interval=1), ic.PartialLastStep(last_steps=0)], x0)
    assert off_ran == plain_ran == [3] * 8
    assert all(torch.equal(a, b) for a, b in zip(off, plain))
    _, two = sample([ic.FixedCadence(interval=1), ic.PartialLastStep(last_steps=2, front=1, back=1)], x0)
    assert two == [3] * 6 + [2, 2]


def test_on_its_own_it_takes_only_the_last_step():
    _, ran = sample([ic.PartialLastStep(last_steps=1, front=2)], torch.randn(1, 5))
    assert ran == [3] * 7 + [2]


@pytest.mark.parametrize("settings, message", [
    (dict(last_steps=-1), "'last_steps' must be a whole number >= 0"),
    (dict(front=0), "'Fn' must be at least 1: the forecast middle is added to what the front blocks compute"),
    (dict(back=-1), "'Bn' must be 0 or more"),
])
def test_impossible_settings_are_refused_by_name(settings, message):
    with pytest.raises(ic.InterceptorError, match=message):
        ic.InterceptorChain.of([ic.PartialLastStep(**settings)])


def test_a_model_with_too_few_blocks_is_refused_before_sampling():
    card = ic.build_card(("WAN21", "BaseModel"), "WAN21", group_counts={"blocks": 3})
    assert card.total_blocks == 3
    assert "must leave blocks to forecast" in " ".join(ic.PartialLastStep(front=2, back=1).check_model(card))
    assert ic.PartialLastStep(front=2).check_model(card) == []
