"""Turn a saved (UI-format) ComfyUI workflow into the API-format prompt the server executes.

``workflow_to_api(workflow, node_defs)`` is a pure function: ``node_defs`` are object_info-style node
definitions (``GET /object_info``), so a workflow can be checked against the node definitions of the
ComfyUI it will run on, and run headless through ComfyUI's executor. It follows what the frontend does
when it queues a workflow:

* widget values are positional (``widgets_values``), in the order of the node's required then optional
  inputs that are widgets; an INT (or COMBO) with ``control_after_generate`` (and, as in the frontend,
  any INT named ``seed``/``noise_seed`` that does not say otherwise) carries one more value after it,
  the control mode ("fixed", "randomize", ...), which is not an input;
* a link into an input replaces its widget value (a "converted" widget keeps its stale value in
  ``widgets_values``); links are followed through Reroute nodes and bypassed nodes, and a
  PrimitiveNode gives its widget value;
* frontend-only nodes (notes, reroutes, primitives) and muted nodes are left out.

``python3 -m cached_sampler_dev.devkit.workflow_api WORKFLOW.json OBJECT_INFO.json`` prints the prompt of a workflow, given the
node definitions saved from a server's ``/object_info``.
"""
from __future__ import annotations

import json
from typing import Any

WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"}
SEED_NAMES = {"seed", "noise_seed"}
FRONTEND_ONLY = {"Note", "MarkdownNote", "Reroute", "PrimitiveNode"}
MODE_MUTED, MODE_BYPASS = 2, 4


class WorkflowError(ValueError):
    """The workflow cannot be turned into a prompt for these node definitions."""


def ordered_inputs(node_def: dict) -> list[tuple[str, Any, dict]]:
    """(name, type, options) of a node's required then optional inputs, in the frontend's order."""
    inputs = node_def.get("input", {})
    order = node_def.get("input_order") or {k: list(v) for k, v in inputs.items()}
    out = []
    for section in ("required", "optional"):
        for name in order.get(section, []):
            spec = inputs.get(section, {}).get(name)
            if spec is None:
                continue
            kind = spec[0] if isinstance(spec, (list, tuple)) and spec else spec
            options = spec[1] if isinstance(spec, (list, tuple)) and len(spec) > 1 and isinstance(spec[1], dict) else {}
            out.append((name, kind, options))
    return out


def is_widget(kind, options: dict) -> bool:
    if options.get("forceInput") or options.get("rawLink"):
        return False
    # An input of several types ("FLOAT,INT") is a widget of the type it names in widgetType, as in the frontend.
    return isinstance(kind, list) or kind in WIDGET_TYPES or options.get("widgetType") in WIDGET_TYPES


def has_control_widget(name: str, kind, options: dict) -> bool:
    """Whether the frontend adds a 'control after generate' widget after this one."""
    if "control_after_generate" in options:
        return bool(options["control_after_generate"])
    return kind == "INT" and name in SEED_NAMES


def widget_slots(node_def: dict) -> list[str | None]:
    """The meaning of each position of ``widgets_values``: an input name, or None for a control value."""
    slots: list[str | None] = []
    for name, kind, options in ordered_inputs(node_def):
        if is_widget(kind, options):
            slots.append(name)
            if has_control_widget(name, kind, options):
                slots.append(None)
    return slots


def widget_values(node: dict, node_def: dict) -> dict[str, Any]:
    """Input name -> widget value of one saved node."""
    values = node.get("widgets_values")
    if values is None:
        return {}
    if isinstance(values, dict):  # some nodes save widgets by name
        names = {n for n, k, o in ordered_inputs(node_def) if is_widget(k, o)}
        return {k: v for k, v in values.items() if k in names}
    slots = widget_slots(node_def)
    if len(values) < len(slots):
        raise WorkflowError(f"node {node.get('id')} ({node.get('type')}): {len(values)} widget values for "
                            f"{len(slots)} widgets {slots}")
    return {name: value for name, value in zip(slots, values) if name is not None}


def _links(workflow: dict) -> dict[int, tuple]:
    out = {}
    for link in workflow.get("links", []):
        if isinstance(link, dict):
            out[link["id"]] = (link["origin_id"], link["origin_slot"], link["target_id"], link["target_slot"],
                               link.get("type"))
        else:
            out[link[0]] = (link[1], link[2], link[3], link[4], link[5] if len(link) > 5 else None)
    return out


def workflow_to_api(workflow: dict, node_defs: dict) -> dict:
    """The API-format prompt (``{node id: {"class_type", "inputs", "_meta"}}``) of a UI-format workflow."""
    if "nodes" not in workflow:
        raise WorkflowError("not a UI-format workflow (no 'nodes'); API-format prompts need no conversion")
    if workflow.get("definitions", {}).get("subgraphs"):
        raise WorkflowError("workflows with subgraphs are not supported")
    nodes = {n["id"]: n for n in workflow["nodes"]}
    links = _links(workflow)

    def source(link_id, seen=()):
        """The (node id, slot) that really feeds a link, or ('value', v) for a primitive, or None."""
        if link_id is None or link_id not in links:
            return None
        origin, slot, *_ = links[link_id]
        node = nodes.get(origin)
        if node is None:
            raise WorkflowError(f"link {link_id} starts at missing node {origin}")
        if origin in seen:
            raise WorkflowError(f"link cycle through node {origin}")
        kind = node.get("type")
        if kind == "Reroute":
            return source(node["inputs"][0].get("link"), (*seen, origin))
        if kind == "PrimitiveNode":
            return ("value", (node.get("widgets_values") or [None])[0])
        if node.get("mode") == MODE_MUTED:
            return None
        if node.get("mode") == MODE_BYPASS:  # as the frontend: the input at the same slot, else the first of its type
            outputs, ins = node.get("outputs") or [], node.get("inputs") or []
            out_type = outputs[slot].get("type") if slot < len(outputs) else None
            fits = [i for i in ins if i.get("type") == out_type and i.get("link") is not None]
            chosen = ins[slot] if slot < len(ins) and ins[slot] in fits else (fits or [None])[0]
            return source(chosen["link"], (*seen, origin)) if chosen else None
        return (str(origin), slot)

    prompt = {}
    for node in workflow["nodes"]:
        kind = node.get("type")
        if kind in FRONTEND_ONLY or node.get("mode") in (MODE_MUTED, MODE_BYPASS):
            continue
        node_def = node_defs.get(kind)
        if node_def is None:
            raise WorkflowError(f"node {node['id']}: unknown node type {kind!r} (missing custom node?)")
        inputs = widget_values(node, node_def)
        declared = {name for name, _, _ in ordered_inputs(node_def)}
        for slot in node.get("inputs", []):
            name = slot.get("widget", {}).get("name") or slot.get("name")
            if name not in declared:
                continue
            fed = source(slot.get("link"))
            if fed is None:
                continue  # unconnected socket: the widget value (if any) stays
            inputs[name] = fed[1] if fed[0] == "value" else [fed[0], fed[1]]
        entry = {"class_type": kind, "inputs": inputs}
        if node.get("title"):
            entry["_meta"] = {"title": node["title"]}
        prompt[str(node["id"])] = entry
    return prompt


def serve(paths) -> dict[str, tuple[int, str, bytes]]:
    """GET each path from a real PromptServer of the ComfyUI imported in this process (nodes already loaded),
    in-process with no socket left open: ``{path: (status, content type, body)}``. ``PromptServer.instance``
    is left as it was."""
    import asyncio

    import server

    async def fetch():
        from aiohttp.test_utils import TestClient, TestServer
        previous = getattr(server.PromptServer, "instance", None)
        try:
            prompt_server = server.PromptServer(asyncio.get_running_loop())
            prompt_server.add_routes()
        finally:
            server.PromptServer.instance = previous
        out = {}
        async with TestClient(TestServer(prompt_server.app)) as client:
            for path in paths:
                response = await client.get(path)
                out[path] = (response.status, response.content_type, await response.read())
        return out

    return asyncio.run(fetch())


def object_info() -> dict:
    """``GET /object_info`` of the ComfyUI imported in this process (nodes already loaded), through a
    real PromptServer's route."""
    status, _, body = serve(["/api/object_info"])["/api/object_info"]
    if status != 200:
        raise WorkflowError(f"GET /api/object_info answered {status}")
    return json.loads(body)


def main(argv=None) -> int:
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workflow", help="a UI-format workflow (.json), as the frontend saves it")
    parser.add_argument("object_info", help="node definitions saved from a server's /object_info (.json)")
    args = parser.parse_args(argv)
    with open(args.workflow, encoding="utf-8") as f:
        wf = json.load(f)
    with open(args.object_info, encoding="utf-8") as f:
        defs = json.load(f)
    print(json.dumps(workflow_to_api(wf, defs), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
