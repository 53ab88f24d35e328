"""Apply Interceptors (Raylight): install a chain inside every Ray actor of komikndr/raylight.

Raylight loads and samples the model inside its Ray actors, so a MODEL patched here never reaches them. This
node sends the install to every actor through Raylight's ``ray_patch`` mechanism (the actor's model is replaced
by the function's result) and asks rank 0 what now runs there. The shipped code lives in ``adapter/raylight.py``.
"""
from __future__ import annotations

from comfy_api.latest import io

from ..adapter import raylight
from .common import CATEGORY, PREFIX, Chain, as_chain, node_label
from .sampler import safety_inputs

RayActors = io.Custom("RAY_ACTORS")


class ApplyInterceptorsRaylight(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id=f"{PREFIX}ApplyInterceptorsRaylight",
            display_name="Apply Interceptors (Raylight)",
            category=CATEGORY,
            description=("Installs an interceptor chain on the model inside every Raylight actor (one per GPU), "
                         "replacing the chain installed there before. With nothing connected to 'interceptors' it "
                         "removes the chain from the actors. Under sequence parallelism (xDiT USP) all ranks reduce "
                         "the change metrics together and agree on every skip."),
            inputs=[
                RayActors.Input("ray_actors", tooltip=(
                    "Raylight's actors, from a Raylight model loader (after its LoRA or ModelSampling nodes). "
                    "Connect the output to Raylight's sampler.")),
                Chain.Input("interceptors", optional=True, tooltip=(
                    "Interceptors to run, from a caching node (Fixed Cadence, DBCache, ...). The actors keep their "
                    "model across prompts, and the chain with it: leave this empty to remove the chain installed "
                    "there before.")),
                *safety_inputs(),
            ],
            outputs=[RayActors.Output(display_name="ray_actors", tooltip=(
                "The same actors, now running the chain on every sampling run (or no chain, when none was "
            "connected)."))],
            hidden=[io.Hidden.unique_id],
        )

    @classmethod
    def execute(cls, ray_actors, interceptors=None, allow_distilled=False, cache_on_cpu=False) -> io.NodeOutput:
        node = node_label("Apply Interceptors (Raylight)", cls.hidden.unique_id)
        chain = as_chain(interceptors, node)
        try:
            text = raylight.install_on_actors(ray_actors, chain, allow_distilled=allow_distilled, cache_on_cpu=cache_on_cpu)
        except ValueError as e:
            raise ValueError(f"{node}: {e}") from None
        return io.NodeOutput(ray_actors, ui={"text": (text,)})


RAYLIGHT_NODES = [ApplyInterceptorsRaylight]
