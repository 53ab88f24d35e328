"""Every method of the shared list (tests/support/methods.py) through ComfyUI's executor, on the tiny Flux at cfg 3: its
config nodes build the chain the core list describes; with the settings that never skip the Cached Sampler is
bit-identical to KSampler and the model computes all its work; with the settings that skip it computes less
(``block_rows``: blocks times the batch rows they ran on) and stays finite."""
from __future__ import annotations

import pytest
import torch

from cached_sampler_dev.support import graphs
from cached_sampler_dev.support import methods
from cached_sampler_dev.support.tiny_nodes import CAPTURED

STEPS = 8


def _run(comfy, name=None, skips=True):
    prompt = graphs.base("flux", latent_seed=5)
    graphs.count_work(prompt, "flux")
    chain = methods.build(prompt, name, skips=skips) if name else None
    graphs.sampler(prompt, "CachedSampler" if chain else "KSampler", chain=chain, model="count", steps=STEPS, cfg=3.0)
    _, ui = comfy.run(prompt)
    return CAPTURED["out"].clone(), dict(CAPTURED["work"]), ui


@pytest.fixture(scope="module")
def plain(comfy):
    return _run(comfy)


@pytest.mark.parametrize("name", methods.NAMES)
def test_every_listed_method_is_bit_identical_when_it_never_skips_and_computes_less_when_it_skips(comfy, plain,
                                                                                                  name):
    reference, ref_work, _ = plain
    ic = comfy.module("interceptors")
    exact, exact_work, ui = _run(comfy, name, skips=False)
    data = ui["sampler"]["cached_sampler"][0]
    # the nodes built the chain the core list describes, and it ran on every evaluation
    assert data["methods"] == " + ".join(i.display_name for i in methods.never_skips(ic)[name]), data["methods"]
    assert data["methods"] == " + ".join(i.display_name for i in methods.skipping(ic)[name])
    assert [r["evaluations"] for r in data["runs"]] == [STEPS] and data["runs"][0]["skipped"] == 0
    assert torch.equal(exact, reference), f"{name} that never skips differs from KSampler"
    assert exact_work["block_rows"] == ref_work["block_rows"] and exact_work["rows"] == ref_work["rows"]

    cached, work, ui = _run(comfy, name)
    assert work["block_rows"] < ref_work["block_rows"], f"{name}: the model computed all its work"
    if name in methods.NEGATIVE_BRANCH_ONLY:  # it skips negative rows, never a whole step
        assert sum(work["negative_rows"]) < sum(ref_work["negative_rows"])
    else:
        assert "s" in ui["sampler"]["cached_sampler"][0]["runs"][0]["decisions"]
    assert torch.isfinite(cached).all() and not torch.equal(cached, reference)
