"""Config nodes keep their schemas: saved workflows store widget values by position and name node types by id, so
a node's id, display name, description, inputs (names, order, defaults, ranges, choices, tooltips) and outputs must
stay what they were. ``tests/support/config_node_schemas.json`` froze them (the fields of ``/object_info`` that
every supported ComfyUI reports alike); a change that is meant (a new input at the end) updates it in the same
commit, and a new config node adds its entry (its ``/object_info`` entry, these fields) in the commit that adds
it."""
import json
from pathlib import Path

import pytest

from cached_sampler_dev.devkit import workflow_api

SNAPSHOT = Path(__file__).resolve().parents[1] / "support" / "config_node_schemas.json"


@pytest.fixture(scope="module")
def info(comfy):
    return workflow_api.object_info()


def test_every_config_node_schema_is_the_frozen_one(info):
    frozen = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    assert len(frozen) >= 11
    for node_id, expected in frozen.items():
        assert node_id in info, f"config node {node_id} is gone"
        current = {key: info[node_id].get(key) for key in expected}
        for key, value in expected.items():
            assert current[key] == value, f"{node_id}.{key} changed: {current[key]!r} (frozen: {value!r})"


def test_every_config_node_is_frozen(comfy):
    configs = comfy.module("nodes.configs")
    frozen = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    nodes = [node.define_schema().node_id for node in configs.CONFIG_NODES]
    assert len(nodes) == len(set(nodes))
    assert set(nodes) == set(frozen), (f"not frozen: {sorted(set(nodes) - set(frozen))}; "
                                       f"gone: {sorted(set(frozen) - set(nodes))}")
