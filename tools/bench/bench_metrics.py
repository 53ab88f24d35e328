"""Image-quality measures for the bench: PSNR and SSIM of decoded images against the uncached output."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def psnr(image: torch.Tensor, reference: torch.Tensor, data_range: float = 1.0) -> float:
    """Peak signal-to-noise ratio in dB over the whole batch; ``inf`` for identical images."""
    mse = float(torch.mean((image.double() - reference.double()) ** 2))
    if mse == 0.0:
        return math.inf
    return 10.0 * math.log10(data_range ** 2 / mse)


def _gaussian_window(size: int = 11, sigma: float = 1.5) -> torch.Tensor:
    coords = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-(coords ** 2) / (2 * sigma ** 2))
    g = g / g.sum()
    return (g[:, None] * g[None, :]).view(1, 1, size, size)


def ssim(image: torch.Tensor, reference: torch.Tensor, data_range: float = 1.0) -> float:
    """Mean SSIM (Wang et al. 2004: 11x11 Gaussian window, sigma 1.5, K1 0.01, K2 0.03) over the batch
    and channels of ComfyUI IMAGE tensors ``[B, H, W, C]``."""
    x = image.double().permute(0, 3, 1, 2).reshape(-1, 1, image.shape[1], image.shape[2])
    y = reference.double().permute(0, 3, 1, 2).reshape(-1, 1, reference.shape[1], reference.shape[2])
    window = _gaussian_window()
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    mu_x, mu_y = F.conv2d(x, window), F.conv2d(y, window)
    sxx = F.conv2d(x * x, window) - mu_x ** 2
    syy = F.conv2d(y * y, window) - mu_y ** 2
    sxy = F.conv2d(x * y, window) - mu_x * mu_y
    value = ((2 * mu_x * mu_y + c1) * (2 * sxy + c2)) / ((mu_x ** 2 + mu_y ** 2 + c1) * (sxx + syy + c2))
    return float(value.mean())
