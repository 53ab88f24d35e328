"""The card rule: which level and which published curves a model class inherits from a known family, and which
models count as step-distilled (plain names, as the adapter hands them over)."""
from __future__ import annotations

import pytest

from cached_sampler_dev.devkit.pack import load_core

ic = load_core()
cards = __import__(f"{ic.__name__}.cards", fromlist=["cards"])

WAN = ic.DiffusionFacts(("WanModel",), (("forward", "WanModel"), ("_forward", "WanModel"),
                                         ("forward_orig", "WanModel")))


# What the adapter hands build_card as its signal probes (adapter/cards.py SIGNAL_PROBES): here, a caller that can
# read the modulated input of Flux and Wan blocks.
SIGNALS = {"modulated_input": ("flux", "wan")}


def block_decider():
    return ic.InterceptorChain.of([ic.FirstBlockCache(node="First Block Cache (node 4)")])


def test_subclass_with_the_ancestors_diffusion_model_inherits_blocks():
    card = ic.build_card(("WAN21_FlowRVS", "WAN21", "BaseModel"), "WAN21_FlowRVS", group_counts={"blocks": 3},
                         diffusion=WAN)
    assert ic.Granularity.BLOCKS in card.levels and card.total_blocks == 3
    # a subclass of the diffusion model that leaves the block loop alone inherits as well
    plain_subclass = ic.DiffusionFacts(("QuietWanModel", "WanModel"), WAN.runners)
    card = ic.build_card(("WAN21_Quiet", "WAN21"), group_counts={"blocks": 3}, diffusion=plain_subclass)
    assert ic.Granularity.BLOCKS in card.levels


@pytest.mark.parametrize("diffusion, why", [
    # CausalWanModel runs its blocks in its own forward_block (the KV-cache path), bypassing the block slots
    (ic.DiffusionFacts(("CausalWanModel", "WanModel"), WAN.runners + (("forward", "CausalWanModel"),
                                                                       ("forward_block", "CausalWanModel"))),
     "forward, forward_block"),
    # a diffusion model of another lineage (MageFlow's is not Qwen-Image's)
    (ic.DiffusionFacts(("SomethingElse",), (("forward", "SomethingElse"),)), "is not WAN21's WanModel"),
    (None, "unknown"),
])
def test_subclass_whose_forward_differs_gets_whole_model_only_with_a_note(diffusion, why):
    # a Wan 2.1 subclass the table has no row of its own for (as WAN21_CausalAR was before it got one)
    card = ic.build_card(("WAN21_NewVariant", "WAN21", "BaseModel"), "WAN21_NewVariant", group_counts={"blocks": 3},
                         diffusion=diffusion)
    assert card.levels == frozenset({ic.Granularity.MODEL}) and card.groups == ()
    assert card.family == "wan"
    note = next(n for n in card.notes if n.startswith("transformer-block caching is off"))
    assert "WAN21_NewVariant" in note and why in note
    with pytest.raises(ic.ChainError) as e:
        block_decider().validate_for(card, allow_distilled=True)
    assert "node 4" in str(e.value) and why in str(e.value)
    # whole-model caching is still offered
    ic.InterceptorChain.of([ic.FixedCadence(node="Fixed Cadence (node 5)")]).validate_for(card, allow_distilled=True)


def test_exact_family_entry_keeps_its_blocks_and_curves_without_facts():
    card = ic.build_card(("Flux", "BaseModel"), "Flux", group_counts={"double_blocks": 2, "single_blocks": 2},
                         signals=SIGNALS)
    assert ic.Granularity.BLOCKS in card.levels and card.teacache == "flux" and card.magcache == "flux"
    assert card.notes == ()
    ic.InterceptorChain.of([ic.TeaCache(node="TeaCache (node 2)")]).validate_for(card)
    ic.InterceptorChain.of([ic.MagCache(node="MagCache (node 2)")]).validate_for(card)


def test_published_curves_are_not_inherited_by_a_subclass():
    flux = ic.DiffusionFacts(("Flux",), (("forward", "Flux"), ("_forward", "Flux"), ("forward_orig", "Flux")))
    # a Flux subclass the table has no row of its own for (as LongCatImage was before it got one)
    card = ic.build_card(("FluxNewVariant", "Flux", "BaseModel"), "FluxNewVariant",
                         group_counts={"double_blocks": 2, "single_blocks": 2}, diffusion=flux, signals=SIGNALS)
    assert ic.Granularity.BLOCKS in card.levels  # same diffusion model: the blocks are Flux's
    assert card.teacache is None and card.magcache is None
    for method in (ic.TeaCache(node="TeaCache (node 2)"), ic.MagCache(node="MagCache (node 2)")):
        with pytest.raises(ic.ChainError) as e:
            ic.InterceptorChain.of([method]).validate_for(card)
        text = str(e.value)
        assert "FluxNewVariant" in text and "model_type" in text and "measured on Flux" in text
    assert "MagCache Calibrate" in str(pytest.raises(ic.ChainError, ic.InterceptorChain.of(
        [ic.MagCache(node="MagCache (node 2)")]).validate_for, card).value)
    # an explicit model_type is the user's statement that the curve applies
    ic.InterceptorChain.of([ic.TeaCache(node="TeaCache (node 2)", model_type="flux")]).validate_for(card)
    ic.InterceptorChain.of([ic.MagCache(node="MagCache (node 2)", model_type="flux")]).validate_for(card)
    # a Wan variant does not get the Wan 2.1 1.3B curve
    variant = ic.build_card(("WAN21_SCAIL", "WAN21"), group_counts={"blocks": 3}, diffusion=WAN)
    assert variant.teacache is None and variant.magcache is None


def test_a_card_offers_the_signals_its_caller_can_read_for_its_family_and_teacache_needs_one():
    """TeaCache's signal is read by the adapter's probes: a card offers it only for a family the caller names, and
    TeaCache is refused on any other, even with an explicit model_type; whole-model and other block methods are
    not."""
    flux = ic.build_card(("Flux", "BaseModel"), "Flux", group_counts={"double_blocks": 2}, signals=SIGNALS)
    assert flux.signals == {"modulated_input"}
    assert ic.build_card(("Flux", "BaseModel"), "Flux", group_counts={"double_blocks": 2}).signals == frozenset()
    qwen = ic.build_card(("QwenImage", "BaseModel"), "QwenImage", group_counts={"transformer_blocks": 2},
                         signals=SIGNALS)
    assert qwen.signals == frozenset() and ic.Granularity.BLOCKS in qwen.levels
    for card in (qwen, ic.build_card(("Flux", "BaseModel"), "Flux", group_counts={"double_blocks": 2})):
        with pytest.raises(ic.ChainError) as e:
            ic.InterceptorChain.of([ic.TeaCache(node="TeaCache (node 2)", model_type="flux")]).validate_for(card)
        assert "TeaCache (node 2)" in str(e.value) and "Adaptive Cache" in str(e.value)
        ic.InterceptorChain.of([ic.FirstBlockCache(node="First Block Cache (node 3)")]).validate_for(card)
    ic.InterceptorChain.of([ic.TeaCache(node="TeaCache (node 2)", model_type="flux")]).validate_for(flux)


def test_inherited_curves_table_lets_a_listed_subclass_use_them(monkeypatch):
    monkeypatch.setitem(cards.INHERITED_CURVES, "WAN21_Shown", "WAN21")
    card = ic.build_card(("WAN21_Shown", "WAN21"), group_counts={"blocks": 3}, diffusion=WAN)
    assert card.teacache == "wan2.1_t2v_1.3B" and card.magcache == "wan2.1_t2v_1.3B"


@pytest.mark.parametrize("config, settings, expected", [
    (("ZImagePixelSpace", "ZImage", "Lumina2", "BASE"), {}, "Z-Image Turbo"),
    (("WAN21_CausalAR_T2V", "WAN21_T2V", "BASE"), {}, "Wan CausalAR"),
    (("Flux2", "Flux", "BASE"), {"guidance_embed": False}, "klein"),
    (("FluxSchnell", "Flux", "BASE"), {}, "schnell"),
])
def test_distilled_configs_match_the_whole_config_mro(config, settings, expected):
    card = ic.build_card(("Model", "BaseModel"), config, config_settings=settings)
    assert expected in card.distilled
    with pytest.raises(ic.ChainError) as e:
        ic.InterceptorChain.of([ic.FixedCadence(node="Fixed Cadence (node 3)")]).validate_for(card)
    assert "distilled" in str(e.value) and "allow_distilled" in str(e.value) and f"({config[0]})" in str(e.value)


@pytest.mark.parametrize("config, settings", [
    (("Flux2", "Flux", "BASE"), {"guidance_embed": True}),   # Flux 2 [dev]
    (("Flux2", "Flux", "BASE"), {}),
    (("Flux", "BASE"), {"guidance_embed": False}),           # the setting marks klein only on a Flux2 config
    (("WAN21_T2V", "BASE"), {}),
])
def test_not_distilled(config, settings):
    assert ic.build_card(("Model", "BaseModel"), config, config_settings=settings).distilled is None


# The families ComfyUI v0.34-v0.38 added, as their model classes and diffusion models are named there
# (docs/families-after-0.33.md): model-class MRO, block lists the loaded model would have, its diffusion model,
# the family and a word of the reason it is kept at whole-model level.
AFTER_033 = [
    (("QwenImage21", "QwenImage", "BaseModel"), {"transformer_blocks": 3},
     ic.DiffusionFacts(("QwenImage21Transformer2DModel",), (("forward", "QwenImage21Transformer2DModel"),
                                                             ("_forward", "QwenImage21Transformer2DModel"))),
     "qwen_image21", "K/V cache"),
    (("MingImage", "Lumina2", "BaseModel"), {"layers": 3, "noise_refiner": 1, "context_refiner": 1},
     ic.DiffusionFacts(("NextDiT",), (("forward", "NextDiT"), ("_forward", "NextDiT"))),
     "ming_image", "no block-replacement slots"),
    (("SenseNovaU15", "BaseModel"), {},
     ic.DiffusionFacts(("SenseNovaU15",), (("forward", "SenseNovaU15"), ("_forward", "SenseNovaU15"))),
     "sensenova_u15", "never consults"),
    (("Kandinsky6", "Kandinsky5", "BaseModel"), {"visual_blocks": 3, "video_text_transformer_blocks": 1},
     ic.DiffusionFacts(("Kandinsky6NativeAVDiT", "Kandinsky6"), (("_forward", "Kandinsky6NativeAVDiT"),
                                                                  ("forward", "Kandinsky6"))),
     "kandinsky6", "'visual' and 'audio'"),
    (("Prism", "BaseModel"), {"fusion_blocks": 3, "remaining_video_blocks": 1},
     ic.DiffusionFacts(("Prism",), (("forward", "Prism"),)), "prism", "no block-replacement slots"),
]


@pytest.mark.parametrize("mro, counts, diffusion, family, why", AFTER_033, ids=[row[0][0] for row in AFTER_033])
def test_families_after_033_get_their_own_card_at_whole_model_level_with_a_reason(mro, counts, diffusion, family,
                                                                                  why):
    """Each new family maps to its own card, not its parent's (Qwen-Image's, Lumina 2's, Kandinsky 5's), and is
    offered whole-model caching only: a block-level node is refused with the family's own reason, while a
    whole-model node is accepted."""
    card = ic.build_card(mro, mro[0], group_counts=counts, diffusion=diffusion, signals=SIGNALS)
    assert card.family == family and card.name == mro[0]
    assert card.levels == frozenset({ic.Granularity.MODEL}) and card.groups == () and card.total_blocks == 0
    assert card.blocks_off is not None and mro[0] in card.blocks_off and why in card.blocks_off
    assert card.teacache is None and card.magcache is None and card.signals == frozenset()
    assert not card.offers(ic.Granularity.BLOCKS) and card.offers(ic.Granularity.MODEL)
    with pytest.raises(ic.ChainError) as e:
        block_decider().validate_for(card, allow_distilled=True)
    assert "node 4" in str(e.value) and card.blocks_off in str(e.value)
    ic.InterceptorChain.of([ic.FixedCadence(node="Fixed Cadence (node 5)")]).validate_for(card)


def test_qwen_image21_does_not_inherit_qwen_images_block_layout():
    """Qwen-Image 2.1's model class subclasses Qwen-Image's and its blocks sit under the same attribute, but its own
    entry decides: Qwen-Image's ("double_block", img + txt) layout is never applied to its single-stream blocks."""
    qwen = ic.build_card(("QwenImage", "BaseModel"), "QwenImage", group_counts={"transformer_blocks": 3})
    assert [(g.name, g.outputs) for g in qwen.groups] == [("double_block", ("img", "txt"))]
    card = ic.build_card(("QwenImage21", "QwenImage", "BaseModel"), "QwenImage21",
                         group_counts={"transformer_blocks": 3})
    assert card.family == "qwen_image21" and card.groups == ()
    # even if its diffusion model were Qwen-Image's own, the entry of the class itself wins
    same = ic.DiffusionFacts(("QwenImageTransformer2DModel",), (("forward", "QwenImageTransformer2DModel"),))
    card = ic.build_card(("QwenImage21", "QwenImage", "BaseModel"), group_counts={"transformer_blocks": 3},
                         diffusion=same)
    assert card.family == "qwen_image21" and ic.Granularity.BLOCKS not in card.levels


def test_a_later_subclass_of_a_new_family_keeps_its_reason():
    """A class ComfyUI might derive from one of them later is carded by its closest known ancestor, and keeps that
    family's reason under its own name."""
    card = ic.build_card(("QwenImage21Edit", "QwenImage21", "QwenImage", "BaseModel"),
                         group_counts={"transformer_blocks": 3})
    assert card.family == "qwen_image21" and card.levels == frozenset({ic.Granularity.MODEL})
    assert card.blocks_off.startswith("transformer-block caching is off for QwenImage21Edit") \
        and "K/V cache" in card.blocks_off
