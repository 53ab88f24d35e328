"""Locales: every node and input of the pack has an English and a Chinese entry, and ComfyUI serves them."""
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

from cached_sampler_dev.generate import make_locales  # noqa: E402
from cached_sampler_dev.devkit import workflow_api  # noqa: E402
from cached_sampler_dev.devkit.workflow_api import serve

LANGS = ("en", "zh")


@pytest.fixture(scope="module")
def defs(comfy):
    return make_locales.pack_nodes(workflow_api.object_info())


def load(lang, name):
    return json.loads((ROOT / "locales" / lang / f"{name}.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("lang", LANGS)
def test_every_node_input_and_output_has_an_entry(defs, lang):
    node_defs = load(lang, "nodeDefs")
    assert len(defs) >= 10
    for name, d in defs.items():
        entry = node_defs.get(name)
        assert entry and entry["display_name"], f"{lang}: no entry for {name}"
        if d.get("description"):
            assert entry.get("description"), f"{lang}: {name} has no description"
        for input_name, _, options in workflow_api.ordered_inputs(d):
            item = entry["inputs"].get(input_name)
            assert item and item["name"], f"{lang}: {name}.{input_name} has no entry"
            if options.get("tooltip"):
                assert item.get("tooltip"), f"{lang}: {name}.{input_name} has no tooltip"
        assert len(entry["outputs"]) == len(d["output"]), f"{lang}: {name} outputs"


def test_chinese_is_translated(defs):
    """Texts missing from tools/generate/locales_zh.json stay English (make_locales lists them): keep that rare."""
    en, zh = load("en", "nodeDefs"), load("zh", "nodeDefs")
    texts = [(en[n].get(k), zh[n].get(k)) for n in defs for k in ("display_name", "description")]
    texts += [(i.get("tooltip"), zh[n]["inputs"][k].get("tooltip")) for n in defs for k, i in en[n]["inputs"].items()]
    texts = [(a, b) for a, b in texts if a]
    same = [a for a, b in texts if a == b and a not in ("TeaCache", "MagCache")]
    assert len(same) <= len(texts) // 10, f"untranslated: {same}"
    assert zh["CachedSampler"]["display_name"] == "缓存采样器"
    assert load("zh", "main")["nodeCategories"]["cached"] == "缓存"


def test_locale_files_match_the_node_schemas(defs):
    files, _ = make_locales.build({**defs})
    for rel, content in files.items():
        assert load(*rel[:-5].split("/")) == content, f"{rel} is stale: run python3 -m cached_sampler_dev.generate.make_locales"


def test_comfyui_serves_the_translations(comfy):
    status, _, body = serve(["/api/i18n"])["/api/i18n"]
    assert status == 200
    served = json.loads(body)
    assert served["zh"]["nodeDefs"]["CachedSampler"]["display_name"] == load("zh", "nodeDefs")["CachedSampler"]["display_name"]
    assert served["en"]["nodeDefs"]["CachedSamplerDBCache"]["inputs"]["threshold"]["tooltip"]
    assert served["zh"]["nodeCategories"]["interceptors"] == "拦截器"
