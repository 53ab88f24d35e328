import os

import pytest
import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)

from devkit.comfy_harness import Comfy, comfyui_version, find_comfyui, find_gguf_nodes  # noqa: E402

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
