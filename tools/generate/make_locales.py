"""Write locales/{en,zh}/{main,nodeDefs}.json from the pack's node schemas.

English comes from the schemas themselves (display names, descriptions, input names, tooltips), so it
cannot drift from the nodes. Chinese comes from the hand-made translation memory tools/generate/locales_zh.json
(input names by identifier, texts by their English wording); a text it does not know yet stays English
and is listed, so translate it there and run this again:

    python3 -m cached_sampler_dev.generate.make_locales            # write the files
    python3 -m cached_sampler_dev.generate.make_locales --check    # exit 1 if the files are not what the nodes say
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOCALES = ROOT / "locales"
MEMORY = Path(__file__).resolve().parent / "locales_zh.json"
PREFIX = "CachedSampler"
CONTROL = "control_after_generate"
CATEGORY_WORDS = {"cached": "cached", "interceptors": "interceptors", "demo": "demo"}

from ..devkit import workflow_api  # noqa: E402


def pack_nodes(defs: dict) -> dict:
    return {name: d for name, d in sorted(defs.items()) if name.startswith(PREFIX)}


def english(d: dict) -> dict:
    """One node's English nodeDefs entry, from its object_info definition."""
    entry = {"display_name": d.get("display_name") or d["name"]}
    if d.get("description"):
        entry["description"] = d["description"]
    inputs = {}
    for name, kind, options in workflow_api.ordered_inputs(d):
        inputs[name] = {"name": name}
        if options.get("tooltip"):
            inputs[name]["tooltip"] = options["tooltip"]
        if workflow_api.is_widget(kind, options) and workflow_api.has_control_widget(name, kind, options):
            inputs[CONTROL] = {"name": "control after generate"}
    entry["inputs"] = inputs
    names = d.get("output_name") or d.get("output") or []
    tooltips = d.get("output_tooltips") or [None] * len(names)
    entry["outputs"] = {str(i): ({"name": n} | ({"tooltip": t} if t else {})) for i, (n, t) in enumerate(zip(names, tooltips))}
    return entry


def translate(entry: dict, memory: dict, missing: list) -> dict:
    def text(s: str) -> str:
        if s in memory["text"]:
            return memory["text"][s]
        missing.append(s)
        return s

    def name(s: str) -> str:
        if s == CONTROL or s == "control after generate":
            return memory["names"].get(CONTROL, s)
        return memory["names"].get(s, s)

    out = {"display_name": text(entry["display_name"])}
    if "description" in entry:
        out["description"] = text(entry["description"])
    out["inputs"] = {k: {"name": name(k)} | ({"tooltip": text(v["tooltip"])} if "tooltip" in v else {})
                     for k, v in entry["inputs"].items()}
    out["outputs"] = {k: {"name": name(v["name"])} | ({"tooltip": text(v["tooltip"])} if "tooltip" in v else {})
                      for k, v in entry["outputs"].items()}
    return out


def build(defs: dict) -> tuple[dict[str, dict], list[str]]:
    """{relative path: JSON content} for every locale file, and the texts not translated yet."""
    memory = json.loads(MEMORY.read_text(encoding="utf-8"))
    en = {name: english(d) for name, d in pack_nodes(defs).items()}
    missing: list[str] = []
    zh = {name: translate(entry, memory, missing) for name, entry in en.items()}
    files = {
        "en/nodeDefs.json": en,
        "zh/nodeDefs.json": zh,
        "en/main.json": {"nodeCategories": dict(CATEGORY_WORDS)},
        "zh/main.json": memory["main"],
    }
    return files, sorted(set(missing))


def dumps(content: dict) -> str:
    return json.dumps(content, indent=2, ensure_ascii=False) + "\n"


def main() -> int:
    from ..devkit.comfy_harness import start
    start()
    files, missing = build(workflow_api.object_info())
    check = "--check" in sys.argv
    stale = []
    for rel, content in files.items():
        target = LOCALES / rel
        if check:
            if not target.is_file() or target.read_text(encoding="utf-8") != dumps(content):
                stale.append(rel)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(dumps(content), encoding="utf-8")
    for text in missing:
        print(f"untranslated (zh): {text}", file=sys.stderr)
    if stale:
        print(f"out of date: {', '.join(stale)} (run python3 -m cached_sampler_dev.generate.make_locales)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
