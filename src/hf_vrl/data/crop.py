"""RandomResizedCrop's box sampling (torchvision's rule), shared by the image augmentations of every method
(SLIP/DiffCLIP's training crop on PIL images, DCR's positive view on tensors)."""

from __future__ import annotations

import math

import torch


def uniform(low: float, high: float, generator: torch.Generator | None) -> float:
    """One draw from U(low, high) on torch's RNG (so Trainer checkpoints capture it)."""
    return low + (high - low) * torch.rand((), generator=generator).item()


def random_resized_crop_box(
    height: int,
    width: int,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    generator: torch.Generator | None = None,
) -> tuple[int, int, int, int]:
    """(top, left, h, w) of a crop covering `scale` of the area with aspect ratio in `ratio` (torchvision's
    rule: 10 tries, then a centre crop with the ratio clamped)."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * uniform(*scale, generator)
        aspect = math.exp(uniform(*log_ratio, generator))
        w = round(math.sqrt(target_area * aspect))
        h = round(math.sqrt(target_area / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, (), generator=generator))
            left = int(torch.randint(0, width - w + 1, (), generator=generator))
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif in_ratio > ratio[1]:
        h, w = height, round(height * ratio[1])
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w
