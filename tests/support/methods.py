"""The caching methods the shared guarantees run over: one list, so a guarantee cannot silently leave a method
out. Each method declares its examples next to its rule (``examples`` of its spec in ``interceptors/methods/``):
chains of config nodes with settings that skip work on the tests' tiny models (8 steps of euler at cfg 3) and
settings of the same chains that never skip. :func:`skipping` and :func:`never_skips` build them as the core's
objects (the node's own ``make``), :data:`NODES` as config nodes for the guarantees that run prompts through
ComfyUI's executor (:func:`build` adds them to a prompt)."""
from __future__ import annotations

import importlib

from ..devkit.pack import load

PREFIX = "CachedSampler"
EXAMPLES = [example for spec in load("interceptors.methods").SPECS for example in spec.examples]
NAMES = [example.name for example in EXAMPLES]
assert len(set(NAMES)) == len(NAMES), f"two examples share a name: {NAMES}"
# Methods that act on the negative CFG branch only: at cfg 1 ComfyUI runs none, so they have nothing to skip.
NEGATIVE_BRANCH_ONLY = {example.name for example in EXAMPLES if example.negative_branch_only}
# name -> [(node type, inputs that skip here, inputs that never skip), ...] in chain order (the decider first).
# Widgets are given in full, as a saved workflow has them.
NODES: dict[str, list[tuple[str, dict, dict]]] = {
    example.name: [(PREFIX + node, dict(skips), dict(never)) for node, skips, never in example.chain]
    for example in EXAMPLES}


def _chains(ic, skips: bool) -> dict[str, list]:
    """The examples as interceptors of ``ic`` (the interceptors package ComfyUI loaded, or the core's)."""
    specs = {spec.name: spec for spec in importlib.import_module(f"{ic.__name__}.methods").SPECS}
    chains = {}
    for example in EXAMPLES:
        chain = []
        for i, (node, skipping_values, never_values) in enumerate(example.chain):
            values = {**specs[node].defaults(), **(skipping_values if skips else never_values)}
            if skips and i == 0:
                values.update(example.core)
            chain.append(specs[node].make(**values))
        chains[example.name] = chain
    return chains


def skipping(ic) -> dict[str, list]:
    return _chains(ic, skips=True)


def never_skips(ic) -> dict[str, list]:
    return _chains(ic, skips=False)


def skipped_work(run) -> bool:
    """Whether a run (LoopState) really skipped model work: a step, blocks, or a branch's rows."""
    return any(r.skipped or r.branches.get("uncond") is False for r in run.records)


def build(prompt: dict, name: str, skips: bool = True, prefix: str = "method") -> str:
    """Add method ``name``'s config nodes to ``prompt``, chained; the id of the last one (the chain's output)."""
    last = None
    for i, (node_type, skipping_inputs, never_inputs) in enumerate(NODES[name]):
        inputs = dict(skipping_inputs if skips else never_inputs)
        if last is not None:
            inputs["interceptors"] = [last, 0]
        last = f"{prefix}{i}"
        prompt[last] = {"class_type": node_type, "inputs": inputs}
    return last
