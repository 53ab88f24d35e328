"""Writes docs/families.md: every supported_models config of a ComfyUI, the card the pack gives it, and the test
that shows whole-model caching on it.

    python3 tools/generate/families_table.py            # ComfyUI at COMFYUI_PATH or ~/ComfyUI
    python3 tools/generate/families_table.py --check    # exit 1 when docs/families.md differs from what it would write

Each config that tests/support/tiny_configs.py can build is built tiny through ComfyUI's real classes and carded by the
pack's own ``adapter.model_card`` (the card rule of interceptors/cards.py, FAMILIES entries included), so the
table follows the rule and the FAMILIES table as they change. A config not built tiny is carded from its classes
alone (no block counts, so at most whole model) and its row says why it is not built.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/: devkit puts the development folders on sys.path
import devkit  # noqa: E402,F401
DOC = ROOT / "docs" / "families.md"
TEST = "tests/integration/test_families.py::test_whole_model_caching_on_every_config"


def _setup_comfy():
    """Import ComfyUI headless on the CPU and the pack as a package; returns the pack's adapter."""
    from devkit import pack
    from devkit.comfy_harness import import_headless
    import_headless(Path(os.environ.get("COMFYUI_PATH", "~/ComfyUI")).expanduser())
    return pack.load("adapter")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _card_without_model(adapter, name):
    """The card of a config not built tiny, from its classes alone (no diffusion model, no block counts)."""
    import comfy.model_base
    import tiny_configs
    cls = tiny_configs.config_class(name)
    base_name = tiny_configs._model_base_name(name)
    base = getattr(comfy.model_base, base_name, None) if base_name else None
    mro = tuple(c.__name__ for c in base.__mro__) if base is not None else (base_name or "?",)
    config_mro = tuple(c.__name__ for c in cls.__mro__ if c is not object)
    settings = {k: v for k, v in cls.unet_config.items() if isinstance(v, (bool, int, float, str))}
    return adapter.cards.build_card(mro, config_mro, config_settings=settings)


def rows(adapter) -> list[list[str]]:
    import torch
    import tiny_configs
    out = []
    for name in tiny_configs.config_names():
        reason = tiny_configs.why_unbuilt(name)
        diffusion = "?"
        if reason is None:
            patcher = tiny_configs.build(name)
            card = adapter.model_card(patcher)
            model_class = type(patcher.model).__name__
            diffusion = type(patcher.model.diffusion_model).__name__
            del patcher
            test = f"`{TEST}[{name}-cadence]`, `[{name}-adaptive]`"
        else:
            card = _card_without_model(adapter, name)
            model_class = card.name.split(" (")[0]
            test = f"not built tiny: {reason}"
        if any(level.value == "blocks" for level in card.levels):
            groups = ", ".join(f"{g.count} {g.name}" for g in card.groups)
            level = f"blocks ({groups}) and whole model"
        else:
            level = "whole model"
        level_notes = [n for n in card.notes if n.startswith("transformer-block")]
        if level_notes:
            level += ": " + "; ".join(level_notes)
        elif level == "whole model" and reason is None:
            level += ": no transformer-block slots known for this model class"
        curves = f"TeaCache {card.teacache or '-'}, MagCache {card.magcache or '-'}"
        curve_notes = [n for n in card.notes if "curves" in n]
        if curve_notes:
            curves += " (" + "; ".join(curve_notes) + ")"
        out.append([name, model_class, diffusion, level, card.distilled or "no", curves, test])
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return out


def render(adapter, version: str) -> str:
    header = ["Config", "Model class", "Diffusion model", "Level offered", "Distilled (refused without "
              "allow_distilled)", "Published curves", "Whole-model test"]
    lines = [
        "# Model families: what the pack offers on each",
        "",
        f"Every `comfy.supported_models` config of ComfyUI {version}, with the model card the pack gives it "
        "(interceptors/cards.py, through adapter.model_card on a tiny model built through the config's real "
        "classes). Whole-model methods (Fixed Cadence, Adaptive Cache, Guidance Cache, Auto Calibrate) work on every "
        "model; block-level methods (DBCache, First Block Cache, TeaCache, MagCache) only where the level says "
        "blocks; TeaCache/MagCache with model_type auto only where a published curve is listed. Families of "
        "ComfyUI versions newer than this one, which no test has run yet, are in "
        "[families-after-0.33.md](families-after-0.33.md), as read in their code. Generated by "
        "`python3 tools/generate/families_table.py`; do not edit by hand.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for row in rows(adapter):
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    return "\n".join(lines) + "\n"


def comfy_version() -> str:
    try:
        import comfyui_version
        return comfyui_version.__version__
    except Exception:
        return "unknown"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare with docs/families.md")
    options = parser.parse_args(argv)
    adapter = _setup_comfy()
    text = render(adapter, comfy_version())
    if options.check:
        same = DOC.is_file() and DOC.read_text() == text
        print("docs/families.md is current" if same else "docs/families.md differs: run tools/generate/families_table.py")
        return 0 if same else 1
    DOC.write_text(text)
    print(f"wrote {DOC.relative_to(ROOT)} ({text.count(chr(10)) - 6} configs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
