"""Tiny models for every ``comfy.supported_models.models`` config of the running ComfyUI that can be built tiny.

A config is built like a checkpoint loader builds it (``config(unet_config) -> get_model(state_dict)``), with the
tiny layout of the closest config in its MRO that has one: a ``tiny_models`` family (``BASES``: a Wan variant gets
the tiny Wan 2.1 layout, an SDXL variant the tiny SDXL one) or a layout of its own (``OWN``: unet_config, latent
shape, the conditioning extras its ``extra_conds`` reads, the weights get_model reads beside the diffusion model,
the buffers a checkpoint would fill), plus the config's own detection keys and the few values the variant needs
(``OVERRIDES``: wider inputs for image-conditioned variants, Vace's hint layers; ``EXTRA``: values set after the
config's unet_extra_config). Conditioning and latent are those of that layout. Configs that cannot be sampled this
way are named in ``UNBUILT`` with the reason.

``comfy`` is imported inside the functions only (the harness sets up ComfyUI first).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from . import tiny_models

CONTEXT = tiny_models.CONTEXT_DIM
POOLED = tiny_models.POOLED_DIM
# SVD's video UNet settings (as checkpoint detection sets them for a video UNet)
_SVD = {"in_channels": 8, "num_classes": "sequential", "use_temporal_resblock": True, "use_temporal_attention": True,
        "extra_ff_mix_layer": True, "use_spatial_context": True, "merge_strategy": "learned_with_images",
        "merge_factor": 0.0, "video_kernel_size": [3, 1, 1], "disable_temporal_crossattention": False}

# PixelDiT's tiny layout (PiD builds on it)
_PIXELDIT = {"in_channels": 3, "num_groups": 2, "hidden_size": 32, "pixel_hidden_size": 8, "pixel_attn_hidden_size": 16,
             "pixel_num_groups": 2, "patch_depth": 2, "pixel_depth": 1, "patch_size": 4, "txt_embed_dim": CONTEXT,
             "txt_max_length": 4}

# supported_models config -> tiny_models family whose tiny unet_config, conditioning and latent it uses.
BASES = {
    "Flux": "flux", "FluxSchnell": "flux_schnell", "Flux2": "flux2", "Chroma": "chroma", "WAN21_T2V": "wan21",
    "WAN22_T2V": "wan22", "WAN22_S2V": "wan22_s2v", "HunyuanVideo": "hunyuan_video",
    "HunyuanVideo15": "hunyuan_video15", "HunyuanVideo15_SR_Distilled": "hunyuan_video15",
    "QwenImage": "qwen_image", "SD3": "sd3", "LTXV": "ltxv", "AuraFlow": "auraflow", "Kandinsky5": "kandinsky5",
    "Lumina2": "lumina2", "SDXL": "sdxl", "SD15": "sd15",
    "LongCatImage": "flux",  # its own config class, Flux's model class and diffusion model
    "SD20": "sd15",  # the SD 2 UNet: the tiny SD 1.5 layout
    "MageFlow": "mage_flow", "JoyImage": "joyimage", "Lens": "lens", "LTXAV": "ltxav",
    # UNets of their own config classes: the tiny SD 1.5 / SDXL layouts with their inputs widened (OVERRIDES)
    "SDXLRefiner": "sdxl", "Stable_Zero123": "sd15", "SVD_img2vid": "sd15",
}

# Values a variant needs on top of its base's tiny unet_config (its image-conditioned inputs are concatenated
# to the latent, so the input layer is wider; ComfyUI fills the missing image with zeros).
OVERRIDES = {
    "SD15_instructpix2pix": {"in_channels": 8},
    "CogVideoX_I2V": {"in_channels": 32},
    "PixArtSigma": {"micro_condition": False},
    "HunyuanDiT1": {"size_cond": True, "use_style_cond": True},
    "CogVideoX_Inpaint": {"in_channels": 48},
    # the refiner's ADM vector: pooled + five size/aesthetic-score embeddings
    "SDXLRefiner": {"adm_in_channels": POOLED + 5 * 256},
    # unCLIP: the noise-augmented CLIP-vision embedding and its noise-level embedding as the class vector
    "SD21UnclipL": {"adm_in_channels": 2 * 768, "num_classes": "sequential"},
    "SD21UnclipH": {"adm_in_channels": 2 * 1024, "num_classes": "sequential"},
    # the x4 upscaler: the low-resolution image (3 channels) concatenated to the latent; the noise level is y
    "SD_X4Upscaler": {"in_channels": 7},
    # Lotus: a 4-wide task embedding as the class vector
    "LotusD": {"adm_in_channels": 4, "num_classes": "sequential"},
    "Stable_Zero123": {"in_channels": 8},
    # SVD / SV3D: the image latent concatenated, temporal resblocks and attention, fps/motion/augmentation (SVD),
    # augmentation (SV3D_u), augmentation + elevation + azimuth (SV3D_p) embeddings as the class vector
    "SVD_img2vid": dict(_SVD, adm_in_channels=3 * 256),
    "SV3D_u": dict(_SVD, adm_in_channels=256),
    "SV3D_p": dict(_SVD, adm_in_channels=256 + 2 * 512),
    "SDXL_instructpix2pix": {"in_channels": 8},
    "HunyuanVideoI2V": {"in_channels": 33},
    "HunyuanVideoSkyreelsI2V": {"in_channels": 32},
    "HunyuanVideo15_SR_Distilled": {"in_channels": 98},
    # HunyuanImage 2.1: an image model on a 64-channel latent, 2-D patches (and a 128-channel input for the refiner)
    "HunyuanImage21": {"vec_in_dim": None, "in_channels": 64, "out_channels": 64, "patch_size": [1, 1],
                       "axes_dim": [16, 16]},
    "HunyuanImage21Refiner": {"vec_in_dim": None, "in_channels": 128, "out_channels": 64, "patch_size": [1, 1, 1]},
    # Z-Image in pixel space: 3 channels in 2x2 patches, a one-block MLP decoder
    "ZImagePixelSpace": {"in_channels": 3, "decoder_hidden_size": 32, "decoder_num_res_blocks": 1,
                         "decoder_in_channels": 12},
    "WAN21_Vace": {"vace_layers": 1, "vace_in_dim": 96},
    "Kandinsky5Image": {"visual_embed_dim": 64},
    "LongCatImage": {"guidance_embed": False, "vec_in_dim": None, "txt_ids_dims": [1, 2]},
    # pixel space: a 3-channel image in 2x2 patches, decoded by a one-layer NeRF head
    "ChromaRadiance": {"in_channels": 3, "out_channels": 3, "patch_size": 2, "nerf_hidden_size": 16,
                       "nerf_mlp_ratio": 2, "nerf_depth": 1, "nerf_max_freqs": 4, "nerf_tile_size": 0,
                       "nerf_final_head_type": "linear", "nerf_embedder_dtype": None, "use_x0": False},
}
# Values given only where the running ComfyUI's parameter class (a dataclass's fields, or a class's constructor
# parameters) has them (newer versions added them): config -> (module, class, values).
NEWER_FIELDS = {
    "ChromaRadiance": ("comfy.ldm.chroma_radiance.model", "ChromaRadianceParams", {"use_sequential_txt_ids": False}),
    "StableAudio": ("comfy.ldm.audio.dit", "AudioDiffusionTransformer", {"timestep_features_type": "learned"}),
}
# Latents that differ from the base family's: (channels, frames; 0 = an image latent).
LATENTS = {"ChromaRadiance": (3, 0)}



@dataclasses.dataclass
class Tiny:
    """A tiny layout of a config's own (for models no tiny_models family covers)."""
    unet: dict  # the tiny unet_config
    latent: tuple | list  # the latent's shape, without the batch; a list of shapes: a NestedTensor of streams
    extra: dict = dataclasses.field(default_factory=dict)  # set after the config's unet_extra_config (heads...)
    cond: Callable | None = None  # generator -> the conditioning's extras (what extra_conds reads)
    context: int = CONTEXT  # width of the text features
    length: int = 4  # text tokens
    state: Callable | None = None  # generator -> the state dict get_model reads (weights beside the diffusion model)
    # diffusion-model buffer -> its value, or a function of its shape: buffers a checkpoint fills, which the
    # constructor leaves as torch.empty or draws from the global generator (set before the weights are drawn:
    # init_weights redraws a buffer holding non-finite garbage, which would shift every weight drawn after it)
    buffers: dict = dataclasses.field(default_factory=dict)


def _inv_freq(shape):
    """Rotary inverse frequencies, 1 / 10000^(2i/d), for a buffer of d/2 values."""
    return 1.0 / 10000 ** (torch.arange(shape[0]) / shape[0])


# Tiny layouts of the configs' own, by config (a subclass config uses its closest ancestor's, with OVERRIDES).
OWN: dict[str, Tiny] = {
    # TripoSplat (image to 3-D gaussian splats): one latent of two streams, the splat tokens (tokens x 16
    # channels) and a camera token (1 x 5), refined and then joined with the image features in its blocks
    "TripoSplat": Tiny({"q_token_length": 16, "in_channels": 16, "model_channels": 32, "cond_channels": CONTEXT,
                        "out_channels": 16, "num_blocks": 1, "num_refiner_blocks": 1, "num_head_channels": 16,
                        "cam_channels": 5, "cond2_channels": None, "mlp_ratio": 2}, [(16, 16), (1, 5)]),
    # Hunyuan3D 2.0 / 2.0 mini: Flux-style double and single blocks over a 1-D shape latent (64 channels x
    # tokens), the image features as the context; 2.1: a plain DiT with mixture-of-experts layers
    "Hunyuan3Dv2": Tiny({"in_channels": 64, "context_in_dim": CONTEXT, "hidden_size": 32, "mlp_ratio": 2.0,
                         "num_heads": 2, "depth": 1, "depth_single_blocks": 1, "qkv_bias": True,
                         "guidance_embed": False}, (64, 16)),
    "Hunyuan3Dv2_1": Tiny({"in_channels": 64, "hidden_size": 32, "context_dim": CONTEXT, "depth": 2,
                           "num_heads": 2, "num_moe_layers": 1, "guidance_cond_proj_dim": None, "num_experts": 2,
                           "moe_top_k": 1}, (64, 16)),
    # ACE-Step 1.5: a 1-D 64-channel audio latent; text, lyric and timbre (ComfyUI's silence latent when no
    # reference audio is given) encoders, the audio tokenizer's hints concatenated to the latent
    "ACEStep15": Tiny({"in_channels": 192, "hidden_size": 32, "text_hidden_dim": CONTEXT, "timbre_hidden_dim": 64,
                       "audio_acoustic_hidden_dim": 64, "num_dit_layers": 2, "num_lyric_layers": 1,
                       "num_timbre_layers": 1, "num_tokenizer_layers": 1, "num_heads": 2, "num_kv_heads": 1,
                       "head_dim": 16, "intermediate_size": 64, "patch_size": 2, "pool_window_size": 5,
                       "sliding_window": 8, "fsq_dim": 32, "encoder_hidden_size": 32,
                       "encoder_intermediate_size": 64, "encoder_num_heads": 2}, (64, 20),
                      cond=lambda gen: {"conditioning_lyrics": torch.randn((1, 6, CONTEXT), generator=gen)}),
    # Stable Audio 3: a 256-channel 1-D latent, adaLN from a shared global embedder (the seconds-total
    # embedding), the inpainting mask + audio (1 + 256 channels, zeros here) added to every layer
    "StableAudio3": Tiny({"io_channels": 256, "embed_dim": 64, "cond_token_dim": 768, "global_cond_dim": 768,
                          "project_cond_tokens": True, "depth": 2, "num_heads": 2, "global_cond_type": "adaLN",
                          "timestep_features_type": "learned", "input_concat_dim": 0,
                          "local_add_cond_dim": 257}, (256, 16),
                         context=768, state=lambda gen: _number_embedders(gen, "seconds_total"),
                         buffers={"transformer.rotary_pos_emb.inv_freq": _inv_freq}),
    # Stable Audio 1: a 1-D 64-channel audio latent; its seconds-start/-total number embedders (768 wide, beside
    # the diffusion model: weights from the state dict) give the global vector and two extra text tokens, so the
    # text features are 768 wide too; its rotary embedding is at least 32 wide, so are the heads
    "StableAudio": Tiny({"io_channels": 64, "embed_dim": 64, "cond_token_dim": 768, "global_cond_dim": 1536,
                         "project_cond_tokens": True, "depth": 2, "num_heads": 2, "input_concat_dim": 0},
                        (64, 16),
                        context=768, state=lambda gen: _number_embedders(gen, "seconds_start", "seconds_total"),
                        buffers={"transformer.rotary_pos_emb.inv_freq": _inv_freq}),
    # MiniMax H3: one joint audio-video latent (a NestedTensor: 24-channel video, 32-channel x 2 audio, which the
    # latent format builds from an empty 32-channel latent), its token refiner run once per sampling on the text
    "MiniMaxH3": Tiny({"hidden_size": 32, "num_layers": 2, "token_refiner_num_layers": 1, "num_attention_heads": 2,
                       "attention_head_dim": 16, "ffn_hidden_size": 64, "latents_dim": 24, "audio_latents_dim": 32,
                       "text_dim": CONTEXT, "timestep_input_dim": 256, "time_embed_hidden_size": 32,
                       "time_embed_dim": 16, "rope_inv_freq_len": 2}, (32, 2, 8, 8),
                      buffers={"rope.inv_freq": _inv_freq}),
    # Mochi: asymmetric joint DiT (a wider video stream than text stream) on its 12-channel video latent; its
    # blocks assert the released video-MLP width (12288), so the ratio makes up for the tiny stream width
    "GenmoMochi": Tiny({"depth": 2, "patch_size": 2, "num_heads": 2, "hidden_size_x": 32, "hidden_size_y": 16,
                        "mlp_ratio_x": 12288 / 32, "mlp_ratio_y": 2.0, "learn_sigma": False, "in_channels": 12,
                        "qk_norm": True, "qkv_bias": False, "out_bias": True, "attn_drop": 0.0,
                        "patch_embed_bias": True, "posenc_preserve_area": True, "timestep_mlp_bias": True,
                        "attend_to_padding": False, "timestep_scale": 1000.0, "use_t5": True,
                        "t5_feat_dim": CONTEXT, "t5_token_length": 4, "rope_theta": 10000.0}, (12, 2, 16, 16),
                       cond=lambda gen: {"attention_mask": torch.ones((1, 4), dtype=torch.long)}),
    # PixelDiT (pixel space: patch-level DiT blocks, then pixel-level blocks); PiD adds the low-quality latent
    # (PiDConditioning's ``lq_latent``) projected into its patch blocks
    "PixelDiTT2I": Tiny(_PIXELDIT, (3, 32, 32),
                        cond=lambda gen: {"attention_mask": torch.ones((1, 4), dtype=torch.long)}),
    "PiD": Tiny(dict(_PIXELDIT, lq_latent_channels=16, lq_hidden_dim=16, lq_num_res_blocks=1, lq_interval=1,
                     sr_scale=1, latent_spatial_down_factor=8), (3, 32, 32),
                cond=lambda gen: {"attention_mask": torch.ones((1, 4), dtype=torch.long),
                                  "lq_latent": torch.randn((1, 16, 4, 4), generator=gen),
                                  "degrade_sigma": torch.tensor([0.0])}),
    # OmniGen2: Lumina-style refiner and main layers with grouped-query attention; Boogu adds dual-stream layers
    "Omnigen2": Tiny({"patch_size": 2, "in_channels": 16, "out_channels": 16, "hidden_size": 32, "num_layers": 1,
                      "num_refiner_layers": 1, "num_attention_heads": 2, "num_kv_heads": 1, "multiple_of": 16,
                      "axes_dim_rope": (8, 4, 4), "axes_lens": (64, 64, 64), "text_feat_dim": CONTEXT},
                     (16, 16, 16), cond=lambda gen: {"attention_mask": torch.ones((1, 4), dtype=torch.long)}),
    "Boogu": Tiny({"patch_size": 2, "in_channels": 16, "out_channels": 16, "hidden_size": 32, "num_layers": 1,
                   "num_double_stream_layers": 1, "num_refiner_layers": 1, "num_attention_heads": 2,
                   "num_kv_heads": 1, "multiple_of": 16, "axes_dim_rope": (8, 4, 4), "axes_lens": (64, 64, 64),
                   "instruction_feat_dim": CONTEXT},
                  (16, 16, 16), cond=lambda gen: {"attention_mask": torch.ones((1, 4), dtype=torch.long)}),
    # Krea 2: single-stream blocks after a text-fusion transformer, on the Wan 2.1 latent
    "Krea2": Tiny({"features": 32, "tdim": 32, "txtdim": CONTEXT, "heads": 2, "kvheads": 1, "multiplier": 2,
                   "layers": 2, "patch": 2, "channels": 16, "txtlayers": 1, "txtheads": 2, "txtkvheads": 2},
                  (16, 1, 16, 16)),
    # Ideogram 4 on the Flux 2 latent (its head counts and widths are set as unet_extra_config: overridden after)
    "Ideogram4": Tiny({"in_channels": 128, "num_layers": 2}, (128, 8, 8),
                      extra={"num_attention_heads": 2, "attention_head_dim": 16, "intermediate_size": 64,
                             "adaln_dim": 32, "llm_features_dim": CONTEXT, "mrope_section": [4, 2, 2]}),
    # ERNIE-Image on the Flux 2 latent, patch 1
    "ErnieImage": Tiny({"hidden_size": 32, "num_attention_heads": 2, "num_layers": 2, "ffn_hidden_size": 64,
                        "in_channels": 128, "out_channels": 128, "patch_size": 1, "text_in_dim": CONTEXT,
                        "rope_axes_dim": (4, 6, 6)}, (128, 8, 8)),
    # HiDream-I1: one double- and one single-stream block, each with its mixture-of-experts MLP; T5 features as the
    # context, one Llama-3 hidden layer per block (``conditioning_llama3``: [batch, layers, tokens, width]) and
    # a pooled vector
    "HiDream": Tiny({"patch_size": 2, "in_channels": 16, "out_channels": 16, "num_layers": 1,
                     "num_single_layers": 1, "attention_head_dim": 16, "num_attention_heads": 2,
                     "caption_channels": [CONTEXT, 32], "text_emb_dim": POOLED, "num_routed_experts": 2,
                     "num_activated_experts": 1, "axes_dims_rope": [8, 4, 4], "max_resolution": [32, 32],
                     "llama_layers": [0, 1]}, (16, 16, 16),
                    cond=lambda gen: {"pooled_output": torch.randn((1, POOLED), generator=gen),
                                      "conditioning_llama3": torch.randn((1, 2, 4, 32), generator=gen)}),
    # SeedVR2 (video restoration): the low-quality video's latent + a mask channel (SeedVR2Conditioning's
    # ``condition``) concatenated to the noisy latent, video and text packed into one varlen sequence
    "SeedVR2": Tiny({"norm_eps": 1e-5, "num_layers": 2, "mlp_type": "swiglu", "vid_in_channels": 33,
                     "vid_dim": 32, "txt_in_dim": CONTEXT, "heads": 2, "head_dim": 16, "mm_layers": 1,
                     "rope_dim": 8, "vid_out_norm": True}, (16, 1, 8, 8),
                    # its stored default text embeddings (the conditioning here brings its own text)
                    buffers={"positive_conditioning": torch.zeros, "negative_conditioning": torch.zeros},
                    cond=lambda gen: {"condition": torch.cat([torch.randn((1, 16, 1, 8, 8), generator=gen),
                                                              torch.ones((1, 1, 1, 8, 8))], dim=1)}),
    # Cosmos 1 (GeneralDIT) and Cosmos Predict2 (MiniTrainDIT): adaLN-LoRA DiT blocks on a 3-D latent with 3-D
    # rotary positions; the image-to-video variants add a mask channel (in_channels 17, from their configs)
    "CosmosT2V": Tiny({"max_img_h": 32, "max_img_w": 32, "max_frames": 8, "out_channels": 16,
                       "patch_spatial": 2, "patch_temporal": 1, "concat_padding_mask": True,
                       "block_config": "FA-CA-MLP", "model_channels": 32, "num_blocks": 2, "num_heads": 2,
                       "crossattn_emb_channels": CONTEXT, "pos_emb_cls": "rope3d", "pos_emb_learnable": False,
                       "pos_emb_interpolation": "crop", "block_x_format": "THWBD", "affline_emb_norm": True,
                       "use_adaln_lora": True, "adaln_lora_dim": 8, "extra_per_block_abs_pos_emb": True,
                       "extra_per_block_abs_pos_emb_type": "learnable"}, (16, 2, 16, 16),
                      cond=lambda gen: {"attention_mask": torch.ones((1, 4), dtype=torch.long)}),
    "CosmosT2IPredict2": Tiny({"max_img_h": 32, "max_img_w": 32, "max_frames": 8, "out_channels": 16,
                               "patch_spatial": 2, "patch_temporal": 1, "concat_padding_mask": True,
                               "model_channels": 32, "num_blocks": 2, "num_heads": 2,
                               "crossattn_emb_channels": CONTEXT, "pos_emb_cls": "rope3d",
                               "pos_emb_learnable": True, "pos_emb_interpolation": "crop", "min_fps": 1,
                               "max_fps": 30, "use_adaln_lora": True, "adaln_lora_dim": 8,
                               "extra_per_block_abs_pos_emb": False, "rope_enable_fps_modulation": False},
                              (16, 1, 16, 16)),
    # PixArt (Alpha with its size / aspect-ratio micro-conditions, Sigma without): cross-attention DiT blocks;
    # the two micro-condition embeddings and the time embedding share the width, so it is a multiple of 3
    "PixArtAlpha": Tiny({"input_size": 48, "patch_size": 2, "in_channels": 4, "hidden_size": 48, "depth": 2,
                         "num_heads": 2, "caption_channels": CONTEXT, "model_max_length": 4,
                         "micro_condition": True, "pe_interpolation": 1.0}, (4, 48, 48),  # its position table
                        # is sized from the latent in 64-pixel steps, rounded: 48 latent pixels is the smallest
                        cond=lambda gen: {"width": 128, "height": 128},
                        # the null-caption embedding, drawn from the global generator by the constructor
                        buffers={"y_embedder.y_embedding": torch.zeros}),
    # HunyuanDiT: CLIP and mT5 text (each with its mask) and the image-size vector; v1.0 adds size and style
    # conditions (OVERRIDES)
    "HunyuanDiT": Tiny({"input_size": (16, 16), "patch_size": 2, "in_channels": 4, "hidden_size": 32, "depth": 2,
                        "num_heads": 2, "text_states_dim": CONTEXT, "text_states_dim_t5": 32, "text_len": 4,
                        "text_len_t5": 4}, (4, 16, 16),
                       cond=lambda gen: {"attention_mask": torch.ones((1, 4), dtype=torch.long),
                                         "conditioning_mt5xl": torch.randn((1, 4, 32), generator=gen),
                                         "attention_mask_mt5xl": torch.ones((1, 4), dtype=torch.long)}),
    # CogVideoX: text and video tokens in one sequence through its blocks, 3-D rotary positions; the I2V and
    # Inpaint variants widen the input (OVERRIDES) and ComfyUI fills the missing image/mask with zeros
    "CogVideoX_T2V": Tiny({"image_model": "cogvideox", "num_attention_heads": 2, "attention_head_dim": 16,
                           "in_channels": 16, "out_channels": 16, "time_embed_dim": 32, "text_embed_dim": CONTEXT,
                           "num_layers": 2, "sample_width": 8, "sample_height": 8, "sample_frames": 5,
                           "max_text_seq_length": 4, "patch_size": 2, "use_rotary_positional_embeddings": True},
                          (16, 2, 8, 8)),
    # Stable Cascade: stage C (the prior, 16-channel latent) and stage B (the decoder stage, 4-channel latent);
    # the pooled text vector is their extra input (the CLIP image embedding and the effnet prior default to zeros)
    "Stable_Cascade_C": Tiny({"stable_cascade_stage": "c", "c_in": 16, "c_out": 16, "c_r": 64, "patch_size": 1,
                              "c_cond": 32, "c_hidden": [32, 32], "nhead": [2, 2], "blocks": [[1, 1], [1, 1]],
                              "block_repeat": [[1, 1], [1, 1]], "level_config": ["CTA", "CTA"],
                              "c_clip_text": CONTEXT, "c_clip_text_pooled": POOLED, "c_clip_img": 768,
                              "c_clip_seq": 4}, (16, 8, 8),
                             cond=lambda gen: {"pooled_output": torch.randn((1, 1, POOLED), generator=gen)}),
    "Stable_Cascade_B": Tiny({"stable_cascade_stage": "b", "c_in": 4, "c_out": 4, "c_r": 64, "patch_size": 2,
                              "c_cond": 32, "c_hidden": [16, 32], "nhead": [-1, 2], "blocks": [[1, 1], [1, 1]],
                              "block_repeat": [[1, 1], [1, 1]], "level_config": ["CT", "CTA"], "c_clip": POOLED,
                              "c_clip_seq": 4, "c_effnet": 16, "c_pixels": 3}, (4, 16, 16),
                             cond=lambda gen: {"pooled_output": torch.randn((1, 1, POOLED), generator=gen)}),
}

# Per config, on top of its base layout: values set after unet_extra_config, conditioning extras
# (generator -> dict), and the state dict get_model reads (generator -> dict).
EXTRA: dict[str, dict] = {}
COND: dict[str, Callable] = {}
EXTRA["SD_X4Upscaler"] = {"disable_self_attentions": [True, False]}  # one per level of the tiny UNet's two
STATE: dict[str, Callable] = {}


class _ClipVisionOutput:
    def __init__(self, image_embeds):
        self.image_embeds = image_embeds


def _unclip(width):
    """unCLIP conditioning as CLIPVisionEncode + unCLIPConditioning give it (one image embedding)."""
    return lambda gen: {"unclip_conditioning": [{"clip_vision_output": _ClipVisionOutput(
        torch.randn((1, width), generator=gen)), "strength": 1.0, "noise_augmentation": 0.1}]}


def _number_embedders(gen, *names):
    """The seconds embedders' weights Stable Audio keeps beside its diffusion model (``NumberConditioner(768)``
    with its default learned Fourier features, as the tiny layouts' ``timestep_features_type`` says), seeded,
    under the checkpoint's ``conditioner.conditioners.<name>.`` keys."""
    import comfy.ldm.audio.embedders
    state = {}
    for name in names:
        embedder = comfy.ldm.audio.embedders.NumberConditioner(768)
        for key, value in embedder.state_dict().items():
            state[f"conditioner.conditioners.{name}.{key}"] = torch.randn(value.shape, generator=gen) * 0.1
    return state


COND.update({"SD21UnclipL": _unclip(768), "SD21UnclipH": _unclip(1024)})
# Zero123's projection of the CLIP-vision embedding + camera pose to the cross-attention width
STATE["Stable_Zero123"] = lambda gen: {"cc_projection.weight": torch.randn((CONTEXT, CONTEXT), generator=gen) * 0.1,
                                       "cc_projection.bias": torch.zeros(CONTEXT)}
# Latents whose batch is the video's frames (SVD's UNet reads them as num_video_frames).
FRAMES_AS_BATCH = {"SVD_img2vid": 2}

# Configs not sampled tiny here, and why.
_FIXED = ("its {} is built at a fixed size that no unet_config value sets ({}), so the model cannot be built tiny")
_NOT_WRITTEN = "no tiny configuration is written for model class {} yet, nor for an ancestor config of it"
UNBUILT = {
    "ACEStep": _FIXED.format("lyric encoder (a 6-block, 1024-wide Conformer)", "about 82 M parameters"),
    "Anima": _FIXED.format("LLM adapter (six 1024-wide layers and a 32128-token embedding)",
                           "about 135 M parameters"),
    "MiniMaxMusic3": _FIXED.format("diffusion transformer (and its 4096-to-2048 conditioner)",
                                   "about 2.5 G parameters"),
    "HiDreamO1": ("not written yet: its diffusion model is a Qwen3-VL language and vision model run on pixel "
                  "patches, fed token ids (text_input_ids) through its own conditioning builder"),
    "Trellis2": ("not written yet: it samples sparse voxel structures whose coordinates, counts and generation "
                 "mode come from its own conditioning nodes"),
    "RT_DETR_v4": "a detection model, not a diffusion model: nothing to sample",
    "SAM3": "a segmentation model, not a diffusion model: nothing to sample",
    "SAM31": "a segmentation model, not a diffusion model: nothing to sample",
    "DepthAnything3": "a depth-estimation model, not a diffusion model: nothing to sample",
}


def config_class(name: str):
    import comfy.supported_models
    return next(c for c in comfy.supported_models.models if c.__name__ == name)


def config_names() -> list[str]:
    import comfy.supported_models
    return [c.__name__ for c in comfy.supported_models.models]


def _ancestors(name: str) -> list[str]:
    return [c.__name__ for c in config_class(name).__mro__]


def base_family(name: str) -> str | None:
    """The tiny layout a config is built from (its own or its closest ancestor config's): a tiny_models family,
    or a config named in OWN; None when there is none."""
    for ancestor in _ancestors(name):
        if ancestor in OWN:
            return ancestor
        if ancestor in BASES:
            return BASES[ancestor]
    return None


def _own(name: str) -> Tiny | None:
    family = base_family(name)
    return OWN.get(family) if family is not None else None


def why_unbuilt(name: str) -> str | None:
    """Why ``name`` is not built tiny here, or None when it is."""
    if name in UNBUILT:
        return UNBUILT[name]
    if base_family(name) is None:
        model = getattr(config_class(name).get_model, "__qualname__", "get_model")
        return _NOT_WRITTEN.format(_model_base_name(name) or model)
    return None


def _model_base_name(name: str) -> str | None:
    import inspect
    import re
    try:
        found = re.findall(r"model_base\.(\w+)\(", inspect.getsource(config_class(name).get_model))
    except (OSError, TypeError):
        return None
    return found[0] if found else None


def unet_config(name: str) -> dict:
    own = _own(name)
    config = dict(own.unet if own is not None else tiny_models._SPECS[base_family(name)][1])
    cls = config_class(name)
    config.update({k: v for k, v in cls.unet_config.items() if k not in config})  # its own detection keys
    config.update(OVERRIDES.get(name, {}))
    if name in NEWER_FIELDS:
        import dataclasses
        import importlib
        import inspect
        module, params, values = NEWER_FIELDS[name]
        params = getattr(importlib.import_module(module), params)
        fields = ({f.name for f in dataclasses.fields(params)} if dataclasses.is_dataclass(params)
                  else set(inspect.signature(params.__init__).parameters))
        config.update({k: v for k, v in values.items() if k in fields})
    return config


def _generator(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(int(seed))


def build(name: str, seed: int = 0):
    """The tiny ``name`` config's model as a ModelPatcher on the CPU."""
    import comfy.model_patcher

    reason = why_unbuilt(name)
    if reason is not None:
        raise ValueError(f"{name}: {reason}")
    own = _own(name)
    config = config_class(name)(unet_config(name))
    config.unet_config.update(own.extra if own is not None else tiny_models._EXTRA_OVERRIDES.get(base_family(name), {}))
    config.unet_config.update(EXTRA.get(name, {}))
    config.set_inference_dtype(torch.float32, None)
    state = STATE.get(name) or (own.state if own is not None else None)
    with torch.no_grad():  # as under the executor (some get_model copy checkpoint weights into parameters)
        model = config.get_model(state(_generator(seed)) if state is not None else {})
    with torch.no_grad():
        for buffer, value in (own.buffers if own is not None else {}).items():
            target = model.diffusion_model.get_buffer(buffer)
            target.copy_(value(target.shape) if callable(value) else value)
    tiny_models.init_weights(model.diffusion_model, seed)
    model.eval()
    cpu = torch.device("cpu")
    return comfy.model_patcher.ModelPatcher(model, load_device=cpu, offload_device=cpu)


def conditioning(name: str, seed: int = 1):
    """``(positive, negative)`` CONDITIONING: the base family's, with the inputs the config's own ``extra_conds``
    reads added."""
    own = _own(name)
    if own is None:
        positive, negative = tiny_models.conditioning(base_family(name), batch=1, seed=seed, length=4)
    else:
        gen = _generator(seed)
        positive, negative = ([[torch.randn((1, own.length, own.context), generator=gen),
                                own.cond(gen) if own.cond is not None else {}]] for _ in range(2))
    if name in COND:
        gen = _generator(seed + 1000)
        for branch in (positive, negative):
            branch[0][1].update(COND[name](gen))
    return positive, negative


def latent(name: str, seed: int | None = None, size: int = 16):
    """A LATENT shaped as the config's tiny layout says: its own shape, or the latent format's channels (image or
    video, with the base family's frame count for video); zeros when ``seed`` is None (the samplers then fit an
    empty latent's channels to the model)."""
    own = _own(name)
    family = base_family(name)
    if own is None and name not in LATENTS and family in tiny_models.AUDIO_VIDEO:
        return tiny_models.latent(family, seed=seed, size=size)
    if own is not None and isinstance(own.latent, list):  # several streams in one latent (a NestedTensor)
        import comfy.nested_tensor
        gen = _generator(seed) if seed is not None else None
        return {"samples": comfy.nested_tensor.NestedTensor(tuple(
            torch.zeros((1,) + tuple(s)) if gen is None else torch.randn((1,) + tuple(s), generator=gen)
            for s in own.latent))}
    if own is not None:
        shape = (1,) + tuple(LATENTS.get(name, own.latent))
    else:
        config = config_class(name)
        channels, frames = LATENTS.get(name, (None, None))
        if channels is None:
            fmt = config.latent_format()
            channels = fmt.latent_channels
            frames = (tiny_models._spec(family)[3] or 1) if fmt.latent_dimensions == 3 else 0
        batch = next((FRAMES_AS_BATCH[a] for a in _ancestors(name) if a in FRAMES_AS_BATCH), 1)
        shape = (batch, channels, frames, size, size) if frames else (batch, channels, size, size)
    if seed is None:
        return {"samples": torch.zeros(shape)}
    return {"samples": torch.randn(shape, generator=_generator(seed))}
