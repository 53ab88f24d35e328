"""Example workflows: served by ComfyUI's template endpoint, valid for the server's node definitions,
and the tiny-model one runs headless with its summary and progress text."""
import asyncio
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

from cached_sampler_dev.devkit import workflow_api
from cached_sampler_dev.devkit.workflow_api import serve

EXAMPLES = ROOT / "example_workflows"
NAMES = sorted(p.stem for p in EXAMPLES.glob("*.json"))
RUNNABLE = "tiny_digits_tuning_plot"


@pytest.fixture(scope="module")
def served(comfy):
    module = Path(comfy.pack_path).name
    paths = ["/api/workflow_templates", "/api/object_info"]
    for name in NAMES:
        paths += [f"/api/workflow_templates/{module}/{name}.json", f"/api/workflow_templates/{module}/{name}.jpg"]
    return module, serve(paths)


@pytest.fixture(scope="module")
def defs(served):
    status, _, body = served[1]["/api/object_info"]
    assert status == 200
    return json.loads(body)


def load(name):
    return json.loads((EXAMPLES / f"{name}.json").read_text(encoding="utf-8"))


def test_every_example_has_a_thumbnail_and_the_required_ones_exist():
    assert set(NAMES) >= {"flux_dbcache_taylorseer", "wan21_adaptive_cache", "sdxl_adaptive_cache",
                          "apply_interceptors_sampler_custom_advanced", RUNNABLE,
                          "wan22_two_stage_first_block_cache", "qwen_image_magcache_calibrate",
                          "hunyuan_video15_first_block_cache", "z_image_fixed_cadence_taylorseer",
                          "ltx2_first_block_cache"}
    for name in NAMES:
        assert (EXAMPLES / f"{name}.jpg").is_file(), name


def test_every_recipe_of_the_readme_names_its_own_template():
    """Each row of the README's recipe table with a chain to connect names one example workflow, and it exists;
    only the step-distilled row, which is not cached, has none."""
    import re
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    table = text.split("## Recipes", 1)[1].split("\n\n", 3)[2]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()[2:]]
    assert len(rows) >= 12, rows
    named = []
    for model, connect, template, *_ in rows:
        if connect.startswith("no caching"):
            assert template == "-", (model, template)
            continue
        names = re.findall(r"`([a-z0-9_]+)`", template)
        assert len(names) == 1 and names[0] in NAMES, f"{model}: the recipe names no existing template: {template}"
        named.append(names[0])
    assert len(named) == len(set(named)), f"a template shown for two recipes: {named}"


def test_template_endpoint_lists_and_serves_every_example(served):
    module, responses = served
    status, _, body = responses["/api/workflow_templates"]
    assert status == 200 and sorted(json.loads(body)[module]) == NAMES
    for name in NAMES:
        status, kind, body = responses[f"/api/workflow_templates/{module}/{name}.json"]
        assert status == 200 and json.loads(body) == load(name)
        status, kind, body = responses[f"/api/workflow_templates/{module}/{name}.jpg"]
        assert status == 200 and kind == "image/jpeg" and body[:2] == b"\xff\xd8"


def skip_unless_this_comfyui_has_what_it_needs(name, defs):
    """A template written for newer node definitions is checked only on a ComfyUI that has them."""
    from cached_sampler_dev.generate import make_example_workflows
    missing = make_example_workflows.missing_requirements(name, defs)
    if missing:
        pytest.skip(f"{name} needs a newer ComfyUI than this one: it lacks {', '.join(missing)}")


@pytest.mark.parametrize("name", NAMES)
def test_example_matches_the_node_definitions(defs, name):
    import folder_paths
    skip_unless_this_comfyui_has_what_it_needs(name, defs)
    model_files = tuple(folder_paths.supported_pt_extensions)
    wf = load(name)
    nodes = {n["id"]: n for n in wf["nodes"]}
    for node in wf["nodes"]:
        if node["type"] in workflow_api.FRONTEND_ONLY:
            continue
        d = defs.get(node["type"])
        assert d is not None, f"node {node['id']}: {node['type']} is not installed"
        slots = workflow_api.widget_slots(d)
        assert len(node["widgets_values"]) == len(slots), (node["type"], slots, node["widgets_values"])
        specs = {name: (kind, options) for name, kind, options in workflow_api.ordered_inputs(d)}
        for slot, value in zip(slots, node["widgets_values"]):
            if slot is None:
                assert value in ("fixed", "increment", "decrement", "randomize"), (node["type"], value)
                continue
            kind, options = specs[slot]
            choices = kind if isinstance(kind, list) else options.get("options") if kind == "COMBO" else None
            if choices is not None and not str(value).endswith(model_files):  # the user adds model files
                assert value in choices, (node["type"], slot, value, choices)
        for i in node["inputs"]:
            assert i["name"] in specs, (node["type"], i["name"])
        sockets = [name for name, (kind, options) in specs.items() if not workflow_api.is_widget(kind, options)]
        assert [i["name"] for i in node["inputs"] if "widget" not in i] == sockets, node["type"]
        # Every listed output is the definition's at that place; only an output node may list fewer (the
        # pass-through output newer ComfyUIs give Save/Preview nodes is left out of the examples).
        declared = list(zip(d.get("output_name", d["output"]), d["output"]))
        listed = [(o["name"], o["type"]) for o in node["outputs"]]
        assert listed == declared[:len(listed)], (node["type"], listed, declared)
        assert len(listed) == len(declared) or d.get("output_node"), (node["type"], listed, declared)
    for link_id, src, slot, dst, dst_slot, kind in wf["links"]:
        assert nodes[src]["outputs"][slot]["type"] == kind and link_id in nodes[src]["outputs"][slot]["links"]
        target = nodes[dst]["inputs"][dst_slot]
        assert target["link"] == link_id
        expected = workflow_api.ordered_inputs(defs[nodes[dst]["type"]])
        declared = {n: k for n, k, _ in expected}[target["name"]]
        assert declared == kind or (isinstance(declared, list) and kind == "COMBO") or \
            (isinstance(declared, str) and kind in declared.split(",")), (target, kind)
    prompt = workflow_api.workflow_to_api(wf, defs)
    for entry in prompt.values():
        d = defs[entry["class_type"]]
        for name in d["input"].get("required", {}):
            assert name in entry["inputs"], (entry["class_type"], name)


def model_folders(comfy, node_types):
    """{(node type, widget): models/ folder} as the running ComfyUI lists them: a probe file put in every model
    folder shows which folder each loader widget offers."""
    import folder_paths
    import tempfile
    saved = dict(folder_paths.folder_names_and_paths)
    cache = dict(getattr(folder_paths, "filename_list_cache", {}))
    probes = {}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for folder, (paths, extensions) in saved.items():
                if folder in ("custom_nodes", "configs"):
                    continue
                path = Path(tmp) / folder
                path.mkdir()
                probe = f"probe-{folder}.safetensors"
                (path / probe).write_bytes(b"")
                probes[probe] = folder
                folder_paths.folder_names_and_paths[folder] = (list(paths) + [str(path)], extensions)
            if hasattr(folder_paths, "filename_list_cache"):
                folder_paths.filename_list_cache.clear()
            responses = serve([f"/api/object_info/{t}" for t in sorted(node_types)])
        finally:
            folder_paths.folder_names_and_paths.clear()
            folder_paths.folder_names_and_paths.update(saved)
            if hasattr(folder_paths, "filename_list_cache"):
                folder_paths.filename_list_cache.clear()
                folder_paths.filename_list_cache.update(cache)
    out = {}
    for t in node_types:
        status, _, body = responses[f"/api/object_info/{t}"]
        assert status == 200, t
        for name, kind, options in workflow_api.ordered_inputs(json.loads(body)[t]):
            choices = kind if isinstance(kind, list) else options.get("options") or []
            folders = {probes[c] for c in choices if c in probes}
            if folders:
                out[(t, name)] = folders
    return out


def official_urls():
    """File name -> download addresses in ComfyUI's own workflow templates, where that package is installed."""
    import importlib.util
    spec = importlib.util.find_spec("comfyui_workflow_templates_json")
    if spec is None or not spec.submodule_search_locations:
        return {}
    urls = {}
    for path in (Path(list(spec.submodule_search_locations)[0]) / "templates").glob("*.json"):
        try:
            wf = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            continue
        if not isinstance(wf, dict):
            continue
        nodes = list(wf.get("nodes", []))
        for sub in wf.get("definitions", {}).get("subgraphs", []):
            nodes += sub.get("nodes", [])
        for n in nodes:
            for m in (n.get("properties") or {}).get("models") or []:
                if m.get("url"):
                    urls.setdefault(m["name"], set()).add(m["url"].split("?")[0])
    return urls


# The model family of each example that loads model files, and the repositories each family's files come from
# (its makers' and Comfy-Org's repackaging of them), written here apart from the generator's table.
FAMILY = {"flux_dbcache_taylorseer": "flux", "apply_interceptors_sampler_custom_advanced": "flux",
          "sdxl_adaptive_cache": "sdxl", "wan21_adaptive_cache": "wan", "wan22_two_stage_first_block_cache": "wan",
          "qwen_image_magcache_calibrate": "qwen_image", "hunyuan_video15_first_block_cache": "hunyuan_video15",
          "z_image_fixed_cadence_taylorseer": "z_image", "ltx2_first_block_cache": "ltx2",
          "flux_first_block_cache_taylorseer": "flux", "flux2_fixed_cadence_taylorseer": "flux2",
          "sd35_first_block_cache_taylorseer": "sd3", "sdxl_fixed_cadence_taylorseer": "sdxl",
          "sdxl_auto_calibrate": "sdxl"}
REPOSITORIES = {
    "flux": {"black-forest-labs/FLUX.1-dev", "black-forest-labs/FLUX.1-schnell", "Comfy-Org/flux1-dev",
             "comfyanonymous/flux_text_encoders"},
    "flux2": {"black-forest-labs/FLUX.2-dev", "Comfy-Org/flux2-dev"},
    "sd3": {"stabilityai/stable-diffusion-3.5-large", "Comfy-Org/stable-diffusion-3.5-fp8"},
    "sdxl": {"stabilityai/stable-diffusion-xl-base-1.0"},
    "wan": {"Comfy-Org/Wan_2.1_ComfyUI_repackaged", "Comfy-Org/Wan_2.2_ComfyUI_Repackaged"},
    "qwen_image": {"Comfy-Org/Qwen-Image_ComfyUI"},
    "hunyuan_video15": {"Comfy-Org/HunyuanVideo_1.5_repackaged"},
    "z_image": {"Comfy-Org/z_image", "Comfy-Org/z_image_turbo"},
    "ltx2": {"Lightricks/LTX-2", "Comfy-Org/ltx-2"},
    # repositories of other families, which no example's files may come from
    "lumina2": {"Comfy-Org/Lumina_Image_2.0_Repackaged"},
    "hidream": {"Comfy-Org/HiDream-I1_ComfyUI"},
}


def repository(url: str) -> str:
    """``owner/name`` of a Hugging Face address ("" for another site)."""
    if not url.startswith("https://huggingface.co/"):
        return ""
    return "/".join(url.removeprefix("https://huggingface.co/").split("/")[:2])


def test_every_model_file_an_example_loads_comes_from_its_own_familys_repository():
    """A model file's download address lies in a repository of the example's own model family: a Flux example
    must not send its user to Z-Image's repository for the VAE, nor HunyuanVideo 1.5's to Qwen-Image's for its
    text encoder, even where the file is the same."""
    owner = {repo: family for family, repos in REPOSITORIES.items() for repo in repos}
    checked = 0
    for name in NAMES:
        entries = [m for node in load(name)["nodes"] for m in (node.get("properties") or {}).get("models") or []]
        if not entries:
            continue
        assert name in FAMILY, f"{name}: say which model family it is (FAMILY) and where its files come from"
        for entry in entries:
            assert "/resolve/" in entry["url"], entry  # a download address on Hugging Face
            repo = repository(entry["url"])
            assert repo in REPOSITORIES[FAMILY[name]], \
                (f"{name}: {entry['name']} is downloaded from {repo}, a repository of "
                 f"{owner.get(repo, 'no known family')}, not of {FAMILY[name]}")
            checked += 1
    assert checked >= 20


def test_every_model_file_an_example_loads_says_where_to_download_it_and_in_which_folder(comfy, defs):
    """What the frontend's missing-models panel reads: per loader node, properties.models = [{name, url,
    directory}] for each file its widgets name, the directory being the models/ folder that widget lists."""
    import folder_paths
    model_files = tuple(folder_paths.supported_pt_extensions)
    loaders = {}
    for name in NAMES:
        for node in load(name)["nodes"]:
            if node["type"] in defs and any(isinstance(v, str) and v.endswith(model_files)
                                            for v in node["widgets_values"]):
                loaders.setdefault(node["type"], []).append((name, node))
    assert {"UNETLoader", "CLIPLoader", "DualCLIPLoader", "VAELoader", "CheckpointLoaderSimple"} <= set(loaders)
    folders = model_folders(comfy, set(loaders))
    official = official_urls()
    checked = 0
    for kind, uses in loaders.items():
        slots = workflow_api.widget_slots(defs[kind])
        for name, node in uses:
            entries = {m["name"]: m for m in node["properties"].get("models", [])}
            for slot, value in zip(slots, node["widgets_values"]):
                if not (isinstance(value, str) and value.endswith(model_files)):
                    continue
                entry = entries.get(value)
                assert entry, f"{name}: {kind}.{slot} loads {value} with no properties.models entry"
                assert entry["url"].startswith("https://") and entry["url"].split("?")[0].endswith("/" + value), entry
                assert {entry["directory"]} == folders[(kind, slot)], (name, kind, slot, entry, folders[(kind, slot)])
                # where ComfyUI's own templates download this file from this family's repositories, the same
                # address (their Flux templates take Flux's VAE from Lumina 2's repository: no family address)
                ours = {u for u in official.get(value, ()) if repository(u) in REPOSITORIES[FAMILY[name]]}
                if ours:
                    assert entry["url"] in ours, (value, entry["url"], ours)
                checked += 1
            assert set(entries) <= set(node["widgets_values"]), (name, kind, "an entry for a file it does not load")
    assert checked >= 10


@pytest.mark.parametrize("name", NAMES)
def test_examples_are_in_sync_with_their_generator(defs, name):
    from cached_sampler_dev.generate import make_example_workflows
    skip_unless_this_comfyui_has_what_it_needs(name, defs)
    assert make_example_workflows.WORKFLOWS[name](defs) == load(name), \
        "the nodes changed: run python3 -m cached_sampler_dev.generate.make_example_workflows"


def test_tiny_example_validates_and_runs_headless_with_summary_and_progress(comfy, defs):
    wf = load(RUNNABLE)
    prompt = workflow_api.workflow_to_api(wf, defs)
    valid = asyncio.run(comfy.execution.validate_prompt("check", prompt, None))
    assert valid[0], valid
    _, outputs = comfy.run(prompt)
    sampler = next(str(n["id"]) for n in wf["nodes"] if n["type"] == "CachedSampler")
    summary = outputs[sampler]["text"][0]
    assert summary.startswith("First Block Cache + TaylorSeer\ncomputed ") and "/20 steps (cond " in summary
    assert "estimated speedup" in summary and "acted: First Block Cache" in summary
    texts = [t for node, t in comfy.server.progress_texts if node == sampler]
    assert len(texts) == 21 and texts[-1] == summary
    assert all(f"step {i + 1}/20:" in t for i, t in enumerate(texts[:-1]))
    previews = [str(n["id"]) for n in wf["nodes"] if n["type"] == "PreviewImage"]
    assert all(outputs[p]["images"] for p in previews), "digits and the tuning plot are previewed"


# -- the converter on its own ---------------------------------------------------------------------

DEFS = {
    "Sampler": {"input": {"required": {"model": ["MODEL", {}], "seed": ["INT", {"default": 0}],
                                       "steps": ["INT", {"default": 20}], "mode": [["a", "b"], {}]},
                          "optional": {"chain": ["CHAIN", {}], "extra": ["FLOAT", {"default": 1.0}],
                                       "noise": ["INT", {"control_after_generate": True}],
                                       "text": ["STRING", {"forceInput": True}]}},
                "input_order": {"required": ["model", "seed", "steps", "mode"],
                                "optional": ["chain", "extra", "noise", "text"]},
                "output": ["LATENT"]},
    "Loader": {"input": {"required": {"name": ["STRING", {}]}}, "output": ["MODEL", "INT"]},
    "Filter": {"input": {"required": {"model": ["MODEL", {}]}}, "output": ["MODEL"]},
}


def node(id, type, inputs=(), outputs=(), widgets=None, mode=0):
    return {"id": id, "type": type, "inputs": list(inputs), "outputs": list(outputs), "widgets_values": widgets,
            "mode": mode}


def test_converter_positional_widgets_control_values_and_links():
    wf = {"nodes": [
        node(1, "Loader", outputs=[{"type": "MODEL"}, {"type": "INT"}], widgets=["m.safetensors"]),
        node(2, "Sampler", inputs=[{"name": "model", "type": "MODEL", "link": 1},
                                   {"name": "steps", "type": "INT", "widget": {"name": "steps"}, "link": 2}],
             widgets=[7, "randomize", 99, "b", 0.5, 3, "fixed"]),
        node(3, "Note", widgets=["hello"])],
        "links": [[1, 1, 0, 2, 0, "MODEL"], [2, 1, 1, 2, 1, "INT"]]}
    prompt = workflow_api.workflow_to_api(wf, DEFS)
    assert prompt == {"1": {"class_type": "Loader", "inputs": {"name": "m.safetensors"}},
                      "2": {"class_type": "Sampler", "inputs": {"model": ["1", 0], "seed": 7, "steps": ["1", 1],
                                                                "mode": "b", "extra": 0.5, "noise": 3}}}


def test_converter_primitive_reroute_bypass_and_mute():
    wf = {"nodes": [
        node(1, "Loader", outputs=[{"type": "MODEL"}, {"type": "INT"}], widgets=["m"]),
        node(2, "Reroute", inputs=[{"name": "", "type": "*", "link": 1}], outputs=[{"type": "MODEL"}]),
        node(3, "Filter", inputs=[{"name": "model", "type": "MODEL", "link": 2}], outputs=[{"type": "MODEL"}], mode=4),
        node(4, "PrimitiveNode", outputs=[{"type": "INT"}], widgets=[12, "fixed"]),
        node(5, "Sampler", inputs=[{"name": "model", "type": "MODEL", "link": 3},
                                   {"name": "steps", "type": "INT", "widget": {"name": "steps"}, "link": 4}],
             widgets=[1, "fixed", 20, "a", 1.0, 0, "fixed"]),
        node(6, "Filter", inputs=[{"name": "model", "type": "MODEL", "link": 5}], outputs=[{"type": "MODEL"}], mode=2)],
        "links": [[1, 1, 0, 2, 0, "MODEL"], [2, 2, 0, 3, 0, "MODEL"], [3, 3, 0, 5, 0, "MODEL"],
                  [4, 4, 0, 5, 1, "INT"], [5, 5, 0, 6, 0, "MODEL"]]}
    prompt = workflow_api.workflow_to_api(wf, DEFS)
    assert set(prompt) == {"1", "5"}
    assert prompt["5"]["inputs"]["model"] == ["1", 0] and prompt["5"]["inputs"]["steps"] == 12


def test_converter_refuses_unknown_nodes_and_short_widget_lists():
    with pytest.raises(workflow_api.WorkflowError, match="unknown node type 'Missing'"):
        workflow_api.workflow_to_api({"nodes": [node(1, "Missing")], "links": []}, DEFS)
    with pytest.raises(workflow_api.WorkflowError, match="widget values"):
        workflow_api.workflow_to_api({"nodes": [node(1, "Sampler", widgets=[1, 20])], "links": []}, DEFS)


def test_workflow_api_command_line(comfy, tmp_path):
    """``python3 -m cached_sampler_dev.devkit.workflow_api --help`` answers, from any folder, and the command turns
    a saved workflow into its prompt."""
    import subprocess
    command = [sys.executable, "-m", "cached_sampler_dev.devkit.workflow_api"]
    shown = subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert shown.returncode == 0 and "object_info" in shown.stdout
    defs = tmp_path / "object_info.json"
    defs.write_text(json.dumps(workflow_api.object_info()))
    made = subprocess.run([*command, str(EXAMPLES / f"{RUNNABLE}.json"), str(defs)],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    prompt = json.loads(made.stdout)
    assert any(node["class_type"] == "CachedSampler" for node in prompt.values())
