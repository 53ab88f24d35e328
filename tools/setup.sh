#!/usr/bin/env bash
# Install what the pack's tests and tools need into the current python, without touching a working torch.
# ComfyUI itself is not on PyPI: point COMFYUI_PATH at a checkout (or keep one at ~/ComfyUI); its
# requirements are installed from there (torchvision/torchaudio are left out: nothing here needs them).
set -euo pipefail
PY=${PYTHON:-python3}
quiet() { "$PY" -m pip install -q --disable-pip-version-check "$@" 2>&1 | grep -v -i "running pip as the 'root' user" || true; }
"$PY" -c "import torch" 2>/dev/null || quiet torch==2.13.0
"$PY" -c "import pytest, sklearn" 2>/dev/null || quiet "pytest>=8" "scikit-learn>=1.3"
COMFY=${COMFYUI_PATH:-}
if [ -z "$COMFY" ] && [ "$(basename "$(dirname "$PWD")")" = custom_nodes ]; then COMFY=$(dirname "$(dirname "$PWD")"); fi
[ -n "$COMFY" ] || COMFY="$HOME/ComfyUI"
if [ -f "$COMFY/requirements.txt" ]; then
  if ! "$PY" -c "import aiohttp, einops, safetensors, torchsde, av, comfy_kitchen, alembic, spandrel" 2>/dev/null; then
    grep -v -E '^(torch|torchvision|torchaudio)([<>=~ ].*)?$' "$COMFY/requirements.txt" > /tmp/cached-sampler-comfy-req.txt
    quiet -r /tmp/cached-sampler-comfy-req.txt
  fi
else
  echo "setup: no ComfyUI at $COMFY (set COMFYUI_PATH); integration tests will be skipped." >&2
fi

# Real-browser test (tests/test_browser.py): Debian's Chromium and playwright-core (pinned, driver only:
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
