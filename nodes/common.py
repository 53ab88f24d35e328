"""Pieces shared by the pack's nodes: the chain socket type, naming, and input helpers."""
from __future__ import annotations

from comfy_api.latest import io

from ..interceptors import Interceptor, InterceptorChain, InterceptorError

PREFIX = "CachedSampler"
CATEGORY = "sampling/cached"
CONFIG_CATEGORY = "sampling/cached/interceptors"

Chain = io.Custom("CACHED_SAMPLER_CHAIN")


def node_label(display_name: str, unique_id) -> str:
    """How error messages point at a node: its title plus its id in the graph."""
    return f"{display_name} (node {unique_id})" if unique_id not in (None, "") else display_name


def chain_input(optional: bool = True, name: str = "interceptors"):
    return Chain.Input(name, optional=optional, tooltip=(
        "Interceptors to run, from a caching node (Fixed Cadence, DBCache, ...). Chain several caching nodes "
        "by connecting one's output to the next one's input. Leave empty for no caching."))


def chain_output():
    return Chain.Output(display_name="interceptors", tooltip="The chain so far, with this node's interceptor "
                        "appended. Connect to a Cached Sampler, Apply Interceptors, or another caching node.")


def as_chain(value, node: str) -> InterceptorChain:
    """The chain a socket delivered, or a clear error for anything else."""
    if value is None:
        return InterceptorChain()
    if isinstance(value, InterceptorChain):
        return value
    if type(value).__name__ == "InterceptorChain":
        raise InterceptorError(f"{node}: the interceptor chain comes from another copy of this node pack; "
                               f"restart ComfyUI after updating it.")
    raise InterceptorError(f"{node}: input 'interceptors' expects an interceptor chain from a caching node, "
                           f"got {type(value).__name__}.")


def extend(upstream, interceptor: Interceptor, node: str) -> InterceptorChain:
    """``upstream`` plus ``interceptor``, validated now so errors name this node before any sampling."""
    return as_chain(upstream, node).then(interceptor.with_node(node))
