"""Import ComfyUI once, headless, the way the tests and the demo do, and name what it misses.

ComfyUI imports modules that its requirements.txt does not list (``requests``, from
app/frontend_management.py), so a list kept by hand drifts; importing it is the check that cannot.

    python3 -m cached_sampler_dev.check_comfy_imports COMFYUI_PATH

Prints ``missing: MODULE`` and exits 1 when ComfyUI's server, executor or nodes cannot be imported for want
of a module (one at a time: install it and run again); exits 0 when they import. ComfyUI's own server is
built before the nodes load, as its main.py does (some built-in nodes register with it). Built-in node files
that still fail to load are reported one per line (``optional: FILE: REASON``, the reason as ComfyUI logged
it): ComfyUI runs without them, and so does the pack.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import logging
import re
import sys
from pathlib import Path

from .devkit.comfy_harness import import_headless

FAILURE = re.compile(r"(?:Cannot import|Error while calling comfy_entrypoint in) (\S+?)(?: module for custom nodes)?: (.*)")


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
    sys.argv = sys.argv[:1]  # ComfyUI parses the command line when comfy.cli_args is imported
    recorder = Recorder()
    logging.getLogger().addHandler(recorder)
    noise = io.StringIO()
    try:
        with contextlib.redirect_stdout(noise), contextlib.redirect_stderr(noise):
            import_headless(Path(args.comfyui))
            import execution  # noqa: F401
            import nodes
            import server
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            server.PromptServer(loop)  # before the nodes, as main.py builds it
            failed = loop.run_until_complete(nodes.init_extra_nodes(init_custom_nodes=False, init_api_nodes=False))
    except ModuleNotFoundError as e:
        print(f"missing: {e.name.split('.')[0]}")
        return 1
    except Exception:
        print(noise.getvalue(), file=sys.stderr)
        raise
    reasons = {}
    for text in recorder.messages:
        match = FAILURE.search(text)
        if match:
            reasons[match.group(1).replace("\\", "/").rsplit("/", 1)[-1]] = match.group(2).strip()
    for name in failed:
        print(f"optional: ComfyUI's built-in {name} did not load ({reasons.get(name, 'no reason logged')}); "
              "its nodes are missing, ComfyUI and the pack run without them")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
