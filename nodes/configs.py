"""Interceptor-config nodes: each appends one caching method to a chain. Pure data, no state.

Every node has the same shape (its own widgets, an optional upstream chain, a chain output), so each is built
by :func:`config_node` from its method's declaration (``interceptors/methods/``, listed by ``SPECS``): the plain
inputs there become ComfyUI's. Ranges are checked by ComfyUI when the prompt is validated; what needs several
inputs (start below end, Fn + Bn against the model) is checked when the chain is built, naming the node and the
input, before any sampler runs. New widgets go at the end of a node's list: saved workflows store widget values
by position.
"""
from __future__ import annotations

from comfy_api.latest import io

from ..interceptors.methods import SPECS
from ..interceptors.spec import Input, MethodSpec
from .common import CONFIG_CATEGORY, PREFIX, chain_input, chain_output, extend, node_label


def comfy_input(spec: Input):
    """ComfyUI's input for a plain one: the same name, default, range, step and tooltip."""
    common = dict(optional=spec.optional, tooltip=spec.tooltip or None)
    if spec.type == "int":
        return io.Int.Input(spec.name, default=spec.default, min=spec.min, max=spec.max, step=spec.step, **common)
    if spec.type == "float":
        return io.Float.Input(spec.name, default=spec.default, min=spec.min, max=spec.max, step=spec.step, **common)
    if spec.type == "bool":
        return io.Boolean.Input(spec.name, default=spec.default, **common)
    if spec.type == "choice":
        return io.Combo.Input(spec.name, options=list(spec.choices), default=spec.default, **common)
    return io.String.Input(spec.name, default=spec.default, multiline=spec.multiline, **common)


def config_node(spec: MethodSpec) -> type[io.ComfyNode]:
    """A config node class: ``spec.make(**widget values)`` builds its interceptor."""

    class ConfigNode(io.ComfyNode):
        @classmethod
        def define_schema(cls):
            return io.Schema(node_id=f"{PREFIX}{spec.name}", display_name=spec.display_name,
                             category=CONFIG_CATEGORY, description=spec.description,
                             inputs=[*map(comfy_input, spec.inputs), chain_input()], outputs=[chain_output()],
                             hidden=[io.Hidden.unique_id])

        @classmethod
        def execute(cls, interceptors=None, **values) -> io.NodeOutput:
            node = node_label(spec.display_name, cls.hidden.unique_id)
            return io.NodeOutput(extend(interceptors, spec.make(**values), node))

    ConfigNode.__name__ = ConfigNode.__qualname__ = f"{spec.name}Node"
    return ConfigNode


CONFIG_NODES = [config_node(spec) for spec in SPECS]
