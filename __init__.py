"""Cached Sampler: training-free caching for ComfyUI sampling, through ComfyUI's official hooks.

``interceptors/`` is plain torch and imports without ComfyUI; the nodes load only inside ComfyUI.
"""
WEB_DIRECTORY = "./web"

try:  # only register nodes when running inside ComfyUI
    import comfy.model_patcher  # noqa: F401
except ImportError:
    pass
else:
    from .nodes import comfy_entrypoint  # noqa: F401

__all__ = ["WEB_DIRECTORY", "comfy_entrypoint"]
