"""API-format prompts for the integration tests."""
from __future__ import annotations


def base(family: str, batch: int = 1, latent_seed: int = -1, model_seed: int = 0) -> dict:
    return {
        "model": {"class_type": "TestTinyModel", "inputs": {"family": family, "seed": model_seed}},
        "cond": {"class_type": "TestTinyConditioning", "inputs": {"family": family, "seed": 1, "length": 4}},
        "latent": {"class_type": "TestTinyLatent", "inputs": {"family": family, "batch": batch, "seed": latent_seed}},
    }


def loaded_wan(loader: str, **loader_inputs) -> dict:
    """A prompt whose model is tiny_models' loadable Wan, loaded from a file by ``loader`` (ComfyUI's UNETLoader,
    ComfyUI-GGUF's loader), captured and counted, with conditioning of its text width."""
    from . import tiny_models
    prompt = {
        "model": {"class_type": loader, "inputs": loader_inputs},
        "captured": {"class_type": "TestCaptureModel", "inputs": {"model": ["model", 0], "key": "loaded"}},
        "cond": {"class_type": "TestTinyConditioningWidth", "inputs": {"width": tiny_models.LOADABLE_WAN_CONTEXT_DIM,
                                                                       "seed": 1, "length": 4}},
        "latent": {"class_type": "TestTinyLatent", "inputs": {"family": "wan21", "batch": 1, "seed": -1}},
    }
    count_work(prompt, "wan21", model="captured")
    return prompt


def count_work(prompt: dict, family: str, model: str = "model", key: str = "work", node_id: str = "count",
               **inputs) -> str:
    """The work-counting node (tiny_nodes' TestCountModelWork, devkit.work_nodes.count_work) between ``model`` and
    whatever samples node ``node_id``: it counts the blocks, forwards and evaluations really run into
    ``CAPTURED[key]``, from zero on every prompt. Returns ``node_id``."""
    prompt[node_id] = {"class_type": "TestCountModelWork",
                       "inputs": {"model": [model, 0], "family": family, "key": key, **inputs}}
    return node_id


def ksampler_inputs(steps=6, cfg=3.0, sampler="euler", scheduler="simple", denoise=1.0, seed=42, model="model"):
    return {"model": [model, 0], "seed": seed, "steps": steps, "cfg": cfg, "sampler_name": sampler,
            "scheduler": scheduler, "positive": ["cond", 0], "negative": ["cond", 1], "latent_image": ["latent", 0],
            "denoise": denoise}


def sampler(prompt: dict, node_type: str = "CachedSampler", key: str = "out", chain: str | None = None,
            node_id: str = "sampler", **kw) -> dict:
    inputs = ksampler_inputs(**kw)
    if chain is not None:
        inputs["interceptors"] = [chain, 0]
    prompt[node_id] = {"class_type": node_type, "inputs": inputs}
    prompt[f"capture_{key}"] = {"class_type": "TestCaptureLatent", "inputs": {"samples": [node_id, 0], "key": key}}
    return prompt


def advanced_inputs(steps=6, cfg=3.0, sampler="euler", scheduler="simple", seed=42, start=0, end=10000,
                    add_noise="enable", leftover="disable", latent=("latent", 0), model="model"):
    return {"model": [model, 0], "add_noise": add_noise, "noise_seed": seed, "steps": steps, "cfg": cfg,
            "sampler_name": sampler, "scheduler": scheduler, "positive": ["cond", 0], "negative": ["cond", 1],
            "latent_image": list(latent), "start_at_step": start, "end_at_step": end,
            "return_with_leftover_noise": leftover}


def config(prompt: dict, node_id: str, class_type: str, upstream: str | None = None, **inputs) -> str:
    if upstream is not None:
        inputs["interceptors"] = [upstream, 0]
    prompt[node_id] = {"class_type": class_type, "inputs": inputs}
    return node_id


def core_node(class_type: str, **inputs) -> dict:
    """A node of ComfyUI itself, with every required widget not given set to its default in the running
    ComfyUI's own definition: core nodes gain required inputs between versions (ContextWindowsManual gained
    four in 2026), and a prompt written for one version must validate on every supported one."""
    import nodes
    required = nodes.NODE_CLASS_MAPPINGS[class_type].INPUT_TYPES()["required"]
    for name, spec in required.items():
        if name in inputs:
            continue
        kind, options = spec[0], (spec[1] if len(spec) > 1 else {})
        if "default" in options:
            inputs[name] = options["default"]
        elif isinstance(kind, list) and kind:  # a combo lists its options first
            inputs[name] = kind[0]
        elif kind == "COMBO" and options.get("options"):
            inputs[name] = options["options"][0]
        else:
            raise ValueError(f"{class_type}: the required input {name!r} has no default to fill in")
    return {"class_type": class_type, "inputs": inputs}


def context_windows(model: str = "model", **inputs) -> dict:
    """ComfyUI's ContextWindowsManual over ``model``, as the tests configure it unless told otherwise."""
    settings = {"context_length": 2, "context_overlap": 1, "context_schedule": "standard_static",
                "context_stride": 1, "closed_loop": False, "fuse_method": "pyramid", "dim": 0, "freenoise": False}
    settings.update(inputs)
    return core_node("ContextWindowsManual", model=[model, 0], **settings)


DIGITS = "0123"


def tiny_prompt(chain=True, threshold=0.25, node_type="CachedSampler", steps=12):
    """The bundled digits model (digits ``DIGITS``) sampled by a Cached Sampler (or its Advanced form) with First Block
    Cache + TaylorSeer (``chain``), decoded and previewed, its tuning plot previewed."""
    prompt = {"model": {"class_type": "CachedSamplerDigitsModel", "inputs": {"digits": DIGITS}}}
    if node_type == "CachedSampler":
        inputs = {"model": ["model", 0], "seed": 0, "steps": steps, "cfg": 3.0, "sampler_name": "euler",
                  "scheduler": "simple", "positive": ["model", 1], "negative": ["model", 2],
                  "latent_image": ["model", 3], "denoise": 1.0}
    else:
        inputs = {"model": ["model", 0], "add_noise": "enable", "noise_seed": 0, "steps": steps, "cfg": 3.0,
                  "sampler_name": "euler", "scheduler": "simple", "positive": ["model", 1],
                  "negative": ["model", 2], "latent_image": ["model", 3], "start_at_step": 0,
                  "end_at_step": 10000, "return_with_leftover_noise": "disable"}
    if chain:
        prompt["fbc"] = {"class_type": "CachedSamplerFirstBlockCache", "inputs": {
            "threshold": threshold, "warmup": 0.1, "max_cached_steps": -1, "max_consecutive_cached": 3,
            "start_percent": 0.0, "end_percent": 1.0}}
        prompt["ts"] = {"class_type": "CachedSamplerTaylorSeer", "inputs": {"order": 1, "interceptors": ["fbc", 0]}}
        inputs["interceptors"] = ["ts", 0]
    prompt["sampler"] = {"class_type": node_type, "inputs": inputs}
    prompt["decode"] = {"class_type": "CachedSamplerDigitsDecode", "inputs": {"samples": ["sampler", 0]}}
    prompt["preview"] = {"class_type": "PreviewImage", "inputs": {"images": ["decode", 0]}}
    prompt["plot"] = {"class_type": "PreviewImage", "inputs": {"images": ["sampler", 1]}}
    return prompt


def demo_model_prompt(loader: str, classes: str, count_work: str, steps: int, chain_nodes=None,
                      key: str = "out") -> dict:
    """A bundled class-conditional demo model (``loader``: its node type) sampled with euler at cfg 3, seed 0:
    KSampler, or the Cached Sampler running ``chain_nodes`` ((class_type, inputs), chained in order). The model
    goes through the work-counting node ``count_work`` (captured as ``key + "w"``), the latent is captured as
    ``key`` and decoded by the model's own decoder."""
    prompt = {"demo": {"class_type": loader, "inputs": {"classes": classes}},
              "work": {"class_type": count_work, "inputs": {"model": ["demo", 0], "key": key + "w"}}}
    inputs = {"model": ["work", 0], "seed": 0, "steps": steps, "cfg": 3.0, "sampler_name": "euler",
              "scheduler": "simple", "positive": ["demo", 1], "negative": ["demo", 2],
              "latent_image": ["demo", 3], "denoise": 1.0}
    node_type = "KSampler"
    if chain_nodes:
        last = None
        for i, (class_type, node_inputs) in enumerate(chain_nodes):
            last = config(prompt, f"m{i}", class_type, upstream=last, **node_inputs)
        inputs["interceptors"] = [last, 0]
        node_type = "CachedSampler"
    prompt["sampler"] = {"class_type": node_type, "inputs": inputs}
    prompt["capture"] = {"class_type": "TestCaptureLatent", "inputs": {"samples": ["sampler", 0], "key": key}}
    prompt["decode"] = {"class_type": "VAEDecode", "inputs": {"samples": ["sampler", 0], "vae": ["demo", 4]}}
    prompt["preview"] = {"class_type": "PreviewImage", "inputs": {"images": ["decode", 0]}}
    return prompt
