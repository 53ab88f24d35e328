"""The pack's ComfyUI nodes (thin: they build chains and hand them to the adapter)."""
from comfy_api.latest import ComfyExtension, io

from .calibrate import CALIBRATION_NODES
from .configs import CONFIG_NODES
from .demo import DEMO_NODES
from .raylight import RAYLIGHT_NODES
from .sampler import SAMPLER_NODES

NODES: list[type[io.ComfyNode]] = [*SAMPLER_NODES, *CONFIG_NODES, *CALIBRATION_NODES, *DEMO_NODES, *RAYLIGHT_NODES]


class CachedSamplerExtension(ComfyExtension):
    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        return NODES


async def comfy_entrypoint() -> ComfyExtension:
    return CachedSamplerExtension()
