"""Host syncs: on a GPU every tensor-to-Python conversion (``.item()``, ``float(t)``, ``bool(t)``, ``.tolist()``)
waits for the device. The pack's own conversions are counted on a real sampling run of every method: what the
sampler costs per evaluation must not grow with the CFG branches, the forwards or the blocks."""
from __future__ import annotations

import contextlib
import os
import sys

import pytest
import torch

from cached_sampler_dev.support import methods
from cached_sampler_dev.support import tiny_models

STEPS = 8
CONVERSIONS = ("item", "tolist", "__float__", "__bool__", "__int__")


@contextlib.contextmanager
def conversions_from(directory: str):
    """Count the tensor-to-Python conversions called from code under ``directory``, by call site."""
    calls: dict[str, int] = {}
    originals = {name: getattr(torch.Tensor, name) for name in CONVERSIONS}

    def counted(name):
        original = originals[name]

        def conversion(self, *args, **kwargs):
            caller = sys._getframe(1)
            if os.path.abspath(caller.f_code.co_filename).startswith(directory):
                site = f"{os.path.basename(caller.f_code.co_filename)}:{caller.f_lineno}"
                calls[site] = calls.get(site, 0) + 1
            return original(self, *args, **kwargs)
        return conversion

    for name in CONVERSIONS:
        setattr(torch.Tensor, name, counted(name))
    try:
        yield calls
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def chains(ic):
    """Every method of the shared list (tests/support/methods.py), and the variants that transfer differently: the Guidance
    Cache in adaptive mode, beside a step cache that measures, and MagCache's calibration."""
    window = dict(start_percent=0.0, end_percent=1.0)
    return {
        **methods.skipping(ic),
        "guidance adaptive": [ic.GuidanceCache(interval=3, mode="adaptive", threshold=10.0, **window)],
        "guidance + adaptive": [ic.GuidanceCache(interval=2, **window), ic.AdaptiveCache(threshold=100.0, **window)],
        "magcache calibration": [ic.MagnitudeRecorder()],
    }


# Per evaluation: one transfer, whatever the branches and blocks: the decision's sums, with the sigma the sampler
# hands over (a tensor) and what was left to read (the NaN watch's flags of the previous evaluation's outputs, a
# rate a computed step measured, a calibration's ratios). Two deciders that decide apart (the guidance cache
# before the model runs, a step cache inside it) take one each.
PER_EVALUATION = 1
# Per run: the schedule and the model's largest sigma, read when it starts; the last evaluation's NaN flags.
PER_RUN = 4


@pytest.mark.parametrize("name", [*methods.NAMES, "guidance adaptive", "guidance + adaptive", "magcache calibration"])
def test_transfers_per_evaluation_do_not_grow_with_branches_forwards_or_blocks(comfy, name):
    import nodes
    adapter, ic = comfy.module("adapter"), comfy.module("interceptors")
    runs = []
    chain = ic.InterceptorChain.of(chains(ic)[name])
    pos, neg = tiny_models.conditioning("flux", seed=1)
    model = adapter.install(tiny_models.build("flux"), chain, on_run_end=lambda run, summary: runs.append(run))
    with conversions_from(os.path.dirname(os.path.dirname(os.path.abspath(adapter.__file__)))) as calls:
        nodes.common_ksampler(model, 42, STEPS, 3.0, "euler", "simple", pos, neg, tiny_models.latent("flux"))
    evaluations = len(runs[0].records)
    assert evaluations == STEPS
    if name != "magcache calibration":
        assert methods.skipped_work(runs[0]), "nothing was skipped: the decisions were never measured"
    deciders = len([ic for ic in chain if ic.role == "decider"]) if name == "guidance + adaptive" else 1
    assert sum(calls.values()) <= PER_EVALUATION * deciders * evaluations + PER_RUN, calls
    # every call site converts at most once per evaluation (and once more for the run's last reads): none is per
    # branch, per forward or per block
    assert max(calls.values()) <= deciders * evaluations + 1, calls
