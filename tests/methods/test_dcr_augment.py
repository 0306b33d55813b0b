"""The torch re-implementation of the official augmentation (torchvision semantics) on hand-checkable
images."""

from __future__ import annotations

import pytest
import torch

from hf_vrl.methods.dcr.augment import (
    DCRAugment,
    adjust_brightness,
    adjust_contrast,
    adjust_hue,
    adjust_saturation,
    grayscale,
    hsv_to_rgb,
    random_resized_crop_box,
    rgb_to_hsv,
)


def _solid(r, g, b, size=4):
    return torch.tensor([r, g, b]).view(3, 1, 1).expand(3, size, size).clone()


def test_colour_ops_hand_cases():
    img = _solid(0.2, 0.4, 0.6)
    torch.testing.assert_close(adjust_brightness(img, 2.0), _solid(0.4, 0.8, 1.0))  # clamped at 1
    gray = 0.2989 * 0.2 + 0.587 * 0.4 + 0.114 * 0.6
    torch.testing.assert_close(grayscale(img)[0, 0, 0], torch.tensor(gray))
    torch.testing.assert_close(adjust_saturation(img, 0.0), torch.full_like(img, gray))  # factor 0: grayscale
    torch.testing.assert_close(adjust_contrast(img, 0.0), torch.full_like(img, gray))  # factor 0: mean gray
    torch.testing.assert_close(adjust_contrast(img, 1.0), img)


def test_hue_rotation():
    red = _solid(1.0, 0.0, 0.0)
    torch.testing.assert_close(adjust_hue(red, 1 / 3), _solid(0.0, 1.0, 0.0), atol=1e-5, rtol=0)
    torch.testing.assert_close(adjust_hue(red, -1 / 3), _solid(0.0, 0.0, 1.0), atol=1e-5, rtol=0)
    torch.manual_seed(0)
    img = torch.rand(2, 3, 5, 5)
    torch.testing.assert_close(hsv_to_rgb(rgb_to_hsv(img)), img, atol=1e-5, rtol=0)
    torch.testing.assert_close(adjust_hue(img, 0.0), img, atol=1e-5, rtol=0)
    hsv = rgb_to_hsv(_solid(0.5, 0.25, 0.0))  # orange: hue 30 deg, saturation 1, value 0.5
    torch.testing.assert_close(hsv[:, 0, 0], torch.tensor([30 / 360, 1.0, 0.5]))


def test_crop_box_respects_scale_and_ratio():
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        top, left, h, w = random_resized_crop_box(100, 120, (0.9, 1.0), (0.9, 1.1), gen)
        assert 0 <= top and top + h <= 100 and 0 <= left and left + w <= 120
        assert 0.88 <= h * w / (100 * 120) <= 1.0
        assert 0.88 <= w / h <= 1.12
    # impossible ratio: falls back to the clamped centre crop
    top, left, h, w = random_resized_crop_box(10, 100, (0.99, 1.0), (1.0, 1.0), gen)
    assert (h, w) == (10, 10) and left == 45


def test_augment_is_random_per_image_seeded_and_in_range():
    torch.manual_seed(1)
    images = torch.rand(4, 3, 16, 16)
    aug = DCRAugment()
    a = aug(images, torch.Generator().manual_seed(3))
    b = aug(images, torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and a.shape == images.shape
    assert a.min() >= 0 and a.max() <= 1
    assert not torch.allclose(a, images, atol=1e-3)
    assert not torch.allclose(a[0], aug(images[:1].repeat(2, 1, 1, 1), torch.Generator().manual_seed(9))[1])


def test_flips_only():
    aug = DCRAugment(brightness=0, contrast=0, saturation=0, hue=0, hflip_prob=1.0, vflip_prob=1.0)
    aug.crop_scale = (1.0, 1.0)
    aug.crop_ratio = (1.0, 1.0)
    img = torch.rand(1, 3, 6, 6)
    torch.testing.assert_close(aug(img), img.flip(-1).flip(-2), atol=1e-6, rtol=0)


def test_official_mode_clamps_in_normalised_space():
    """Official quirk: jitter on the CLIP-normalised tensor clamps every negative value to 0."""
    normalised = torch.linspace(-1.8, 2.1, 3 * 8 * 8).view(1, 3, 8, 8)
    other = torch.where(normalised < 0, -0.5 * torch.rand_like(normalised), normalised)  # new negative values
    out = DCRAugment()(normalised, torch.Generator().manual_seed(0))
    assert out.min() >= 0 and out.max() <= 1
    # whatever the negative values were, the augmented view is the same: that detail is lost
    torch.testing.assert_close(out, DCRAugment()(other, torch.Generator().manual_seed(0)))


def test_bad_settings():
    with pytest.raises(ValueError, match="hue"):
        DCRAugment(hue=0.7)
    with pytest.raises(ValueError, match="crop_scale"):
        DCRAugment(crop_scale=(0.0, 1.0))
    with pytest.raises(ValueError, match="B, 3, H, W"):
        DCRAugment()(torch.rand(3, 8, 8))
