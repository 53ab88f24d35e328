"""Cached Sampler's developer wing (tools/), installed in development mode by tools/setup.sh; see tools/README.md."""
