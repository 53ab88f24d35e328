"""The rank group's collectives run where the group's backend reduces: CUDA under NCCL, the CPU under gloo."""
import pytest
import torch
import torch.distributed as dist

from pack import load_core

load_core()
from cached_sampler_pack.interceptors.distributed import RankGroup, collective_device  # noqa: E402


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
