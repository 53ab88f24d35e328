"""The quality measures of the core (PSNR, SSIM), with torch only."""
import math

import torch

from cached_sampler_dev.devkit.pack import load_core

ic = load_core()
from cached_sampler_dev.bench import bench_metrics  # noqa: E402  (the bench's own SSIM, written separately: a second implementation)


def test_ssim_of_flat_images_follows_the_formula_of_wang_et_al():
    a, b = 0.2, 0.7
    x, y = torch.full((1, 16, 16, 3), a), torch.full((1, 16, 16, 3), b)
    c1 = 0.01 ** 2
    assert math.isclose(ic.ssim(x, y), (2 * a * b + c1) / (a * a + b * b + c1), rel_tol=1e-6)
    assert ic.ssim(x, x) == 1.0


def test_ssim_agrees_with_an_independent_implementation_and_takes_video_frames():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(2, 3, 24, 20, 3, generator=g)
    y = (x + 0.1 * torch.randn(x.shape, generator=g)).clamp(0, 1)
    frames = lambda v: v.reshape(-1, 24, 20, 3)  # noqa: E731
    assert math.isclose(ic.ssim(x, y), bench_metrics.ssim(frames(y), frames(x)), rel_tol=1e-9)
    assert 0.0 < ic.ssim(x, y) < 1.0


def test_image_psnr_is_against_the_unit_range_and_worst_takes_each_minimum():
    x = torch.zeros(1, 8, 8, 3)
    q = ic.image_quality(x, x + 0.1)
    assert math.isclose(q.psnr, 20.0, rel_tol=1e-6) and q.space == "image"
    worst = ic.worst_quality([ic.Quality(30.0, 0.9, "image"), ic.Quality(28.0, 0.95, "image")])
    assert (worst.psnr, worst.ssim, worst.seeds) == (28.0, 0.9, 2)
    assert "image PSNR 28.00 dB, SSIM 0.9000" in worst.describe() and "worst of 2 seeds" in worst.describe()


def test_worst_quality_keeps_each_seeds_psnr_and_the_text_lists_them_with_the_median():
    worst = ic.worst_quality([ic.Quality(30.0), ic.Quality(28.0), ic.Quality(33.0)])
    assert worst.per_seed == (30.0, 28.0, 33.0) and worst.psnr == 28.0
    assert "per seed 30.00, 28.00, 33.00 dB, median 30.00" in worst.describe()
    assert ic.worst_quality([ic.Quality(30.0)]).per_seed == (), "one seed has no spread to list"


def test_the_seed_margin_is_zero_for_one_seed_grows_with_the_spread_and_is_bounded_both_ways():
    assert ic.seed_margin([36.0]) == 0.0, "one seed: nothing compared"
    assert ic.seed_margin([36.0, math.inf, math.inf]) == 0.0, "exact results say nothing of the spread"
    floor = ic.quality.MIN_MARGIN
    assert floor > 0 and ic.seed_margin([36.0, 36.0, 36.0]) == floor, "seeds that agree still get the floor"
    assert ic.seed_margin([36.0, 36.1, 36.2]) == floor
    narrow, wide = ic.seed_margin([35.0, 36.0, 37.0]), ic.seed_margin([34.5, 36.0, 37.5])
    assert floor < narrow < wide
    assert math.isclose(narrow, ic.quality.SPREAD_FACTOR * 1.0) and math.isclose(wide, ic.quality.SPREAD_FACTOR * 1.5)
    assert ic.seed_margin([10.0, 40.0, 70.0]) == ic.quality.MAX_MARGIN
    assert ic.seed_margin([35.0, 37.0], cap=0.5) == 0.5
