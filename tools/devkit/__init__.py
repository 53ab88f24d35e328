"""The project's development kit, shared by the tests, the bench, the demo and the generators; never shipped
to users and never loaded by ComfyUI.

* ``comfy_harness``: ComfyUI started headless (``import_headless``: on sys.path, its command-line flags set,
  imported in the right order) and ``Comfy``, that ComfyUI with the pack loaded by ComfyUI's own custom-node
  loader, its executor and a server that records what it would send to a browser;
* ``pack``: the pack imported as a package without ComfyUI (its core is plain torch);
* ``work_nodes``: ComfyUI nodes that count the model work a run really did, time it and capture its results;
* ``workflow_api``: a saved workflow turned into the API prompt the server runs, and a server's GET routes
  called in-process.

Part of the developer wing's package (``cached_sampler_dev.devkit``, tools/pyproject.toml), and importable as a
top-level ``devkit`` by tools/demo.py run as a file (its own folder is then on the path): so it imports only
itself relatively and what ComfyUI's requirements install. The pack's root is never put on the path: ComfyUI has a
top-level ``nodes`` module, and so does the pack, which is imported as a package.
"""
