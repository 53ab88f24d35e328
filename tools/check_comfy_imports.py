"""Import ComfyUI once, headless, the way the tests and the demo do, and name what it misses.

ComfyUI imports modules that its requirements.txt does not list (``requests``, from
app/frontend_management.py), so a list kept by hand drifts; importing it is the check that cannot.

    python3 tools/check_comfy_imports.py COMFYUI_PATH

Prints ``missing: MODULE`` and exits 1 when ComfyUI's server, executor or nodes cannot be imported for want
of a module (one at a time: install it and run again); exits 0 when they import. Built-in node files that
fail for want of a module (e.g. the audio nodes without torchaudio) are only reported (``optional: ...``):
ComfyUI runs without them, and so does the pack.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import logging
import re
import sys

MISSING = re.compile(r"No module named '([^'.]+)")


class Recorder(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("comfyui", help="the ComfyUI checkout (the folder with main.py)")
    args = parser.parse_args(argv)
    sys.path.insert(0, args.comfyui)
    sys.argv = sys.argv[:1]  # ComfyUI parses the command line when comfy.cli_args is imported
    recorder = Recorder()
    logging.getLogger().addHandler(recorder)
    noise = io.StringIO()
    try:
        with contextlib.redirect_stdout(noise), contextlib.redirect_stderr(noise):
            from comfy.cli_args import args as comfy_args
            comfy_args.cpu = True
            import comfy.model_management  # noqa: F401  (after the CPU flag)
            import utils.extra_config  # noqa: F401  (before `nodes`, or `utils` resolves to comfy/utils.py)
            import execution  # noqa: F401
            import nodes
            import server  # noqa: F401
            failed = asyncio.run(nodes.init_extra_nodes(init_custom_nodes=False, init_api_nodes=False))
    except ModuleNotFoundError as e:
        print(f"missing: {e.name.split('.')[0]}")
        return 1
    except Exception:
        print(noise.getvalue(), file=sys.stderr)
        raise
    optional = sorted({m for text in recorder.messages for m in MISSING.findall(text)})
    if failed:
        print(f"optional: {', '.join(optional) or 'unknown'} (ComfyUI's {', '.join(failed)} did not load)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
