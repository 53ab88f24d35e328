"""Node pages: every node has an English and a Chinese page in the folder the frontend reads, naming every
input and output of the node as the running ComfyUI defines it, equal to what tools/generate/make_node_docs.py writes,
and served by ComfyUI at the address the frontend asks for."""
import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

from cached_sampler_dev.generate import make_locales  # noqa: E402
from cached_sampler_dev.generate import make_node_docs  # noqa: E402
from cached_sampler_dev.devkit import workflow_api  # noqa: E402
from cached_sampler_dev.devkit.workflow_api import serve


@pytest.fixture(scope="module")
def defs(comfy):
    return make_locales.pack_nodes(workflow_api.object_info())


def page(rel):
    path = make_node_docs.DOCS / rel
    assert path.is_file(), f"no page {path.relative_to(ROOT)}"
    return path.read_text(encoding="utf-8")


def test_every_node_has_both_pages_naming_every_input_and_output(defs):
    zh = json.loads((ROOT / "locales" / "zh" / "nodeDefs.json").read_text(encoding="utf-8"))
    assert len(defs) >= 16
    for node_id, d in defs.items():
        pages = {"en": page(f"{node_id}/en.md"), "zh": page(f"{node_id}/zh.md"), "fallback": page(f"{node_id}.md")}
        assert pages["fallback"] == pages["en"], node_id
        assert f"# {d['display_name']}\n" in pages["en"] and d["description"] in pages["en"], node_id
        assert f"# {zh[node_id]['display_name']}\n" in pages["zh"], node_id
        for lang, text in pages.items():
            for name, _, _ in workflow_api.ordered_inputs(d):
                assert re.search(rf"^\| `{re.escape(name)}`", text, re.M), f"{node_id} {lang}: input {name} missing"
            for name in d.get("output_name") or d["output"]:
                assert re.search(rf"^\| `{re.escape(name)}`", text, re.M), f"{node_id} {lang}: output {name} missing"
        for section in make_node_docs.HEADINGS[:3] + make_node_docs.HEADINGS[4:]:
            assert f"## {section}\n" in pages["en"], (node_id, section)
        # The Chinese page is Chinese: its headings and prose come from the translation memory.
        assert "## 何时选用\n" in pages["zh"] and "## 运行之后\n" in pages["zh"], node_id
        assert "When to choose it" not in pages["zh"], node_id


def test_deciders_give_settings_by_model_family(defs):
    for node_id in ("CachedSamplerFirstBlockCache", "CachedSamplerDBCache", "CachedSamplerTeaCache",
                    "CachedSamplerMagCache", "CachedSamplerAdaptiveCache", "CachedSamplerFixedCadence",
                    "CachedSamplerGuidanceCache", "CachedSampler"):
        assert "## Where to start, by model family\n" in page(f"{node_id}/en.md"), node_id
        assert "## 按模型系列的起始设置\n" in page(f"{node_id}/zh.md"), node_id
    assert "| Wan 2.1 / 2.2 | 0.05-0.15 |" in page("CachedSamplerFirstBlockCache/en.md")


def test_ranges_and_defaults_are_the_definitions(defs):
    """A changed range or default reaches the page: each widget's row carries the running definition's values."""
    d = defs["CachedSamplerDBCache"]
    spec = d["input"]["required"]["threshold"][1]
    row = next(line for line in page("CachedSamplerDBCache/en.md").splitlines() if line.startswith("| `threshold`"))
    cells = [c.strip() for c in row.strip("|").split(" | ")]
    assert cells[2] == f"{spec['default']:g}"
    assert cells[3] == f"{spec['min']:g} - {spec['max']:g}, step {spec['step']:g}"
    assert cells[4] == spec["tooltip"]


def test_committed_pages_equal_the_generators_output(defs):
    pages = make_node_docs.build(defs)
    assert make_node_docs.committed() == pages, "web/docs is stale: run python3 -m cached_sampler_dev.generate.make_node_docs"


def test_the_readme_caching_node_table_is_the_specs():
    """The README's rows of the caching nodes are the generator's output: a spec whose inputs or summary changed
    without regenerating fails here, and every row names each of the node's inputs."""
    from cached_sampler_dev.devkit.pack import load
    from cached_sampler_dev.generate.marked_block import block
    readme = make_node_docs.README.read_text(encoding="utf-8")
    assert block(make_node_docs.README_BEGIN, make_node_docs.README_END, make_node_docs.readme_table()) in readme, (
        "README.md's table of caching nodes is stale: run python3 -m cached_sampler_dev.generate.make_node_docs")
    rows = {line.split(" | ")[0][2:]: line for line in make_node_docs.readme_table().splitlines()[2:]}
    specs = load("interceptors.methods").SPECS
    assert list(rows) == [spec.display_name for spec in specs]
    for spec in specs:
        assert spec.summary.strip() and "\n" not in spec.summary and "|" not in spec.summary, spec.name
        inputs = rows[spec.display_name].split(" | ")[1]
        for i in spec.inputs:
            named = f"`{i.name}`" in inputs or (i.name.endswith("_percent") and "percents" in inputs)
            assert named, (spec.name, i.name)


def test_a_prose_text_without_its_chinese_stops_the_generator(defs, monkeypatch):
    prose = dict(make_node_docs.PROSE)
    prose["CachedSamplerTaylorSeer"] = dict(prose["CachedSamplerTaylorSeer"], when=["A sentence nobody translated."])
    monkeypatch.setattr(make_node_docs, "PROSE", prose)
    with pytest.raises(make_node_docs.MissingTranslation, match="A sentence nobody translated"):
        make_node_docs.build(defs)


def test_the_translation_memory_holds_exactly_the_prose():
    memory = json.loads(make_node_docs.MEMORY.read_text(encoding="utf-8"))
    assert sorted(memory) == sorted(make_node_docs.english_texts()), "stale or missing texts in tools/generate/node_docs_zh.json"


def test_comfyui_serves_the_pages_where_the_frontend_asks(comfy, defs):
    # The frontend's extractCustomNodeName: the second part of python_module, before any '@'.
    pack = defs["CachedSampler"]["python_module"].split(".")[1].split("@")[0]
    rels = ["CachedSampler/en.md", "CachedSampler/zh.md", "CachedSamplerDBCache.md"]
    responses = serve([f"/extensions/{pack}/docs/{rel}" for rel in rels])
    for rel in rels:
        status, kind, body = responses[f"/extensions/{pack}/docs/{rel}"]
        assert status == 200, rel
        assert "text/html" not in kind, (rel, kind)  # the frontend discards an HTML answer as 'not found'
        assert body.decode("utf-8") == page(rel)


def test_the_frontend_reads_node_pages_from_these_paths():
    """The bundled frontend of this ComfyUI asks for docs/<node>/<locale>.md, then docs/<node>.md."""
    spec = importlib.util.find_spec("comfyui_frontend_package")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("comfyui_frontend_package is not installed in this Python")
    static = Path(list(spec.submodule_search_locations)[0]) / "static" / "assets"
    per_locale = re.compile(r"/extensions/\$\{\w+\}/docs/\$\{\w+\.name\}/\$\{\w+\}\.md")
    fallback = re.compile(r"/extensions/\$\{\w+\}/docs/\$\{\w+\.name\}\.md")
    for script in sorted(static.glob("*.js")):
        text = script.read_text(encoding="utf-8", errors="replace")
        if "fetchCustomNodeHelp" in text:
            assert per_locale.search(text) and fallback.search(text), script.name
            return
    pytest.fail("the frontend bundle has no fetchCustomNodeHelp: node pages may have moved")
