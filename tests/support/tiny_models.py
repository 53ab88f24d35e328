"""Tiny random-weight models of real ComfyUI architectures, for tests.

Every model is built through ComfyUI's own classes, exactly like a checkpoint
loader would do it::

    comfy.supported_models.<Config>(unet_config)
      -> config.set_inference_dtype(torch.float32, None)
      -> config.get_model({})                       # comfy.model_base.<Model>
      -> comfy.model_patcher.ModelPatcher(model, load_device=cpu, offload_device=cpu)

only with very small ``unet_config`` values (hidden size 64-128, two attention
heads, two or three blocks per block type), so one sampling step takes a few
milliseconds on one CPU thread (Flux.2 is the slowest, roughly 20-25 ms at
batch 1 without CFG: ``model_base.Flux2`` always pads the text to 512 tokens).  ComfyUI's ops skip weight initialisation, so every
parameter (and every uninitialised buffer) is filled from a seeded generator:
Linear/Conv weights ~ N(0, 1/sqrt(fan_in)), norm weights 1, everything else
(biases, embeddings, learned tokens, modulation tables) ~ N(0, 0.02).  The same
``(family, seed)`` always gives the same weights.

``comfy`` is imported inside the functions only: ComfyUI's headless start-up
(``devkit.comfy_harness.import_headless``) puts it on ``sys.path`` and sets
``comfy.cli_args.args`` (``cpu``, ``use_pytorch_cross_attention``) before
anything here is called.

Public API:

* ``FAMILIES``: the family names that can be built.
* ``build(family, seed=0, identity_from=-1)``: a ``comfy.model_patcher.ModelPatcher``
  (optionally with pass-through blocks from ``identity_from`` on).
* ``conditioning(family, batch=1, seed=0, length=4)``: ``(positive, negative)``
  CONDITIONING lists with the extras each family's ``extra_conds`` requires.
* ``latent(family, batch=1, seed=None, size=16)``: a LATENT dict.
* ``block_groups(family)``: ``{"double_block": n, "single_block": m}`` for the
  blocks that the model exposes through ``patches_replace["dit"]``.
"""

from __future__ import annotations

import math

import torch

FAMILIES = (
    "flux",
    "flux_schnell",
    "flux2",
    "chroma",
    "wan21",
    "wan22",
    "wan22_s2v",
    "wan_dancer",
    "wan_animate2",
    "wan_scail",
    "wan_scail2",
    "wan_flowrvs",
    "wan_causal",
    "hunyuan_video",
    "hunyuan_video15",
    "qwen_image",
    "mage_flow",
    "joyimage",
    "lens",
    "longcat_image",
    "sd3",
    "ltxv",
    "ltxav",
    "auraflow",
    "kandinsky5",
    "lumina2",
    "sdxl",
    "sd15",
)

# Text-encoder feature width and pooled-vector width of the tiny models (the
# real ones are 4096 / 768 / 2048 ...; only the shapes matter here).
CONTEXT_DIM = 32
POOLED_DIM = 32

# Wan S2V's audio features: [batch, AUDIO_LAYERS encoder layers, AUDIO_DIM, 4 per latent frame].
AUDIO_DIM = 32
AUDIO_LAYERS = 25

# WanDancer's music features per frame.
MUSIC_FEATURES = 35

# Families whose latent is a NestedTensor of a video and an audio latent (LTXVConcatAVLatent's layout); the
# audio latent is [batch, 8 channels, AUDIO_FRAMES, 16 frequency bins].
AUDIO_VIDEO = ("ltxav",)
AUDIO_FRAMES = 6

# SDXL's ``encode_adm`` appends six 256-wide size embeddings to the pooled vector.
_SDXL_ADM = POOLED_DIM + 6 * 256

# family -> (supported_models class name, unet_config, latent channels,
#            latent frames (0 = 4-D image latent), patches_replace["dit"] blocks)
# Wan 2.1's block layout at a tiny width; the Wan families below differ from it only where named.
_WAN = {
    "image_model": "wan2.1",
    "model_type": "t2v",
    "patch_size": (1, 2, 2),
    "in_dim": 16,
    "out_dim": 16,
    "dim": 64,
    "ffn_dim": 128,
    "freq_dim": 256,
    "text_dim": CONTEXT_DIM,
    "num_heads": 2,
    "num_layers": 3,
    "window_size": (-1, -1),
    "qk_norm": True,
    "cross_attn_norm": True,
    "eps": 1e-6,
}

# Flux.1 dev's tiny layout; the variants below name only what differs.
_FLUX = {
    "image_model": "flux",
    "guidance_embed": True,
    "in_channels": 16,
    "out_channels": 16,
    "vec_in_dim": POOLED_DIM,
    "context_in_dim": CONTEXT_DIM,
    "hidden_size": 64,
    "mlp_ratio": 4.0,
    "num_heads": 2,
    "depth": 2,
    "depth_single_blocks": 2,
    "axes_dim": [4, 14, 14],
    "theta": 10000,
    "patch_size": 2,
    "qkv_bias": True,
    "txt_ids_dims": [],
    "yak_mlp": False,
    "txt_norm": False,
}

_SPECS = {
    # Flux.1 dev: double + single stream blocks, guidance embedding, pooled CLIP vector.
    "flux": ("Flux", dict(_FLUX), 16, 0, {"double_block": 2, "single_block": 2}),
    # Flux.1 schnell: no guidance embedding, FLOW model type, shift 1.
    "flux_schnell": ("FluxSchnell", dict(_FLUX, guidance_embed=False), 16, 0,
                     {"double_block": 2, "single_block": 2}),
    # Flux.2: 128-channel latent, patch 1, shared (global) modulation, 4 rope axes.
    # ``model_base.Flux2`` left-pads the text to 512 tokens.
    "flux2": ("Flux2", {
        "image_model": "flux2",
        "guidance_embed": True,
        "in_channels": 128,
        "out_channels": 128,
        "vec_in_dim": None,
        "context_in_dim": CONTEXT_DIM,
        "hidden_size": 64,
        "mlp_ratio": 3.0,
        "num_heads": 2,
        "depth": 2,
        "depth_single_blocks": 2,
        "axes_dim": [8, 8, 8, 8],
        "theta": 2000,
        "patch_size": 1,
        "qkv_bias": False,
        "global_modulation": True,
        "mlp_silu_act": True,
        "ops_bias": False,
        "default_ref_method": "index",
        "ref_index_scale": 10.0,
        "txt_ids_dims": [3],
        "yak_mlp": False,
        "txt_norm": False,
    }, 128, 0, {"double_block": 2, "single_block": 2}),
    # Chroma: Flux without the vector/time MLPs; a distilled "approximator"
    # produces all modulations.  in_channels counts patchified channels (16 * 2 * 2).
    "chroma": ("Chroma", {
        "image_model": "chroma",
        "in_channels": 64,
        "out_channels": 64,
        "context_in_dim": CONTEXT_DIM,
        "hidden_size": 64,
        "mlp_ratio": 4.0,
        "num_heads": 2,
        "depth": 2,
        "depth_single_blocks": 2,
        "axes_dim": [4, 14, 14],
        "theta": 10000,
        "patch_size": 2,
        "qkv_bias": True,
        "in_dim": 64,  # 16 (timestep) + 16 (guidance) + 32 (modulation index), fixed by the model
        "out_dim": 64,  # == hidden_size
        "hidden_dim": 128,
        "n_layers": 2,
        "txt_ids_dims": [],
        "vec_in_dim": None,
    }, 16, 0, {"double_block": 2, "single_block": 2}),
    # Wan 2.1 text-to-video.
    "wan21": ("WAN21_T2V", _WAN, 16, 2, {"double_block": 3}),
    # Wan 2.2 TI2V-5B: 48-channel latent (Wan 2.2 VAE), per-token timesteps.
    "wan22": ("WAN22_T2V", dict(_WAN, in_dim=48, out_dim=48), 48, 2, {"double_block": 3}),
    # Wan 2.2 S2V (speech to video): Wan 2.1 blocks; an audio injector adds its output to the stream after
    # every block listed in audio_inject_layers (all three here) when the conditioning carries audio.
    "wan22_s2v": ("WAN22_S2V", dict(_WAN, model_type="s2v", audio_dim=AUDIO_DIM, num_audio_token=4, cond_dim=16,
                                    audio_inject_layers=[0, 1, 2]), 16, 2, {"double_block": 3}),
    # Wan 2.2 WanDancer: Wan's i2v blocks (16 latent + 20 image-condition channels); a music encoder turns the
    # music features (``audio_embed``, [batch, frames, 35]) into one embedding per latent frame and 8 tokens,
    # and its injector adds them to the stream after every block in audio_inject_layers (all three here).
    "wan_dancer": ("WAN22_WanDancer", dict(_WAN, model_type="wandancer", in_dim=36, audio_inject_layers=[0, 1, 2],
                                           music_dim=32, music_heads=2, music_latent_dim=32), 16, 2,
                   {"double_block": 3}),
    # Wan Animate 2: i2v-shaped blocks (36 input channels) with a pose branch that runs beside every block and
    # hands it keys and values; the conditioning carries pose latents (one frame fewer than the video: the
    # first frame is the reference slot).
    "wan_animate2": ("WAN_Animate2", dict(_WAN, model_type="animate2", in_dim=36), 16, 2, {"double_block": 3}),
    # SCAIL / SCAIL-2: pose latents (16 + 4 mask channels) become tokens concatenated to the stream.
    "wan_scail": ("WAN21_SCAIL", dict(_WAN, model_type="scail", in_dim=20), 16, 2, {"double_block": 3}),
    "wan_scail2": ("WAN21_SCAIL2", dict(_WAN, model_type="scail2", in_dim=20), 16, 2, {"double_block": 3}),
    # FlowRVS: Wan 2.1's own model as an image-to-image flow.
    "wan_flowrvs": ("WAN21_FlowRVS", dict(_WAN, model_type="flow_rvs"), 16, 2, {"double_block": 3}),
    # Causal (autoregressive) Wan 2.1: its block loop never consults patches_replace.
    "wan_causal": ("WAN21_CausalAR_T2V", dict(_WAN, causal_ar=True), 16, 2, {}),
    # HunyuanVideo (v1): token refiner, double + single blocks, pooled CLIP vector.
    "hunyuan_video": ("HunyuanVideo", {
        "image_model": "hunyuan_video",
        "in_channels": 16,
        "out_channels": 16,
        "patch_size": [1, 2, 2],
        "vec_in_dim": POOLED_DIM,
        "axes_dim": [4, 14, 14],
        "meanflow": False,
        "context_in_dim": CONTEXT_DIM,
        "hidden_size": 64,
        "mlp_ratio": 4.0,
        "num_heads": 2,
        "depth": 2,
        "depth_single_blocks": 2,
        "theta": 256,
        "qkv_bias": True,
        "byt5": False,
        "guidance_embed": True,
        "use_cond_type_embedding": False,
        "vision_in_dim": None,
        "meanflow_sum": False,
    }, 16, 2, {"double_block": 2, "single_block": 2}),
    # HunyuanVideo 1.5: 32-channel latent, patch 1, image-cond concat (32 + mask)
    # and only double blocks, like the real model.  The optional ByT5 glyph
    # branch (hard-coded 1472 -> 2048 widths) is left out; it only runs when a
    # ``conditioning_byt5small`` is given.
    "hunyuan_video15": ("HunyuanVideo15", {
        "image_model": "hunyuan_video",
        "in_channels": 65,
        "out_channels": 32,
        "patch_size": [1, 1, 1],
        "vec_in_dim": None,
        "axes_dim": [4, 14, 14],
        "meanflow": False,
        "context_in_dim": CONTEXT_DIM,
        "hidden_size": 64,
        "mlp_ratio": 4.0,
        "num_heads": 2,
        "depth": 3,
        "depth_single_blocks": 0,
        "theta": 256,
        "qkv_bias": True,
        "byt5": False,
        "guidance_embed": False,
        "use_cond_type_embedding": True,
        "vision_in_dim": 1152,
        "meanflow_sum": True,
    }, 32, 1, {"double_block": 3}),
    # Qwen-Image: MMDiT-style dual-stream blocks; in_channels counts 2x2 patches.
    "qwen_image": ("QwenImage", {
        "image_model": "qwen_image",
        "patch_size": 2,
        "in_channels": 64,
        "out_channels": 16,
        "num_layers": 3,
        "attention_head_dim": 32,
        "num_attention_heads": 2,
        "joint_attention_dim": CONTEXT_DIM,
        "axes_dims_rope": (4, 14, 14),
    }, 16, 1, {"double_block": 3}),
    # MageFlow: Qwen-Image's block loop on the Flux.2 latent (128 channels, patch 1).
    "mage_flow": ("MageFlow", {
        "image_model": "mage_flow",
        "in_channels": 128,
        "out_channels": 128,
        "num_layers": 3,
        "attention_head_dim": 32,
        "num_attention_heads": 2,
        "joint_attention_dim": CONTEXT_DIM,
        "axes_dims_rope": (4, 14, 14),
    }, 128, 0, {"double_block": 3}),
    # JoyImage: HunyuanVideo-style dual-stream blocks (image and text in, both out) on the Wan 2.1 latent.
    "joyimage": ("JoyImage", {
        "image_model": "joyimage",
        "patch_size": [1, 2, 2],
        "in_channels": 16,
        "out_channels": 16,
        "hidden_size": 128,
        "num_attention_heads": 1,
        "text_dim": CONTEXT_DIM,
        "mlp_width_ratio": 2.0,
        "num_layers": 3,
        "rope_dim_list": [16, 56, 56],
    }, 16, 1, {"double_block": 3}),
    # Lens: dual-stream MMDiT on the Flux.2 latent (128 channels = 32 x 2x2 patch, one token per latent pixel),
    # one text feature.
    "lens": ("Lens", {
        "image_model": "lens",
        "patch_size": 2,
        "in_channels": 128,
        "out_channels": 32,
        "num_layers": 3,
        "attention_head_dim": 32,
        "num_attention_heads": 2,
        "enc_hidden_dim": CONTEXT_DIM,
        "axes_dims_rope": (4, 14, 14),
        "multi_layer_encoder_feature": False,
    }, 128, 0, {"double_block": 3}),
    # LongCat-Image: Flux's own model (no guidance embedding, no pooled vector).
    "longcat_image": ("LongCatImage", dict(_FLUX, guidance_embed=False, vec_in_dim=None), 16, 0,
                      {"double_block": 2, "single_block": 2}),
    # SD3 MMDiT: hidden = 64 * depth, heads = depth; num_blocks adds a third block.
    "sd3": ("SD3", {
        "in_channels": 16,
        "out_channels": 16,
        "patch_size": 2,
        "depth": 2,
        "num_blocks": 3,
        "input_size": None,
        "adm_in_channels": POOLED_DIM,
        "context_embedder_config": {
            "target": "torch.nn.Linear",
            "params": {"in_features": CONTEXT_DIM, "out_features": 128},
        },
        "num_patches": 32 * 32,
        "pos_embed_max_size": 32,
        "pos_embed_scaling_factor": None,
        "qk_norm": "rms",
        "x_block_self_attn_layers": [],
    }, 16, 0, {"double_block": 3}),
    # LTX-Video: 128-channel latent, patch 1, cross-attention blocks, needs an attention mask.
    "ltxv": ("LTXV", {
        "image_model": "ltxv",
        "in_channels": 128,
        "num_layers": 3,
        "attention_head_dim": 32,
        "num_attention_heads": 2,
        "cross_attention_dim": 64,
        "caption_channels": CONTEXT_DIM,
    }, 128, 1, {"double_block": 3}),
    # LTX-2 (LTXAV): video (128 channels, patch 1) and audio (8 channels x 16 frequency bins) streams through
    # the same blocks, handed over as one tuple ``img`` = (video, audio); the text features are already
    # processed (video half, audio half: 2 * caption_channels wide). The latent is a NestedTensor
    # (LTXVConcatAVLatent's), see ``latent``.
    "ltxav": ("LTXAV", {
        "image_model": "ltxav",
        "in_channels": 128,
        "audio_in_channels": 128,
        "num_layers": 3,
        "attention_head_dim": 32,
        "num_attention_heads": 2,
        "audio_attention_head_dim": 16,
        "audio_num_attention_heads": 2,
        "cross_attention_dim": 64,
        "audio_cross_attention_dim": 32,
        "caption_channels": CONTEXT_DIM // 2,
        "connector_attention_head_dim": 16,
        "connector_num_attention_heads": 2,
        "connector_num_layers": 1,
    }, 128, 1, {"double_block": 3}),
    # AuraFlow: 2 joint (double) + 2 single layers, learned positional table.
    "auraflow": ("AuraFlow", {
        "in_channels": 4,
        "out_channels": 4,
        "patch_size": 2,
        "dim": 64,
        "n_layers": 4,
        "n_double_layers": 2,
        "n_heads": 2,
        "global_conddim": 64,
        "cond_seq_dim": CONTEXT_DIM,
        "max_seq": 32 * 32,
    }, 4, 0, {"double_block": 2, "single_block": 2}),
    # Kandinsky 5 (video lite): text encoder blocks + visual decoder blocks;
    # visual_embed_dim = (16 latent + 16 image + 1 mask) * (1 * 2 * 2).
    # block_groups is empty: the model routes its visual blocks through
    # patches_replace["dit"][("double_block", i)], but in ComfyUI v0.8.0 the
    # ``original_block`` it hands to the replacement calls the block with
    # keyword names the block does not take (``x=``, ``context=``) and the
    # caller indexes the returned tensor with ["x"], so any replacement that
    # runs the original block raises TypeError.  Sampling without block
    # replacements works normally.
    "kandinsky5": ("Kandinsky5", {
        "image_model": "kandinsky5",
        "in_visual_dim": 16,
        "out_visual_dim": 16,
        "in_text_dim": CONTEXT_DIM,
        "in_text_dim2": POOLED_DIM,
        "time_dim": 32,
        "model_dim": 64,
        "ff_dim": 128,
        "visual_embed_dim": 132,
        "patch_size": (1, 2, 2),
        "num_text_blocks": 2,
        "num_visual_blocks": 3,
        "axes_dims": (8, 12, 12),
        "rope_scale_factor": (1.0, 2.0, 2.0),
    }, 16, 2, {}),
    # Lumina 2 (NextDiT): grouped-query attention.  Its layers are not routed
    # through ``patches_replace["dit"]`` in ComfyUI, so block_groups is empty.
    "lumina2": ("Lumina2", {
        "image_model": "lumina2",
        "patch_size": 2,
        "in_channels": 16,
        "dim": 64,
        "cap_feat_dim": CONTEXT_DIM,
        "n_layers": 3,
        "n_refiner_layers": 1,
        "n_heads": 2,
        "n_kv_heads": 1,
        "multiple_of": 16,
        "ffn_dim_multiplier": 4.0,
        "qk_norm": True,
        "axes_dims": [8, 12, 12],
        "axes_lens": [300, 512, 512],
        "rope_theta": 10000.0,
    }, 16, 0, {}),
    # SDXL UNet: ADM vector = pooled + six size embeddings; linear transformer in/out.
    # UNets have no patches_replace["dit"] blocks (only attn1/attn2 patches),
    # so block_groups is empty for SDXL and SD1.5.
    "sdxl": ("SDXL", {
        "use_checkpoint": False,
        "image_size": 32,
        "use_spatial_transformer": True,
        "legacy": False,
        "num_classes": "sequential",
        "adm_in_channels": _SDXL_ADM,
        "in_channels": 4,
        "out_channels": 4,
        "model_channels": 32,
        "num_res_blocks": [1, 1],
        "transformer_depth": [0, 1],
        "transformer_depth_output": [0, 0, 1, 1],
        "channel_mult": [1, 2],
        "transformer_depth_middle": 1,
        "use_linear_in_transformer": True,
        "context_dim": CONTEXT_DIM,
        "use_temporal_resblock": False,
        "use_temporal_attention": False,
    }, 4, 0, {}),
    # SD 1.5 UNet.
    "sd15": ("SD15", {
        "use_checkpoint": False,
        "image_size": 32,
        "use_spatial_transformer": True,
        "legacy": False,
        "adm_in_channels": None,
        "in_channels": 4,
        "out_channels": 4,
        "model_channels": 32,
        "num_res_blocks": [1, 1],
        "transformer_depth": [1, 1],
        "transformer_depth_output": [1, 1, 1, 1],
        "channel_mult": [1, 2],
        "transformer_depth_middle": 1,
        "use_linear_in_transformer": False,
        "context_dim": CONTEXT_DIM,
        "use_temporal_resblock": False,
        "use_temporal_attention": False,
    }, 4, 0, {}),
}

# Attention-head settings that the config classes force through
# ``unet_extra_config`` (8 heads for SD1.5, 64-channel heads for SDXL) are
# overridden so the tiny UNets have two heads per attention layer.
_EXTRA_OVERRIDES = {
    "sd15": {"num_heads": 2, "num_head_channels": -1},
    "sdxl": {"num_heads": 2, "num_head_channels": -1},
}

# Which extras each family's ``model_base.<Model>.extra_conds`` needs:
#   "pooled": ``encode_adm`` reads kwargs["pooled_output"] (a tensor here),
#   "pooled_none": the key must exist but the real text encoder gives None,
#   "mask": the diffusion model's forward takes an attention mask positionally.
_EXTRAS = {
    "flux": ("pooled",),
    "flux_schnell": ("pooled",),
    "flux2": ("pooled_none",),
    "chroma": ("pooled_none",),
    "hunyuan_video": ("pooled",),
    "hunyuan_video15": ("pooled_none",),
    "sd3": ("pooled",),
    "sdxl": ("pooled",),
    "kandinsky5": ("pooled",),
    "ltxv": ("mask",),
    "ltxav": ("mask",),
    "wan22_s2v": ("audio",),
    "wan_dancer": ("music",),
    "wan_animate2": ("pose",),
    "wan_scail": ("pose_scail",),
    "wan_scail2": ("pose_scail",),
}


def _spec(family):
    try:
        return _SPECS[family]
    except KeyError:
        raise ValueError("unknown family {!r}; known: {}".format(family, ", ".join(FAMILIES))) from None


def _is_norm(module):
    return "norm" in type(module).__name__.lower()


@torch.no_grad()
def init_weights(module, seed: int = 0):
    """Fill every parameter of ``module`` from a generator seeded with ``seed``.

    Linear/Conv weights ~ N(0, 1/sqrt(fan_in)); weights/scales of norm layers
    = 1; everything else (biases, embeddings, learned tokens and tables) ~
    N(0, 0.02).  Floating-point buffers that hold no finite values (left
    uninitialised by ``torch.empty``) get N(0, 0.02) too.
    """
    gen = torch.Generator(device="cpu").manual_seed(int(seed))

    def normal(shape, std):
        return torch.randn(shape, generator=gen, dtype=torch.float32) * std

    for _, mod in module.named_modules():
        is_lin_conv = isinstance(mod, (torch.nn.Linear, torch.nn.modules.conv._ConvNd))
        is_norm = _is_norm(mod)
        for pname, p in mod.named_parameters(recurse=False):
            if is_lin_conv and pname == "weight":
                fan_in = p[0].numel()
                value = normal(p.shape, 1.0 / math.sqrt(fan_in))
            elif is_norm and pname in ("weight", "scale"):
                value = torch.ones(p.shape)
            else:
                value = normal(p.shape, 0.02)
            p.copy_(value.to(p.dtype))
        for bname, b in mod.named_buffers(recurse=False):
            if b is None or not torch.is_floating_point(b) or b.numel() == 0:
                continue
            if bname == "pos_embed" or not bool(torch.isfinite(b).all()):
                b.copy_(normal(b.shape, 0.02).to(b.dtype))
    return module


def build(family: str, seed: int = 0, identity_from: int = -1):
    """Build the tiny ``family`` model as a ComfyUI ``ModelPatcher`` on the CPU. With ``identity_from`` >= 0,
    every transformer block from that index on has all-zero weights, which makes it pass its input through
    exactly (its gated attention and MLP outputs are zero), while the model around it still works."""
    import comfy.model_patcher
    import comfy.supported_models

    class_name, unet_config, _, _, _ = _spec(family)
    config = getattr(comfy.supported_models, class_name)(dict(unet_config))
    config.unet_config.update(_EXTRA_OVERRIDES.get(family, {}))
    config.set_inference_dtype(torch.float32, None)
    model = config.get_model({})
    init_weights(model.diffusion_model, seed)
    if identity_from >= 0:
        with torch.no_grad():
            for child in model.diffusion_model.children():
                if isinstance(child, torch.nn.ModuleList) and len(child) == sum(block_groups(family).values()):
                    for block in child[identity_from:]:
                        for p in block.parameters():
                            p.zero_()
    model.eval()
    cpu = torch.device("cpu")
    return comfy.model_patcher.ModelPatcher(model, load_device=cpu, offload_device=cpu)


def conditioning(family: str, batch: int = 1, seed: int = 0, length: int = 4):
    """``(positive, negative)`` CONDITIONING for ``family``.

    Cross-attention features are ``[batch, length, CONTEXT_DIM]`` seeded
    normals; the negative uses different random numbers (same length, so both
    batch together).  Pooled vectors, attention masks and the like are added
    where the family's ``extra_conds`` requires them.
    """
    _spec(family)
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    extras = _EXTRAS.get(family, ())

    def one():
        cross = torch.randn((batch, length, CONTEXT_DIM), generator=gen)
        d = {}
        if "pooled" in extras:
            d["pooled_output"] = torch.randn((batch, POOLED_DIM), generator=gen)
        if "pooled_none" in extras:
            d["pooled_output"] = None
        if "mask" in extras:
            d["attention_mask"] = torch.ones((batch, length), dtype=torch.long)
        if "audio" in extras:
            frames = _spec(family)[3]
            d["audio_embed"] = torch.randn((batch, AUDIO_LAYERS, AUDIO_DIM, 4 * frames), generator=gen)
        if "music" in extras:  # WanDancer's music features: [batch, music frames, 35]
            d["audio_embed"] = torch.randn((batch, 8 * _spec(family)[3], MUSIC_FEATURES), generator=gen)
        if extras and extras[0].startswith("pose"):  # pose video latents (raw, as a VAE encodes them)
            frames = _spec(family)[3] - (1 if extras[0] == "pose" else 0)
            d["pose_video_latent"] = torch.randn((batch, 16, frames, 16, 16), generator=gen)
        return [[cross, d]]

    positive = one()
    negative = one()
    return positive, negative


def latent(family: str, batch: int = 1, seed: int | None = None, size: int = 16):
    """A LATENT dict ``{"samples": tensor}`` shaped for ``family``.

    ``size`` is the latent's height and width (in latent pixels, so the
    token count is ``(size / patch)**2`` per frame).  Image families get
    ``[batch, C, size, size]``; families whose latent format is 3-D get
    ``[batch, C, frames, size, size]`` with 2 frames (1 for the patch-1 video
    models LTXV and HunyuanVideo 1.5, and for Qwen-Image, an image model on
    the Wan 2.1 video latent).  Zeros when ``seed`` is None, else seeded
    standard normals.
    """
    _, _, channels, frames, _ = _spec(family)
    shape = (batch, channels, frames, size, size) if frames else (batch, channels, size, size)
    shapes = [shape] + ([(batch, 8, AUDIO_FRAMES, 16)] if family in AUDIO_VIDEO else [])
    gen = torch.Generator(device="cpu").manual_seed(int(seed)) if seed is not None else None
    parts = [torch.zeros(s) if gen is None else torch.randn(s, generator=gen) for s in shapes]
    if len(parts) == 1:
        return {"samples": parts[0]}
    import comfy.nested_tensor
    return {"samples": comfy.nested_tensor.NestedTensor(tuple(parts))}


def available(family: str) -> bool:
    """Whether the running ComfyUI has the family's supported_models config (newer families are missing from
    older ComfyUIs)."""
    import comfy.supported_models
    return hasattr(comfy.supported_models, _spec(family)[0])


def as_tensor(samples):
    """A latent's samples as one tensor: an audio-video latent's streams (a NestedTensor) flattened and joined."""
    if getattr(samples, "is_nested", False):
        return torch.cat([t.reshape(t.shape[0], -1) for t in samples.unbind()], dim=1)
    return samples


def block_groups(family: str) -> dict:
    """``{patches_replace["dit"] block name: count}`` of the tiny ``family`` model."""
    return dict(_spec(family)[4])


# A Wan 2.1 that ComfyUI's checkpoint detection recognises from its state dict alone (comfy.model_detection
# reads the width from the weights and fixes 128-wide heads and a 4096-wide text encoder), for tests that load
# a file through ComfyUI's own loaders (UNETLoader and its weight_dtype).
LOADABLE_WAN = dict(_SPECS["wan21"][1], dim=128, ffn_dim=256, num_heads=1, text_dim=4096)
LOADABLE_WAN_CONTEXT_DIM = 4096


def loadable_wan_state(dtype=torch.float32, seed: int = 0) -> dict:
    """The loadable tiny Wan's diffusion-model weights (seeded), in ``dtype``."""
    import comfy.supported_models

    config = comfy.supported_models.WAN21_T2V(dict(LOADABLE_WAN))
    config.set_inference_dtype(torch.float32, None)
    model = config.get_model({})
    init_weights(model.diffusion_model, seed)
    return {k: v.to(dtype).contiguous() for k, v in model.diffusion_model.state_dict().items()}


def save_loadable_wan(path, dtype=torch.float32, seed: int = 0) -> dict:
    """Write the loadable tiny Wan to a safetensors file, stored in ``dtype``; returns what was written."""
    from safetensors.torch import save_file

    state = loadable_wan_state(dtype, seed)
    save_file(state, str(path))
    return state


def save_loadable_wan_gguf(path, seed: int = 0) -> dict:
    """Write the loadable tiny Wan as a GGUF file the way quantized community models are made (the ``gguf``
    package's writer, architecture ``wan``): 2-D weights quantized to Q8_0, everything else float32, tensors
    of more than 4 dimensions (the patch embedding) flattened with their shape in ``comfy.gguf.orig_shape``.
    Returns the float32 weights the file was made from."""
    import gguf

    state = loadable_wan_state(torch.float32, seed)
    writer = gguf.GGUFWriter(str(path), arch="wan")
    for name, value in state.items():
        data = value.numpy()
        if value.ndim > 4:
            writer.add_array(f"comfy.gguf.orig_shape.{name}", list(value.shape))
            data = data.reshape(value.shape[0], -1)
        if value.ndim == 2 and value.shape[-1] % 32 == 0:
            writer.add_tensor(name, gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0),
                              raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return state
