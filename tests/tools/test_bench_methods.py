"""The bench and the tests measure the same methods: every decider node of the shared method list
(tests/support/methods.py) is discovered and swept by the bench, so a method added to the list and not to the
bench's sweeps (or the other way round) fails here instead of drifting. The bench keeps its own settings per
method: its sweeps are tuned to the trained digits model, the list's to the random tiny models."""
from cached_sampler_dev.support import methods


def test_the_bench_sweeps_every_method_of_the_shared_list(comfy):
    import nodes
    from cached_sampler_dev.bench.bench_discover import Config, discover
    found, skipped = discover(nodes, Config())
    benched = {m.node for m in found}
    listed = {entries[0][0] for entries in methods.NODES.values()}
    assert listed - benched == set(), f"in the shared list, not on the bench: {sorted(listed - benched)}; {skipped}"
    pack = {n for n in benched if n.startswith("CachedSampler")}
    calibrations = {"CachedSamplerAutoCalibrate", "CachedSamplerMagCacheCalibrate"}  # make a chain from a run
    assert pack - listed - calibrations == set(), f"on the bench, not in the shared list: {sorted(pack - listed)}"


def test_the_bench_measures_the_levels_asked_for_and_only_names_a_method_at_every_level(comfy):
    import nodes
    from cached_sampler_dev.bench.bench import parse_args
    from cached_sampler_dev.bench.bench_discover import discover
    found, _ = discover(nodes, parse_args(["--levels", "model,features", "--only", "fixed_cadence+ts1,adaptive",
                                           "--taylorseer", "1", "--no-spectrum"]))
    keys = {m.key: m for m in found}
    assert set(keys) == {"fixed_cadence+ts1", "fixed_cadence@features+ts1", "adaptive", "adaptive+ts1",
                         "adaptive@features", "adaptive@features+ts1"}
    assert keys["fixed_cadence@features+ts1"].fixed["level"] == "features" and keys["fixed_cadence+ts1"].taylorseer == 1
    assert "level" not in keys["adaptive"].fixed or keys["adaptive"].fixed["level"] == "model"
    by_default, _ = discover(nodes, parse_args(["--only", "fixed_cadence+ts1", "--taylorseer", "1"]))
    assert [m.key for m in by_default] == ["fixed_cadence+ts1"]
