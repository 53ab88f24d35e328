"""The development layout: tools/ is one package, ``cached_sampler_dev`` (tests/support its ``support``), installed in
development mode by tools/setup.sh; every entry point runs as a module of it from any folder; nothing in the
project edits ``sys.path`` except where that is the job; pytest puts at most one folder on the path and never the
pack's root (ComfyUI has a top-level ``nodes`` module, and so does the pack)."""
import ast
import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import cached_sampler_dev

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "cached_sampler_dev"
# Where editing sys.path is the job: ComfyUI's documented way to import it headless (it goes first, ahead of any
# folder with a `nodes` or `utils` of its own), and Raylight's src/, which Raylight itself puts on the path.
SYS_PATH_EDITS_ALLOWED = {"tools/devkit/comfy_harness.py": "import_headless",
                          "tests/distributed/test_distributed_raylight.py": "actors"}


def project_python_files():
    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / name for name in listed.stdout.split()]


def entry_modules():
    """Every module of the developer wing with a command line (a ``__main__`` block), as ``python -m`` names it."""
    found = []
    for path in sorted((ROOT / "tools").rglob("*.py")):
        if 'if __name__ == "__main__":' in path.read_text(encoding="utf-8"):
            found.append(".".join([PACKAGE, *path.relative_to(ROOT / "tools").with_suffix("").parts]))
    return found


def sys_path_edits(tree):
    """(line, function) of each statement that changes sys.path: a call of one of its mutating methods, an
    assignment to it or to an item or slice of it."""
    def is_sys_path(node):
        return (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
                and node.value.id == "sys")
    edits = []

    def visit(node, function):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_sys_path(node.func.value)
                and node.func.attr in {"insert", "append", "extend", "remove", "pop", "clear", "__setitem__"}):
            edits.append((node.lineno, function))
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                if is_sys_path(target) or isinstance(target, ast.Subscript) and is_sys_path(target.value):
                    edits.append((node.lineno, function))
        for child in ast.iter_child_nodes(node):
            visit(child, function)
    visit(tree, None)
    return edits


def test_no_sys_path_edit_in_the_project_except_where_it_is_the_job():
    edits = {}
    for path in project_python_files():
        for line, function in sys_path_edits(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            edits.setdefault(path.relative_to(ROOT).as_posix(), []).append(f"line {line} in {function}")
    assert set(edits) == set(SYS_PATH_EDITS_ALLOWED), edits
    for name, where in edits.items():
        assert all(w.endswith(f" in {SYS_PATH_EDITS_ALLOWED[name]}") for w in where), (name, where)


def test_the_checker_sees_each_form_of_sys_path_edit():
    code = ("import sys\nsys.path.insert(0, 'a')\nsys.path[:0] = ['b']\nsys.path[0] = 'c'\n"
            "def f():\n    sys.path.append('d')\nsys.path = []\nsys.path += ['e']\nprint(sys.path)\n")
    assert sys_path_edits(ast.parse(code)) == [(2, None), (3, None), (4, None), (6, "f"), (7, None), (8, None)]


def test_pytest_puts_at_most_one_folder_on_the_path_and_never_the_pack_root():
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["pytest"]["ini_options"]
    folders = settings.get("pythonpath", [])
    assert len(folders) <= 1, folders
    assert all((ROOT / f).resolve() != ROOT for f in folders)
    assert "--import-mode=importlib" in settings["addopts"].split()


def test_the_developer_wing_is_one_package_installed_from_the_working_tree():
    """tools/pyproject.toml maps the one distinctive top-level name onto tools/ (and its support subpackage onto
    tests/support); the install this Python has is the development-mode one of this working tree."""
    config = tomllib.loads((ROOT / "tools" / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    assert {name.split(".")[0] for name in config["packages"]} == {PACKAGE}
    subpackages = {name.partition(".")[2] for name in config["packages"]} - {""}
    assert subpackages == {"bench", "devkit", "generate", "studies", "training", "support"}
    for sub in subpackages - {"support"}:
        assert (ROOT / "tools" / sub / "__init__.py").is_file(), sub
    assert (ROOT / "tests" / "support" / "__init__.py").is_file()
    assert Path(cached_sampler_dev.__file__).resolve() == ROOT / "tools" / "__init__.py"
    from cached_sampler_dev import support
    assert Path(support.__file__).resolve() == ROOT / "tests" / "support" / "__init__.py"
    # the only top-level name it installs, and one neither ComfyUI nor the pack uses
    assert importlib.metadata.packages_distributions().get(PACKAGE) == ["cached-sampler-dev"]
    top_level = importlib.metadata.distribution("cached-sampler-dev").read_text("top_level.txt")
    assert top_level is None or top_level.split() == [PACKAGE]


def test_bench_report_and_plot_do_not_import_each_other():
    def imported(name):
        tree = ast.parse((ROOT / "tools" / "bench" / f"{name}.py").read_text(encoding="utf-8"))
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                found.add(node.module or "")
                found.update(f"{node.module or ''}.{alias.name}".lstrip(".") for alias in node.names)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        return {re.sub(r"^.*\.", "", n) for n in found}
    assert "bench_report" not in imported("bench_plot")
    assert "bench_plot" in imported("bench_report")  # the report draws the plot; the plot needs nothing of it


def test_every_entry_point_is_a_module_of_the_package():
    modules = entry_modules()
    assert len(modules) >= 15 and f"{PACKAGE}.bench.bench" in modules and f"{PACKAGE}.demo" in modules, modules


@pytest.mark.parametrize("module", [m for m in entry_modules()
                                    if "argparse" in (ROOT / "tools" / (m.partition(".")[2].replace(".", "/") + ".py"))
                                    .read_text(encoding="utf-8")])
def test_entry_modules_start_from_any_folder(module, tmp_path):
    """``python -m MODULE --help`` from an unrelated working directory and with no PYTHONPATH: the installed
    package is all it takes."""
    result = subprocess.run([sys.executable, "-m", module, "--help"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout


def test_the_demo_starts_as_a_file_from_any_folder(tmp_path):
    """The README's command needs no install: run as a file, the demo finds devkit beside it (Python puts the
    script's folder on the path)."""
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "demo.py"), "--help"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120,
                            env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0 and "usage:" in result.stdout, result.stderr


def test_comfyui_nodes_module_is_comfyuis_and_the_pack_is_a_package(comfy):
    """``python3 -m pytest`` puts the working directory (the pack's root) on the path; ComfyUI's start-up goes first,
    so ``nodes`` is ComfyUI's own and the pack's nodes are a subpackage of the pack."""
    assert Path(sys.modules["nodes"].__file__).resolve() == comfy.path / "nodes.py"
    assert comfy.module("nodes").__name__ == f"{comfy.pack.__name__}.nodes"


def test_the_counting_nodes_are_one_module_for_tests_and_bench():
    """One CAPTURED for everything: the tests' nodes, the bench's and devkit's store into the same dict."""
    from cached_sampler_dev.bench import bench_nodes
    from cached_sampler_dev.support import tiny_nodes
    from cached_sampler_dev.devkit import work_nodes
    assert tiny_nodes.CAPTURED is work_nodes.CAPTURED
    assert bench_nodes.CaptureLatent is work_nodes.CaptureLatent
    assert issubclass(bench_nodes.BenchCountWork, work_nodes.CountWork)
    assert issubclass(tiny_nodes.CountModelWork, work_nodes.CountWork)


HOLDING_TEST_MODULE = '''
from cached_sampler_dev.support import tiny_models
from cached_sampler_dev.devkit import work_nodes
from cached_sampler_dev.devkit.comfy_harness import Comfy, find_comfyui

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
