import os

import pytest
import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)

try:
    from cached_sampler_dev.devkit.comfy_harness import Comfy, comfyui_version, find_comfyui, find_gguf_nodes
except ModuleNotFoundError as e:  # the developer wing (tools/) is not installed in this Python
    if e.name != "cached_sampler_dev":
        raise
    raise pytest.UsageError("the tests import the developer wing, the package cached_sampler_dev: run 'bash "
                            "tools/setup.sh' (or 'python3 -m pip install -e tools') with this Python first") from None

_COMFY = None


def pytest_report_header(config):
    path = find_comfyui()
    if path is None:
        return ("!!! NO COMFYUI FOUND (set COMFYUI_PATH, install the pack in ComfyUI/custom_nodes, or put one at "
                "~/ComfyUI): ALL INTEGRATION TESTS WILL BE SKIPPED !!!")
    gguf = find_gguf_nodes(path)
    return [f"ComfyUI for integration tests: {path} (version {comfyui_version(path)})",
            f"ComfyUI-GGUF for the GGUF tests: {gguf}" if gguf else
            "!!! ComfyUI-GGUF is not installed in that ComfyUI (nor at COMFYUI_GGUF_PATH): THE GGUF TESTS WILL BE SKIPPED !!!"]


@pytest.fixture(scope="session")
def comfy(tmp_path_factory):
    global _COMFY
    if _COMFY is None:
        path = find_comfyui()
        if path is None:
            pytest.skip("no ComfyUI found (COMFYUI_PATH, ../../ when installed in custom_nodes, or ~/ComfyUI)")
        _COMFY = Comfy(path, tmp_path_factory.mktemp("comfy"))
    return _COMFY
