"""The feature level (``Decider.level`` "features") on a hand-made model with Flux's layout: a whole-model decider's
skip runs the embeddings and the final layer, passes every block through and adds each block group's forecast
residual per stream."""
import pytest
import torch

from cached_sampler_dev.devkit.pack import load_core

ic = load_core()
from cached_sampler_pack.interceptors.engine import BlockPlan, block_call, model_forward  # noqa: E402

SIGMAS = [1.0, 0.9, 0.75, 0.6, 0.45, 0.3, 0.2, 0.1, 0.0]
GROUPS = [("double_block", 2), ("single_block", 2)]
COMPUTED = (0, 2, 4, 6, 7)  # Fixed Cadence, interval 2, over 8 steps (the last step computed)


def plain_block(position, keys, args, run_block):
    return run_block(args)


class TinyJoint:
    """Flux in miniature: a sigma-dependent embedding of the latent tokens and a text stream that differs per batch
    row; double blocks adding into both streams in place; single blocks on the text and image tokens joined; a
    final layer on the image tokens. ``block(position, out_keys, args, run_block)`` runs each block (the
    engine's block_call, or the block itself)."""

    def __init__(self, hidden: int = 8, text: int = 3, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.embedding = torch.randn(4, hidden, generator=g) * 0.5
        self.text = torch.randn(text, hidden, generator=g)
        self.final = torch.randn(hidden, 4, generator=g) * 0.5
        self.double = [torch.randn(hidden, hidden, generator=g) * 0.3 for _ in range(GROUPS[0][1])]
        self.single = [torch.randn(hidden, hidden, generator=g) * 0.3 for _ in range(GROUPS[1][1])]
        self.blocks_run = 0

    def embed(self, x, sigma):
        img = x @ self.embedding + sigma.reshape(-1, 1, 1)
        rows = torch.arange(x.shape[0], dtype=x.dtype).reshape(-1, 1, 1)
        return img, self.text.expand(x.shape[0], -1, -1) + rows

    def double_blocks(self, img, txt, block=plain_block, first=0):
        for i, w in enumerate(self.double):
            def run_block(args, w=w):
                self.blocks_run += 1
                args["img"] += torch.tanh(args["img"] @ w)  # in place, as Flux's blocks do
                args["txt"] += 0.5 * torch.tanh(args["txt"] @ w)
                return {"img": args["img"], "txt": args["txt"]}
            out = block(first + i, ("img", "txt"), {"img": img, "txt": txt}, run_block)
            img, txt = out["img"], out["txt"]
        return img, txt

    def single_blocks(self, joined, block=plain_block, first=GROUPS[0][1]):
        for i, w in enumerate(self.single):
            def run_block(args, w=w):
                self.blocks_run += 1
                return {"img": args["img"] + torch.tanh(args["img"] @ w)}
            joined = block(first + i, ("img",), {"img": joined}, run_block)["img"]
        return joined

    def head(self, joined, text_tokens):
        return joined[:, text_tokens:] @ self.final

    def __call__(self, x, sigma, block=plain_block):
        img, txt = self.embed(x, sigma)
        img, txt = self.double_blocks(img, txt, block)
        return self.head(self.single_blocks(torch.cat([txt, img], 1), block), txt.shape[1])


def sample(chain, model, x, feature_plan=None, blocks=True):
    """One evaluation per step, both CFG branches in one forward, the blocks through the engine."""
    run = ic.LoopState(ic.InterceptorChain.of(chain), SIGMAS)
    run.feature_plan = feature_plan
    plan = feature_plan or BlockPlan(GROUPS, 0, 0)
    engine_block = (lambda position, keys, args, run_block: block_call(run, plan, position, keys, args, run_block))
    outputs = []
    for sigma in SIGMAS[:-1]:
        run.begin_evaluation(sigma)
        batch = torch.cat([x, x])
        s = torch.full((2,), sigma)
        fwd = run.begin_forward(sigma, 2, tuple(batch.shape[1:]), batch.dtype, [0, 1], ["c", "u"])
        out = model_forward(run, fwd, batch, s, lambda: model(batch, s, engine_block if blocks else plain_block))
        run.end_forward(fwd, out)
        run.end_evaluation()
        outputs.append(out)
    return outputs, run


def hand_built(model, x, estimator):
    """The feature-level forecast built by hand: on the computed steps each block group's residual per stream, rows
    of each branch apart, goes to the estimator; on the others the embeddings run, each group adds the estimator's
    forecast of its residual, and the final layer runs."""
    slots, outputs = {}, []
    for step, sigma in enumerate(SIGMAS[:-1]):
        batch, s = torch.cat([x, x]), torch.full((2,), sigma)
        img, txt = model.embed(batch, s)
        if step in COMPUTED:
            img_in, txt_in = img.clone(), txt.clone()
            img, txt = model.double_blocks(img, txt)
            joined_in = torch.cat([txt, img], 1)
            joined = model.single_blocks(joined_in.clone())
            residuals = {"0.img": img - img_in, "0.txt": txt - txt_in, "1.img": joined - joined_in}
            for name, residual in residuals.items():
                for row in range(2):
                    slot = slots.setdefault((row, name), estimator.new_slot(SIGMAS))
                    estimator.observe(slot, residual[row:row + 1], sigma)
        else:
            def forecast(name, base):
                return base + torch.cat([estimator.estimate(slots[(row, name)], sigma, base.device).to(base.dtype)
                                         for row in range(2)])
            img, txt = forecast("0.img", img), forecast("0.txt", txt)
            joined = forecast("1.img", torch.cat([txt, img], 1))
        outputs.append(model.head(joined, txt.shape[1]))
    return outputs


@pytest.mark.parametrize("estimator", [ic.TaylorSeer(order=1), ic.TaylorSeer(order=2), None])
def test_the_feature_level_forecasts_each_block_groups_residual_as_built_by_hand(estimator):
    model, x = TinyJoint(), torch.randn(1, 6, 4)
    chain = [ic.FixedCadence(interval=2, level="features")] + ([estimator] if estimator else [])
    outputs, run = sample(chain, model, x, BlockPlan(GROUPS, 0, 0))
    reference = hand_built(TinyJoint(), x, estimator or ic.ReuseLast())
    assert [not r.skipped for r in run.records] == [i in COMPUTED for i in range(8)]
    # the skipped steps ran no block at all: 4 blocks on each of the 5 computed steps
    assert model.blocks_run == 4 * len(COMPUTED)
    for step, (out, expected) in enumerate(zip(outputs, reference)):
        assert torch.allclose(out, expected, rtol=0, atol=1e-6), step
    plain = [TinyJoint()(torch.cat([x, x]), torch.full((2,), s)) for s in SIGMAS[:-1]]
    assert not torch.allclose(outputs[1], plain[1], atol=1e-3)  # a skipped step is a forecast, not the model


def test_the_feature_level_computing_every_step_is_bit_identical_to_no_chain():
    x = torch.randn(1, 6, 4)
    plain, _ = sample([], TinyJoint(), x)
    for chain in ([ic.FixedCadence(interval=1, level="features")],
                  [ic.FixedCadence(interval=1, level="features"), ic.TaylorSeer(order=2)]):
        model = TinyJoint()
        outputs, run = sample(chain, model, x, BlockPlan(GROUPS, 0, 0))
        assert all(torch.equal(a, b) for a, b in zip(plain, outputs))
        assert model.blocks_run == 4 * 8 and not any(r.skipped for r in run.records)


def test_without_a_block_stack_the_feature_level_forecasts_the_model_output():
    """No plan (a family without block slots): the decider works as at the model level, its skipped forwards not
    run at all."""
    x = torch.randn(1, 6, 4)
    model_level, _ = sample([ic.FixedCadence(interval=2), ic.TaylorSeer(order=1)], TinyJoint(), x)
    model = TinyJoint()
    features, run = sample([ic.FixedCadence(interval=2, level="features"), ic.TaylorSeer(order=1)], model, x)
    assert all(torch.equal(a, b) for a, b in zip(model_level, features))
    assert model.blocks_run == 4 * len(COMPUTED) and sum(r.forwards_skipped for r in run.records) == 3


def test_the_feature_level_keeps_the_block_residuals_not_the_model_output():
    x = torch.randn(1, 6, 4)
    _, run = sample([ic.FixedCadence(interval=2, level="features")], TinyJoint(), x, BlockPlan(GROUPS, 0, 0))
    assert {name for cache in run.caches.branches.values() for name in cache.slots} == {"0.img", "0.txt", "1.img"}


@pytest.mark.parametrize("decider", [ic.DBCache(level="features"), ic.VerifiedForecast(level="features")])
def test_the_feature_level_is_refused_where_the_decider_is_not_a_whole_model_forecast(decider):
    with pytest.raises(ic.InterceptorError, match="'level'"):
        ic.InterceptorChain.of([decider])
    with pytest.raises(ic.InterceptorError, match="'level' must be one of"):
        ic.InterceptorChain.of([ic.FixedCadence(level="blocks")])


def test_a_non_finite_forecast_at_the_feature_level_blames_the_whole_model_decider():
    model, x = TinyJoint(), torch.randn(1, 6, 4)
    plan = BlockPlan(GROUPS, 0, 0)
    cadence = ic.FixedCadence(interval=2, level="features", node="Cadence (node 7)")
    run = ic.LoopState(ic.InterceptorChain.of([cadence]),
                       SIGMAS, observers=[ic.NaNWatch()])
    run.feature_plan = plan
    block = (lambda position, keys, args, run_block: block_call(run, plan, position, keys, args, run_block))
    with pytest.raises(ic.NonFiniteOutputError, match=r"in charge: 'Cadence \(node 7\)'"):
        for step, sigma in enumerate(SIGMAS[:3]):
            run.begin_evaluation(sigma)
            s = torch.full((1,), sigma)
            fwd = run.begin_forward(sigma, 1, tuple(x.shape[1:]), x.dtype, [0], ["c"])
            out = model_forward(run, fwd, x, s, lambda: model(x, s, block))
            run.end_forward(fwd, out)
            run.end_evaluation()
            if step == 0:  # the single blocks' residual goes bad: the next step forecasts from it
                slot = next(iter(run.caches.branches.values())).slots["1.img"]
                slot.value = torch.full_like(slot.value, float("nan"))
        run.transfer()
