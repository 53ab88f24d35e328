"""The rank group's collectives run where the group's backend reduces: CUDA under NCCL, the CPU under gloo; and
its agreements wait for the other ranks as long as configured (tests/distributed/test_distributed_sp.py runs a rank that
fails against one that waits)."""
import pytest
import torch
import torch.distributed as dist

from cached_sampler_dev.devkit.pack import load_core

load_core()
from cached_sampler_pack.interceptors.distributed import (DEFAULT_TIMEOUT_S, TIMEOUT_ENV, RankGroup,  # noqa: E402
                                                          agreement_timeout, collective_device)


def test_nccl_reduces_on_the_current_cuda_device_gloo_on_the_cpu():
    assert collective_device("nccl") == torch.device("cuda")  # no index: the current device when reduced
    assert collective_device(dist.Backend.NCCL) == torch.device("cuda")
    assert collective_device("gloo") == torch.device("cpu")
    assert collective_device("cpu:gloo,cuda:nccl") == torch.device("cpu")  # CPU tensors go to its gloo part


@pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="torch without gloo")
def test_a_gloo_group_reduces_its_buffers_on_the_cpu():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        group = RankGroup()
        assert group.device == torch.device("cpu")
        assert group.sum([1.5, 2.0]) == [1.5, 2.0]
        assert group.any(True) is True and group.any(False) is False
    finally:
        dist.destroy_process_group()


def test_the_agreement_timeout_comes_from_the_caller_the_environment_or_the_default(monkeypatch):
    monkeypatch.delenv(TIMEOUT_ENV, raising=False)
    assert agreement_timeout() == DEFAULT_TIMEOUT_S >= 300  # generous: a slow step must never be cut off
    monkeypatch.setenv(TIMEOUT_ENV, " 42.5 ")
    assert agreement_timeout() == 42.5
    assert agreement_timeout(7) == 7.0  # the caller's (group_of(..., timeout_s=...)) wins
    for bad in ("soon", "0", "-3", "inf", "nan"):
        monkeypatch.setenv(TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match=TIMEOUT_ENV):
            agreement_timeout()


@pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="torch without gloo")
def test_a_group_takes_its_timeout_when_it_is_made(monkeypatch):
    monkeypatch.setenv(TIMEOUT_ENV, "12")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert RankGroup().timeout_s == 12.0
        assert RankGroup(timeout_s=3).timeout_s == 3.0
    finally:
        dist.destroy_process_group()
