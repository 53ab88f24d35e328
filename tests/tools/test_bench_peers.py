"""The bench keeps measuring Spectrum's ComfyUI ports (judian17/ComfyUI-Spectrum, xmarre/ComfyUI-Spectrum-Proper
and the others that keep the reference's input names) when they are installed: a stand-in node with the same
inputs is discovered as another pack's method and swept over its compute schedule (warm-up steps, initial window,
window growth), its work counted even though it puts its own block patches over the bench's counters, as
judian17's port does; and the pack's own Spectrum Forecast is chained after the pack's deciders.
"""
import math
import types

import pytest


class FakeSpectrum:
    """Stands in for a Spectrum port: the inputs of judian17's "Spectrum" node and its scheduling (compute the
    first warmup_steps steps, then every int(window)-th, the window growing by flex_window per computed step).
    On a skipped step every block returns its input (no forecast: only the schedule and the counting matter
    here). Like that port it sets its own block replacements, which call the blocks themselves, not the
    replacements that were there before."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "model": ("MODEL",),
            "w": ("FLOAT", {"default": 0.5, "min": 0.0, "max": 1.0, "step": 0.05}),
            "M": ("INT", {"default": 4, "min": 1, "max": 10}),
            "lam": ("FLOAT", {"default": 0.1, "min": 0.001, "max": 10.0, "step": 0.01}),
            "warmup_steps": ("INT", {"default": 3, "min": 0, "max": 20}),
            "window_size": ("FLOAT", {"default": 2.0, "min": 1.0, "max": 16.0, "step": 0.5}),
            "flex_window": ("FLOAT", {"default": 0.75, "min": 0.0, "max": 4.0, "step": 0.01}),
            "max_w": ("FLOAT", {"default": 0.8, "min": 0.0, "max": 1.0, "step": 0.05}),
            "verbose": ("BOOLEAN", {"default": False}),
        }}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "apply"
    CATEGORY = "testing"

    def apply(self, model, w, M, lam, warmup_steps, window_size, flex_window, max_w, verbose):
        from comfy.patcher_extension import WrappersMP
        state = {}

        def reset(executor, *args, **kwargs):
            state.update(step=0, cached=0, window=window_size, compute=True)
            return executor(*args, **kwargs)

        def step(executor, *args, **kwargs):
            if state["step"] < warmup_steps:
                state["compute"] = True
            else:
                state["compute"] = (state["cached"] + 1) % max(1, int(state["window"])) == 0
                if state["compute"]:
                    state["window"] += flex_window
            try:
                return executor(*args, **kwargs)
            finally:
                state["cached"] = 0 if state["compute"] else state["cached"] + 1
                state["step"] += 1

        def block(args, extra):
            if state["compute"]:
                return extra["original_block"](args)
            return {k: args[k] for k in ("img", "txt") if k in args}

        m = model.clone()
        m.add_wrapper_with_key(WrappersMP.OUTER_SAMPLE, "fake_spectrum", reset)
        m.add_wrapper_with_key(WrappersMP.PREDICT_NOISE, "fake_spectrum", step)
        diffusion = m.model.diffusion_model
        # as judian17's port: Flux's double and single blocks, or Wan's blocks, which take "double_block" slots
        groups = {"double_block": getattr(diffusion, "double_blocks", None) or getattr(diffusion, "blocks", None),
                  "single_block": getattr(diffusion, "single_blocks", None)}
        for name, blocks in groups.items():
            for i in range(len(blocks or ())):
                m.set_model_patch_replace(block, "dit", name, i)
        return (m,)


def test_spectrum_port_becomes_a_schedule_sweep_without_comfyui():
    from cached_sampler_dev.bench import bench
    from cached_sampler_dev.bench.bench_discover import discover
    from cached_sampler_dev.bench.bench_report import fmt_setting
    fake_nodes = types.SimpleNamespace(NODE_CLASS_MAPPINGS={"FakeSpectrum": FakeSpectrum},
                                       NODE_DISPLAY_NAME_MAPPINGS={"FakeSpectrum": "Fake Spectrum"})
    methods, skipped = discover(fake_nodes, bench.Config())
    assert not skipped and [m.key for m in methods] == ["peer:FakeSpectrum"]
    m = methods[0]
    assert m.kind == "model" and m.param == "schedule" and m.source != "pack"
    assert m.fixed == {"w": 0.5, "M": 4, "lam": 0.1, "max_w": 0.8, "verbose": False}
    # first the setting that computes every step (the curve's anchor, what overhead is measured at) ...
    assert m.values[0] == m.zero == {"warmup_steps": 3, "window_size": 1.0, "flex_window": 0.0}
    # ... then every other combination of the grid, the node's own default warm-up among them
    grid = bench.SCHEDULE_GRID
    assert len(m.values) == 1 + len(grid["warmup_steps"]) * (len(grid["window_size"]) * len(grid["flex_window"]) - 1)
    assert {"warmup_steps": 3, "window_size": 2.0, "flex_window": 0.75} in m.values
    assert all(s["window_size"] != 1.0 or s["flex_window"] != 0.0 for s in m.values[1:])
    assert len({tuple(sorted(s.items())) for s in m.values}) == len(m.values)
    assert m.describe(m.values[0]) == "warmup_steps=3, window_size=1, flex_window=0"
    assert fmt_setting(m.values[0]) == "warmup_steps 3, window_size 1, flex_window 0"
    # a grid narrowed from the command line, values outside the node's range dropped
    config = bench.parse_args(["--sweep", "schedule.window_size=1,2,99", "--sweep", "schedule.flex_window=0",
                               "--sweep", "schedule.warmup_steps=1"])
    m = discover(fake_nodes, config)[0][0]
    assert m.values == [{"warmup_steps": 1, "window_size": 1.0, "flex_window": 0.0},
                        {"warmup_steps": 1, "window_size": 2.0, "flex_window": 0.0}]


def bench_with_fake_port(comfy, out, model: str = "digits") -> dict:
    import nodes

    from cached_sampler_dev.bench import bench
    nodes.NODE_CLASS_MAPPINGS["FakeSpectrum"] = FakeSpectrum
    sweeps = {"fixed_cadence": [1, 2], "schedule.warmup_steps": [1], "schedule.window_size": [1.0, 2.0],
              "schedule.flex_window": [0.0]}
    config = bench.Config(steps=[5], repeats=[1], taylorseer=[], sweeps=sweeps, only=["peer:FakeSpectrum",
                          "fixed_cadence"], overhead=False, other_packs=False, out=str(out), plot=False,
                          verbose=False, extend=0, model=model, classes="01")
    try:
        return bench.run_bench(config, comfy=comfy)
    finally:
        del nodes.NODE_CLASS_MAPPINGS["FakeSpectrum"]


@pytest.fixture(scope="module")
def results(comfy, tmp_path_factory):
    return bench_with_fake_port(comfy, tmp_path_factory.mktemp("bench_peers"))


@pytest.mark.slow
def test_a_port_on_the_video_model_has_its_work_counted_on_wan_blocks(comfy, tmp_path):
    # Wan keeps its blocks in ``blocks`` behind "double_block" slots: the counting on the block modules finds them
    rows = [r for r in bench_with_fake_port(comfy, tmp_path, "video")["video"]["5"]["rows"]
            if r["node"] == "FakeSpectrum"]
    off, skipping = rows
    assert off["identical"] and off["work"] == 1.0
    assert skipping["error"] is None and skipping["blocks"] > 0 and skipping["work"] == pytest.approx(3 / 5)


def test_spectrum_port_is_swept_and_its_work_counted(results):
    rows = [r for r in results["digits"]["5"]["rows"] if r["node"] == "FakeSpectrum"]
    assert [r["value"] for r in rows] == [{"warmup_steps": 1, "window_size": 1.0, "flex_window": 0.0},
                                          {"warmup_steps": 1, "window_size": 2.0, "flex_window": 0.0}]
    off, skipping = rows
    assert off["error"] is None and off["identical"] and off["psnr"] == math.inf and off["work"] == 1.0
    # steps 0, 2 and 4 of 5 computed: counted on the block modules, its patches having replaced the counters'
    assert skipping["error"] is None and skipping["work"] == pytest.approx(3 / 5), skipping
    assert skipping["blocks"] > 0 and math.isfinite(skipping["psnr"]) and not skipping["identical"]
    assert skipping["setting"] == "warmup_steps=1, window_size=2, flex_window=0"
    w = results["digits"]["5"]
    assert w["targets"][off["method"]]["30"] in (0.0, pytest.approx(0.4))


def test_pack_spectrum_forecast_is_chained_after_the_deciders(results):
    rows = {r["key"]: r for r in results["digits"]["5"]["rows"]}
    chained = rows["fixed_cadence+spectrum"]
    assert chained["estimator"] == "CachedSamplerSpectrum" and chained["value"] == 2
    assert chained["error"] is None and chained["work"] < 0.8 and math.isfinite(chained["psnr"])
    assert chained["method"] == "Fixed Cadence + Spectrum Forecast"
