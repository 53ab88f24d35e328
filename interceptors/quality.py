"""How close a cached result is to the uncached one: PSNR of latents, PSNR and SSIM of decoded images."""
from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Iterable, Sequence

import torch
import torch.nn.functional as F


@dataclasses.dataclass(frozen=True)
class Quality:
    """A result measured against the uncached pass. ``space``: "latent" (PSNR of the final latents) or
    "image" (PSNR and SSIM of the decoded images); ``seeds``: how many seeds it is the worst of; ``per_seed``:
    the PSNR on each of them, in seed order (empty for one seed)."""

    psnr: float
    ssim: float | None = None
    space: str = "latent"
    seeds: int = 1
    per_seed: tuple[float, ...] = ()

    def describe(self) -> str:
        text = f"{self.space} PSNR {self.psnr:.2f} dB"
        if self.ssim is not None:
            text += f", SSIM {self.ssim:.4f}"
        text += " against the uncached pass"
        if self.seeds > 1 and self.per_seed:
            return text + (f" (the worst of {self.seeds} seeds; per seed " +
                           ", ".join(f"{p:.2f}" for p in self.per_seed) +
                           f" dB, median {statistics.median(self.per_seed):.2f})")
        return text + (f" (the worst of {self.seeds} seeds)" if self.seeds > 1 else "")


def worst_quality(qualities: Iterable[Quality]) -> Quality:
    """The lowest PSNR and the lowest SSIM of results measured on different seeds, keeping each seed's PSNR."""
    qualities = list(qualities)
    ssims = [q.ssim for q in qualities if q.ssim is not None]
    per_seed = tuple(p for q in qualities for p in (q.per_seed or (q.psnr,)))
    return Quality(min(q.psnr for q in qualities), min(ssims) if ssims else None, qualities[0].space,
                   sum(q.seeds for q in qualities), per_seed if len(per_seed) > 1 else ())


SPREAD_FACTOR = 1.5  # margin per dB of seed-to-seed standard deviation
MIN_MARGIN = 1.0     # dB: the least margin where seeds were compared, however closely they agreed
MAX_MARGIN = 6.0     # dB: a spread this wide says the seeds differ too much for a margin to stand in for them


def seed_margin(per_seed: Sequence[float], factor: float = SPREAD_FACTOR, floor: float = MIN_MARGIN,
                cap: float = MAX_MARGIN) -> float:
    """How many dB above a PSNR target to plan, given one plan's PSNR on each calibration seed.

    A plan picked as the cheapest that meets the target on a few seeds is picked partly for its luck on them: on the
    next seed it reads lower (measured on the digits model, a 35 dB plan from one seed kept 35 dB on 5 of 8 other
    seeds). The margin is ``factor`` times the sample standard deviation of the per-seed PSNRs, and at least
    ``floor``: three seeds that agree say little of the next one (a 40 dB plan on the video model read 40.3-40.7 dB
    on its 3 seeds and 36.6 dB on a held-out one), so a plan must clear its target by ``floor`` on every seed
    checked. One seed (nothing compared), no margin; at most ``cap``. Replayed on the plans Auto Calibrate
    measured on the three bench models (``bench/autocalibrate/margin_rules.md``), no multiple of the spread alone
    fit all three: 3 times planned the photos model's 35 dB plan 2.7 dB above its target, 10 computed steps where
    the 8 found at the target held on 8 held-out seeds; 1.5 times let the video model's 40 dB plan above through.
    Seeds where the result is exact (infinite PSNR) say nothing of the spread and are left out."""
    finite = [p for p in per_seed if math.isfinite(p)]
    if len(finite) < 2:
        return 0.0
    return min(cap, max(floor, factor * statistics.stdev(finite)))


def psnr(reference: torch.Tensor, other: torch.Tensor, peak: float) -> float:
    mse = float((reference.double() - other.double()).pow(2).mean())
    return math.inf if mse == 0 else 10 * math.log10(peak * peak / mse)


def latent_psnr(reference: torch.Tensor, other: torch.Tensor) -> float:
    """PSNR of ``other`` against ``reference``, peak = the reference's value range (latents have no fixed range)."""
    return psnr(reference, other, float(reference.max() - reference.min()))


def _gaussian_window(size: int, sigma: float = 1.5) -> torch.Tensor:
    coords = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-coords.pow(2) / (2 * sigma * sigma))
    g = g / g.sum()
    return (g[:, None] * g[None, :]).view(1, 1, size, size)


def ssim(reference: torch.Tensor, other: torch.Tensor, data_range: float = 1.0) -> float:
    """Mean SSIM over images ``[..., H, W, C]`` (ComfyUI's IMAGE layout; leading dims such as video frames
    are treated as more images), each channel on its own.

    Wang, Bovik, Sheikh, Simoncelli 2004, "Image quality assessment: from error visibility to structural
    similarity": Gaussian window 11x11 with sigma 1.5 (smaller on images under 11 pixels), K1 0.01, K2 0.03.
    """
    height, width = reference.shape[-3], reference.shape[-2]

    def planes(images):
        return images.double().reshape(-1, height, width, images.shape[-1]).permute(0, 3, 1, 2).reshape(
            -1, 1, height, width)

    x, y = planes(reference), planes(other)
    window = _gaussian_window(min(11, height, width))
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    mu_x, mu_y = F.conv2d(x, window), F.conv2d(y, window)
    var_x = F.conv2d(x * x, window) - mu_x.pow(2)
    var_y = F.conv2d(y * y, window) - mu_y.pow(2)
    cov = F.conv2d(x * y, window) - mu_x * mu_y
    value = (2 * mu_x * mu_y + c1) * (2 * cov + c2) / ((mu_x.pow(2) + mu_y.pow(2) + c1) * (var_x + var_y + c2))
    return float(value.mean())


def latent_quality(reference: torch.Tensor, other: torch.Tensor) -> Quality:
    return Quality(latent_psnr(reference, other))


def image_quality(reference: torch.Tensor, other: torch.Tensor) -> Quality:
    """PSNR and SSIM of decoded images in a VAE's output range, 0..1."""
    return Quality(psnr(reference, other, 1.0), ssim(reference, other), "image")
