"""The two views CLUE trains on (ReSA's pipeline, `winci-ai/resa` `src/transform.py`), written in torch.

* weak view:   RandomResizedCrop(size, scale=(0.2, 1)) -> HorizontalFlip(0.5)
* strong view: RandomResizedCrop(size, scale=(0.2, 1), bicubic) -> ColorJitter(0.4, 0.4, 0.2, 0.1) with
  p = 0.8 -> Grayscale p = 0.2 -> GaussianBlur(sigma ~ U(0.1, 2)) p = 0.5 -> Solarize p = 0.2
  -> HorizontalFlip(0.5)

then both are normalised with the backbone's mean and std. The Sinkhorn targets come from the weak view (view
0). Blur sigmas are given for 224-pixel crops (ReSA's size) and scaled with the crop size, so a 32-pixel toy
image is blurred as much, relative to its size, as a 224-pixel one.

Randomness is a function of the sample: `CLUECollator` seeds a `torch.Generator` with the row's `sample_seed`
when the run adds that column, so a killed-and-resumed run sees the same views and ends bit-identical. Without
the column it draws from torch's global RNG, which the data loader advances ahead of training (it prefetches
batches): such a run trains fine but does not resume bit-identically.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from hf_vrl.data.crop import random_resized_crop_box, uniform
from hf_vrl.methods.dcr.augment import DCRAugment, grayscale, resize

__all__ = [
    "SAMPLE_SEED",
    "CLUECollator",
    "CLUEViews",
    "gaussian_blur",
    "image_to_tensor",
    "row_generator",
    "solarize",
]

SAMPLE_SEED = "sample_seed"  # int column the run layer adds: a function of run seed, epoch and sample id
_REFERENCE_SIZE = 224  # ReSA's crop size, at which its blur sigmas are defined


def image_to_tensor(image: Any) -> torch.Tensor:
    """A PIL image as a float `[3, H, W]` tensor in [0, 1]."""
    array = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
    return torch.from_numpy(array).permute(2, 0, 1)


def gaussian_blur(image: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian blur of a `[3, H, W]` image with standard deviation `sigma` pixels (reflect padding,
    kernel radius ceil(3 sigma)), as PIL's `GaussianBlur(radius=sigma)` that ReSA applies."""
    radius = min(math.ceil(3 * sigma), image.shape[-1] - 1, image.shape[-2] - 1)
    if radius < 1:
        return image
    offsets = torch.arange(-radius, radius + 1, dtype=image.dtype)
    kernel = torch.exp(-0.5 * (offsets / sigma) ** 2)
    kernel = kernel / kernel.sum()
    x = F.pad(image.unsqueeze(0), (radius, radius, radius, radius), mode="reflect")
    x = F.conv2d(x, kernel.view(1, 1, 1, -1).expand(3, 1, 1, -1), groups=3)
    x = F.conv2d(x, kernel.view(1, 1, -1, 1).expand(3, 1, -1, 1), groups=3)
    return x.squeeze(0)


def solarize(image: torch.Tensor, threshold: float = 128 / 255) -> torch.Tensor:
    """PIL's `ImageOps.solarize`: invert every value at or above the threshold."""
    return torch.where(image >= threshold, 1.0 - image, image)


@dataclass
class CLUEViews:
    """ReSA's weak and strong views of one `[3, H, W]` image in [0, 1] -> `[2, 3, size, size]` (see the
    module docstring)."""

    size: int = 224
    crop_scale: tuple[float, float] = (0.2, 1.0)
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    brightness: float = 0.4
    contrast: float = 0.4
    saturation: float = 0.2
    hue: float = 0.1
    jitter_prob: float = 0.8
    grayscale_prob: float = 0.2
    blur_prob: float = 0.5
    blur_sigma: tuple[float, float] = (0.1, 2.0)
    solarize_prob: float = 0.2
    flip_prob: float = 0.5

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"size must be >= 1, got {self.size}")
        if not 0 < self.crop_scale[0] <= self.crop_scale[1] <= 1:
            raise ValueError(f"crop_scale must satisfy 0 < low <= high <= 1, got {self.crop_scale}")
        if not 0 < self.crop_ratio[0] <= self.crop_ratio[1]:
            raise ValueError(f"crop_ratio must satisfy 0 < low <= high, got {self.crop_ratio}")
        if not 0 < self.blur_sigma[0] <= self.blur_sigma[1]:
            raise ValueError(f"blur_sigma must satisfy 0 < low <= high, got {self.blur_sigma}")
        for name in ("jitter_prob", "grayscale_prob", "blur_prob", "solarize_prob", "flip_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must lie in [0, 1], got {getattr(self, name)}")
        self._jitter = DCRAugment(  # torchvision's ColorJitter in torch (validates the four ranges)
            brightness=self.brightness, contrast=self.contrast, saturation=self.saturation, hue=self.hue
        )

    def _crop(self, image: torch.Tensor, mode: str, generator: torch.Generator | None) -> torch.Tensor:
        top, left, h, w = random_resized_crop_box(
            image.shape[-2], image.shape[-1], self.crop_scale, self.crop_ratio, generator
        )
        return resize(image[:, top : top + h, left : left + w], (self.size, self.size), mode)

    def _flip(self, image: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        return image.flip(-1) if _chance(self.flip_prob, generator) else image

    def weak(self, image: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return self._flip(self._crop(image, "bilinear", generator), generator)

    def strong(self, image: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        image = self._crop(image, "bicubic", generator)
        if _chance(self.jitter_prob, generator):
            image = self._jitter.color_jitter(image, generator)
        if _chance(self.grayscale_prob, generator):
            image = grayscale(image).expand(3, -1, -1)
        if _chance(self.blur_prob, generator):
            sigma = uniform(*self.blur_sigma, generator) * self.size / _REFERENCE_SIZE
            image = gaussian_blur(image, sigma)
        if _chance(self.solarize_prob, generator):
            image = solarize(image)
        return self._flip(image, generator)

    def __call__(self, image: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return torch.stack([self.weak(image, generator), self.strong(image, generator)])


def _chance(probability: float, generator: torch.Generator | None) -> bool:
    return torch.rand((), generator=generator).item() < probability


def row_generator(row: dict[str, Any]) -> torch.Generator | None:
    """A generator seeded by the row's `sample_seed` when it has one (None: torch's global RNG)."""
    seed = row.get(SAMPLE_SEED)
    return None if seed is None else torch.Generator().manual_seed(int(seed))


class CLUECollator:
    """Rows (`image`, optional `sample_seed`, description) -> `{"pixel_values": [B, 2, 3, S, S]}` (weak,
    strong view, normalised) plus `text_embeds` `[B, D]` from a `TextBank` when one is given. Views sit on
    dim 1 so that a batch split across processes along dim 0 keeps each sample's views together."""

    def __init__(
        self,
        views: CLUEViews,
        image_mean: Sequence[float],
        image_std: Sequence[float],
        text_bank: Any | None = None,
    ) -> None:
        self.views = views
        self.mean = torch.tensor(image_mean, dtype=torch.float32).view(1, 3, 1, 1)
        self.std = torch.tensor(image_std, dtype=torch.float32).view(1, 3, 1, 1)
        self.text_bank = text_bank

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if not rows or "image" not in rows[0]:
            raise ValueError("CLUECollator needs rows with an 'image' column (see hf_vrl.data.schema)")
        views = [self.views(image_to_tensor(row["image"]), row_generator(row)) for row in rows]
        batch = {"pixel_values": (torch.stack(views) - self.mean) / self.std}
        if self.text_bank is not None:
            batch["text_embeds"] = self.text_bank.embed_rows(rows)
        return batch
