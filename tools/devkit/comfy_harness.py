"""Run the pack inside a real ComfyUI, headless: ComfyUI's own custom-node loader, its executor, its models.

ComfyUI is found through ``COMFYUI_PATH``, else the folder above ``custom_nodes/`` when the pack is
installed there, else ``~/ComfyUI``.
"""
from __future__ import annotations

import asyncio
import atexit
import copy
import gc
import itertools
import logging
import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACK_DIR_NAME = "cached-sampler"
CAPTURED: dict = {}


def find_comfyui() -> Path | None:
    candidates = []
    if os.environ.get("COMFYUI_PATH"):
        candidates.append(Path(os.environ["COMFYUI_PATH"]).expanduser())
    if ROOT.parent.name == "custom_nodes":
        candidates.append(ROOT.parent.parent)
    candidates.append(Path.home() / "ComfyUI")
    for c in candidates:
        if (c / "main.py").is_file() and (c / "comfy").is_dir():
            return c.resolve()
    return None


def start(cpu: bool = True, quiet: bool = False, tmp: Path | None = None, test_nodes: bool = True) -> "Comfy":
    """The headless ComfyUI of a tool (the demo, the bench, a generator), found as ``find_comfyui`` finds it, with
    one torch thread; exits naming ``COMFYUI_PATH`` when there is none. ``quiet`` keeps ComfyUI's start-up
    output to itself unless the start fails; ``test_nodes`` as ``Comfy`` takes it."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    torch.set_num_threads(1)
    path = find_comfyui()
    if path is None:
        raise SystemExit("No ComfyUI found: keep a checkout at ~/ComfyUI or set COMFYUI_PATH (see README).")
    if not quiet:
        return Comfy(path, tmp, cpu=cpu, test_nodes=test_nodes)
    import contextlib
    import io
    noise = io.StringIO()
    try:
        with contextlib.redirect_stderr(noise), contextlib.redirect_stdout(noise):
            return Comfy(path, tmp, cpu=cpu, test_nodes=test_nodes)
    except BaseException:
        print(noise.getvalue(), file=sys.stderr)
        raise


def find_gguf_nodes(comfy_path: Path) -> Path | None:
    """city96's ComfyUI-GGUF: ``COMFYUI_GGUF_PATH``, else a folder of the ComfyUI's custom_nodes named like it."""
    candidates = [Path(os.environ["COMFYUI_GGUF_PATH"]).expanduser()] if os.environ.get("COMFYUI_GGUF_PATH") else []
    custom = comfy_path / "custom_nodes"
    if custom.is_dir():
        candidates += sorted(p for p in custom.iterdir() if "gguf" in p.name.lower())
    return next((p for p in candidates if (p / "nodes.py").is_file() and (p / "loader.py").is_file()), None)


def comfyui_version(path: Path) -> str:
    try:
        text = (path / "comfyui_version.py").read_text()
        return text.split('__version__ = "')[1].split('"')[0]
    except Exception:
        return "unknown"


def import_headless(path: Path | None = None, cpu: bool = True) -> Path:
    """Import the ComfyUI at ``path`` (else ``find_comfyui()``) headless, as its main.py would with ``--cpu``
    (``cpu`` False: its GPU) and ``--use-pytorch-cross-attention``; returns its path. The one place that does it:

    * ComfyUI goes first on ``sys.path``, ahead of any folder with a ``nodes`` or ``utils`` of its own (the pack's
      root, a working directory);
    * its flags are set before ``comfy.model_management`` reads them;
    * ``utils.extra_config`` is imported before ``nodes``, or ``utils`` resolves to comfy/utils.py.

    Nothing else is imported: ``nodes``, ``server`` and the custom nodes are the caller's to load (``Comfy``)."""
    if path is None:
        path = find_comfyui()
        if path is None:
            raise RuntimeError("no ComfyUI found: set COMFYUI_PATH or keep a checkout at ~/ComfyUI")
    path = Path(path)
    if str(path) in sys.path:
        sys.path.remove(str(path))
    sys.path.insert(0, str(path))
    from comfy.cli_args import args
    args.cpu = cpu
    args.use_pytorch_cross_attention = True
    import comfy.model_management  # noqa: F401  (after the flags)
    import utils.extra_config  # noqa: F401  (before `nodes`, or `utils` resolves to comfy/utils.py)
    return path


def recording_server(server_module, loop):
    """ComfyUI's own PromptServer, built as its main.py builds it, recording what it would send to a browser.

    Built before the built-in and custom nodes load, as ComfyUI does: some nodes register with it on load
    (``nodes_replacements.py`` in newer versions)."""

    class RecordingServer(server_module.PromptServer):
        def __init__(self, loop):
            super().__init__(loop)
            self.sent: list[tuple] = []
            self.progress_texts: list[tuple[str, str]] = []

        def send_sync(self, event, data, sid=None):
            self.sent.append((event, data))

        def send_progress_text(self, text, node_id, sid=None):
            self.progress_texts.append((str(node_id), text))

    return RecordingServer(loop)


def executor_cache_args(comfy_args) -> dict:
    """The ``cache_args`` ComfyUI's main.py hands its PromptExecutor, for the classic (unbounded) cache.

    Newer versions read more keys (``ram_inactive`` since 2026); main.py's own dict is the reference, built
    here from the same command-line arguments with the RAM-pressure headrooms off."""
    return {"lru": comfy_args.cache_lru, "ram": 0, "ram_inactive": 0}


def _finalized(*args, **kwargs) -> None:
    """What a ModelPatcher finalized by ``release_models`` does when CPython frees it later: nothing more."""


def release_models() -> int:
    """Finalize every ComfyUI ModelPatcher this process still holds, while ComfyUI's modules are whole; returns
    how many something still held after the harness's own references were dropped.

    At exit CPython clears the modules that outlive the last collection one by one, in the reverse order of
    their import, setting their globals to None. ComfyUI is imported by ``Comfy``, after the test and tool modules
    (and their support modules) that hold its models, so its modules are cleared first; a ModelPatcher freed after
    that runs its ``__del__`` on a torn-down ComfyUI: ``detach`` looks up ``CallbacksMP`` in comfy.model_patcher's
    globals and a process that succeeded prints, after pytest's summary line, "Exception ignored in:
    ModelPatcher.__del__ ... AttributeError: 'NoneType' object has no attribute 'ON_DETACH'" for each. ``Comfy``
    runs this at exit, before that teardown: the work-counting nodes' CAPTURED store is emptied, ComfyUI unloads
    its models and garbage is collected, so that the models only the harness kept are freed now; a ModelPatcher
    something else still holds (a module's global, a cycle) runs its ``__del__`` now, and its later one does
    nothing more (its ``unpin_all_weights`` and ``detach``, what ComfyUI's ``__del__`` calls, become no-ops on
    that object only)."""
    model_patcher = sys.modules.get("comfy.model_patcher")
    if model_patcher is None:
        return 0
    from . import work_nodes
    work_nodes.CAPTURED.clear()
    CAPTURED.clear()
    import comfy.model_management
    comfy.model_management.unload_all_models()
    gc.collect()
    # type(o), not isinstance: isinstance reads __class__, which some lazy module attributes answer with a warning
    held = [o for o in gc.get_objects() if issubclass(type(o), model_patcher.ModelPatcher)]
    for patcher in held:
        try:
            patcher.__del__()
        finally:
            patcher.unpin_all_weights = patcher.detach = _finalized
    return len(held)


class Comfy:
    """A headless ComfyUI with the pack loaded from a custom_nodes folder by ComfyUI's own loader."""

    def __init__(self, path: Path, tmp: Path | None = None, cpu: bool = True, test_nodes: bool = True):
        """``tmp`` holds ComfyUI's input/output/temp/user folders and the pack's custom_nodes link; without
        one, a temporary folder removed when the process exits. ``cpu`` False lets ComfyUI use its GPU.
        ``test_nodes`` registers the tests' nodes (``cached_sampler_dev.support.tiny_nodes``, of the installed
        developer wing); the demo, which runs with nothing installed, goes without them."""
        self.path = path
        self.version = comfyui_version(path)
        import_headless(path, cpu=cpu)
        from comfy.cli_args import args
        args.disable_all_custom_nodes = False
        import folder_paths
        import nodes
        self.nodes = nodes
        self.folder_paths = folder_paths
        if tmp is None:
            tmp = Path(tempfile.mkdtemp(prefix="cached-sampler-"))
            atexit.register(shutil.rmtree, tmp, ignore_errors=True)
        atexit.unregister(release_models)  # once per process, however many harnesses it starts
        atexit.register(release_models)
        self.tmp = tmp
        for name in ("output", "temp", "input", "user"):
            (self.tmp / name).mkdir()
        folder_paths.set_output_directory(str(self.tmp / "output"))
        folder_paths.set_temp_directory(str(self.tmp / "temp"))
        folder_paths.set_input_directory(str(self.tmp / "input"))
        folder_paths.set_user_directory(str(self.tmp / "user"))
        custom = self.tmp / "custom_nodes"
        custom.mkdir()
        (custom / PACK_DIR_NAME).symlink_to(ROOT, target_is_directory=True)
        folder_paths.folder_names_and_paths["custom_nodes"] = ([str(custom)], set())
        self.pack_path = str(custom / PACK_DIR_NAME)
        logging.getLogger().setLevel(logging.WARNING)
        import server
        self.loop = asyncio.new_event_loop()
        self.server = recording_server(server, self.loop)
        self.comfy_args = args
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(nodes.init_extra_nodes(init_custom_nodes=True, init_api_nodes=False))
        self.pack = sys.modules.get(self.pack_path.replace(".", "_x_"))
        if self.pack is None or "CachedSampler" not in nodes.NODE_CLASS_MAPPINGS:
            raise RuntimeError("ComfyUI did not load the pack from custom_nodes (see the log for IMPORT FAILED).")
        if test_nodes:
            self._register_test_nodes()
        import execution
        self.execution = execution
        self._ids = itertools.count()

    def module(self, name: str):
        """A module of the pack as ComfyUI imported it, e.g. ``module("adapter")``."""
        import importlib
        return importlib.import_module(f"{self.pack.__name__}.{name}")

    def _register_test_nodes(self):
        from ..support.tiny_nodes import TEST_NODES
        for name, cls in TEST_NODES.items():
            self.nodes.NODE_CLASS_MAPPINGS[name] = cls

    def executor(self, cache: bool = True):
        cache_type = self.execution.CacheType.CLASSIC if cache else self.execution.CacheType.NONE
        return self.execution.PromptExecutor(self.server, cache_type=cache_type,
                                             cache_args=executor_cache_args(self.comfy_args))

    def run(self, prompt: dict, executor=None, expect_error: bool = False):
        """Validate and execute an API-format prompt; returns (executor, ui outputs by node id)."""
        ex = executor or self.executor()
        prompt = copy.deepcopy(prompt)  # ComfyUI writes into the prompt's node dicts
        pid = str(uuid.uuid4())
        valid, err, outputs, node_errors = self.loop.run_until_complete(self.execution.validate_prompt(pid, prompt, None))
        if not valid:
            if expect_error:
                return None, {"error": err, "node_errors": node_errors}
            raise AssertionError(f"prompt invalid: {err} {node_errors}")
        self.server.progress_texts.clear()
        ex.execute(prompt, pid, extra_data={}, execute_outputs=outputs)
        errors = [m for m in ex.status_messages if m[0] == "execution_error"]
        if expect_error:
            return ex, {"error": errors[0][1] if errors else None}
        if not ex.success:
            detail = errors[0][1] if errors else ex.status_messages
            raise AssertionError(f"prompt failed: {detail.get('exception_message') if isinstance(detail, dict) else detail}\n"
                                 f"{''.join(detail.get('traceback', [])) if isinstance(detail, dict) else ''}")
        return ex, ex.history_result.get("outputs", {})
