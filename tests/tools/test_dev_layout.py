"""The development layout: the folders on the import path are the ones the pyproject names, never the pack's
root, and every entry script in a folder of tools/ finds what it imports when run from anywhere."""
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import devkit

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ["tools/bench/bench.py", "tools/bench/bench_gpu.py", "tools/studies/bench_guidance.py",
           "tools/studies/calibration_spaces.py", "tools/studies/forecast_limits.py", "tools/studies/hook_costs.py",
           "tools/studies/guidance_on_cadence.py", "tools/studies/held_out_seeds.py", "tools/studies/partial_refresh.py",
           "tools/studies/schedules.py",
           "tools/generate/families_table.py",
           "tools/generate/make_memory_table.py", "tools/training/train_digits_model.py",
           "tools/devkit/workflow_api.py"]


def test_pytest_and_devkit_put_the_same_folders_on_the_path_and_never_the_pack_root():
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["pytest"]["ini_options"]
    assert tuple(settings["pythonpath"]) == devkit.PATHS
    folders = [(ROOT / p).resolve() for p in devkit.PATHS]
    assert all(f.is_dir() for f in folders) and ROOT not in folders
    assert set(folders) <= {Path(p).resolve() for p in sys.path if p}


def test_comfyui_nodes_module_is_comfyuis_and_the_pack_is_a_package(comfy):
    """``python3 -m pytest`` puts the working directory (the pack's root) on the path; ComfyUI's start-up goes first,
    so ``nodes`` is ComfyUI's own and the pack's nodes are a subpackage of the pack."""
    assert Path(sys.modules["nodes"].__file__).resolve() == comfy.path / "nodes.py"
    assert comfy.module("nodes").__name__ == f"{comfy.pack.__name__}.nodes"


def test_the_counting_nodes_are_one_module_for_tests_and_bench():
    """One CAPTURED for everything: the tests' nodes, the bench's and devkit's store into the same dict."""
    import bench_nodes
    import tiny_nodes
    from devkit import work_nodes
    assert tiny_nodes.CAPTURED is work_nodes.CAPTURED
    assert bench_nodes.CaptureLatent is work_nodes.CaptureLatent
    assert issubclass(bench_nodes.BenchCountWork, work_nodes.CountWork)
    assert issubclass(tiny_nodes.CountModelWork, work_nodes.CountWork)


@pytest.mark.parametrize("script", SCRIPTS)
def test_entry_scripts_start_from_any_folder(script, tmp_path):
    """``--help`` from an unrelated working directory: the script's bootstrap finds devkit and the folders it
    imports from, without the pack's root or tests/ on the path."""
    result = subprocess.run([sys.executable, str(ROOT / script), "--help"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout


HOLDING_TEST_MODULE = '''
import tiny_models
from devkit import work_nodes
from devkit.comfy_harness import Comfy, find_comfyui

HELD = []  # a module's global, freed only when CPython tears the modules down at exit


def test_holds_models_to_the_end(tmp_path):
    comfy = Comfy(find_comfyui(), tmp_path)
    HELD.extend(tiny_models.build("flux", seed) for seed in range(4))
    work_nodes.CAPTURED["model"] = tiny_models.build("wan21", 0)
    assert comfy.version
'''


def test_a_run_that_holds_models_to_its_end_ends_on_its_summary_line(comfy, tmp_path):
    """ComfyUI's ModelPatcher.__del__ needs ComfyUI's modules whole; a pytest run whose modules still hold
    models at exit, which CPython frees after it tore ComfyUI's modules down, used to print a traceback per model
    after the summary line. The harness finalizes them at exit, before that teardown."""
    (tmp_path / "test_holding.py").write_text(HOLDING_TEST_MODULE, encoding="utf-8")
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "COMFYUI_PATH": str(comfy.path), "HOME": str(tmp_path)}
    result = subprocess.run([sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir",
                             str(ROOT), "-q", str(tmp_path / "test_holding.py")],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            timeout=300)
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert result.returncode == 0, result.stdout[-3000:]
    assert "Exception ignored" not in result.stdout and "Traceback" not in result.stdout, result.stdout[-3000:]
    assert re.fullmatch(r"1 passed in [\d.]+s", lines[-1]), lines[-5:]
