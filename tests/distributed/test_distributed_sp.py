"""Sequence parallelism: two ranks (gloo on CPU) that share tiny Wan's or Flux's tokens make one decision per
evaluation.

Each rank samples through the pack's real wrappers and block replacements while its blocks see only its shard
of the image tokens (tests/support/distributed_harness.py; Flux's text whole on every rank, its single blocks on the
text and this rank's image shard). The ranks must decide alike at every evaluation, issue the same
collectives in the same order, and produce what one process produces on the whole sequence. With the change
concentrated in one rank's shard, ranks that decide on their own shard diverge: the last test runs that
unsynchronised variant of each model and checks that the consistency check catches it.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from cached_sampler_dev.support import distributed_harness as harness
from cached_sampler_dev.devkit.comfy_harness import find_comfyui

pytestmark = [
    pytest.mark.slow,  # two processes, each starting ComfyUI
    pytest.mark.skipif(find_comfyui() is None, reason="no ComfyUI found"),
    pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="torch without gloo"),
]

DBCACHE = ("DBCache", {"front": 1, "back": 0, "threshold": 0.3, "warmup": 0.0, "max_consecutive_cached": -1})
ADAPTIVE = ("AdaptiveCache", {"threshold": 1.0, "start_percent": 0.0})
FLUX_DBCACHE = (DBCACHE[0], DBCACHE[1] | {"threshold": 0.65})  # the random tiny Flux's probe changes by 0.5-0.8
SCENARIOS = [
    # block level: the probe residual is a token shard, its relative L1 is reduced over the ranks
    {"name": "dbcache", "chain": DBCACHE, "reference": True},
    # the same, with the change between steps concentrated in rank 0's shard
    {"name": "concentrated", "chain": DBCACHE, "reference": True, "concentrate": 2.0},
    # whole-model level: the latent is replicated on every rank
    {"name": "adaptive", "chain": ADAPTIVE, "reference": True},
    # CFG-parallel (each rank runs one branch): whole-model caching works, block caching turns off with a note
    {"name": "cfg_parallel/adaptive", "chain": ADAPTIVE, "reference": True, "cfg_parallel": True},
    {"name": "cfg_parallel/dbcache", "chain": DBCACHE, "cfg_parallel": True},
    # Flux: the probe is the double blocks' image shard; the single blocks run on the text and the image shard
    {"name": "flux/dbcache", "model": "flux", "chain": FLUX_DBCACHE, "reference": True},
    {"name": "flux/concentrated", "model": "flux", "chain": FLUX_DBCACHE, "reference": True, "concentrate": 2.0},
    {"name": "flux/adaptive", "model": "flux", "chain": ADAPTIVE, "reference": True},
]
AGREEING = [s["name"] for s in SCENARIOS if s.get("reference")]
CONCENTRATED = {s["name"]: s for s in SCENARIOS if s.get("concentrate")}


@pytest.fixture(scope="module")
def ranks():
    return harness.run_ranks(2, SCENARIOS)


def decisions(run) -> list:
    return [(e["index"], e["decisions"]) for e in run["evaluations"]]


def assert_consistent(results, name):
    """Both ranks finished, decided alike at every evaluation, ran the same blocks and issued the same
    collectives in the same order, with one agreement on every evaluation."""
    for r in results:
        assert "error" not in r, r["error"]
    run0, run1 = (r["runs"][name] for r in results)
    assert decisions(run0) == decisions(run1), f"{name}: the ranks decided differently\n{harness.as_json(results)}"
    assert run0["blocks"] == run1["blocks"]
    assert run0["collectives"] == run1["collectives"], f"{name}: the ranks issued different collectives"
    agreements = [c for c in run0["collectives"] if "MAX" in c]
    assert len(agreements) == len(run0["evaluations"]) == harness.STEPS, \
        f"{name}: not one agreement per evaluation, forced ones included: {agreements}"


@pytest.mark.parametrize("name", AGREEING)
def test_ranks_make_one_decision_per_evaluation(ranks, name):
    assert_consistent(ranks, name)
    made = [d for _, ds in decisions(ranks[0]["runs"][name]) for d in ds.values()]
    assert True in made and False in made, \
        f"{name}: nothing skipped or nothing computed; the test proves nothing: {harness.as_json(ranks[:1])}"


@pytest.mark.parametrize("name", AGREEING)
def test_output_and_decisions_equal_one_process(ranks, name):
    single = ranks[0]["runs"][name + "/single"]
    assert not any("MAX" in c or "SUM" in c for c in single["collectives"]), "one process issued collectives"
    for r in ranks:
        run = r["runs"][name]
        assert decisions(run) == decisions(single)
        for shared, alone in zip(run["evaluations"], single["evaluations"]):
            if alone["metric"] is not None:  # reduced exactly, the shard padding left out
                assert shared["metric"] == pytest.approx(alone["metric"], rel=1e-6)
        torch.testing.assert_close(run["output"], single["output"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", CONCENTRATED)
def test_metrics_are_reduced_over_the_shards(ranks, name):
    """The block-level metric is one sum over both shards: one SUM reduction per measured evaluation, and the
    ranks see the same value although their shards changed by very different amounts."""
    run = ranks[0]["runs"][name]
    reductions = [c for c in run["collectives"] if "SUM" in c]
    measured = [e for e in run["evaluations"] if e["metric"] is not None]
    assert measured and len(reductions) == len(measured)
    assert [e["metric"] for e in measured] == [e["metric"] for e in ranks[1]["runs"][name]["evaluations"]
                                               if e["metric"] is not None]


def test_cfg_parallel_turns_block_caching_off_with_a_note(ranks):
    """Under CFG-parallel the blocks see one branch's rows; block caching would silently never skip. It is
    switched off, said once, and every block runs on both ranks (the same run without CFG-parallel skips)."""
    runs = [r["runs"]["cfg_parallel/dbcache"] for r in ranks]
    for run in runs:
        assert [n for n in run["notes"] if "CFG-parallel" in n], run["notes"]
        assert [e["blocks_run"] for e in run["evaluations"]] == [3] * harness.STEPS
    assert runs[0]["collectives"] == runs[1]["collectives"]
    assert any(e["blocks_run"] < 3 for e in ranks[0]["runs"]["dbcache"]["evaluations"])


@pytest.mark.parametrize("name", CONCENTRATED)
def test_unsynchronised_ranks_diverge(name):
    """The same concentrated run with no rank group (each rank decides on its own shard): the check above must
    catch it, or the concentrated scenario would not be testing anything. A rank may fail only in a collective
    (its diverged peer left or paired it wrongly), never in the model. Tiny Flux's diverged ranks do not even
    fail: their mismatched all_gathers have the same size and pair up silently. Each model runs in ranks of its
    own, since a failed collective leaves the process group unusable."""
    results = harness.run_ranks(2, [CONCENTRATED[name] | {"reference": False}], sync=False, timeout_s=20)
    for r in results:
        assert "error" not in r or "distributed_c10d" in r["error"], r["error"]
    with pytest.raises(AssertionError):
        assert_consistent(results, name)


AGREEMENT_TIMEOUT_S = 5  # the test's bound on an agreement's wait (the default is minutes)
FAILING = {"name": "failing", "chain": ADAPTIVE, "fail_at": {"rank": 1, "evaluation": 3}}


def test_a_rank_that_fails_mid_run_ends_the_others_wait_within_the_bound():
    """Rank 1 raises at its evaluation 3, before its model runs, and lives on (as a Raylight actor does after its
    prompt failed: no connection closes). Rank 0 goes on to that evaluation's agreement, which rank 1 never
    reaches; it must give up within the bound (CACHED_SAMPLER_AGREEMENT_TIMEOUT, shortened here) and fail saying
    what happened. The process group's own timeout is longer than the test's deadline: a rank 0 that waited
    for it instead is killed at the deadline, and the test fails rather than hang."""
    results = harness.run_ranks(2, [FAILING], timeout_s=900, deadline_s=150,
                                env={"CACHED_SAMPLER_AGREEMENT_TIMEOUT": str(AGREEMENT_TIMEOUT_S)})
    survivor, failed = results
    assert "rank 1 fails at evaluation 3" in failed.get("error", ""), failed.get("error")
    assert not survivor.get("killed"), "rank 0 was still waiting when the test's deadline came: it hung"
    error = survivor.get("error", "")
    assert "AgreementError" in error, error
    assert f"the other ranks did not reach the agreement within {AGREEMENT_TIMEOUT_S} s" in error, error
    assert "another rank probably failed: see its log" in error, error
    # the evaluations before went through (one decision agreed on each of 0, 1 and 2); the wait that ran out was
    # the pack's agreement of evaluation 3 (its metric's sums, before its decision), not one of the model's
    decisions = [c for c in survivor["collectives"] if "MAX" in c]
    assert len(decisions) == FAILING["fail_at"]["evaluation"], survivor["collectives"]
    assert survivor["collectives"][-1].startswith("all_reduce"), survivor["collectives"]
