"""The web extension: valid JavaScript, for both Cached Sampler nodes, display-only widget."""
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "web" / "cached_sampler.js"


def test_extension_is_valid_module_javascript(tmp_path):
    if shutil.which("node") is None:
        pytest.skip("no node to check the JavaScript syntax")
    copy = tmp_path / "cached_sampler.mjs"
    copy.write_text(SCRIPT.read_text(encoding="utf-8"))
    result = subprocess.run(["node", "--check", str(copy)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_extension_targets_both_samplers_and_never_serialises_its_widget():
    source = SCRIPT.read_text(encoding="utf-8")
    assert '"CachedSampler", "CachedSamplerAdvanced"' in source
    assert "serialize: false" in source and "widget.serialize = false" in source
    assert "onSerialize" in source, "display-only widgets are dropped from positional widgets_values"
    assert 'from "../../scripts/app.js"' in source
