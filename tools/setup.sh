#!/usr/bin/env bash
# Install what the pack's tests, demo and tools need into the current python, without touching a working torch.
# ComfyUI itself is not on PyPI: point COMFYUI_PATH at a checkout (or keep one at ~/ComfyUI, or install the
# pack in its custom_nodes/); its requirements are installed from there, then ComfyUI is imported once to
# install what it imports without listing it (tools/check_comfy_imports.py).
set -euo pipefail
PY=${PYTHON:-python3}
HERE="$(cd "$(dirname "$0")" && pwd)"
quiet() {  # pip install, its exit status kept, without the root-user warning
  local log rc=0
  log=$("$PY" -m pip install -q --disable-pip-version-check "$@" 2>&1) || rc=$?
  printf '%s\n' "$log" | grep -v -i -e "running pip as the 'root' user" -e "^WARNING: Location 'file:" -e '^$' >&2 || true
  return $rc
}
installed() { "$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1" 2>/dev/null; }

# One torch set. torch, torchvision and torchaudio are released together, each build made for one torch
# version; pip left to itself pairs the newest torchaudio with any torch, and such a pair fails to import
# or crashes later. So with no torch, install one known set; with a torch already there, keep it and add
# only the torchvision/torchaudio releases made for exactly that version (every later install is pinned).
TORCH=2.11.0 TORCHVISION=0.26.0 TORCHAUDIO=2.11.0  # the newest set with all three (torchaudio ends at 2.11)
"$PY" -c "import torch" 2>/dev/null || quiet "torch==$TORCH" "torchvision==$TORCHVISION" "torchaudio==$TORCHAUDIO"
TORCH_NOW=$(installed torch) || { echo "setup: torch did not install" >&2; exit 1; }
TORCH_NOW=${TORCH_NOW%%+*}  # a local build tag (+cpu, +cu128) is not part of the release number
PIN="torch==$TORCH_NOW"
"$PY" -c "import torchvision" 2>/dev/null || quiet torchvision "$PIN" \
  || echo "setup: no torchvision release is made for torch $TORCH_NOW; ComfyUI's upscale-model nodes will not load." >&2
# torchaudio shares torch's release number: only torchaudio==$TORCH_NOW is made for this torch.
"$PY" -c "import torchaudio" 2>/dev/null || quiet "torchaudio==$TORCH_NOW" "$PIN" 2>/dev/null || true
quiet "pytest>=8" "scikit-learn>=1.3" "$PIN"

COMFY=${COMFYUI_PATH:-}
if [ -z "$COMFY" ] && [ "$(basename "$(dirname "$(dirname "$HERE")")")" = custom_nodes ]; then
  COMFY=$(dirname "$(dirname "$(dirname "$HERE")")")
fi
[ -n "$COMFY" ] || COMFY="$HOME/ComfyUI"
if [ -f "$COMFY/requirements.txt" ]; then
  quiet -r <(grep -v -E '^(torch|torchvision|torchaudio)([<>=~ ].*)?$' "$COMFY/requirements.txt") "$PIN"
  ok=
  for _ in 1 2 3 4 5; do
    if report=$("$PY" "$HERE/check_comfy_imports.py" "$COMFY"); then ok=1; break; fi
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

# Real-browser test (tests/ui/test_browser.py): Debian's Chromium and playwright-core (pinned, driver only:
# it never downloads a browser) in the git-ignored .browser/. Failures here only make that test skip.
PLAYWRIGHT_CORE_VERSION=1.65.1
BROWSER_DIR="$(cd "$(dirname "$0")/.." && pwd)/.browser"
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; } \
    || echo "setup: could not install chromium; the browser test will be skipped." >&2
fi
if command -v npm >/dev/null 2>&1; then
  if [ "$(node -p "try{require(process.argv[1]+'/node_modules/playwright-core/package.json').version}catch(e){''}" "$BROWSER_DIR" 2>/dev/null)" != "$PLAYWRIGHT_CORE_VERSION" ]; then
    mkdir -p "$BROWSER_DIR"
    PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm install --prefix "$BROWSER_DIR" --no-save --no-audit --no-fund --silent \
      "playwright-core@$PLAYWRIGHT_CORE_VERSION" || echo "setup: could not install playwright-core; the browser test will be skipped." >&2
  fi
else
  echo "setup: no node/npm; the browser test will be skipped." >&2
fi
