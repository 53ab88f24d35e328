"""Helpers of the tests (tiny models, their nodes and graphs, the method list), also used by the bench and the
studies: ``cached_sampler_dev.support`` of the developer wing installed by tools/setup.sh (tools/pyproject.toml)."""
