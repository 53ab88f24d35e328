"""The caching methods the shared guarantees run over: one list, so a guarantee cannot silently leave a method
out. Each entry builds a chain (the core's objects) with settings that skip work on the tests' tiny Flux
(8 steps of euler at cfg 3); :func:`never_skips` holds the settings of the same methods that never skip.
:data:`NODES` holds the same methods as config nodes, for the guarantees that run prompts through ComfyUI's
executor (:func:`build` adds them to a prompt)."""
from __future__ import annotations

WINDOW = dict(start_percent=0.0, end_percent=1.0)


def skipping(ic) -> dict[str, list]:
    return {
        "fixed cadence": [ic.FixedCadence(interval=2)],
        "fixed cadence + taylorseer": [ic.FixedCadence(interval=3), ic.TaylorSeer(order=2)],
        # window 4, degree 2: the Chebyshev fit takes part from the 4th computed step (step 6 of 8) on
        "fixed cadence + spectrum": [ic.FixedCadence(interval=2), ic.Spectrum(window=4, degree=2)],
        # Spectrum's growing schedule: 8 steps computed at 0, 1, 3, 6 and the last (gaps 1, 2, 3)
        "growing cadence + spectrum": [ic.FixedCadence(interval=1, growth=1.0), ic.Spectrum(window=4, degree=1)],
        "adaptive": [ic.AdaptiveCache(threshold=0.6, **WINDOW)],
        "dbcache": [ic.DBCache(threshold=1.0, warmup=0.0)],
        "dbcache + taylorseer": [ic.DBCache(front=1, back=1, threshold=50.0, warmup=0.0, max_consecutive_cached=2,
                                            **WINDOW), ic.TaylorSeer(order=2)],
        "fbcache": [ic.FirstBlockCache(threshold=50.0, warmup=0.0, **WINDOW)],
        "teacache": [ic.TeaCache(threshold=100.0, **WINDOW)],
        "magcache": [ic.MagCache(threshold=100.0, max_consecutive_cached=2, retention=0.0, **WINDOW)],
        "guidance cache": [ic.GuidanceCache(interval=2, **WINDOW)],
        "guidance cache + fixed cadence": [ic.FixedCadence(interval=2), ic.GuidanceCache(interval=3, **WINDOW)],
        # threshold 1.5: 1 - cos < 1.5 for every pair of predictions but opposite ones, so it skips here
        "guidance agreement": [ic.GuidanceCache(interval=3, mode="agreement", threshold=1.5, **WINDOW)],
        "verified forecast + taylorseer": [ic.VerifiedForecast(threshold=10.0, **WINDOW), ic.TaylorSeer(order=1)],
        "verified blocks + taylorseer": [ic.VerifiedBlockCache(front=1, back=1, threshold=10.0, **WINDOW),
                                         ic.TaylorSeer(order=2)],
    }


def never_skips(ic) -> dict[str, list]:
    return {
        "fixed cadence": [ic.FixedCadence(interval=1)],
        "fixed cadence + taylorseer": [ic.FixedCadence(interval=1), ic.TaylorSeer(order=2)],
        "fixed cadence + spectrum": [ic.FixedCadence(interval=1), ic.Spectrum(window=4, degree=2)],
        "growing cadence + spectrum": [ic.FixedCadence(interval=1, growth=0.0), ic.Spectrum(window=4, degree=1)],
        "adaptive": [ic.AdaptiveCache(threshold=0.0, **WINDOW)],
        "dbcache": [ic.DBCache(threshold=0.0, warmup=0.0)],
        "dbcache + taylorseer": [ic.DBCache(front=1, back=1, threshold=0.0, warmup=0.0, **WINDOW),
                                 ic.TaylorSeer(order=2)],
        "fbcache": [ic.FirstBlockCache(threshold=0.0, warmup=0.0, **WINDOW)],
        "teacache": [ic.TeaCache(threshold=0.0, **WINDOW)],
        "magcache": [ic.MagCache(threshold=0.0, retention=0.0, **WINDOW)],
        "guidance cache": [ic.GuidanceCache(interval=1, **WINDOW)],
        "guidance cache + fixed cadence": [ic.FixedCadence(interval=1), ic.GuidanceCache(interval=1, **WINDOW)],
        "guidance agreement": [ic.GuidanceCache(interval=3, mode="agreement", threshold=0.0, **WINDOW)],
        "verified forecast + taylorseer": [ic.VerifiedForecast(threshold=0.0, **WINDOW), ic.TaylorSeer(order=1)],
        "verified blocks + taylorseer": [ic.VerifiedBlockCache(front=1, back=1, threshold=0.0, **WINDOW),
                                         ic.TaylorSeer(order=2)],
    }


NAMES = ["fixed cadence", "fixed cadence + taylorseer", "fixed cadence + spectrum", "growing cadence + spectrum", "adaptive", "dbcache",
         "dbcache + taylorseer", "fbcache", "teacache", "magcache", "guidance cache", "guidance cache + fixed cadence",
         "guidance agreement", "verified forecast + taylorseer", "verified blocks + taylorseer"]
# Methods that act on the negative CFG branch only: at cfg 1 ComfyUI runs none, so they have nothing to skip.
NEGATIVE_BRANCH_ONLY = {"guidance cache", "guidance agreement"}


def skipped_work(run) -> bool:
    """Whether a run (LoopState) really skipped model work: a step, blocks, or a branch's rows."""
    return any(r.skipped or r.branches.get("uncond") is False for r in run.records)


# The same methods as config nodes: name -> [(node type, inputs that skip here, inputs that never skip), ...] in
# chain order (the decider first). Widgets are given in full, as a saved workflow has them.
_FC = "CachedSamplerFixedCadence"
_TS = "CachedSamplerTaylorSeer"
_DB = dict(max_cached_steps=-1, **WINDOW)
NODES: dict[str, list[tuple[str, dict, dict]]] = {
    "fixed cadence": [(_FC, dict(interval=2, **WINDOW), dict(interval=1, **WINDOW))],
    "fixed cadence + taylorseer": [(_FC, dict(interval=3, **WINDOW), dict(interval=1, **WINDOW)),
                                   (_TS, dict(order=2), dict(order=2))],
    "fixed cadence + spectrum": [(_FC, dict(interval=2, **WINDOW), dict(interval=1, **WINDOW)),
                                 ("CachedSamplerSpectrum", dict(window=4, degree=2, ridge=0.1, blend=0.5, order=1),
                                  dict(window=4, degree=2, ridge=0.1, blend=0.5, order=1))],
    "growing cadence + spectrum": [(_FC, dict(interval=1, growth=1.0, **WINDOW), dict(interval=1, growth=0.0, **WINDOW)),
                                   ("CachedSamplerSpectrum", dict(window=4, degree=1, ridge=0.1, blend=0.5, order=1),
                                    dict(window=4, degree=1, ridge=0.1, blend=0.5, order=1))],
    "adaptive": [("CachedSamplerAdaptiveCache", dict(threshold=2.0, max_consecutive_cached=-1, **WINDOW),
                  dict(threshold=0.0, max_consecutive_cached=-1, **WINDOW))],
    "dbcache": [("CachedSamplerDBCache", dict(Fn=1, Bn=0, threshold=1.0, warmup=0.0, max_consecutive_cached=3, **_DB),
                 dict(Fn=1, Bn=0, threshold=0.0, warmup=0.0, max_consecutive_cached=3, **_DB))],
    "dbcache + taylorseer": [("CachedSamplerDBCache",
                              dict(Fn=1, Bn=1, threshold=50.0, warmup=0.0, max_consecutive_cached=2, **_DB),
                              dict(Fn=1, Bn=1, threshold=0.0, warmup=0.0, max_consecutive_cached=2, **_DB)),
                             (_TS, dict(order=2), dict(order=2))],
    "fbcache": [("CachedSamplerFirstBlockCache", dict(threshold=50.0, warmup=0.0, max_consecutive_cached=3, **_DB),
                 dict(threshold=0.0, warmup=0.0, max_consecutive_cached=3, **_DB))],
    # Wan's fitted polynomial turns the random tiny Wan's changes into values far above any threshold: the gentler
    # LTXV fit, chosen explicitly, skips on every tiny model here
    "teacache": [("CachedSamplerTeaCache", dict(threshold=100.0, model_type="ltxv", **WINDOW),
                  dict(threshold=0.0, model_type="auto", **WINDOW))],
    "magcache": [("CachedSamplerMagCache",
                  dict(threshold=100.0, K=2, retention_ratio=0.0, model_type="auto", custom_ratios="", **WINDOW),
                  dict(threshold=0.0, K=2, retention_ratio=0.0, model_type="auto", custom_ratios="", **WINDOW))],
    "guidance cache": [("CachedSamplerGuidanceCache",
                        dict(interval=2, mode="cadence", threshold=0.0, estimate="difference forecast", **WINDOW),
                        dict(interval=1, mode="cadence", threshold=0.0, estimate="difference forecast", **WINDOW))],
    "guidance cache + fixed cadence": [
        (_FC, dict(interval=2, **WINDOW), dict(interval=1, **WINDOW)),
        ("CachedSamplerGuidanceCache",
         dict(interval=3, mode="cadence", threshold=0.0, estimate="difference forecast", **WINDOW),
         dict(interval=1, mode="cadence", threshold=0.0, estimate="difference forecast", **WINDOW))],
    "guidance agreement": [("CachedSamplerGuidanceCache",
                            dict(interval=3, mode="agreement", threshold=1.5, estimate="difference forecast", **WINDOW),
                            dict(interval=3, mode="agreement", threshold=0.0, estimate="difference forecast", **WINDOW))],
    "verified forecast + taylorseer": [
        ("CachedSamplerVerifiedForecast", dict(threshold=10.0, max_consecutive_cached=-1, **WINDOW),
         dict(threshold=0.0, max_consecutive_cached=-1, **WINDOW)),
        (_TS, dict(order=1), dict(order=1))],
    "verified blocks + taylorseer": [
        ("CachedSamplerVerifiedBlockCache",
         dict(Fn=1, Bn=1, threshold=10.0, refresh_ratio=2.0, max_consecutive_cached=-1, **WINDOW),
         dict(Fn=1, Bn=1, threshold=0.0, refresh_ratio=2.0, max_consecutive_cached=-1, **WINDOW)),
        (_TS, dict(order=2), dict(order=2))],
}
assert list(NODES) == NAMES


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
