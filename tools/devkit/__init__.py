"""The project's development kit, shared by the tests, the bench, the demo and the generators; never shipped
to users and never loaded by ComfyUI.

* ``comfy_harness``: ComfyUI started headless (``import_headless``: on sys.path, its command-line flags set,
  imported in the right order) and ``Comfy``, that ComfyUI with the pack loaded by ComfyUI's own custom-node
  loader, its executor and a server that records what it would send to a browser;
* ``pack``: the pack imported as a package without ComfyUI (its core is plain torch);
* ``work_nodes``: ComfyUI nodes that count the model work a run really did, time it and capture its results;
* ``workflow_api``: a saved workflow turned into the API prompt the server runs, and a server's GET routes
  called in-process.

Importing ``devkit`` puts the development folders (``PATHS``, the same list as pytest's ``pythonpath`` in
pyproject.toml) on ``sys.path``, so an entry script in a folder of tools/ needs one line to find tools/ and
nothing more. The pack's root is never among them: ComfyUI has a top-level ``nodes`` module, and so does the
pack, which is imported as a package.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PATHS = ("tools", "tools/bench", "tools/generate", "tests/support")


def use_paths() -> None:
    """Put every folder of ``PATHS`` on ``sys.path`` (once, in that order, before the rest)."""
    missing = [str(ROOT / p) for p in PATHS if str(ROOT / p) not in sys.path]
    sys.path[:0] = missing


use_paths()
