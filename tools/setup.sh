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
