"""The augmentation a(x) that makes DCR's positive view x+ (§4.2), written in torch (no torchvision needed).

Official recipe (per image): ColorJitter(0.1, 0.1, 0.1, 0.05) -> HFlip(0.5) -> VFlip(0.5) ->
RandomResizedCrop(size, scale=(0.9, 1), ratio=(0.9, 1.1)). The ops follow torchvision's definitions on float
images in [0, 1]: every colour op blends and clamps to [0, 1]; the four colour ops run in a random order per
image.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hf_vrl.data.crop import random_resized_crop_box, uniform

_GRAY = (0.2989, 0.587, 0.114)


def _blend(image: torch.Tensor, other: torch.Tensor | float, ratio: float) -> torch.Tensor:
    return (ratio * image + (1.0 - ratio) * other).clamp(0.0, 1.0)


def grayscale(image: torch.Tensor) -> torch.Tensor:
    """ITU-R 601 luma `[..., 1, H, W]` of an RGB image `[..., 3, H, W]`."""
    r, g, b = image.unbind(dim=-3)
    return (_GRAY[0] * r + _GRAY[1] * g + _GRAY[2] * b).unsqueeze(-3)


def adjust_brightness(image: torch.Tensor, factor: float) -> torch.Tensor:
    return _blend(image, 0.0, factor)


def adjust_contrast(image: torch.Tensor, factor: float) -> torch.Tensor:
    return _blend(image, grayscale(image).mean(dim=(-3, -2, -1), keepdim=True), factor)


def adjust_saturation(image: torch.Tensor, factor: float) -> torch.Tensor:
    return _blend(image, grayscale(image), factor)


def rgb_to_hsv(image: torch.Tensor) -> torch.Tensor:
    """RGB -> HSV, all channels in [0, 1] (hue as a fraction of a turn)."""
    r, g, b = image.unbind(dim=-3)
    value, argmax = image.max(dim=-3)
    chroma = value - image.min(dim=-3).values
    safe_chroma = torch.where(chroma > 0, chroma, torch.ones_like(chroma))
    saturation = torch.where(value > 0, chroma / torch.where(value > 0, value, torch.ones_like(value)), 0.0)
    hue_r = ((g - b) / safe_chroma) % 6.0
    hue_g = (b - r) / safe_chroma + 2.0
    hue_b = (r - g) / safe_chroma + 4.0
    hue = torch.where(argmax == 0, hue_r, torch.where(argmax == 1, hue_g, hue_b))
    hue = torch.where(chroma > 0, hue / 6.0, torch.zeros_like(hue))
    return torch.stack([hue, saturation, value], dim=-3)


def hsv_to_rgb(image: torch.Tensor) -> torch.Tensor:
    """HSV -> RGB, inverse of `rgb_to_hsv`."""
    hue, saturation, value = image.unbind(dim=-3)
    sector = torch.floor(hue * 6.0)
    frac = hue * 6.0 - sector
    sector = sector.long() % 6
    p = (value * (1.0 - saturation)).clamp(0.0, 1.0)
    q = (value * (1.0 - saturation * frac)).clamp(0.0, 1.0)
    t = (value * (1.0 - saturation * (1.0 - frac))).clamp(0.0, 1.0)
    table = torch.stack(
        [
            torch.stack([value, t, p], dim=-3),
            torch.stack([q, value, p], dim=-3),
            torch.stack([p, value, t], dim=-3),
            torch.stack([p, q, value], dim=-3),
            torch.stack([t, p, value], dim=-3),
            torch.stack([value, p, q], dim=-3),
        ]
    )  # [6, ..., 3, H, W]
    index = sector.unsqueeze(-3).expand_as(table[0]).unsqueeze(0)
    return table.gather(0, index).squeeze(0)


def adjust_hue(image: torch.Tensor, shift: float) -> torch.Tensor:
    """Rotate the hue by `shift` turns, `shift` in [-0.5, 0.5]."""
    hsv = rgb_to_hsv(image)
    hsv = torch.stack([(hsv[..., 0, :, :] + shift) % 1.0, hsv[..., 1, :, :], hsv[..., 2, :, :]], dim=-3)
    return hsv_to_rgb(hsv)


def resize(image: torch.Tensor, size: tuple[int, int], mode: str = "bilinear") -> torch.Tensor:
    """Antialiased resize of `[C, H, W]` or `[B, C, H, W]` to `size`, clamped back to [0, 1]."""
    batched = image if image.dim() == 4 else image.unsqueeze(0)
    out = F.interpolate(batched, size=size, mode=mode, antialias=True, align_corners=False).clamp(0.0, 1.0)
    return out if image.dim() == 4 else out.squeeze(0)


def random_resized_crop(
    image: torch.Tensor,
    size: tuple[int, int],
    scale: tuple[float, float],
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """torchvision's RandomResizedCrop on one `[C, H, W]` image."""
    top, left, h, w = random_resized_crop_box(image.shape[-2], image.shape[-1], scale, ratio, generator)
    return resize(image[..., top : top + h, left : left + w], size)


@dataclass
class DCRAugment:
    """a(x) of DCR §4.2 on a batch `[B, 3, H, W]` in [0, 1]; each image gets its own random parameters.

    With the official compatibility mode the caller passes CLIP-normalised tensors instead: the colour ops
    then clamp in normalised space (all negative values become 0), reproducing the official code's behaviour.
    """

    brightness: float = 0.1
    contrast: float = 0.1
    saturation: float = 0.1
    hue: float = 0.05
    hflip_prob: float = 0.5
    vflip_prob: float = 0.5
    crop_scale: tuple[float, float] = (0.9, 1.0)
    crop_ratio: tuple[float, float] = (0.9, 1.1)

    def __post_init__(self):
        if not 0.0 <= self.hue <= 0.5:
            raise ValueError(f"hue jitter must lie in [0, 0.5], got {self.hue}")
        if min(self.brightness, self.contrast, self.saturation) < 0:
            raise ValueError("brightness/contrast/saturation jitter must be non-negative")
        if not 0 < self.crop_scale[0] <= self.crop_scale[1] <= 1.0:
            raise ValueError(f"crop_scale must satisfy 0 < low <= high <= 1, got {self.crop_scale}")

    def color_jitter(self, image: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """torchvision ColorJitter: factors drawn per call, the four ops in a random order."""
        ops = [
            (adjust_brightness, max(0.0, 1 - self.brightness), 1 + self.brightness),
            (adjust_contrast, max(0.0, 1 - self.contrast), 1 + self.contrast),
            (adjust_saturation, max(0.0, 1 - self.saturation), 1 + self.saturation),
            (adjust_hue, -self.hue, self.hue),
        ]
        for index in torch.randperm(4, generator=generator).tolist():
            op, low, high = ops[index]
            image = op(image, uniform(low, high, generator))
        return image

    def augment_image(self, image: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """ColorJitter -> HFlip -> VFlip -> RandomResizedCrop on one `[3, H, W]` image (official order)."""
        image = self.color_jitter(image, generator)
        if torch.rand((), generator=generator).item() < self.hflip_prob:
            image = image.flip(-1)
        if torch.rand((), generator=generator).item() < self.vflip_prob:
            image = image.flip(-2)
        return random_resized_crop(
            image, tuple(image.shape[-2:]), self.crop_scale, self.crop_ratio, generator
        )

    def __call__(self, images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        if images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(f"DCRAugment expects images [B, 3, H, W], got {tuple(images.shape)}")
        return torch.stack([self.augment_image(image, generator) for image in images])
