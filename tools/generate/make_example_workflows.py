"""Write example_workflows/*.json (UI format, as the frontend saves them) and their .jpg thumbnails.

Each workflow is declared below as data, one ``Template`` each: its model family (whose repositories its
model files come from), its loaders with their files, its other inputs, its stages (a chain of the pack's
cache nodes with their settings, first to last, and the sampler the chain feeds, with its settings), its
outputs and its note. One builder, ``render``, turns a declaration into the file: it numbers the nodes,
links each chain in order and into its sampler, colours the pack's nodes, and takes the widget order,
sockets and output types from the node definitions of the ComfyUI this runs in, so
the files always match the nodes. The files are one set for every supported ComfyUI: the graphs use only
nodes whose sockets and widgets did not change from v0.8.0 on (Wan's video is saved by SaveAnimatedWEBP:
CreateVideo gained a widget and SaveVideo became dynamic combos), and an output node lists its outputs only
as far as the graph links them, so this writes the same files on each version (the tests check it there).
Run from the pack's folder after changing nodes or graphs:

    python3 -m cached_sampler_dev.generate.make_example_workflows

The tiny-model workflow's thumbnail shows its real output (digits and tuning plot, sampled here); the
others show the graph itself, since they need model files to run: with ``--thumbnails-from-browser`` as
the browser test screenshotted it in ComfyUI (run ``python3 -m pytest tests/ui/test_browser.py`` first), else a
drawing of the graph (only where no thumbnail exists yet). Since the examples name their model files
(properties.models), both frontends cover a screenshot with their missing-models dialog or card: the examples
added since have drawings.
"""
from __future__ import annotations

import functools
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "example_workflows"

from ..devkit import workflow_api  # noqa: E402

SLOT_H, WIDGET_H, TITLE_H = 20, 24, 30
MODEL_EXTENSIONS = (".safetensors", ".ckpt", ".pt", ".pth", ".bin", ".sft", ".gguf")

HF = "https://huggingface.co"


def hf(repository: str, path: str) -> str:
    return f"{HF}/{repository}/resolve/main/{path}"


# Every model file an example loads, per model family: the folder of ComfyUI/models/ it belongs in and where to
# download it, from that family's own repositories (the official release, or Comfy-Org's repackaging of it at the
# address ComfyUI's own workflow templates use). A file name two families share is listed under each with its own
# family's address: Flux's VAE, ae.safetensors, is FLUX.1's, released with FLUX.1 [schnell] (the same file as
# [dev]'s, without [dev]'s gated licence) although ComfyUI's Flux templates point at a copy in Lumina 2's
# repository; Z-Image uses the same VAE and ships it in its own repository. Written into the loader node's
# properties.models, which both frontends' missing-models panel reads (name, url, directory).
FLUX_TEXT_ENCODERS = "comfyanonymous/flux_text_encoders"
WAN21 = "Comfy-Org/Wan_2.1_ComfyUI_repackaged"
QWEN_IMAGE = "Comfy-Org/Qwen-Image_ComfyUI"
HUNYUAN_VIDEO15 = "Comfy-Org/HunyuanVideo_1.5_repackaged"
FLUX2 = "Comfy-Org/flux2-dev"
MODEL_FILES = {
    "flux": {
        "flux1-dev.safetensors": ("diffusion_models", hf("Comfy-Org/flux1-dev", "flux1-dev.safetensors")),
        "clip_l.safetensors": ("text_encoders", hf(FLUX_TEXT_ENCODERS, "clip_l.safetensors")),
        "t5xxl_fp16.safetensors": ("text_encoders", hf(FLUX_TEXT_ENCODERS, "t5xxl_fp16.safetensors")),
        "ae.safetensors": ("vae", hf("black-forest-labs/FLUX.1-schnell", "ae.safetensors")),
    },
    "flux2": {  # Flux 2 [dev]'s own VAE and Mistral text encoder, from Comfy-Org's Flux 2 repository
        "flux2_dev_fp8mixed.safetensors": ("diffusion_models", hf(FLUX2, "split_files/diffusion_models/flux2_dev_fp8mixed.safetensors")),
        "mistral_3_small_flux2_fp8.safetensors": ("text_encoders", hf(FLUX2, "split_files/text_encoders/mistral_3_small_flux2_fp8.safetensors")),
        "flux2-vae.safetensors": ("vae", hf(FLUX2, "split_files/vae/flux2-vae.safetensors")),
    },
    "sd3": {  # SD3.5 Large with its text encoders in one checkpoint, as ComfyUI's SD3.5 template loads it
        "sd3.5_large_fp8_scaled.safetensors": ("checkpoints", hf("Comfy-Org/stable-diffusion-3.5-fp8",
                                                                 "sd3.5_large_fp8_scaled.safetensors")),
    },
    "sdxl": {
        "sd_xl_base_1.0.safetensors": ("checkpoints", hf("stabilityai/stable-diffusion-xl-base-1.0",
                                                         "sd_xl_base_1.0.safetensors")),
    },
    "wan21": {
        "wan2.1_t2v_1.3B_fp16.safetensors": ("diffusion_models", hf(WAN21, "split_files/diffusion_models/wan2.1_t2v_1.3B_fp16.safetensors")),
        "umt5_xxl_fp8_e4m3fn_scaled.safetensors": ("text_encoders", hf(WAN21, "split_files/text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors")),
        "wan_2.1_vae.safetensors": ("vae", hf(WAN21, "split_files/vae/wan_2.1_vae.safetensors")),
    },
    "wan22": {  # Wan 2.2 14B keeps Wan 2.1's text encoder and VAE
        "wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors": ("diffusion_models", hf("Comfy-Org/Wan_2.2_ComfyUI_Repackaged", "split_files/diffusion_models/wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors")),
        "wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors": ("diffusion_models", hf("Comfy-Org/Wan_2.2_ComfyUI_Repackaged", "split_files/diffusion_models/wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors")),
        "umt5_xxl_fp8_e4m3fn_scaled.safetensors": ("text_encoders", hf(WAN21, "split_files/text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors")),
        "wan_2.1_vae.safetensors": ("vae", hf(WAN21, "split_files/vae/wan_2.1_vae.safetensors")),
    },
    "qwen_image": {
        "qwen_image_fp8_e4m3fn.safetensors": ("diffusion_models", hf(QWEN_IMAGE, "split_files/diffusion_models/qwen_image_fp8_e4m3fn.safetensors")),
        "qwen_2.5_vl_7b_fp8_scaled.safetensors": ("text_encoders", hf(QWEN_IMAGE, "split_files/text_encoders/qwen_2.5_vl_7b_fp8_scaled.safetensors")),
        "qwen_image_vae.safetensors": ("vae", hf(QWEN_IMAGE, "split_files/vae/qwen_image_vae.safetensors")),
    },
    "hunyuan_video15": {  # its Qwen2.5-VL text encoder from its own repository, as ComfyUI's template has it
        "hunyuanvideo1.5_720p_t2v_fp16.safetensors": ("diffusion_models", hf(HUNYUAN_VIDEO15, "split_files/diffusion_models/hunyuanvideo1.5_720p_t2v_fp16.safetensors")),
        "qwen_2.5_vl_7b_fp8_scaled.safetensors": ("text_encoders", hf(HUNYUAN_VIDEO15, "split_files/text_encoders/qwen_2.5_vl_7b_fp8_scaled.safetensors")),
        "byt5_small_glyphxl_fp16.safetensors": ("text_encoders", hf(HUNYUAN_VIDEO15, "split_files/text_encoders/byt5_small_glyphxl_fp16.safetensors")),
        "hunyuanvideo15_vae_fp16.safetensors": ("vae", hf(HUNYUAN_VIDEO15, "split_files/vae/hunyuanvideo15_vae_fp16.safetensors")),
    },
    "z_image": {  # the text encoder and VAE in Z-Image Turbo's repository, as ComfyUI's Z-Image template has them
        "z_image_bf16.safetensors": ("diffusion_models", hf("Comfy-Org/z_image", "split_files/diffusion_models/z_image_bf16.safetensors")),
        "qwen_3_4b.safetensors": ("text_encoders", hf("Comfy-Org/z_image_turbo", "split_files/text_encoders/qwen_3_4b.safetensors")),
        "ae.safetensors": ("vae", hf("Comfy-Org/z_image_turbo", "split_files/vae/ae.safetensors")),
    },
    "ltx2": {
        "ltx-2-19b-dev-fp8.safetensors": ("checkpoints", hf("Lightricks/LTX-2", "ltx-2-19b-dev-fp8.safetensors")),
        "gemma_3_12B_it_fp4_mixed.safetensors": ("text_encoders", hf("Comfy-Org/ltx-2", "split_files/text_encoders/gemma_3_12B_it_fp4_mixed.safetensors")),
    },
}


class Graph:
    """A workflow under construction: nodes with widget values by name, links by input name."""

    def __init__(self, defs: dict, family: str | None = None):
        """``family``: the key of MODEL_FILES that says where the model files this graph loads come from."""
        self.defs = defs
        self.family = family
        self.nodes: list[dict] = []
        self.links: list[list] = []

    def add(self, kind: str, pos, widgets: dict | None = None, title: str | None = None, size=None,
            color: str | None = None) -> int:
        node_id = len(self.nodes) + 1
        self.nodes.append({"id": node_id, "type": kind, "pos": list(pos), "values": dict(widgets or {}),
                           "title": title, "size": size, "color": color, "links_in": {}})
        return node_id

    def note(self, pos, text: str, size=(380, 220)) -> int:
        node_id = len(self.nodes) + 1
        self.nodes.append({"id": node_id, "type": "MarkdownNote", "pos": list(pos), "note": text,
                           "size": list(size), "title": None, "color": None, "links_in": {}})
        return node_id

    def link(self, src: int, slot: int, dst: int, name: str) -> None:
        self.nodes[dst - 1]["links_in"][name] = (src, slot)

    def build(self) -> dict:
        nodes_out, links = [], []
        outputs_links: dict[tuple[int, int], list[int]] = {}
        link_id = 0
        built = {}
        used: dict[int, list[int]] = {}  # node id -> the output slots the example links
        for n in self.nodes:
            for src, slot in n["links_in"].values():
                used.setdefault(src, []).append(slot)
        for n in self.nodes:
            if n["type"] == "MarkdownNote":
                built[n["id"]] = {"id": n["id"], "type": "MarkdownNote", "pos": n["pos"], "size": n["size"],
                                  "flags": {}, "order": 0, "mode": 0, "inputs": [], "outputs": [],
                                  "properties": {}, "widgets_values": [n["note"]], "color": "#432", "bgcolor": "#653"}
                continue
            d = self.defs[n["type"]]
            sockets, widgets = [], []
            for name, kind, options in workflow_api.ordered_inputs(d):
                if workflow_api.is_widget(kind, options):
                    if name in n["links_in"]:
                        sockets.append({"name": name, "type": kind if isinstance(kind, str) else "COMBO",
                                        "widget": {"name": name}, "link": None})
                    choices = kind if isinstance(kind, list) else options.get("options") or []
                    default = options.get("default", choices[0] if choices else None)
                    if name not in n["values"] and default is None:
                        raise ValueError(f"{n['type']}: give a value for {name!r}")
                    widgets.append(n["values"].pop(name, default))  # model file names may be absent here
                    if workflow_api.has_control_widget(name, kind, options):
                        widgets.append("fixed")
                else:
                    sockets.append({"name": name, "type": kind, "link": None})
            if n["values"]:
                raise ValueError(f"{n['type']}: unknown widgets {sorted(n['values'])}")
            outputs = [{"name": name, "type": kind, "links": []}
                       for name, kind in zip(d.get("output_name", d["output"]), d["output"])]
            if d.get("output_node"):
                # Newer ComfyUIs give Save/Preview nodes a pass-through output that older ones lack: an output
                # node lists its outputs only as far as the example links them, so the file opens on both.
                outputs = outputs[:max(used.get(n["id"], [-1])) + 1]
            width = n["size"][0] if n["size"] else 320
            rows = max(len(sockets), len(outputs))
            height = n["size"][1] if n["size"] else rows * SLOT_H + len(widgets) * WIDGET_H + 16
            properties = {"Node name for S&R": n["type"]}
            files = [v for v in widgets if isinstance(v, str) and v.endswith(MODEL_EXTENSIONS)]
            known = MODEL_FILES.get(self.family, {})
            unknown = [f for f in files if f not in known]
            if unknown:
                raise ValueError(f"{n['type']}: add {unknown} to MODEL_FILES[{self.family!r}] (folder and download "
                                 f"address, in that family's repositories)")
            if files:
                properties["models"] = [{"name": f, "url": known[f][1], "directory": known[f][0]} for f in files]
            node = {"id": n["id"], "type": n["type"], "pos": n["pos"], "size": [width, height], "flags": {},
                    "order": 0, "mode": 0, "inputs": sockets, "outputs": outputs,
                    "properties": properties, "widgets_values": widgets}
            if n["title"]:
                node["title"] = n["title"]
            if n["color"]:
                node["color"], node["bgcolor"] = n["color"]
            built[n["id"]] = node
        for n in self.nodes:
            for name, (src, slot) in n["links_in"].items():
                link_id += 1
                target = built[n["id"]]
                index = next(i for i, s in enumerate(target["inputs"]) if s["name"] == name)
                kind = built[src]["outputs"][slot]["type"]
                target["inputs"][index]["link"] = link_id
                built[src]["outputs"][slot]["links"].append(link_id)
                outputs_links.setdefault((src, slot), []).append(link_id)
                links.append([link_id, src, slot, n["id"], index, kind])
        for node in built.values():
            for i, o in enumerate(node["outputs"]):
                o["slot_index"] = i
        order = _execution_order(built, links)
        for i, node_id in enumerate(order):
            built[node_id]["order"] = i
        nodes_out = [built[n["id"]] for n in self.nodes]
        return {"last_node_id": len(self.nodes), "last_link_id": link_id, "nodes": nodes_out, "links": links,
                "groups": [], "config": {}, "extra": {"ds": {"scale": 0.8, "offset": [40, 40]}}, "version": 0.4}


def _execution_order(nodes: dict, links: list) -> list[int]:
    deps = {i: {l[1] for l in links if l[3] == i} for i in nodes}
    order, done = [], set()
    while len(order) < len(nodes):
        for i in sorted(nodes):
            if i not in done and deps[i] <= done:
                order.append(i)
                done.add(i)
    return order


CACHE = ("#233", "#355")     # colour of the pack's nodes in the examples
SAMPLER = ("#232", "#353")
CHAIN = "<chain>"            # in a sampler's inputs: where its chain's link goes (else after its other inputs)


@dataclass(frozen=True)
class N:
    """One node of a template: its type, where it sits, its widget values by name and its inputs as the node
    they come from ("key" for that node's first output, "key.2" for its third)."""
    type: str
    at: tuple[int, int]
    widgets: dict = field(default_factory=dict)
    inputs: dict = field(default_factory=dict)
    title: str | None = None
    size: list | None = None


@dataclass(frozen=True)
class Stage:
    """A chain of the pack's cache nodes, first to last (each one's `interceptors` output into the next one's
    input), and the sampler its last node feeds (a Cached Sampler, or Apply Interceptors)."""
    chain: dict
    sampler: tuple  # (key, N)


@dataclass(frozen=True)
class Template:
    """One example workflow as data. Its nodes are numbered in this order: the model loaders, the other inputs,
    every stage's chain, every stage's sampler, the outputs, the note."""
    name: str
    title: str                 # the thumbnail drawing's heading
    family: str | None         # the key of MODEL_FILES its model files come from
    models: dict               # key -> N: the loaders (their widgets name the files)
    inputs: dict               # key -> N: prompts, latents, model patches
    stages: list
    outputs: dict              # key -> N: decoding, saving, plots, and whatever runs after the sampler
    note: tuple                # (text, at, size)
    requires: tuple = ()       # (node, input) pairs newer than the oldest supported ComfyUI


def render(template: Template, defs: dict) -> dict:
    """The one builder: a template's declaration as the UI-format workflow the frontend saves."""
    g = Graph(defs, template.family)
    ids: dict[str, int] = {}
    declared = [*template.models.items(), *template.inputs.items()]
    declared += [(key, node, CACHE) for stage in template.stages for key, node in stage.chain.items()]
    declared += [(*stage.sampler, SAMPLER) for stage in template.stages]
    declared += template.outputs.items()
    for key, node, *colour in declared:
        if key in ids:
            raise ValueError(f"{template.name}: two nodes are named {key!r}")
        ids[key] = g.add(node.type, node.at, node.widgets, title=node.title, size=node.size,
                         color=colour[0] if colour else None)
    chain_ends = {stage.sampler[0]: list(stage.chain)[-1] for stage in template.stages if stage.chain}
    followers = {key: follower for stage in template.stages for key, follower in zip(stage.chain, list(stage.chain)[1:])}

    def source(ref: str) -> tuple[int, int]:
        key, _, slot = ref.partition(".")
        return ids[key], int(slot or 0)

    for key, node, *_ in declared:
        inputs = dict(node.inputs)
        previous = next((k for k, follower in followers.items() if follower == key), None)
        if previous is not None:
            inputs["interceptors"] = previous
        if key in chain_ends:
            if CHAIN in inputs.values():
                inputs = {name: chain_ends[key] if ref == CHAIN else ref for name, ref in inputs.items()}
            else:
                inputs["interceptors"] = chain_ends[key]
        for name, ref in inputs.items():
            g.link(*source(ref), ids[key], name)
    text, at, size = template.note
    g.note(at, text, size=size)
    return g.build()


# The models of the text-to-image examples that load a diffusion model, text encoders and a VAE apart.
def flux_loaders() -> dict:
    return {
        "unet": N("UNETLoader", (40, 80), {"unet_name": "flux1-dev.safetensors", "weight_dtype": "default"}),
        "clip": N("DualCLIPLoader", (40, 220), {"clip_name1": "clip_l.safetensors", "clip_name2": "t5xxl_fp16.safetensors",
                                                "type": "flux", "device": "default"}),
        "vae": N("VAELoader", (40, 420), {"vae_name": "ae.safetensors"}),
    }


def image_outputs(prefix: str) -> dict:
    """VAEDecode and SaveImage after the sampler, and its tuning plot."""
    return {
        "decode": N("VAEDecode", (1580, 80), inputs={"samples": "sampler", "vae": "vae"}),
        "save": N("SaveImage", (1580, 200), {"filename_prefix": prefix}, {"images": "decode"}, size=[400, 440]),
        "plot": N("PreviewImage", (1220, 460), inputs={"images": "sampler.1"}, title="Tuning plot", size=[330, 260]),
    }


def video_outputs(prefix: str, fps: float) -> dict:
    """VAEDecode and SaveAnimatedWEBP after the sampler (the same in every supported ComfyUI), and its plot."""
    outputs = image_outputs(prefix)
    outputs["save"] = N("SaveAnimatedWEBP", (1580, 200), {"filename_prefix": prefix, "fps": fps, "lossless": False,
                                                          "quality": 90, "method": "default"},
                        {"images": "decode"}, size=[400, 440])
    return outputs


def cached_sampler(at, steps: int, cfg: float, sampler_name: str, scheduler: str, model: str = "shift",
                   positive: str = "pos", negative: str = "neg", latent: str = "latent", seed: int = 42,
                   size=None) -> N:
    return N("CachedSampler", at, {"seed": seed, "steps": steps, "cfg": cfg, "sampler_name": sampler_name,
                                   "scheduler": scheduler, "denoise": 1.0},
             {"model": model, "positive": positive, "negative": negative, "latent_image": latent}, size=size)


def prompt(at, text: str, title: str = "Prompt", height: int = 160, clip: str = "clip") -> N:
    return N("CLIPTextEncode", at, {"text": text}, {"clip": clip}, title=title, size=[400, height])


TS = N("CachedSamplerTaylorSeer", (850, 330), {"order": 1})


TEMPLATES = [
    Template(
        "flux_dbcache_taylorseer", "Flux: DBCache + TaylorSeer", "flux",
        models=flux_loaders(),
        inputs={
            "pos": prompt((400, 80), "a red fox reading a newspaper in a cosy cafe, morning light, 35mm photo"),
            "neg": prompt((400, 290), "", "Negative (unused at cfg 1)", 100),
            "guidance": N("FluxGuidance", (850, 80), {"guidance": 3.5}, {"conditioning": "pos"}),
            "latent": N("EmptySD3LatentImage", (400, 450), {"width": 1024, "height": 1024, "batch_size": 1}),
        },
        stages=[Stage({
            "db": N("CachedSamplerDBCache", (850, 240), {"Fn": 1, "Bn": 0, "threshold": 0.12, "warmup": 0.1,
                                                         "max_cached_steps": -1, "max_consecutive_cached": 3,
                                                         "start_percent": 0.0, "end_percent": 1.0}),
            "ts": N("CachedSamplerTaylorSeer", (850, 510), {"order": 1}),
        }, ("sampler", cached_sampler((1220, 80), 28, 1.0, "euler", "simple", model="unet", positive="guidance")))],
        outputs=image_outputs("flux_cached"),
        note=("**Flux.1 dev + DBCache + TaylorSeer**\n\nDBCache skips Flux's middle blocks while block 1's "
              "residual barely changes; TaylorSeer forecasts the skipped work instead of reusing it stale. "
              "Flux: threshold 0.08-0.2. Watch the *Tuning plot* and the numbers on the Cached Sampler to tune.\n\n"
              "**Model files:** `diffusion_models/flux1-dev.safetensors`, `text_encoders/clip_l.safetensors`, "
              "`text_encoders/t5xxl_fp16.safetensors`, `vae/ae.safetensors`.", (40, 540), (340, 250)),
    ),
    Template(
        "flux_first_block_cache_taylorseer", "FLUX.1-dev: First Block Cache + TaylorSeer", "flux",
        models=flux_loaders(),
        inputs={
            "pos": prompt((400, 80), "a red fox reading a newspaper in a cosy cafe, morning light, 35mm photo"),
            "neg": prompt((400, 290), "", "Negative (unused at cfg 1)", 100),
            "guidance": N("FluxGuidance", (850, 460), {"guidance": 3.5}, {"conditioning": "pos"}),
            "latent": N("EmptySD3LatentImage", (400, 450), {"width": 1024, "height": 1024, "batch_size": 1}),
        },
        stages=[Stage({
            "fbc": N("CachedSamplerFirstBlockCache", (850, 80), {"threshold": 0.12}),
            "ts": TS,
        }, ("sampler", cached_sampler((1220, 80), 28, 1.0, "euler", "simple", model="unet", positive="guidance")))],
        outputs=image_outputs("flux_cached"),
        note=("**FLUX.1-dev + First Block Cache + TaylorSeer** (also for Chroma)\n\nBlock 1 probes each step; "
              "the other blocks are skipped while its residual barely changes, and TaylorSeer forecasts the skipped "
              "work instead of reusing it stale. Threshold 0.12 at 28 steps, from the published range for Flux.1 "
              "dev: 0.08 (lossless) to 0.2 (2.9x faster, slight degradation).\n\n**What to expect:** the summary "
              "shows the steps whose blocks were computed of 28 and the work saved; read the tuning plot before "
              "raising the threshold.", (40, 540), (360, 280)),
    ),
    Template(
        "flux2_fixed_cadence_taylorseer", "Flux 2: Fixed Cadence + TaylorSeer", "flux2",
        models={
            "unet": N("UNETLoader", (40, 80), {"unet_name": "flux2_dev_fp8mixed.safetensors", "weight_dtype": "default"}),
            "clip": N("CLIPLoader", (40, 220), {"clip_name": "mistral_3_small_flux2_fp8.safetensors", "type": "flux2",
                                                "device": "default"}),
            "vae": N("VAELoader", (40, 380), {"vae_name": "flux2-vae.safetensors"}),
        },
        inputs={
            "pos": prompt((400, 80), "a hand-painted enamel sign reading \"FRESH BREAD\" above a bakery door, "
                                     "morning light, street photo"),
            "neg": prompt((400, 290), "", "Negative (unused at cfg 1)", 100),
            "guidance": N("FluxGuidance", (850, 430), {"guidance": 4.0}, {"conditioning": "pos"}),
            "latent": N("EmptyFlux2LatentImage", (400, 450), {"width": 1024, "height": 1024, "batch_size": 1}),
        },
        stages=[Stage({
            "cadence": N("CachedSamplerFixedCadence", (850, 80), {"interval": 3}),
            "ts": N("CachedSamplerTaylorSeer", (850, 260), {"order": 1}),
        }, ("sampler", cached_sampler((1220, 80), 28, 1.0, "euler", "simple", model="unet", positive="guidance")))],
        outputs=image_outputs("flux2_cached"),
        note=("**Flux 2 [dev] + Fixed Cadence + TaylorSeer**\n\nNo caching setting is published for Flux 2: compute "
              "every 3rd step and forecast the others in sigma. For block-level caching instead, use FLUX.1-dev's "
              "First Block Cache chain from threshold 0.05 and raise it while reading the tuning plot. Flux 2 Klein "
              "is step-distilled: caching is refused there unless `allow_distilled` is on.\n\n**What to expect:** "
              "the summary shows about 10 of 28 steps computed (the first and last always are).",
              (40, 540), (360, 280)),
    ),
    Template(
        "wan21_adaptive_cache", "Wan 2.1 video: Adaptive Cache + TaylorSeer", "wan21",
        models={
            "unet": N("UNETLoader", (40, 80), {"unet_name": "wan2.1_t2v_1.3B_fp16.safetensors", "weight_dtype": "default"}),
            "clip": N("CLIPLoader", (40, 220), {"clip_name": "umt5_xxl_fp8_e4m3fn_scaled.safetensors", "type": "wan",
                                                "device": "default"}),
            "vae": N("VAELoader", (40, 380), {"vae_name": "wan_2.1_vae.safetensors"}),
        },
        inputs={
            "shift": N("ModelSamplingSD3", (400, 500), {"shift": 8.0}, {"model": "unet"}),
            "pos": prompt((400, 80), "a paper boat drifting down a rainy street gutter, close-up, cinematic"),
            "neg": prompt((400, 290), "blurry, low quality, static, watermark", "Negative", 140),
            "latent": N("EmptyHunyuanLatentVideo", (850, 620), {"width": 832, "height": 480, "length": 33,
                                                                "batch_size": 1}),
        },
        stages=[Stage({
            "cache": N("CachedSamplerAdaptiveCache", (850, 80), {"threshold": 0.1, "max_consecutive_cached": -1,
                                                                 "start_percent": 0.15, "end_percent": 0.95}),
            "ts": N("CachedSamplerTaylorSeer", (850, 420), {"order": 1}),
        }, ("sampler", cached_sampler((1220, 80), 30, 6.0, "uni_pc", "simple")))],
        outputs=video_outputs("video/wan_cached", 16.0),
        note=("**Wan 2.1 text-to-video + Adaptive Cache + TaylorSeer** (also Wan 2.2 in one stage)\n\nThe Adaptive "
              "Cache skips whole model steps while the predicted output change stays under the threshold (0.1 "
              "about 2x, 0.2 about 3x, the published values for Wan); TaylorSeer forecasts the skipped steps "
              "instead of reusing the last one. No calibration needed.\n\n**Model files:** "
              "`diffusion_models/wan2.1_t2v_1.3B_fp16.safetensors`, "
              "`text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors`, `vae/wan_2.1_vae.safetensors`.",
              (40, 520), (340, 280)),
    ),
    Template(
        "sdxl_adaptive_cache", "SDXL: Adaptive Cache", "sdxl",
        models={"ckpt": N("CheckpointLoaderSimple", (40, 80), {"ckpt_name": "sd_xl_base_1.0.safetensors"})},
        inputs={
            "pos": prompt((400, 80), "a lighthouse on a cliff at dusk, dramatic clouds, oil painting", clip="ckpt.1"),
            "neg": prompt((400, 290), "blurry, low quality, text, watermark", "Negative", 140, clip="ckpt.1"),
            "latent": N("EmptyLatentImage", (400, 480), {"width": 1024, "height": 1024, "batch_size": 1}),
        },
        stages=[Stage({
            "cache": N("CachedSamplerAdaptiveCache", (850, 80), {"threshold": 0.1, "max_consecutive_cached": 2,
                                                                 "start_percent": 0.15, "end_percent": 0.95}),
        }, ("sampler", cached_sampler((1220, 80), 30, 6.5, "dpmpp_2m", "karras", model="ckpt")))],
        outputs={**image_outputs("sdxl_cached"),
                 "decode": N("VAEDecode", (1580, 80), inputs={"samples": "sampler", "vae": "ckpt.2"})},
        note=("**SDXL + Adaptive Cache (whole-model cache)**\n\nUNet models expose no transformer blocks to "
              "cache, so the Adaptive Cache works on whole model steps. `max_consecutive_cached` 2 keeps long reuse "
              "runs short on a 30-step schedule.\n\n**Model file:** `checkpoints/sd_xl_base_1.0.safetensors`.",
              (40, 260), (320, 230)),
    ),
]
TEMPLATES += [
    Template(
        "sdxl_fixed_cadence_taylorseer", "SDXL: Fixed Cadence + TaylorSeer", "sdxl",
        models={"ckpt": N("CheckpointLoaderSimple", (40, 80), {"ckpt_name": "sd_xl_base_1.0.safetensors"})},
        inputs={
            "pos": prompt((400, 80), "a lighthouse on a cliff at dusk, dramatic clouds, oil painting", clip="ckpt.1"),
            "neg": prompt((400, 290), "blurry, low quality, text, watermark", "Negative", 140, clip="ckpt.1"),
            "latent": N("EmptyLatentImage", (400, 480), {"width": 1024, "height": 1024, "batch_size": 1}),
        },
        stages=[Stage({
            "cadence": N("CachedSamplerFixedCadence", (850, 80), {"interval": 3}),
            "ts": N("CachedSamplerTaylorSeer", (850, 260), {"order": 1}),
        }, ("sampler", cached_sampler((1220, 80), 30, 6.5, "dpmpp_2m", "karras", model="ckpt")))],
        outputs={**image_outputs("sdxl_cached"),
                 "decode": N("VAEDecode", (1580, 80), inputs={"samples": "sampler", "vae": "ckpt.2"})},
        note=("**SDXL + Fixed Cadence + TaylorSeer** (also SD 1.5)\n\nUNet models expose no transformer blocks to "
              "cache, so whole steps are skipped: compute every 3rd step and forecast the others in sigma (at "
              "28-30 steps interval 3-5; 5-8 at 50 steps).\n\n**What to expect:** the summary shows about 11 of "
              "30 steps computed (the first and last always are).\n\n**Model file:** "
              "`checkpoints/sd_xl_base_1.0.safetensors`.", (40, 260), (320, 280)),
    ),
    Template(
        "sdxl_auto_calibrate", "SDXL: Auto Calibrate to a PSNR", "sdxl",
        models={"ckpt": N("CheckpointLoaderSimple", (40, 80), {"ckpt_name": "sd_xl_base_1.0.safetensors"})},
        inputs={
            "pos": prompt((400, 80), "a lighthouse on a cliff at dusk, dramatic clouds, oil painting", clip="ckpt.1"),
            "neg": prompt((400, 290), "blurry, low quality, text, watermark", "Negative", 140, clip="ckpt.1"),
            "latent": N("EmptyLatentImage", (400, 480), {"width": 1024, "height": 1024, "batch_size": 1}),
        },
        stages=[Stage({
            "calib": N("CachedSamplerAutoCalibrate", (850, 80),
                       {"seed": 42, "steps": 30, "cfg": 6.5, "sampler_name": "dpmpp_2m", "scheduler": "karras",
                        "denoise": 1.0, "target": "quality", "min_psnr": 35.0},
                       {"model": "ckpt", "positive": "pos", "negative": "neg", "latent_image": "latent",
                        "vae": "ckpt.2"}, size=[340, 500]),
        }, ("sampler", cached_sampler((1220, 80), 30, 6.5, "dpmpp_2m", "karras", model="ckpt")))],
        outputs={**image_outputs("sdxl_calibrated"),
                 "decode": N("VAEDecode", (1580, 80), inputs={"samples": "sampler", "vae": "ckpt.2"})},
        note=("**SDXL + Auto Calibrate** (any model, to save more)\n\nAuto Calibrate samples the prompt once "
              "uncached, then plans which steps to compute so that the decoded image keeps `min_psnr` (35 dB: hard "
              "to tell apart) against the uncached one, and forecasts the others. The model's VAE is connected, so "
              "plans are judged on images. Keep its steps, sampler and scheduler equal to the sampler's.\n\n"
              "**What to expect:** the first queue costs the calibration (25-80 sampling runs); queued again with "
              "the same inputs, ComfyUI reuses the plan.", (40, 260), (340, 320)),
    ),
    Template(
        "sd35_first_block_cache_taylorseer", "SD3.5: First Block Cache + TaylorSeer", "sd3",
        models={"ckpt": N("CheckpointLoaderSimple", (40, 80), {"ckpt_name": "sd3.5_large_fp8_scaled.safetensors"})},
        inputs={
            "pos": prompt((400, 80), "a glass bottle holding a tiny galaxy on a wooden kitchen table, mountains "
                                     "outside the window, bright sun", clip="ckpt.1"),
            "neg": prompt((400, 290), "", "Negative", 100, clip="ckpt.1"),
            "latent": N("EmptySD3LatentImage", (400, 440), {"width": 1024, "height": 1024, "batch_size": 1}),
        },
        stages=[Stage({
            "fbc": N("CachedSamplerFirstBlockCache", (850, 80), {"threshold": 0.12}),
            "ts": TS,
        }, ("sampler", cached_sampler((1220, 80), 28, 4.0, "euler", "sgm_uniform", model="ckpt")))],
        outputs={**image_outputs("sd35_cached"),
                 "decode": N("VAEDecode", (1580, 80), inputs={"samples": "sampler", "vae": "ckpt.2"})},
        note=("**SD3.5 Large + First Block Cache + TaylorSeer** (also SD3)\n\nBlock 1 probes each step; the other "
              "blocks are skipped while its residual barely changes, and TaylorSeer forecasts the skipped work. "
              "Threshold 0.12 is the value published for SD3.5.\n\n**What to expect:** the summary shows the steps "
              "whose blocks were computed of 28 and the work saved; read the tuning plot before raising the "
              "threshold.\n\n**Model file:** `checkpoints/sd3.5_large_fp8_scaled.safetensors` (its text encoders "
              "included).", (40, 260), (340, 300)),
    ),
    Template(
        "apply_interceptors_sampler_custom_advanced", "Apply Interceptors + SamplerCustomAdvanced", "flux",
        models=flux_loaders(),
        inputs={},
        stages=[Stage({
            "fbc": N("CachedSamplerFirstBlockCache", (40, 540), {"threshold": 0.12, "warmup": 0.1,
                                                                 "max_cached_steps": -1, "max_consecutive_cached": 3,
                                                                 "start_percent": 0.0, "end_percent": 1.0}),
        }, ("apply", N("CachedSamplerApplyInterceptors", (400, 540), inputs={"model": "unet"})))],
        outputs={
            "pos": prompt((400, 80), "an isometric tiny city on a floating island, soft pastel colours, detailed"),
            "guidance": N("FluxGuidance", (400, 290), {"guidance": 3.5}, {"conditioning": "pos"}),
            "latent": N("EmptySD3LatentImage", (400, 400), {"width": 1024, "height": 1024, "batch_size": 1}),
            "noise": N("RandomNoise", (850, 80), {"noise_seed": 42}),
            "guider": N("BasicGuider", (850, 200), inputs={"model": "apply", "conditioning": "guidance"}),
            "select": N("KSamplerSelect", (850, 300), {"sampler_name": "euler"}),
            "sched": N("BasicScheduler", (850, 400), {"scheduler": "simple", "steps": 28, "denoise": 1.0},
                       {"model": "apply"}),
            "sampler": N("SamplerCustomAdvanced", (1220, 80), inputs={
                "noise": "noise", "guider": "guider", "sampler": "select", "sigmas": "sched", "latent_image": "latent"}),
            "decode": N("VAEDecode", (1580, 80), inputs={"samples": "sampler", "vae": "vae"}),
            "save": N("SaveImage", (1580, 200), {"filename_prefix": "flux_custom_cached"}, {"images": "decode"},
                      size=[400, 440]),
        },
        note=("**Apply Interceptors + SamplerCustomAdvanced**\n\nApply Interceptors installs the chain on the "
              "model, so any sampler runs it (custom samplers, guiders, other packs). Every sampling run starts with a "
              "fresh cache; what caching did goes to the ComfyUI log.\n\n**Model files:** as the Flux example.",
              (850, 540), (340, 220)),
    ),
    Template(
        "tiny_digits_tuning_plot", "Tiny digits model: tuning plot", None,
        models={"model": N("CachedSamplerDigitsModel", (40, 80), {"digits": "0123456789"})},
        inputs={},
        stages=[Stage({
            "fbc": N("CachedSamplerFirstBlockCache", (40, 260), {"threshold": 0.25, "warmup": 0.1,
                                                                 "max_cached_steps": -1, "max_consecutive_cached": 3,
                                                                 "start_percent": 0.0, "end_percent": 1.0}),
            "ts": N("CachedSamplerTaylorSeer", (40, 520), {"order": 1}),
        }, ("sampler", cached_sampler((420, 80), 20, 3.0, "euler", "simple", model="model", positive="model.1",
                                      negative="model.2", latent="model.3", seed=0, size=[340, 330])))],
        outputs={
            "decode": N("CachedSamplerDigitsDecode", (820, 80), inputs={"samples": "sampler"}),
            "images": N("PreviewImage", (820, 180), inputs={"images": "decode"}, title="Digits", size=[420, 260]),
            "plot": N("PreviewImage", (420, 580), inputs={"images": "sampler.1"}, title="Tuning plot",
                      size=[820, 470]),
        },
        note=("**Tuning plot on the bundled tiny model** (runs in a second on a CPU)\n\nRaise First Block "
              "Cache's `threshold` and queue again: more orange (skipped) steps, more work saved. The summary on the "
              "Cached Sampler tells computed/skipped steps and the estimated speedup; compare the digits with "
              "threshold 0.", (40, 640), (340, 240)),
    ),
]


def wan22_stage(at, title: str, model: str, latent: str, widgets: dict) -> N:
    return N("CachedSamplerAdvanced", at, {"noise_seed": 42, "steps": 20, "cfg": 3.5, "sampler_name": "euler",
                                           "scheduler": "simple", **widgets},
             {"model": model, "positive": "pos", "negative": "neg", "interceptors": CHAIN, "latent_image": latent},
             title=title)


TEMPLATES += [
    Template(
        "wan22_two_stage_first_block_cache", "Wan 2.2: two stages, each cached", "wan22",
        models={
            "high": N("UNETLoader", (40, 80), {"unet_name": "wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors",
                                               "weight_dtype": "default"}, title="High-noise model"),
            "low": N("UNETLoader", (40, 220), {"unet_name": "wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors",
                                              "weight_dtype": "default"}, title="Low-noise model"),
            "clip": N("CLIPLoader", (40, 360), {"clip_name": "umt5_xxl_fp8_e4m3fn_scaled.safetensors", "type": "wan",
                                                "device": "default"}),
            "vae": N("VAELoader", (40, 520), {"vae_name": "wan_2.1_vae.safetensors"}),
        },
        inputs={
            "shift_high": N("ModelSamplingSD3", (400, 80), {"shift": 8.0}, {"model": "high"}),
            "shift_low": N("ModelSamplingSD3", (400, 200), {"shift": 8.0}, {"model": "low"}),
            "pos": prompt((400, 320), "a red kite dancing over a windy beach at sunset, waves rolling in, cinematic "
                                      "wide shot", height=150),
            "neg": prompt((400, 500), "blurry, low quality, static, watermark, subtitles", "Negative", 120),
            "latent": N("EmptyHunyuanLatentVideo", (400, 660), {"width": 832, "height": 480, "length": 81,
                                                                "batch_size": 1}),
        },
        stages=[
            Stage({"fbc_high": N("CachedSamplerFirstBlockCache", (850, 80), {"threshold": 0.1},
                                 title="First Block Cache (high noise)"),
                   "ts_high": N("CachedSamplerTaylorSeer", (850, 330), {"order": 1})},
                  ("stage1", wan22_stage((1220, 80), "Cached Sampler (Advanced): high noise, steps 0-10",
                                         "shift_high", "latent",
                                         {"add_noise": "enable", "start_at_step": 0, "end_at_step": 10,
                                          "return_with_leftover_noise": "enable"}))),
            Stage({"fbc_low": N("CachedSamplerFirstBlockCache", (850, 440), {"threshold": 0.1},
                                title="First Block Cache (low noise)"),
                   "ts_low": N("CachedSamplerTaylorSeer", (850, 690), {"order": 1})},
                  ("stage2", wan22_stage((1580, 80), "Cached Sampler (Advanced): low noise, steps 10-20",
                                         "shift_low", "stage1",
                                         {"add_noise": "disable", "start_at_step": 10, "end_at_step": 10000,
                                          "return_with_leftover_noise": "disable"}))),
        ],
        outputs={
            "decode": N("VAEDecode", (1940, 80), inputs={"samples": "stage2", "vae": "vae"}),
            "save": N("SaveAnimatedWEBP", (1940, 200), {"filename_prefix": "video/wan22_cached", "fps": 16.0,
                                                        "lossless": False, "quality": 90, "method": "default"},
                      {"images": "decode"}, size=[400, 440]),
            "plot1": N("PreviewImage", (1220, 560), inputs={"images": "stage1.1"}, title="Tuning plot (high noise)",
                       size=[330, 260]),
            "plot2": N("PreviewImage", (1580, 560), inputs={"images": "stage2.1"}, title="Tuning plot (low noise)",
                       size=[330, 260]),
        },
        note=("**Wan 2.2 14B text-to-video, two stages, each cached**\n\nOne Cached Sampler (Advanced) per "
              "stage, each with its own First Block Cache + TaylorSeer chain. Each stage starts a fresh cache, and "
              "warm-up is counted on the whole 20-step schedule, so the low-noise stage does not warm up again. Wan: "
              "threshold 0.05-0.15 (0.1 here); lower it on the high-noise stage if the layout drifts.\n\n**What to "
              "expect:** each sampler's summary shows its steps computed of its 10; the tuning plots show where it "
              "skipped. Compare with threshold 0 (bit-identical, nothing skipped).", (40, 800), (380, 300)),
    ),
    Template(
        "qwen_image_magcache_calibrate", "Qwen-Image: MagCache, calibrated", "qwen_image",
        models={
            "unet": N("UNETLoader", (40, 80), {"unet_name": "qwen_image_fp8_e4m3fn.safetensors", "weight_dtype": "default"}),
            "clip": N("CLIPLoader", (40, 220), {"clip_name": "qwen_2.5_vl_7b_fp8_scaled.safetensors", "type": "qwen_image",
                                                "device": "default"}),
            "vae": N("VAELoader", (40, 380), {"vae_name": "qwen_image_vae.safetensors"}),
        },
        inputs={
            "shift": N("ModelSamplingAuraFlow", (40, 480), {"shift": 3.1}, {"model": "unet"}),
            "pos": prompt((400, 80), "a neon-lit night market street in the rain, shop signs reading \"Cached "
                                     "Sampler\", reflections on wet stones"),
            "neg": prompt((400, 290), "", "Negative", 100),
            "latent": N("EmptySD3LatentImage", (400, 440), {"width": 1328, "height": 1328, "batch_size": 1}),
        },
        stages=[Stage({
            "calib": N("CachedSamplerMagCacheCalibrate", (850, 80),
                       {"seed": 42, "steps": 30, "cfg": 2.5, "sampler_name": "euler", "scheduler": "simple",
                        "denoise": 1.0, "threshold": 0.1, "K": 2, "retention_ratio": 0.2},
                       {"model": "shift", "positive": "pos", "negative": "neg", "latent_image": "latent"},
                       size=[340, 430]),
        }, ("sampler", cached_sampler((1220, 80), 30, 2.5, "euler", "simple")))],
        outputs=image_outputs("qwen_image_cached"),
        note=("**Qwen-Image + MagCache, calibrated for this model**\n\nQwen-Image has no published MagCache "
              "curve: MagCache Calibrate runs the prompt once uncached and records it, and its chain (threshold 0.1, K 2, "
              "retention 0.2, the published Qwen-Image setting) drives the Cached Sampler. Keep its steps, sampler and "
              "scheduler equal to the sampler's.\n\n**What to expect:** the first queue costs one extra uncached run; "
              "queued again with the same inputs, ComfyUI reuses the calibration. The calibrate node shows the ratios: "
              "paste them into a MagCache node's `custom_ratios` (model_type `custom`) to skip calibrating.",
              (40, 620), (360, 300)),
    ),
    Template(
        "hunyuan_video15_first_block_cache", "HunyuanVideo 1.5: First Block Cache", "hunyuan_video15",
        models={
            "unet": N("UNETLoader", (40, 80), {"unet_name": "hunyuanvideo1.5_720p_t2v_fp16.safetensors",
                                               "weight_dtype": "default"}),
            "clip": N("DualCLIPLoader", (40, 220), {"clip_name1": "qwen_2.5_vl_7b_fp8_scaled.safetensors",
                                                    "clip_name2": "byt5_small_glyphxl_fp16.safetensors",
                                                    "type": "hunyuan_video_15", "device": "default"}),
            "vae": N("VAELoader", (40, 420), {"vae_name": "hunyuanvideo15_vae_fp16.safetensors"}),
        },
        inputs={
            "shift": N("ModelSamplingSD3", (40, 520), {"shift": 7.0}, {"model": "unet"}),
            "pos": prompt((400, 80), "a paper airplane gliding between skyscrapers, spiralling up into the clouds, "
                                     "tracking shot"),
            "neg": prompt((400, 290), "", "Negative", 100),
            "latent": N("EmptyHunyuanVideo15Latent", (400, 440), {"width": 1280, "height": 720, "length": 121,
                                                                  "batch_size": 1}),
        },
        stages=[Stage({
            "fbc": N("CachedSamplerFirstBlockCache", (850, 80), {"threshold": 0.1}),
            "ts": TS,
        }, ("sampler", cached_sampler((1220, 80), 20, 6.0, "euler", "simple")))],
        outputs=video_outputs("video/hunyuan15_cached", 24.0),
        note=("**HunyuanVideo 1.5 text-to-video + First Block Cache + TaylorSeer**\n\nBlock-level caching: "
              "block 1 probes each step and the others are skipped while its residual barely changes. Threshold 0.1 is "
              "HunyuanVideo's published value, a starting point for 1.5 (no value is published for 1.5 itself). The "
              "1080p super-resolution model is step-distilled: caching is refused there.\n\n**What to expect:** the "
              "summary shows the steps computed of 20 and the work saved; read the tuning plot before raising the "
              "threshold.", (40, 660), (360, 300)),
    ),
    Template(
        "z_image_fixed_cadence_taylorseer", "Z-Image: Fixed Cadence + TaylorSeer", "z_image",
        models={
            "unet": N("UNETLoader", (40, 80), {"unet_name": "z_image_bf16.safetensors", "weight_dtype": "default"}),
            "clip": N("CLIPLoader", (40, 220), {"clip_name": "qwen_3_4b.safetensors", "type": "lumina2",
                                                "device": "default"}),
            "vae": N("VAELoader", (40, 380), {"vae_name": "ae.safetensors"}),
        },
        inputs={
            "shift": N("ModelSamplingAuraFlow", (40, 480), {"shift": 3.0}, {"model": "unet"}),
            "pos": prompt((400, 80), "a ceramic teapot shaped like a sleeping cat on a sunlit wooden table, studio "
                                     "photo"),
            "neg": prompt((400, 290), "blurry, low quality", "Negative", 100),
            "latent": N("EmptySD3LatentImage", (400, 440), {"width": 1024, "height": 1024, "batch_size": 1}),
        },
        stages=[Stage({
            "cadence": N("CachedSamplerFixedCadence", (850, 80), {"interval": 3}),
            "ts": N("CachedSamplerTaylorSeer", (850, 260), {"order": 1}),
        }, ("sampler", cached_sampler((1220, 80), 30, 4.0, "res_multistep", "simple")))],
        outputs=image_outputs("z_image_cached"),
        note=("**Z-Image (base) + Fixed Cadence + TaylorSeer**\n\nZ-Image (Lumina2 family) is cached at "
              "whole-model level: compute every 3rd step and forecast the others in sigma (at 28-30 steps interval "
              "3-5; 50 steps 5-8). Z-Image Turbo is step-distilled: caching is refused there unless `allow_distilled` "
              "is on.\n\n**What to expect:** the summary shows about 11 of 30 steps computed per branch (the first "
              "and last always are).", (40, 620), (360, 260)),
    ),
    Template(
        "ltx2_first_block_cache", "LTX-2 video + audio: First Block Cache", "ltx2",
        requires=(("LTXAVTextEncoderLoader", "device"),),
        models={
            "ckpt": N("CheckpointLoaderSimple", (40, 80), {"ckpt_name": "ltx-2-19b-dev-fp8.safetensors"}),
            "text": N("LTXAVTextEncoderLoader", (40, 240), {"text_encoder": "gemma_3_12B_it_fp4_mixed.safetensors",
                                                            "ckpt_name": "ltx-2-19b-dev-fp8.safetensors",
                                                            "device": "default"}),
            "audio_vae": N("LTXVAudioVAELoader", (40, 400), {"ckpt_name": "ltx-2-19b-dev-fp8.safetensors"}),
        },
        inputs={
            "pos": prompt((400, 80), "a puppet with yarn hair sings under a red umbrella while rain taps on a tin "
                                     "roof, close-up", clip="text"),
            "neg": prompt((400, 290), "blurry, low quality, still frame, watermark, subtitles", "Negative", 100,
                          clip="text"),
            "cond": N("LTXVConditioning", (400, 440), {"frame_rate": 25.0}, {"positive": "pos", "negative": "neg"}),
            "video": N("EmptyLTXVLatentVideo", (400, 560), {"width": 768, "height": 512, "length": 97, "batch_size": 1}),
            "audio": N("LTXVEmptyLatentAudio", (400, 720), {"frames_number": 97, "frame_rate": 25.0, "batch_size": 1},
                       {"audio_vae": "audio_vae"}),
            "av": N("LTXVConcatAVLatent", (850, 600), inputs={"video_latent": "video", "audio_latent": "audio"}),
        },
        stages=[Stage({
            "fbc": N("CachedSamplerFirstBlockCache", (850, 80), {"threshold": 0.1}),
        }, ("apply", N("CachedSamplerApplyInterceptors", (850, 340), inputs={"model": "ckpt"})))],
        outputs={
            "guider": N("CFGGuider", (1220, 80), {"cfg": 4.0}, {"model": "apply", "positive": "cond",
                                                              "negative": "cond.1"}),
            "sched": N("LTXVScheduler", (1220, 220), {"steps": 20, "max_shift": 2.05, "base_shift": 0.95,
                                                      "stretch": True, "terminal": 0.1}, {"latent": "av"}),
            "noise": N("RandomNoise", (1220, 440), {"noise_seed": 42}),
            "select": N("KSamplerSelect", (1220, 560), {"sampler_name": "euler"}),
            "sampler": N("SamplerCustomAdvanced", (1580, 80), inputs={
                "noise": "noise", "guider": "guider", "sampler": "select", "sigmas": "sched", "latent_image": "av"}),
            "split": N("LTXVSeparateAVLatent", (1580, 300), inputs={"av_latent": "sampler"}),
            "decode": N("VAEDecode", (1940, 80), inputs={"samples": "split", "vae": "ckpt.2"}),
            "decode_audio": N("LTXVAudioVAEDecode", (1940, 200), inputs={"samples": "split.1",
                                                                         "audio_vae": "audio_vae"}),
            "save": N("SaveAnimatedWEBP", (2300, 80), {"filename_prefix": "video/ltx2_cached", "fps": 25.0,
                                                       "lossless": False, "quality": 90, "method": "default"},
                      {"images": "decode"}, size=[400, 440]),
            "save_audio": N("SaveAudio", (2300, 560), {"filename_prefix": "audio/ltx2_cached"},
                            {"audio": "decode_audio"}),
        },
        note=("**LTX-2 text-to-video with audio + First Block Cache**\n\nApply Interceptors puts the chain on "
              "the model for SamplerCustomAdvanced. LTX-2 is cached at block level with its video and audio streams, "
              "each restored from its own residual; the video stream's probe decides. Threshold 0.1 is LTXV's published "
              "value, a starting point for LTX-2 (none is published for it). Needs a ComfyUI newer than v0.8.0 (its "
              "LTX-2 nodes gained inputs since).\n\n**What to expect:** no summary on a node here: each run's "
              "summary (steps computed of 20, work saved) goes to the ComfyUI log.", (40, 860), (380, 300)),
    ),
]
BY_NAME = {t.name: t for t in TEMPLATES}


def missing_requirements(name: str, defs: dict) -> list[str]:
    """What the running ComfyUI lacks for this template, as 'Node.input' (empty when it has everything)."""
    missing = []
    for node, input_name in BY_NAME[name].requires:
        names = {n for n, _, _ in workflow_api.ordered_inputs(defs[node])} if node in defs else set()
        if input_name not in names:
            missing.append(f"{node}.{input_name}")
    return missing


# name -> a function of the node definitions that writes the workflow (what the tests compare the files with)
WORKFLOWS = {t.name: functools.partial(render, t) for t in TEMPLATES}
RUNNABLE = "tiny_digits_tuning_plot"


def schematic(workflow: dict, title: str, size=(512, 384)):
    """A thumbnail of a graph: its nodes as boxes, its links as lines, the pack's nodes highlighted."""
    from PIL import Image, ImageDraw, ImageFont
    nodes = workflow["nodes"]
    x0 = min(n["pos"][0] for n in nodes); y0 = min(n["pos"][1] for n in nodes) - TITLE_H
    x1 = max(n["pos"][0] + n["size"][0] for n in nodes); y1 = max(n["pos"][1] + n["size"][1] for n in nodes)
    w, h = size
    top = 52
    scale = min((w - 24) / (x1 - x0), (h - top - 12) / (y1 - y0))

    def at(x, y):
        return 12 + (x - x0) * scale, top + (y - y0) * scale

    image = Image.new("RGB", size, (32, 32, 36))
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=9) if hasattr(ImageFont, "load_default") else None
    title_font = ImageFont.load_default(size=20)
    draw.text((12, 12), title, fill=(235, 235, 235), font=title_font)
    by_id = {n["id"]: n for n in nodes}
    for link in workflow["links"]:
        a, b = by_id[link[1]], by_id[link[3]]
        start = at(a["pos"][0] + a["size"][0], a["pos"][1] + 10 + 20 * link[2])
        end = at(b["pos"][0], b["pos"][1] + 10 + 20 * link[4])
        draw.line([start, end], fill=(120, 160, 200), width=1)
    for n in nodes:
        left, upper = at(n["pos"][0], n["pos"][1] - TITLE_H)
        right, lower = at(n["pos"][0] + n["size"][0], n["pos"][1] + n["size"][1])
        ours = n["type"].startswith("CachedSampler")
        fill = (40, 90, 60) if ours else (100, 80, 50) if n["type"] == "MarkdownNote" else (60, 60, 66)
        draw.rounded_rectangle([left, upper, right, lower], radius=4, fill=fill,
                               outline=(120, 220, 150) if ours else (110, 110, 118))
        label = n.get("title") or ("Note" if n["type"] == "MarkdownNote" else n["type"].replace("CachedSampler", "") or "Cached Sampler")
        if n["type"] == "CachedSampler":
            label = "Cached Sampler"
        draw.text((left + 3, upper + 2), label[:int((right - left) / 5)], fill=(235, 235, 235), font=font)
    return image


def run_tiny_thumbnail(comfy, workflow: dict, defs: dict):
    """Run the tiny-model workflow headless and compose its digits and tuning plot into a thumbnail."""
    from PIL import Image
    prompt = workflow_api.workflow_to_api(workflow, defs)
    _, outputs = comfy.run(prompt)
    files = {}
    for node in workflow["nodes"]:
        if node["type"] == "PreviewImage":
            files[node.get("title")] = [comfy.tmp / i["type"] / i["subfolder"] / i["filename"]
                                        for i in outputs[str(node["id"])]["images"]]
    plot = Image.open(files["Tuning plot"][0]).convert("RGB")
    digits = [Image.open(f).convert("RGB") for f in files["Digits"]]
    thumb = Image.new("RGB", (512, 384), (255, 255, 255))
    cell = 512 // len(digits)
    for i, d in enumerate(digits):
        thumb.paste(d.resize((cell, cell), Image.NEAREST), (i * cell + (512 - cell * len(digits)) // 2, 8))
    p = plot.resize((512, int(plot.height * 512 / plot.width)), Image.LANCZOS)
    thumb.paste(p, (0, 384 - p.height))
    return thumb


def from_screenshot(path: Path):
    """A thumbnail from the browser test's screenshot of the loaded workflow (artifacts/example_NAME.png)."""
    from PIL import Image
    shot = Image.open(path).convert("RGB")
    scale = 512 / shot.width
    return shot.resize((512, round(shot.height * scale)), Image.LANCZOS)


def save_thumbnail(image, path: Path, tolerance: float = 1.0) -> None:
    """Save ``image`` as ``path`` (JPEG) unless the thumbnail there already shows it: the runnable workflow's
    plot carries timings, and JPEG re-encoding alone changes the bytes, so without this every regeneration would
    rewrite an unchanged picture. ``tolerance``: mean absolute difference per channel (0-255) still counted as
    the same picture."""
    from PIL import Image, ImageChops, ImageStat
    if path.is_file():
        with Image.open(path) as old:
            old = old.convert("RGB")
            if old.size == image.size and sum(ImageStat.Stat(ImageChops.difference(old, image)).mean) / 3 <= tolerance:
                return
    image.save(path, quality=88)


def main() -> None:
    from ..devkit.comfy_harness import start
    comfy = start()
    defs = workflow_api.object_info()
    OUT.mkdir(exist_ok=True)
    for name, make in WORKFLOWS.items():
        missing = missing_requirements(name, defs)
        if missing:
            print(f"kept {name}.json as it is: this ComfyUI lacks {', '.join(missing)}")
            continue
        workflow = make(defs)
        (OUT / f"{name}.json").write_text(json.dumps(workflow, indent=1) + "\n", encoding="utf-8")
        thumb, shot = OUT / f"{name}.jpg", ROOT / "artifacts" / f"example_{name}.png"
        if name == RUNNABLE:
            save_thumbnail(run_tiny_thumbnail(comfy, workflow, defs), thumb)
        elif "--thumbnails-from-browser" in sys.argv and shot.is_file():
            save_thumbnail(from_screenshot(shot), thumb)
        elif not thumb.is_file():
            schematic(workflow, BY_NAME[name].title).save(thumb, quality=88)
        print("wrote", OUT / f"{name}.json")


if __name__ == "__main__":
    main()
