"""The developer's set-up (tools/setup.sh), run against stand-ins for python, pip, apt-get, sudo, npm and node that
record what they are asked: it keeps an installed torch and pins everything to it, asks nothing of the system
package manager or npm unless --browser is given (and then says what it installs before installing it), and CI
passes --browser."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SETUP = ROOT / "tools" / "setup.sh"

pytestmark = pytest.mark.skipif(sys.platform == "win32" or shutil.which("bash") is None, reason="needs bash")

# Every stand-in appends "STUB <name> <arguments>" to the log that the set-up's standard output is appended to
# too, so that its place among the set-up's messages shows. The python one answers the few questions setup.sh asks.
PYTHON_STUB = r"""#!/bin/sh
echo "STUB python $*" >> "$STUB_LOG"
if [ "$1" = -c ]; then
  case "$2" in
    "import torch") [ -e "$STUB_DIR/no-torch" ] && exit 1 ;;
    *sys.base_prefix*) echo "1 /stub-venv" ;;
    *importlib.metadata*) [ -e "$STUB_DIR/no-torch" ] && exit 1; cat "$STUB_DIR/torch-version" ;;
  esac
elif [ "$1 $2 $3" = "-m pip install" ]; then
  case "$*" in
    *"torch==2.11.0 torchvision==0.26.0 torchaudio==2.11.0"*)
      rm -f "$STUB_DIR/no-torch"; echo 2.11.0+cpu > "$STUB_DIR/torch-version" ;;
  esac
fi
exit 0
"""
OTHER_STUB = r"""#!/bin/sh
echo "STUB $(basename "$0") $*" >> "$STUB_LOG"
exit 0
"""
TOOLS = ("bash", "sh", "dirname", "basename", "grep", "sed", "uname", "id", "env", "mkdir", "rm", "cat")


def run_setup(tmp_path, *args, torch="2.6.0+cu124", no_torch=False, comfyui=False):
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found, tool
        (stubs / tool).symlink_to(found)
    for name, text in {"python3": PYTHON_STUB, "apt-get": OTHER_STUB, "sudo": OTHER_STUB, "npm": OTHER_STUB,
                       "node": OTHER_STUB}.items():
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    (stubs / "torch-version").write_text(torch + "\n")
    if no_torch:
        (stubs / "no-torch").write_text("")
    log = tmp_path / "calls.log"
    log.write_text("")
    (tmp_path / "home").mkdir()
    if comfyui:  # a stand-in checkout: its requirements file is all the set-up reads of it
        (tmp_path / "comfyui").mkdir()
        (tmp_path / "comfyui" / "requirements.txt").write_text("torch\nnumpy\n")
    env = {"PATH": str(stubs), "HOME": str(tmp_path / "home"),
           "COMFYUI_PATH": str(tmp_path / ("comfyui" if comfyui else "no-comfyui")),
           "STUB_LOG": str(log), "STUB_DIR": str(stubs), "LC_ALL": "C"}
    with log.open("a") as out:
        result = subprocess.run([shutil.which("bash"), str(SETUP), *args], env=env, stdout=out,
                                stderr=subprocess.PIPE, text=True, timeout=60)
    lines = log.read_text().splitlines()
    calls = [line.split(" ", 1)[1] for line in lines if line.startswith("STUB ")]
    said = [line for line in lines if not line.startswith("STUB ")]
    return result, lines, said, calls, [c for c in calls if c.startswith("python -m pip install")]


def test_without_browser_it_keeps_torch_and_asks_nothing_of_apt_or_npm(tmp_path):
    result, lines, said, calls, pip = run_setup(tmp_path)
    assert result.returncode == 0, "\n".join(lines) + result.stderr
    assert not [c for c in calls if c.split()[0] in ("apt-get", "sudo", "npm")], calls
    assert "setup: keeping the torch already installed (2.6.0+cu124)" in said
    assert pip and all("torch==2.6.0" in c for c in pip), pip  # every install pinned to the torch that is there
    assert not [c for c in pip if "torch==2.11.0" in c or "--index-url" in c], pip
    assert any("bash tools/setup.sh --browser" in line for line in said), "says how to enable the browser test"


def test_it_installs_the_developer_wing_in_development_mode_and_checks_comfyui_with_it(tmp_path):
    """tools/ goes in as the editable package cached_sampler_dev (what the tests import and the entry points run
    as modules of), pinned to the torch there like every install, before ComfyUI is checked by a module of it."""
    result, lines, said, calls, pip = run_setup(tmp_path, comfyui=True)
    assert result.returncode == 0, "\n".join(lines) + result.stderr
    editable = [c for c in pip if c.split()[-2:-1] == [str(ROOT / "tools")] and c.split()[-3] == "-e"]
    assert len(editable) == 1 and editable[0].endswith("torch==2.6.0"), pip
    assert any("developer wing" in line and "cached_sampler_dev" in line for line in said), said
    check = calls.index(f"python -m cached_sampler_dev.check_comfy_imports {tmp_path / 'comfyui'}")
    assert calls.index(editable[0]) < check
    comfyui_requirements = next(c for c in pip if " -r " in c)
    assert calls.index(comfyui_requirements) < check  # ComfyUI's requirements first, then the check


def test_browser_says_what_it_installs_before_installing_it(tmp_path):
    result, lines, said, calls, _ = run_setup(tmp_path, "--browser")
    assert result.returncode == 0, "\n".join(lines) + result.stderr

    def first(condition):
        return next(i for i, line in enumerate(lines) if condition(line))

    apt = first(lambda line: line.startswith("STUB apt-get install") or " apt-get install" in line and
                line.startswith("STUB sudo"))
    npm = first(lambda line: line.startswith("STUB npm install"))
    assert "chromium" in lines[apt].split() and "playwright-core@1.65.1" in lines[npm].split()
    assert first(lambda line: line.startswith("setup: --browser: installing") and "apt-get" in line) < apt
    assert first(lambda line: line.startswith("setup: --browser: installing playwright-core 1.65.1 with npm")) < npm


def test_a_python_without_torch_gets_the_cpu_set_where_there_is_no_nvidia_driver(tmp_path):
    if os.uname().sysname != "Linux":
        pytest.skip("the CPU index is chosen on Linux only")
    result, lines, said, calls, pip = run_setup(tmp_path, no_torch=True)
    assert result.returncode == 0, "\n".join(lines) + result.stderr
    first = pip[0].split()
    assert first[first.index("--index-url") + 1] == "https://download.pytorch.org/whl/cpu"
    assert first[-3:] == ["torch==2.11.0", "torchvision==0.26.0", "torchaudio==2.11.0"]
    announced = next(i for i, line in enumerate(lines) if "the CPU build" in line)
    assert announced < lines.index("STUB " + pip[0])
    assert all("torch==2.11.0" in c for c in pip[1:]), pip  # the rest pinned to the torch just installed


def test_an_unknown_option_is_refused_with_the_usage(tmp_path):
    result, lines, said, calls, pip = run_setup(tmp_path, "--brwoser")
    assert result.returncode == 2 and "--browser" in result.stderr and not pip


def test_ci_runs_the_developer_setup_with_the_browser_part():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "bash tools/setup.sh --browser" in ci
