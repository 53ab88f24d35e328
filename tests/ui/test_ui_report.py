"""What users see of a run, through ComfyUI's executor: live progress text, the summary, the tuning plot."""
import pytest
import torch
from PIL import Image

from cached_sampler_dev.support.graphs import tiny_prompt

def plot_image(comfy, outputs):
    info = outputs["plot"]["images"][0]
    return Image.open(comfy.tmp / info["type"] / info["subfolder"] / info["filename"])


@pytest.mark.parametrize("node_type", ["CachedSampler", "CachedSamplerAdvanced"])
def test_plot_is_appended_as_last_output(comfy, node_type):
    import nodes
    info = nodes.NODE_CLASS_MAPPINGS[node_type].GET_NODE_INFO_V1()
    assert info["output"] == ["LATENT", "IMAGE"] and info["output_name"] == ["LATENT", "tuning_plot"]


def test_progress_text_per_evaluation_then_summary(comfy):
    _, outputs = comfy.run(tiny_prompt(steps=12))
    texts = [t for node, t in comfy.server.progress_texts if node == "sampler"]
    assert len(texts) == 12 + 1, "one line per evaluation, then the summary"
    assert texts[0].startswith("First Block Cache + TaylorSeer\nstep 1/12: 1 computed, 0 skipped so far")
    assert "not checked" in texts[0], "the first step is always computed"
    measured = [t for t in texts[:-1] if "threshold 0.25" in t]
    assert measured, "the change metric is shown against the threshold"
    assert any(t.endswith(": skipped") and " < threshold" in t for t in measured)
    assert any(t.endswith(": computed") and " >= threshold" in t for t in measured)
    last_live = texts[-2].splitlines()[1]
    summary = outputs["sampler"]["text"][0]
    assert texts[-1] == summary
    data = outputs["sampler"]["cached_sampler"][0]
    run = data["runs"][0]
    assert last_live == f"step 12/12: {run['computed']} computed, {run['skipped']} skipped so far " \
                        f"({run['skipped'] / 12:.0%} skipped)"
    assert 0 < run["skipped"] < 12 and len(run["decisions"]) == 12
    assert run["decisions"].count("s") == run["skipped"]
    lines = summary.splitlines()
    assert lines[0] == "First Block Cache + TaylorSeer"
    assert lines[1] == f"computed {run['computed']}/12 steps (cond {run['computed']}/12, uncond {run['computed']}/12)"
    assert lines[2].startswith(f"model work saved {run['work_saved']:.0%}, estimated speedup {run['speedup']:.2f}x")
    assert lines[2].endswith(f"s, cache {run['cache_bytes']['cpu'] / 1e3:.3g} KB on cpu"), lines[2]
    assert lines[3] == "acted: First Block Cache (node fbc)"
    assert data["interceptors"] == ["First Block Cache (node fbc)", "TaylorSeer Forecast (node ts)"]
    assert data["metric"] == "residual change (relative L1)"


def test_plot_output_shows_the_run(comfy):
    _, outputs = comfy.run(tiny_prompt(steps=12))
    image = plot_image(comfy, outputs)
    assert image.size == (960, 540)
    colors = set(image.convert("RGB").getdata())
    assert (239, 108, 0) in colors and (46, 125, 50) in colors, "skipped and computed steps are marked"


def test_empty_chain_says_so_everywhere(comfy):
    _, outputs = comfy.run(tiny_prompt(chain=False))
    assert outputs["sampler"]["text"][0] == "No interceptors connected: plain KSampler."
    assert outputs["sampler"]["cached_sampler"][0]["empty"] is True
    assert not [t for node, t in comfy.server.progress_texts if node == "sampler"]
    assert plot_image(comfy, outputs).size[0] < 960


def test_advanced_reports_and_plots_too(comfy):
    _, outputs = comfy.run(tiny_prompt(node_type="CachedSamplerAdvanced", steps=10))
    assert outputs["sampler"]["text"][0].splitlines()[1].startswith("computed ")
    assert plot_image(comfy, outputs).size == (960, 540)
    assert [t for node, t in comfy.server.progress_texts if node == "sampler"]


class BrokenServer:
    client_id = None

    def send_progress_text(self, *args, **kwargs):
        raise RuntimeError("connection closed")


@pytest.mark.parametrize("instance", [None, BrokenServer()], ids=["no server", "failing server"])
def test_headless_or_failing_server_never_breaks_sampling(comfy, monkeypatch, instance):
    import server
    monkeypatch.setattr(server.PromptServer, "instance", instance)
    _, outputs = comfy.run(tiny_prompt(steps=6))
    assert outputs["sampler"]["text"][0].startswith("First Block Cache + TaylorSeer\ncomputed ")
    assert not comfy.server.progress_texts


def test_the_metric_is_named_by_the_chains_deciders_and_a_secondary_one_only_alone(comfy):
    """The plot's axis and the live text name the metric each decider declares; the Guidance Cache's is named only
    where no step or block cache reports one, and two deciders measuring different things give the generic name."""
    report, ic = comfy.module("nodes.summary.report"), comfy.module("interceptors")

    def name(*interceptors):
        return report.RunReport("node", ic.InterceptorChain.of(list(interceptors))).metric_name
    guidance = ic.GuidanceCache(interval=2)
    assert name(ic.FixedCadence(interval=2)) == "evaluations since last compute"
    assert name(ic.FirstBlockCache(threshold=0.1)) == name(ic.DBCache(threshold=0.1)) == "residual change (relative L1)"
    assert name(guidance) == "guidance: steps / predicted change / disagreement"
    assert name(ic.FixedCadence(interval=2), guidance) == "evaluations since last compute"
    assert name(ic.MagCache(threshold=0.1), ic.TaylorSeer(order=1)) == "accumulated error"
    assert name(ic.MagnitudeRecorder()) == report.DEFAULT_METRIC


def test_the_threshold_says_what_it_means_where_a_middle_tier_runs_the_back_blocks(comfy):
    """Verified Block Cache forecasts everything below its threshold and, up to refresh_ratio times it, still runs
    the back blocks: the plot's legend and the live text say so; every other decider skips below its threshold."""
    report, ic = comfy.module("nodes.summary.report"), comfy.module("interceptors")
    plot = comfy.module("nodes.summary.plot")

    def rule(*interceptors):
        return report.RunReport("node", ic.InterceptorChain.of(list(interceptors))).threshold_rule
    assert rule(ic.FirstBlockCache(threshold=0.1)) == rule(ic.MagCache(threshold=0.1)) == "skip below"
    tiered = rule(ic.VerifiedBlockCache(threshold=0.1, refresh_ratio=2.0), ic.TaylorSeer(order=1))
    assert "back blocks" in tiered and "2x" in tiered
    assert rule(ic.VerifiedBlockCache(threshold=0.1, refresh_ratio=1.0), ic.TaylorSeer(order=1)) == "skip below"
    texts = [text for _, _, text in plot.legend([], "metric", tiered, {0.1})]
    assert f"threshold 0.1 ({tiered})" in texts


def test_the_summary_says_the_time_the_skipped_work_saved_as_the_run_timed_its_steps(comfy):
    """Each evaluation is timed from its placement to the next one's; the time saved is each evaluation that did
    less than all its work against the median one that did all of it. Nothing skipped: nothing said."""
    runs = {}
    for threshold in (0.0, 0.25):
        _, ui = comfy.run(tiny_prompt(threshold=threshold, steps=12))
        (run,) = ui["sampler"]["cached_sampler"][0]["runs"]
        runs[threshold] = (run, ui["sampler"]["text"][0])
    plain, text = runs[0.0]
    assert plain["skipped"] == 0 and plain["seconds_saved"] is None and "less than computed ones" not in text
    cached, text = runs[0.25]
    assert cached["skipped"] > 0 and 0 <= cached["seconds_saved"] < cached["seconds"] * 2, cached
    said = float(text.split("the steps that skipped work took ")[1].split(" s less than computed ones")[0])
    assert abs(said - cached["seconds_saved"]) <= 0.005 + 1e-9, (said, cached)


def test_each_evaluation_is_timed_and_the_times_add_up_to_the_run(comfy):
    import nodes
    from cached_sampler_dev.support import tiny_models
    adapter, ic = comfy.module("adapter"), comfy.module("interceptors")
    seen = []
    chain = ic.InterceptorChain.of([ic.FixedCadence(interval=2), ic.TaylorSeer(order=1)])
    patched = adapter.install(tiny_models.build("flux"), chain,
                              on_run_end=lambda run, summary: seen.append((run.records, summary)))
    positive, negative = tiny_models.conditioning("flux", seed=1)
    nodes.common_ksampler(patched, 0, 8, 3.0, "euler", "simple", positive, negative,
                          tiny_models.latent("flux", seed=5))
    (records, summary), = seen
    assert len(records) == 8 and all(r.seconds > 0 for r in records), [r.seconds for r in records]
    assert sum(r.seconds for r in records) <= summary.seconds, (sum(r.seconds for r in records), summary.seconds)
