"""SLIP's (and DiffCLIP's) only training augmentation: RandomResizedCrop on each PIL image."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["RandomResizedCropCollator"]


@dataclass
class RandomResizedCropCollator:
    """RandomResizedCrop(size, scale, ratio=(3/4, 4/3)) with bilinear resampling (SLIP's training crop),
    applied to each row's PIL image before `collator` (e.g. `ImageTextCollator`).

    Each crop draws from a generator seeded by the row's `sample_seed` (a function of run seed, epoch and
    sample, added by the run layer), so the crops of a resumed run are those of the uninterrupted one whatever
    the DataLoader had prefetched; rows without it draw from torch's global RNG.
    """

    collator: Callable[[Sequence[dict[str, Any]]], dict[str, torch.Tensor]]
    size: int
    scale: tuple[float, float] = (0.5, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)

    def __post_init__(self) -> None:
        if not 0 < self.scale[0] <= self.scale[1] <= 1:
            raise ValueError(f"crop scale must satisfy 0 < low <= high <= 1, got {tuple(self.scale)}")

    def crop(self, image: Any, generator: torch.Generator | None = None) -> Any:
        from PIL import Image

        from hf_vrl.data.crop import random_resized_crop_box

        box = random_resized_crop_box(image.height, image.width, tuple(self.scale), self.ratio, generator)
        top, left, h, w = box
        return image.resize((self.size, self.size), Image.BILINEAR, box=(left, top, left + w, top + h))

    def __call__(self, rows: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        column = getattr(self.collator, "image_column", "image")
        cropped = []
        for row in rows:
            seed = row.get("sample_seed")
            generator = None if seed is None else torch.Generator().manual_seed(int(seed))
            cropped.append({**row, column: self.crop(row[column], generator)})
        return self.collator(cropped)
