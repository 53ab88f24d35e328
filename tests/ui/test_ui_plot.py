"""The tuning plot is a pure function of evaluation records: an IMAGE tensor that shows what happened."""
import dataclasses
import importlib.util
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def load_plot():
    spec = importlib.util.spec_from_file_location("cached_sampler_plot", ROOT / "nodes" / "summary" / "plot.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


plot = load_plot()


@dataclasses.dataclass
class Record:
    step: int
    metric: float | None
    threshold: float | None
    skipped: bool


def records(threshold=0.2, n=12):
    out = []
    for i in range(n):
        if i in (0, n - 1):
            out.append(Record(i, None, None, False))
            continue
        metric = 0.05 + 0.03 * (i % 4)
        out.append(Record(i, metric, threshold, metric < threshold))
    return out


def pixels(image, color, tol=12):
    data = torch.tensor(list(image.convert("RGB").getdata()), dtype=torch.int32)
    return int(((data - torch.tensor(color)).abs().max(dim=1).values <= tol).sum())


def test_returns_comfy_image_tensor():
    t = plot.tuning_plot(records(), heading="Cached Sampler (node 3): First Block Cache")
    assert t.shape == (1, plot.HEIGHT, plot.WIDTH, 3) and t.dtype == torch.float32
    assert 0.0 <= float(t.min()) and float(t.max()) <= 1.0
    image = plot.render(records(), heading="Cached Sampler (node 3): First Block Cache")
    pixel_bytes = torch.tensor(list(image.tobytes()), dtype=torch.float32).view(1, plot.HEIGHT, plot.WIDTH, 3)
    assert torch.equal(t, pixel_bytes / 255.0), "every pixel, in row-major RGB order"


def test_empty_chain_gives_small_image_saying_so():
    t = plot.tuning_plot([])
    assert t.shape[0] == 1 and t.shape[3] == 3
    assert t.shape[1] * t.shape[2] < plot.HEIGHT * plot.WIDTH / 4
    assert (t < 0.5).any(), "some text is drawn"


def test_draws_metric_threshold_and_both_decisions():
    image = plot.render(records())
    assert pixels(image, plot.METRIC) > 50
    assert pixels(image, plot.THRESHOLD) > 50
    assert pixels(image, plot.COMPUTED) > 200 and pixels(image, plot.SKIPPED) > 200
    assert pixels(image, plot.SKIPPED_BAND) > 1000, "skipped columns are shaded"


def test_more_skips_show_more_orange():
    few = plot.render(records(threshold=0.06))
    many = plot.render(records(threshold=0.2))
    assert pixels(many, plot.SKIPPED) > pixels(few, plot.SKIPPED)


def test_headline_counts_and_work_saved():
    r = records(threshold=0.2)
    skipped = sum(x.skipped for x in r)
    text = plot.headline(r)
    assert f"computed {len(r) - skipped} of {len(r)}" in text and f"skipped {skipped}" in text
    assert f"{skipped / len(r):.0%}" in text


def test_block_level_work_counts_the_work_each_forward_did():
    """The work the run counted per forward (a forward that ran 2 of its 8 blocks did a quarter of its work), as
    the run summary reads it."""
    @dataclasses.dataclass
    class Blocks(Record):
        rows_total: int = 1
        work_done: float = 1.0
    r = [Blocks(0, None, None, False), Blocks(1, 0.1, 0.2, True, work_done=0.25), Blocks(2, None, None, False)]
    assert "~25% model work saved" in plot.headline(r)


@pytest.mark.parametrize("n", [1, 2, 7, 60, 400])
def test_any_length_and_metrics_without_threshold(n):
    r = [Record(i // 2, (i % 5) * 0.1 if i % 3 else None, 0.3 if i % 2 else None, bool(i % 3)) for i in range(n)]
    t = plot.tuning_plot(r, metric_name="accumulated error")
    assert t.shape == (1, plot.HEIGHT, plot.WIDTH, 3) and torch.isfinite(t).all()


def test_all_zero_metrics_do_not_break_the_axis():
    r = [Record(i, 0.0, 0.0, False) for i in range(5)]
    assert torch.isfinite(plot.tuning_plot(r)).all()


def test_guidance_cache_strip_shows_which_steps_computed_the_negative_branch():
    @dataclasses.dataclass
    class Guided(Record):
        branches: dict = dataclasses.field(default_factory=dict)
        rows_total: int = 2
        work_done: float = 2.0

    def run(skip_negative):
        return [Guided(i, None, None, False, {"cond": True, "uncond": not (skip_negative and i % 2)},
                       work_done=1.0 if skip_negative and i % 2 else 2.0) for i in range(10)]

    def orange(image):
        return int((image[0] == torch.tensor(plot.SKIPPED) / 255.0).all(-1).sum())

    plain, guided = plot.tuning_plot(run(False)), plot.tuning_plot(run(True))
    assert orange(guided) > orange(plain)  # the legend has an orange box in both
    assert "~25% model work saved" in plot.headline(run(True))
