"""Test-only nodes: load a tiny real-architecture model, its conditioning and latent, and capture results
(the counting and capturing nodes are shared with the bench: tools/devkit/work_nodes.py).

Registered into ComfyUI by the test harness (never shipped to users).
"""
from __future__ import annotations

from . import tiny_models
from ..devkit.work_nodes import CAPTURED, CaptureLatent, CountWork, transformer_options_of


class TinyModel:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"family": (list(tiny_models.FAMILIES),), "seed": ("INT", {"default": 0})}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "load"
    CATEGORY = "testing"

    def load(self, family, seed):
        return (tiny_models.build(family, seed),)


class TinyConditioning:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"family": (list(tiny_models.FAMILIES),), "seed": ("INT", {"default": 0}),
                             "length": ("INT", {"default": 4})}}

    RETURN_TYPES = ("CONDITIONING", "CONDITIONING")
    FUNCTION = "make"
    CATEGORY = "testing"

    def make(self, family, seed, length):
        return tiny_models.conditioning(family, batch=1, seed=seed, length=length)


class TinyLatent:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"family": (list(tiny_models.FAMILIES),), "batch": ("INT", {"default": 1}),
                             "seed": ("INT", {"default": -1, "min": -1})}}

    RETURN_TYPES = ("LATENT",)
    FUNCTION = "make"
    CATEGORY = "testing"

    def make(self, family, batch, seed):
        return (tiny_models.latent(family, batch=batch, seed=None if seed < 0 else seed),)


TEST_NODES = {"TestTinyModel": TinyModel, "TestTinyConditioning": TinyConditioning, "TestTinyLatent": TinyLatent,
              "TestCaptureLatent": CaptureLatent}


class CountModelWork(CountWork):
    """Counts the model work of a tiny ``family`` model (see work_nodes.count_work)."""

    @classmethod
    def INPUT_TYPES(cls):
        spec = CountWork.INPUT_TYPES()
        spec["required"]["family"] = (list(tiny_models.FAMILIES),)
        return spec

    def groups(self, model, family, **inputs) -> dict[str, int]:
        return tiny_models.block_groups(family)


TEST_NODES["TestCountModelWork"] = CountModelWork


class TinyConditioningPair:
    """Positive and negative of different text lengths, which ComfyUI cannot batch together when the
    lengths are far apart: cond and uncond then run as separate forwards."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"family": (list(tiny_models.FAMILIES),), "pos_length": ("INT", {"default": 4}),
                             "neg_length": ("INT", {"default": 77})}}

    RETURN_TYPES = ("CONDITIONING", "CONDITIONING")
    FUNCTION = "make"
    CATEGORY = "testing"

    def make(self, family, pos_length, neg_length):
        positive = tiny_models.conditioning(family, batch=1, seed=1, length=pos_length)[0]
        negative = tiny_models.conditioning(family, batch=1, seed=2, length=neg_length)[1]
        return positive, negative


TEST_NODES["TestTinyConditioningPair"] = TinyConditioningPair


# ------------------------------------------------------------------------------------------------------------
# Nodes for the safety tests (tests/test_safety_*.py).
# ------------------------------------------------------------------------------------------------------------

def _fresh(cls):
    """Make a test node re-run on every prompt (ComfyUI compares IS_CHANGED values; NaN never equals itself)."""
    cls.IS_CHANGED = classmethod(lambda c, **kwargs: float("nan"))
    return cls


@_fresh
class PassLatent:
    """Hands its latent on unchanged but re-runs on every prompt, so every node downstream of it re-runs too
    while nodes that do not depend on it (models, config nodes) stay cached in the executor."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"samples": ("LATENT",)}}

    RETURN_TYPES = ("LATENT",)
    FUNCTION = "run"
    CATEGORY = "testing"

    def run(self, samples):
        return ({"samples": samples["samples"].clone()},)


class TinyLatentSized:
    """A latent of a chosen size and dtype (TestTinyLatent's is fixed at 16x16, float32)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"family": (list(tiny_models.FAMILIES),), "size": ("INT", {"default": 16}),
                             "batch": ("INT", {"default": 1}), "seed": ("INT", {"default": 3}),
                             "dtype": (["float32", "float64", "bfloat16"],)}}

    RETURN_TYPES = ("LATENT",)
    FUNCTION = "make"
    CATEGORY = "testing"

    def make(self, family, size, batch, seed, dtype):
        import torch
        samples = tiny_models.latent(family, batch=batch, seed=seed, size=size)["samples"]
        return ({"samples": samples.to(getattr(torch, dtype))},)


class TinyModelDtype:
    """The tiny model of a family with another inference dtype (the weights ComfyUI computes in)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"family": (list(tiny_models.FAMILIES),), "seed": ("INT", {"default": 0}),
                             "dtype": (["bfloat16", "float16", "float32"],)}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "load"
    CATEGORY = "testing"

    def load(self, family, seed, dtype):
        import torch
        import comfy.model_patcher
        import comfy.supported_models
        class_name, unet_config, _, _, _ = tiny_models._spec(family)
        config = getattr(comfy.supported_models, class_name)(dict(unet_config))
        config.unet_config.update(tiny_models._EXTRA_OVERRIDES.get(family, {}))
        config.set_inference_dtype(getattr(torch, dtype), None)
        model = config.get_model({})
        tiny_models.init_weights(model.diffusion_model, seed)
        model.eval()
        cpu = torch.device("cpu")
        return (comfy.model_patcher.ModelPatcher(model, load_device=cpu, offload_device=cpu),)


class LoraPatch:
    """A seeded rank-4 LoRA on every Linear weight whose name contains ``target``, applied through ComfyUI's
    own LoRA loader (comfy.sd.load_lora_for_models -> ModelPatcher.add_patches), like LoraLoaderModelOnly."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "strength": ("FLOAT", {"default": 1.0, "min": -10.0, "max": 10.0}),
                             "target": ("STRING", {"default": "single_blocks.0."}), "seed": ("INT", {"default": 5})}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "patch"
    CATEGORY = "testing"

    def patch(self, model, strength, target, seed):
        import torch
        import comfy.sd
        gen = torch.Generator().manual_seed(seed)
        lora = {}
        for key, weight in model.model.state_dict().items():
            if not (key.startswith("diffusion_model.") and key.endswith(".weight") and target in key
                    and weight.ndim == 2):
                continue
            name = key[len("diffusion_model."):-len(".weight")]
            out_f, in_f = weight.shape
            lora[f"diffusion_model.{name}.lora_up.weight"] = torch.randn(out_f, 4, generator=gen) * 0.3
            lora[f"diffusion_model.{name}.lora_down.weight"] = torch.randn(4, in_f, generator=gen) * 0.3
        if not lora:
            raise ValueError(f"no Linear weight matches {target!r}")
        patched, _ = comfy.sd.load_lora_for_models(model, None, lora, strength, 0.0)
        return (patched,)


class CaptureModel:
    """Stores the MODEL it is handed under ``key`` and passes it on (to inspect it after a prompt); calls
    ``CAPTURED[key + ":on_capture"](model)`` if a test put a callback there."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "key": ("STRING", {"default": "model"})}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "capture"
    CATEGORY = "testing"

    def capture(self, model, key):
        CAPTURED[key] = model
        hook = CAPTURED.get(f"{key}:on_capture")  # a test's callback, e.g. to snapshot the model's state now
        if hook is not None:
            hook(model)
        return (model,)


def _branch_rows(x, transformer_options, branch):
    """Row mask of ``x`` belonging to cond (0) / uncond (1) entries of a batched forward."""
    import torch
    order = transformer_options.get("cond_or_uncond") or [0]
    per = x.shape[0] // len(order)
    mask = torch.zeros(x.shape[0], dtype=torch.bool)
    for i, b in enumerate(order):
        if branch < 0 or b == branch:
            mask[i * per:(i + 1) * per] = True
    return mask




@_fresh
class NaNAt:
    """Poisons the input of diffusion-model forward number ``at`` (counted from 0 within each sampling run)
    with NaN in the rows of one CFG branch (0 cond, 1 uncond, -1 all), so the model produces NaN there."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "at": ("INT", {"default": 2, "min": -1}),
                             "branch": ("INT", {"default": 0, "min": -1, "max": 1})}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "patch"
    CATEGORY = "testing"

    def patch(self, model, at, branch):
        import comfy.patcher_extension
        m = model.clone()
        counter = {"n": 0}

        def outer(executor, *args, **kwargs):
            counter["n"] = 0
            return executor(*args, **kwargs)

        def forward(executor, x, *args, **kwargs):
            n = counter["n"]
            counter["n"] += 1
            if n == at:
                x = x.clone()
                x[_branch_rows(x, transformer_options_of(args, kwargs), branch)] = float("nan")
            return executor(x, *args, **kwargs)

        m.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.OUTER_SAMPLE, "test_nan", outer)
        m.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, "test_nan", forward)
        return (m,)


@_fresh
class InterruptAt:
    """Calls ComfyUI's interrupt_current_processing() during diffusion-model forward number ``at`` (from 0):
    before the forward (block -1) or inside transformer block ``block`` of ``group``, so the run stops with
    a forward half done. ComfyUI's ops raise InterruptProcessingException at the next layer."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "family": (list(tiny_models.FAMILIES),),
                             "at": ("INT", {"default": 3, "min": -1}), "group": ("STRING", {"default": "single_block"}),
                             "block": ("INT", {"default": -1, "min": -1})}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "patch"
    CATEGORY = "testing"

    def patch(self, model, family, at, group, block):
        import comfy.model_management
        import comfy.patcher_extension
        m = model.clone()
        state = {"n": -1}
        CAPTURED["interrupt_fired"] = False

        def fire():
            CAPTURED["interrupt_fired"] = True
            comfy.model_management.interrupt_current_processing()

        def outer(executor, *args, **kwargs):
            state["n"] = -1
            return executor(*args, **kwargs)

        def forward(executor, *args, **kwargs):
            state["n"] += 1
            if state["n"] == at and block < 0:
                fire()
            return executor(*args, **kwargs)

        def in_block(args, extra):
            if state["n"] == at:
                fire()
            return extra["original_block"](args)

        m.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.OUTER_SAMPLE, "test_interrupt", outer)
        m.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, "test_interrupt", forward)
        if block >= 0:
            m.set_model_patch_replace(in_block, "dit", group, block)
        return (m,)


class BlockReplace:
    """Registers a block replacement before any caching node, like other packs do: ``skip`` passes the block's
    input through, ``scale`` runs the block and scales the image stream it returns."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "group": ("STRING", {"default": "double_block"}),
                             "index": ("INT", {"default": 1}), "mode": (["skip", "scale"],),
                             "factor": ("FLOAT", {"default": 0.5})}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "patch"
    CATEGORY = "testing"

    def patch(self, model, group, index, mode, factor):
        m = model.clone()

        def replacement(args, extra):
            if mode == "skip":
                return {k: v for k, v in args.items() if k in ("img", "txt")}
            out = dict(extra["original_block"](args))
            out["img"] = out["img"] * factor
            return out

        m.set_model_patch_replace(replacement, "dit", group, index)
        return (m,)


@_fresh
class BlockLog:
    """Records, per diffusion-model forward, how many transformer blocks really ran and which block slots
    were served by a replacement that is not the pack's (e.g. Skip Layer Guidance's per-pass ``skip``).
    Apply it to the model before any caching node: its counters then sit under the pack's replacements."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "family": (list(tiny_models.FAMILIES),),
                             "key": ("STRING", {"default": "blocklog"})}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "patch"
    CATEGORY = "testing"

    def patch(self, model, family, key):
        import comfy.patcher_extension
        log = CAPTURED[key] = []
        m = model.clone()
        groups = tiny_models.block_groups(family)

        def forward(executor, *args, **kwargs):
            opts = transformer_options_of(args, kwargs)
            slots = opts.get("patches_replace", {}).get("dit", {})
            foreign = sorted(k for k in slots if not hasattr(slots[k], "cached_sampler_position")
                             and not getattr(slots[k], "test_block_log", False))
            log.append({"blocks": 0, "foreign": foreign, "cond_or_uncond": list(opts.get("cond_or_uncond") or [])})
            return executor(*args, **kwargs)

        def count(args, extra):
            log[-1]["blocks"] += 1
            return extra["original_block"](args)

        count.test_block_log = True
        m.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, "test_block_log", forward)
        for name, n in groups.items():
            for i in range(n):
                m.set_model_patch_replace(count, "dit", name, i)
        return (m,)


class TorchCompileBackend:
    """What ComfyUI's TorchCompileModel node does (comfy_api.torch_helpers.set_torch_compile_wrapper with the
    node's guard filter), with a backend that works on any CPU quickly (the node only offers inductor and
    cudagraphs)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "backend": (["eager", "aot_eager"],)}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "patch"
    CATEGORY = "testing"

    def patch(self, model, backend):
        import importlib
        from comfy_api.torch_helpers import set_torch_compile_wrapper
        node_module = importlib.import_module("comfy_extras.nodes_torch_compile")
        m = model.clone()
        set_torch_compile_wrapper(model=m, backend=backend, options={"guard_filter_fn": node_module.skip_torch_compile_dict})
        return (m,)


class TinyFluxControlNet:
    """A real ComfyUI ControlNet (comfy.controlnet.ControlNet around comfy.ldm.flux.controlnet.ControlNetFlux,
    the XLabs layout that takes an image hint) with the tiny Flux's sizes and seeded weights. Use it with
    ComfyUI's ControlNetApplyAdvanced; the hint image is 8x the latent size."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"seed": ("INT", {"default": 11})}}

    RETURN_TYPES = ("CONTROL_NET",)
    FUNCTION = "load"
    CATEGORY = "testing"

    def load(self, seed):
        import torch
        import comfy.controlnet
        import comfy.ldm.flux.controlnet
        import comfy.ops
        params = dict(tiny_models._spec("flux")[1])  # the unet_config a ControlNet checkpoint of this Flux would have
        model = comfy.ldm.flux.controlnet.ControlNetFlux(operations=comfy.ops.disable_weight_init,
                                                         dtype=torch.float32, device="cpu", **params)
        tiny_models.init_weights(model, seed)
        return (comfy.controlnet.ControlNet(model, load_device=torch.device("cpu"), extra_conds=["y", "guidance"]),)


@_fresh
class HintImage:
    """A seeded IMAGE (the ControlNet hint)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"size": ("INT", {"default": 128}), "seed": ("INT", {"default": 2})}}

    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "make"
    CATEGORY = "testing"

    def make(self, size, seed):
        import torch
        gen = torch.Generator().manual_seed(seed)
        return (torch.rand(1, size, size, 3, generator=gen),)


class TinyModelIdentityBlocks:
    """The tiny model of a single-group family whose blocks from ``identity_from`` on pass their input through
    exactly: a skipped span of them has a zero residual, so whatever the model adds between them is the only
    thing a block cache could get wrong."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"family": (list(tiny_models.FAMILIES),), "seed": ("INT", {"default": 0}),
                             "identity_from": ("INT", {"default": 1})}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "load"
    CATEGORY = "testing"

    def load(self, family, seed, identity_from):
        return (tiny_models.build(family, seed, identity_from=identity_from),)


class TinyConditioningWithout:
    """TestTinyConditioning's pair (seed 1, length 4) without one of its extras, e.g. Wan S2V's audio."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"family": (list(tiny_models.FAMILIES),), "drop": ("STRING", {"default": ""})}}

    RETURN_TYPES = ("CONDITIONING", "CONDITIONING")
    FUNCTION = "make"
    CATEGORY = "testing"

    def make(self, family, drop):
        pair = tiny_models.conditioning(family, batch=1, seed=1, length=4)
        return tuple([[c[0], {k: v for k, v in c[1].items() if k != drop}] for c in cond] for cond in pair)


class TinyModelWithout:
    """The tiny model of a family with one module of its first transformer block removed: a model laid out
    differently from what ComfyUI v0.8.0's block classes have."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"family": (list(tiny_models.FAMILIES),), "module": ("STRING", {"default": "img_mod"})}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "load"
    CATEGORY = "testing"

    def load(self, family, module):
        import torch
        model = tiny_models.build(family)
        blocks = next(c for c in model.model.diffusion_model.children() if isinstance(c, torch.nn.ModuleList))
        delattr(blocks[0], module)
        return (model,)


class _LatentVAE:
    """Stands in for the VAE a DiffSynth ControlNet encodes its hint with: a fixed seeded map from 8x8 pixel
    patches to the 16 Wan 2.1 latent channels Qwen-Image uses (the encoder itself plays no part here)."""

    def __init__(self):
        import torch
        self.proj = torch.randn(16, 3, generator=torch.Generator().manual_seed(7))

    def spacial_compression_encode(self):
        return 8

    def encode(self, image):
        import torch
        pooled = torch.nn.functional.avg_pool2d(image.movedim(-1, 1), 8)        # [B, 3, H/8, W/8]
        return torch.einsum("oc,bchw->bohw", self.proj, pooled).unsqueeze(2)     # [B, 16, 1, H/8, W/8]


class TinyQwenDiffsynthControlNet:
    """ComfyUI's own QwenImageDiffsynthControlnet node path (DiffSynthCnetPatch around a
    QwenImageBlockWiseControlNet, registered with set_model_double_block_patch) with a block-wise ControlNet of
    the tiny Qwen-Image's width: after every block the model calls the patch, which adds the control block's
    output to the image stream in place."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "image": ("IMAGE",), "strength": ("FLOAT", {"default": 1.0}),
                             "seed": ("INT", {"default": 13})}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "patch"
    CATEGORY = "testing"

    def patch(self, model, image, strength, seed):
        import torch
        import comfy.model_patcher
        import comfy.ops
        from comfy_extras.nodes_model_patch import QwenImageBlockWiseControlNet, QwenImageDiffsynthControlnet
        spec = tiny_models._spec("qwen_image")[1]
        dim = spec["attention_head_dim"] * spec["num_attention_heads"]
        net = QwenImageBlockWiseControlNet(num_layers=spec["num_layers"], in_dim=spec["in_channels"], dim=dim,
                                           dtype=torch.float32, operations=comfy.ops.manual_cast)
        tiny_models.init_weights(net, seed)
        cpu = torch.device("cpu")
        model_patch = comfy.model_patcher.ModelPatcher(net, load_device=cpu, offload_device=cpu)
        return QwenImageDiffsynthControlnet().diffsynth_controlnet(model, model_patch, _LatentVAE(), image, strength)


class AnyOutput:
    """Outputs whatever it is given as the wildcard type '*', which ComfyUI lets connect to any input: the way
    a wrongly typed value can still reach a node's input."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("MODEL",)}}

    RETURN_TYPES = ("*",)
    FUNCTION = "run"
    CATEGORY = "testing"

    def run(self, value):
        return (value,)


TEST_NODES.update({
    "TestPassLatent": PassLatent, "TestTinyLatentSized": TinyLatentSized, "TestTinyModelDtype": TinyModelDtype,
    "TestLoraPatch": LoraPatch, "TestCaptureModel": CaptureModel, "TestNaNAt": NaNAt,
    "TestInterruptAt": InterruptAt, "TestBlockReplace": BlockReplace, "TestBlockLog": BlockLog,
    "TestTorchCompileBackend": TorchCompileBackend, "TestTinyFluxControlNet": TinyFluxControlNet,
    "TestHintImage": HintImage, "TestAnyOutput": AnyOutput, "TestTinyModelIdentityBlocks": TinyModelIdentityBlocks,
    "TestTinyQwenDiffsynthControlNet": TinyQwenDiffsynthControlNet, "TestTinyConditioningWithout": TinyConditioningWithout,
    "TestTinyModelWithout": TinyModelWithout,
})


# ------------------------------------------------------------------------------------------------------------
# Nodes for the Raylight node's tests without Ray (tests/distributed/test_raylight_actor.py).
# ------------------------------------------------------------------------------------------------------------

@_fresh
class RayActors:
    """Hands on the stand-in for Raylight's actors that a test put in ``CAPTURED[key]``, as Raylight's loaders
    output them (``RAY_ACTORS``): the same actors, and the models they keep, on every prompt."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"key": ("STRING", {"default": "ray_actors"})}}

    RETURN_TYPES = ("RAY_ACTORS",)
    FUNCTION = "run"
    CATEGORY = "testing"

    def run(self, key):
        return (CAPTURED[key],)


@_fresh
class RayActorsSample:
    """Raylight's sampler, on the stand-in actors: every actor samples its own model (``actor.sample()``); what
    each returned goes to ``CAPTURED[key]``, in actor order."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"ray_actors": ("RAY_ACTORS",), "key": ("STRING", {"default": "ray_samples"})}}

    RETURN_TYPES = ()
    OUTPUT_NODE = True
    FUNCTION = "run"
    CATEGORY = "testing"

    def run(self, ray_actors, key):
        CAPTURED[key] = [actor.sample() for actor in ray_actors["workers"]]
        return ()


TEST_NODES.update({"TestRayActors": RayActors, "TestRayActorsSample": RayActorsSample})


# ------------------------------------------------------------------------------------------------------------
# Nodes for the dtype tests (tests/integration/test_dtypes.py).
# ------------------------------------------------------------------------------------------------------------

class TinyConditioningWidth:
    """Conditioning of any text-feature width (a loaded model expects its real text encoder's, e.g. 4096)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"width": ("INT", {"default": 4096}), "seed": ("INT", {"default": 1}),
                             "length": ("INT", {"default": 4})}}

    RETURN_TYPES = ("CONDITIONING", "CONDITIONING")
    FUNCTION = "make"
    CATEGORY = "testing"

    def make(self, width, seed, length):
        import torch
        gen = torch.Generator().manual_seed(seed)
        return tuple([[torch.randn(1, length, width, generator=gen), {}]] for _ in range(2))


@_fresh
class SpikeAt:
    """Adds ``value`` to the image stream a block returns in diffusion-model forward number ``at`` (from 0 within
    each sampling run): an activation spike, as in half-precision models near their range. Registered before
    any caching node, which chains to it."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "group": ("STRING", {"default": "single_block"}),
                             "index": ("INT", {"default": 0}), "at": ("INT", {"default": 4}),
                             "value": ("FLOAT", {"default": 60000.0, "min": -1e9, "max": 1e9})}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "patch"
    CATEGORY = "testing"

    def patch(self, model, group, index, at, value):
        import comfy.patcher_extension
        m = model.clone()
        counter = {"n": -1}

        def outer(executor, *args, **kwargs):
            counter["n"] = -1
            return executor(*args, **kwargs)

        def forward(executor, *args, **kwargs):
            counter["n"] += 1
            return executor(*args, **kwargs)

        def replacement(args, extra):
            out = dict(extra["original_block"](args))
            if counter["n"] == at:
                out["img"] = out["img"] + value
            return out

        m.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.OUTER_SAMPLE, "test_spike", outer)
        m.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, "test_spike", forward)
        m.set_model_patch_replace(replacement, "dit", group, index)
        return (m,)


TEST_NODES.update({"TestTinyConditioningWidth": TinyConditioningWidth, "TestSpikeAt": SpikeAt})


# ------------------------------------------------------------------------------------------------------------
# Nodes for the model-family tests (tests/integration/test_integration_families.py).
# ------------------------------------------------------------------------------------------------------------

class StreamOffset:
    """Registers, before any caching node (and chained to a replacement already in the slot), a replacement of
    block ``index`` that runs the block and adds a
    fixed seeded vector (one per stream, broadcast over the tokens) to every stream it returns: LTX-2's video
    and audio in its ``img`` tuple, or ``img`` alone. On a model whose other blocks pass their input through,
    the residual of a span holding this block is exactly these vectors, the same on every step: a cache that
    restores each stream from its own residual changes nothing, one that drops a stream's residual or applies
    one stream's to another does."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "group": ("STRING", {"default": "double_block"}),
                             "index": ("INT", {"default": 1}), "seed": ("INT", {"default": 17}),
                             "scale": ("FLOAT", {"default": 0.05})}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "patch"
    CATEGORY = "testing"

    def patch(self, model, group, index, seed, scale):
        import torch
        m = model.clone()
        gen = torch.Generator().manual_seed(seed)
        offsets = {}

        def offset(i, t):
            if (i, t.shape[-1]) not in offsets:
                offsets[(i, t.shape[-1])] = torch.randn(t.shape[-1], generator=gen) * scale
            return t + offsets[(i, t.shape[-1])].to(t)

        previous = m.model_options.get("transformer_options", {}).get("patches_replace", {}).get("dit", {}).get(
            (group, index))

        def replacement(args, extra):  # chains to a replacement already there (a block counter)
            out = dict(previous(args, extra) if previous is not None else extra["original_block"](args))
            streams = out["img"]
            if isinstance(streams, (tuple, list)):
                out["img"] = tuple(offset(i, t) for i, t in enumerate(streams))
            else:
                out["img"] = offset(0, streams)
            return out

        m.set_model_patch_replace(replacement, "dit", group, index)
        return (m,)


TEST_NODES.update({"TestStreamOffset": StreamOffset})


# ------------------------------------------------------------------------------------------------------------
# Every supported_models config of the running ComfyUI, built tiny (tests/support/tiny_configs.py).
# ------------------------------------------------------------------------------------------------------------

class TinyConfigModel:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"config": ("STRING", {"default": "Flux"}), "seed": ("INT", {"default": 0})}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "load"
    CATEGORY = "testing"

    def load(self, config, seed):
        from . import tiny_configs
        return (tiny_configs.build(config, seed),)


class TinyConfigConditioning:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"config": ("STRING", {"default": "Flux"})}}

    RETURN_TYPES = ("CONDITIONING", "CONDITIONING")
    FUNCTION = "make"
    CATEGORY = "testing"

    def make(self, config):
        from . import tiny_configs
        return tiny_configs.conditioning(config)


class TinyConfigLatent:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"config": ("STRING", {"default": "Flux"})}}

    RETURN_TYPES = ("LATENT",)
    FUNCTION = "make"
    CATEGORY = "testing"

    def make(self, config):
        from . import tiny_configs
        return (tiny_configs.latent(config),)


@_fresh
class CountForwards:
    """Counts the diffusion model's real forwards into ``CAPTURED[key]["forwards"]``: a torch forward pre-hook on
    the diffusion model, registered for the length of each sampling run (its OUTER_SAMPLE wrapper) and removed
    after it. Works for every model, SD3 included, whose forward has no DIFFUSION_MODEL wrapper; a forward the
    pack skips never reaches it."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "key": ("STRING", {"default": "forwards"})}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "patch"
    CATEGORY = "testing"

    def patch(self, model, key):
        from comfy.patcher_extension import WrappersMP
        record = CAPTURED.setdefault(key, {})
        record.update(forwards=0, runs=0)
        m = model.clone()

        def count(module, args):
            record["forwards"] += 1

        def outer(executor, *args, **kwargs):
            handle = executor.class_obj.model_patcher.model.diffusion_model.register_forward_pre_hook(count)
            try:
                return executor(*args, **kwargs)
            finally:
                handle.remove()
                record["runs"] += 1

        m.add_wrapper_with_key(WrappersMP.OUTER_SAMPLE, "count_forwards", outer)
        return (m,)


TEST_NODES.update({"TestTinyConfigModel": TinyConfigModel, "TestTinyConfigConditioning": TinyConfigConditioning,
                   "TestTinyConfigLatent": TinyConfigLatent, "TestCountForwards": CountForwards})
