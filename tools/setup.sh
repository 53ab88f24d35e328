#!/usr/bin/env bash
# The developer's set-up: what the pack's tests, bench and tools need, installed into the current Python (best a
# virtual environment), a working torch kept, and the developer wing (tools/) itself in development mode, as the
# package cached_sampler_dev (tools/pyproject.toml). The pack itself needs none of it, and tools/demo.py runs with
# what ComfyUI already has.
#   bash tools/setup.sh            torch (only where there is none), pytest, scikit-learn, ComfyUI's requirements,
#                                  the developer wing
#   bash tools/setup.sh --browser  the same, and what the real-browser test needs: Chromium from the system package
#                                  manager (apt-get, as root or through sudo) and playwright-core from npm in .browser/
# ComfyUI itself is not on PyPI: point COMFYUI_PATH at a checkout (or keep one at ~/ComfyUI, or install the
# pack in its custom_nodes/); its requirements are installed from there, then ComfyUI is imported once to
# install what it imports without listing it (python -m cached_sampler_dev.check_comfy_imports).
set -euo pipefail
usage() { sed -n '2,9s/^# \{0,1\}//p' "$0"; }
BROWSER=
for arg in "$@"; do
  case $arg in
    --browser) BROWSER=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "setup: unknown option '$arg'" >&2; usage >&2; exit 2 ;;
  esac
done
PY=${PYTHON:-python3}
HERE="$(cd "$(dirname "$0")" && pwd)"
quiet() {  # pip install, its exit status kept, without the root-user warning
  local log rc=0
  log=$("$PY" -m pip install -q --disable-pip-version-check "$@" 2>&1) || rc=$?
  printf '%s\n' "$log" | grep -v -i -e "running pip as the 'root' user" -e "^WARNING: Location 'file:" -e '^$' >&2 || true
  return $rc
}
installed() { "$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1" 2>/dev/null; }

where=$("$PY" -c "import sys; print(int(sys.prefix != sys.base_prefix), sys.prefix)") \
  || { echo "setup: no Python at '$PY' (set PYTHON)" >&2; exit 1; }
echo "setup: installing into the Python at ${where#* }"
[ "${where%% *}" = 1 ] || echo "setup: that Python is not a virtual environment, so these packages go into its own" \
  "site-packages; python3 -m venv .venv && . .venv/bin/activate first keeps them apart."

# One torch set. torch, torchvision and torchaudio are released together, each build made for one torch
# version; pip left to itself pairs the newest torchaudio with any torch, and such a pair fails to import
# or crashes later. So with no torch, install one known set; with a torch already there, keep it and add
# only the torchvision/torchaudio releases made for exactly that version (every later install is pinned).
# PyPI's Linux torch is the CUDA build (with its NVIDIA libraries, gigabytes): on Linux with no NVIDIA driver
# the set comes from PyTorch's CPU index instead (TORCH_INDEX_URL chooses another, e.g. a ROCm one).
TORCH=2.11.0 TORCHVISION=0.26.0 TORCHAUDIO=2.11.0  # the newest set with all three (torchaudio ends at 2.11)
if ! "$PY" -c "import torch" 2>/dev/null; then
  SET=("torch==$TORCH" "torchvision==$TORCHVISION" "torchaudio==$TORCHAUDIO")
  index=${TORCH_INDEX_URL:-}
  if [ -z "$index" ] && [ "$(uname -s)" = Linux ] && ! command -v nvidia-smi >/dev/null 2>&1; then
    index=https://download.pytorch.org/whl/cpu
    echo "setup: no torch in this Python and no NVIDIA driver: installing torch $TORCH, torchvision $TORCHVISION and" \
         "torchaudio $TORCHAUDIO, the CPU build, from $index"
  else
    echo "setup: no torch in this Python: installing torch $TORCH, torchvision $TORCHVISION and torchaudio $TORCHAUDIO" \
         "from ${index:-PyPI}"
  fi
  if [ -n "$index" ]; then
    quiet --retries 2 --index-url "$index" "${SET[@]}" || {
      [ -n "${TORCH_INDEX_URL:-}" ] && exit 1
      echo "setup: $index did not answer; installing the set from PyPI instead (its Linux build is the CUDA one)" >&2
      quiet "${SET[@]}"
    }
  else
    quiet "${SET[@]}"
  fi
else
  echo "setup: keeping the torch already installed ($(installed torch || echo '?'))"
fi
TORCH_NOW=$(installed torch) || { echo "setup: torch did not install" >&2; exit 1; }
TORCH_NOW=${TORCH_NOW%%+*}  # a local build tag (+cpu, +cu128) is not part of the release number
PIN="torch==$TORCH_NOW"
"$PY" -c "import torchvision" 2>/dev/null || quiet torchvision "$PIN" \
  || echo "setup: no torchvision release is made for torch $TORCH_NOW; ComfyUI's upscale-model nodes will not load." >&2
# torchaudio shares torch's release number: only torchaudio==$TORCH_NOW is made for this torch.
"$PY" -c "import torchaudio" 2>/dev/null || quiet "torchaudio==$TORCH_NOW" "$PIN" 2>/dev/null || true
quiet "pytest>=8" "scikit-learn>=1.3" "$PIN"
# The developer wing: tools/ as one package, cached_sampler_dev, installed in development mode (an editable install
# reads the working tree), so the tests import it and its entry points run as modules from any folder.
echo "setup: installing the developer wing (tools/) in development mode, as the package cached_sampler_dev"
quiet -e "$HERE" "$PIN"

COMFY=${COMFYUI_PATH:-}
if [ -z "$COMFY" ] && [ "$(basename "$(dirname "$(dirname "$HERE")")")" = custom_nodes ]; then
  COMFY=$(dirname "$(dirname "$(dirname "$HERE")")")
fi
[ -n "$COMFY" ] || COMFY="$HOME/ComfyUI"
if [ -f "$COMFY/requirements.txt" ]; then
  quiet -r <(grep -v -E '^(torch|torchvision|torchaudio)([<>=~ ].*)?$' "$COMFY/requirements.txt") "$PIN"
  ok=
  for _ in 1 2 3 4 5; do
    if report=$("$PY" -m cached_sampler_dev.check_comfy_imports "$COMFY"); then ok=1; break; fi
    case $report in missing:*) ;; *) break ;; esac
    module=${report#missing: }
    if [ "$module" = torchaudio ]; then  # listed by ComfyUI, but no release was made for this torch
      echo "setup: ComfyUI at $COMFY imports torchaudio at start-up, and no torchaudio release is made for" \
           "torch $TORCH_NOW (torchaudio shares torch's release number; its last release is 2.11). Install a" \
           "matching set into this Python, e.g. pip install torch==$TORCH torchvision==$TORCHVISION" \
           "torchaudio==$TORCHAUDIO (add --index-url for a CUDA build), then run this set-up again." >&2
      exit 1
    fi
    echo "setup: ComfyUI imports '$module' without listing it; installing it." >&2
    quiet "$module" "$PIN"
  done
  [ -n "$ok" ] || { echo "setup: ComfyUI does not import (${report:-see above})." >&2; exit 1; }
  [ -z "$report" ] || printf '%s\n' "$report" | sed 's/^/setup: /' >&2
  # city96's ComfyUI-GGUF, where that ComfyUI has it (or COMFYUI_GGUF_PATH names it): its requirements, as
  # ComfyUI-Manager would install them, so that the GGUF test runs instead of skipping for want of `gguf`
  for gguf_nodes in "${COMFYUI_GGUF_PATH:-}" "$COMFY"/custom_nodes/*[Gg][Gg][Uu][Ff]*; do
    if [ -f "$gguf_nodes/requirements.txt" ]; then
      quiet -r "$gguf_nodes/requirements.txt" "$PIN" \
        || echo "setup: could not install the requirements of $gguf_nodes; the GGUF test will be skipped." >&2
      break
    fi
  done
else
  echo "setup: no ComfyUI at $COMFY (set COMFYUI_PATH); integration tests will be skipped." >&2
fi

# The real-browser test (tests/ui/test_browser.py) needs Debian's Chromium (the system package manager's) and
# playwright-core (pinned; a driver only, it never downloads a browser) in the git-ignored .browser/. Only with
# --browser, saying first what it installs; without them that test skips, saying so. Failures here only make it skip.
PLAYWRIGHT_CORE_VERSION=1.65.1
BROWSER_DIR="$(cd "$HERE/.." && pwd)/.browser"
CHROMIUM=${CHROMIUM_PATH:-$(command -v chromium 2>/dev/null || true)}
playwright_now() {
  node -p "try{require(process.argv[1]+'/node_modules/playwright-core/package.json').version}catch(e){''}" \
    "$BROWSER_DIR" 2>/dev/null || true
}
if [ -z "$BROWSER" ]; then
  if [ -z "$CHROMIUM" ] || [ "$(playwright_now)" != "$PLAYWRIGHT_CORE_VERSION" ]; then
    echo "setup: the real-browser test (tests/ui/test_browser.py) will be skipped: it needs Chromium and" \
         "playwright-core $PLAYWRIGHT_CORE_VERSION. 'bash tools/setup.sh --browser' installs them: Chromium with" \
         "apt-get (as root, or through sudo) and playwright-core with npm into .browser/."
  fi
  exit 0
fi
if [ -n "$CHROMIUM" ]; then
  echo "setup: --browser: Chromium is at $CHROMIUM"
elif command -v apt-get >/dev/null 2>&1; then
  SUDO=
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO=sudo; else SUDO=none; fi
  fi
  if [ "$SUDO" = none ]; then
    echo "setup: --browser: installing Chromium needs root: run 'apt-get install chromium' as root (or set" \
         "CHROMIUM_PATH to a Chromium); the browser test will be skipped." >&2
  else
    echo "setup: --browser: installing Debian's chromium package with ${SUDO:+sudo }apt-get (the system package" \
         "manager: chromium and its dependencies, about 480 MB on a bare system)"
    { $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
      || echo "setup: could not install chromium; the browser test will be skipped." >&2
  fi
else
  echo "setup: --browser: no apt-get here: install Chromium with this system's package manager (or set" \
       "CHROMIUM_PATH to one); the browser test will be skipped until then." >&2
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "setup: --browser: no node/npm; install Node.js for playwright-core; the browser test will be skipped." >&2
elif [ "$(playwright_now)" = "$PLAYWRIGHT_CORE_VERSION" ]; then
  echo "setup: --browser: playwright-core $PLAYWRIGHT_CORE_VERSION is in $BROWSER_DIR"
else
  echo "setup: --browser: installing playwright-core $PLAYWRIGHT_CORE_VERSION with npm into $BROWSER_DIR (git-ignored)"
  mkdir -p "$BROWSER_DIR"
  PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm install --prefix "$BROWSER_DIR" --no-save --no-audit --no-fund --silent \
    "playwright-core@$PLAYWRIGHT_CORE_VERSION" || echo "setup: could not install playwright-core; the browser test will be skipped." >&2
fi
# The browser test also runs against the newest frontend package (the server started with --front-end-root): its
# wheel, downloaded from PyPI with pip (no install) and extracted into the git-ignored .frontend/.
NEWEST_FRONTEND=1.58.1
FRONTEND_DIR="$(cd "$HERE/.." && pwd)/.frontend"
FRONTEND_ROOT="$FRONTEND_DIR/comfyui_frontend_package-$NEWEST_FRONTEND"
if [ -f "$FRONTEND_ROOT/comfyui_frontend_package/static/index.html" ]; then
  echo "setup: --browser: comfyui-frontend-package $NEWEST_FRONTEND is in $FRONTEND_ROOT"
else
  echo "setup: --browser: downloading comfyui-frontend-package $NEWEST_FRONTEND (the newest frontend, a 30 MB wheel)" \
       "with pip and extracting it into $FRONTEND_DIR (git-ignored)"
  mkdir -p "$FRONTEND_DIR/download"
  { "$PY" -m pip download --no-deps --only-binary=:all: -q -d "$FRONTEND_DIR/download" \
      "comfyui-frontend-package==$NEWEST_FRONTEND" \
    && "$PY" -m zipfile -e "$FRONTEND_DIR/download/comfyui_frontend_package-$NEWEST_FRONTEND-py3-none-any.whl" \
      "$FRONTEND_ROOT"; } \
    || echo "setup: could not fetch comfyui-frontend-package $NEWEST_FRONTEND; the browser test skips its run" \
            "with the newest frontend." >&2
  rm -rf "$FRONTEND_DIR/download"
fi
