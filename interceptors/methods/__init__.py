"""The caching methods, one module each: its rule (the Interceptor classes) and its config nodes' declarations
(``SPECS``, see ``interceptors/spec.py``). :data:`SPECS` lists every config node in the order the pack registers
them; nodes, node pages, the memory table, the bench and the tests read it."""
from __future__ import annotations

from ..spec import MethodSpec
from . import (adaptive, dbcache, fixed_cadence, guidance, magcache, partial_last_step, spectrum, taylorseer, teacache,
               verified)

SPECS: tuple[MethodSpec, ...] = (*fixed_cadence.SPECS, *dbcache.SPECS, *partial_last_step.SPECS,
                                 *taylorseer.SPECS, *spectrum.SPECS, *adaptive.SPECS, *teacache.SPECS,
                                 *magcache.SPECS, *guidance.SPECS, *verified.SPECS)


def spec(name: str) -> MethodSpec:
    """The spec of config node ``name`` (its id without the pack's prefix)."""
    return next(s for s in SPECS if s.name == name)
