"""The web extension: valid JavaScript, for both Cached Sampler nodes, display-only widget."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "web" / "cached_sampler.js"


def test_extension_is_valid_module_javascript(tmp_path):
    if shutil.which("node") is None:
        pytest.skip("no node to check the JavaScript syntax")
    copy = tmp_path / "cached_sampler.mjs"
    copy.write_text(SCRIPT.read_text(encoding="utf-8"))
    result = subprocess.run(["node", "--check", str(copy)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


SERIALISE = """
import "./web/cached_sampler.mjs";
const extension = globalThis.registered;
const out = {};
for (const name of ["CachedSampler", "CachedSamplerAdvanced", "KSampler"]) {
  function Node() {}
  Node.prototype.onSerialize = function (o) { o.base = true; };  // the frontend's own, which must still run
  await extension.beforeRegisterNodeDef(Node, { name });
  const node = new Node();
  node.widgets = [{ name: "seed" }, { name: "cached_sampler_summary", serialize: false },
                  { name: "$$node-text-preview" }, { name: "steps" }, { name: "other", serialize: false }];
  const saved = { widgets_values: [7, "shown summary", "progress", 20, "display"] };
  node.onSerialize(saved);
  out[name] = saved;
}
console.log(JSON.stringify(out));
"""


def test_the_extension_keeps_display_only_widgets_out_of_saved_workflows_of_both_samplers_only(tmp_path):
    """A workflow saves widget values by position: on both Cached Sampler nodes (and no other node) the extension's
    onSerialize leaves out its summary, ComfyUI's progress-text preview and any widget marked not to serialise,
    keeps every other value in order, and still calls the frontend's own onSerialize."""
    out = run_extension(tmp_path, SERIALISE, [])
    for name in ("CachedSampler", "CachedSamplerAdvanced"):
        assert out[name] == {"widgets_values": [7, 20], "base": True}, name
    assert out["KSampler"] == {"widgets_values": [7, "shown summary", "progress", 20, "display"], "base": True}


TRANSLATE = """
import { translateProgress, STRINGS } from "./web/cached_sampler.mjs";
const texts = JSON.parse(process.argv[2]);
console.log(JSON.stringify({ en: texts.map((t) => translateProgress(t, STRINGS.en)),
                             zh: texts.map((t) => translateProgress(t, STRINGS.zh)) }));
"""


def run_extension(tmp_path, script, argument):
    """``script`` (an ES module beside the extension) run in node with ``argument`` as JSON, the frontend's modules
    stubbed (the extension it registers is ``globalThis.registered``); what it prints, as JSON."""
    if shutil.which("node") is None:
        pytest.skip("no node to run the extension")
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "app.js").write_text(
        "export const app = { registerExtension(e) { globalThis.registered = e; } };\n")
    (tmp_path / "scripts" / "api.js").write_text("export const api = { addEventListener() {} };\n")
    web = tmp_path / "extensions" / "web"  # "../../scripts/app.js" from here is the stub
    web.mkdir(parents=True)
    (web / "cached_sampler.mjs").write_text(
        SCRIPT.read_text(encoding="utf-8") + "\nexport { translateProgress, STRINGS };\n")
    (tmp_path / "extensions" / "run.mjs").write_text(script)
    import json
    result = subprocess.run(["node", str(tmp_path / "extensions" / "run.mjs"), json.dumps(argument)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def translate(tmp_path, texts):
    """The extension's translateProgress on the texts, in node, with the frontend's modules stubbed."""
    return run_extension(tmp_path, TRANSLATE, texts)


def test_the_extension_translates_every_fixed_phrase_of_the_live_text(comfy, tmp_path):
    """The server's live lines (English, over the progress-text channel), as a real run sends them and for every
    metric name: in Chinese no English phrase is left and the numbers are the same; in English they are as sent.
    A change of wording in nodes/summary/report.py that the extension does not know fails here."""
    from cached_sampler_dev.support.graphs import tiny_prompt
    report, ic = comfy.module("nodes.summary.report"), comfy.module("interceptors")
    comfy.run(tiny_prompt(steps=12))
    texts = [t for node, t in comfy.server.progress_texts if node == "sampler"][:-1]  # the last is the summary
    assert len(texts) == 12
    deciders = [c for c in vars(ic).values() if isinstance(c, type) and issubclass(c, ic.Decider)]
    metrics = [*dict.fromkeys(c.metric_name for c in deciders if c.metric_name), report.DEFAULT_METRIC]
    assert len(metrics) >= 7, metrics
    texts += [f"Methods\nstep 3/9: 2 computed, 1 skipped so far (33% skipped)\n{m} 0.01 < threshold 0.1: skipped"
              for m in metrics]
    out = translate(tmp_path, texts)
    assert out["en"] == texts
    english = ("step ", "computed", "skipped", "threshold", "not checked", *metrics)
    for sent, shown in zip(texts, out["zh"]):
        first, *rest = shown.splitlines()
        assert first == sent.splitlines()[0], "method names stay as they are"
        left = [w for w in english if w in "\n".join(rest)]
        assert not left, f"left in English: {left} in {shown!r}"
        assert re.findall(r"[\d.]+%?", sent) == re.findall(r"[\d.]+%?", shown), (sent, shown)
