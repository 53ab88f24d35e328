"""The caching methods the shared guarantees run over: one list, so a guarantee cannot silently leave a method
out. Each entry builds a chain (the core's objects) with settings that skip work on the tests' tiny Flux
(8 steps of euler at cfg 3); ``NEVER_SKIPS`` holds the settings of the same methods that never skip."""
from __future__ import annotations

WINDOW = dict(start_percent=0.0, end_percent=1.0)


def skipping(ic) -> dict[str, list]:
    return {
        "fixed cadence": [ic.FixedCadence(interval=2)],
        "fixed cadence + taylorseer": [ic.FixedCadence(interval=3), ic.TaylorSeer(order=2)],
        # window 4, degree 2: the Chebyshev fit takes part from the 4th computed step (step 6 of 8) on
        "fixed cadence + spectrum": [ic.FixedCadence(interval=2), ic.Spectrum(window=4, degree=2)],
        "adaptive": [ic.AdaptiveCache(threshold=0.6, **WINDOW)],
        "dbcache": [ic.DBCache(threshold=1.0, warmup=0.0)],
        "dbcache + taylorseer": [ic.DBCache(front=1, back=1, threshold=50.0, warmup=0.0, max_consecutive_cached=2,
                                            **WINDOW), ic.TaylorSeer(order=2)],
        "fbcache": [ic.FirstBlockCache(threshold=50.0, warmup=0.0, **WINDOW)],
        "teacache": [ic.TeaCache(threshold=100.0, **WINDOW)],
        "magcache": [ic.MagCache(threshold=100.0, max_skips=2, retention=0.0, **WINDOW)],
        "guidance cache": [ic.GuidanceCache(interval=2, **WINDOW)],
        "guidance cache + fixed cadence": [ic.FixedCadence(interval=2), ic.GuidanceCache(interval=3, **WINDOW)],
    }


def never_skips(ic) -> dict[str, list]:
    return {
        "fixed cadence": [ic.FixedCadence(interval=1)],
        "fixed cadence + taylorseer": [ic.FixedCadence(interval=1), ic.TaylorSeer(order=2)],
        "fixed cadence + spectrum": [ic.FixedCadence(interval=1), ic.Spectrum(window=4, degree=2)],
        "adaptive": [ic.AdaptiveCache(threshold=0.0, **WINDOW)],
        "dbcache": [ic.DBCache(threshold=0.0, warmup=0.0)],
        "dbcache + taylorseer": [ic.DBCache(front=1, back=1, threshold=0.0, warmup=0.0, **WINDOW),
                                 ic.TaylorSeer(order=2)],
        "fbcache": [ic.FirstBlockCache(threshold=0.0, warmup=0.0, **WINDOW)],
        "teacache": [ic.TeaCache(threshold=0.0, **WINDOW)],
        "magcache": [ic.MagCache(threshold=0.0, retention=0.0, **WINDOW)],
        "guidance cache": [ic.GuidanceCache(interval=1, **WINDOW)],
        "guidance cache + fixed cadence": [ic.FixedCadence(interval=1), ic.GuidanceCache(interval=1, **WINDOW)],
    }


NAMES = ["fixed cadence", "fixed cadence + taylorseer", "fixed cadence + spectrum", "adaptive", "dbcache",
         "dbcache + taylorseer", "fbcache", "teacache", "magcache", "guidance cache", "guidance cache + fixed cadence"]
# Methods that act on the negative CFG branch only: at cfg 1 ComfyUI runs none, so they have nothing to skip.
NEGATIVE_BRANCH_ONLY = {"guidance cache"}


def skipped_work(run) -> bool:
    """Whether a run (LoopState) really skipped model work: a step, blocks, or a branch's rows."""
    return any(r.skipped or r.branches.get("uncond") is False for r in run.records)
