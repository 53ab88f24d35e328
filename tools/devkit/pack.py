"""Import the pack as a package (never as top-level modules), without ComfyUI."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAME = "cached_sampler_pack"


def load_core():
    """The pack's ``interceptors`` package, imported as ``cached_sampler_pack.interceptors``."""
    return load("interceptors")


def load(submodule: str):
    """A module of the pack, imported as ``cached_sampler_pack.<submodule>`` (``adapter`` needs ComfyUI
    importable first)."""
    if NAME not in sys.modules:
        spec = importlib.util.spec_from_file_location(NAME, ROOT / "__init__.py", submodule_search_locations=[str(ROOT)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[NAME] = module
        spec.loader.exec_module(module)
    return importlib.import_module(f"{NAME}.{submodule}")
