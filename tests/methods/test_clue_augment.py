"""CLUE's views: ReSA's weak/strong recipes, hand-checked ops, and randomness drawn from `sample_seed`."""

from __future__ import annotations

import math

import pytest
import torch
from clue_helpers import toy_data

from hf_vrl.methods.clue.augment import CLUECollator, CLUEViews, gaussian_blur, image_to_tensor, solarize
from hf_vrl.methods.clue.text import TextBank
from hf_vrl.methods.dcr.augment import resize

MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)


def _image(seed: int = 0, size: int = 20) -> torch.Tensor:
    return torch.rand(3, size, size, generator=torch.Generator().manual_seed(seed))


def test_views_shape_and_range():
    views = CLUEViews(size=16)(_image(), torch.Generator().manual_seed(0))
    assert views.shape == (2, 3, 16, 16)
    assert views.min() >= 0 and views.max() <= 1


def test_views_are_a_function_of_the_generator_seed():
    views = CLUEViews(size=16)
    a = views(_image(), torch.Generator().manual_seed(5))
    torch.testing.assert_close(views(_image(), torch.Generator().manual_seed(5)), a, rtol=0, atol=0)
    assert not torch.equal(views(_image(), torch.Generator().manual_seed(6)), a)


def test_without_randomness_both_views_are_the_resized_image():
    quiet = dict(crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), flip_prob=0.0)
    views = CLUEViews(size=10, jitter_prob=0, grayscale_prob=0, blur_prob=0, solarize_prob=0, **quiet)
    image = _image()
    out = views(image, torch.Generator().manual_seed(0))
    torch.testing.assert_close(out[0], resize(image, (10, 10), "bilinear"))
    torch.testing.assert_close(out[1], resize(image, (10, 10), "bicubic"))
    flipped = CLUEViews(
        size=10, jitter_prob=0, grayscale_prob=0, blur_prob=0, solarize_prob=0, **quiet | {"flip_prob": 1.0}
    )
    torch.testing.assert_close(flipped(image)[0], out[0].flip(-1))


def test_strong_view_ops():
    always = CLUEViews(size=12, jitter_prob=0, grayscale_prob=1.0, blur_prob=0, solarize_prob=0)
    strong = always.strong(_image(), torch.Generator().manual_seed(0))
    torch.testing.assert_close(strong[0], strong[1])
    torch.testing.assert_close(strong[1], strong[2])
    solar = CLUEViews(size=12, jitter_prob=0, grayscale_prob=0, blur_prob=0, solarize_prob=1.0, flip_prob=0)
    plain = CLUEViews(size=12, jitter_prob=0, grayscale_prob=0, blur_prob=0, solarize_prob=0, flip_prob=0)
    gen = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    torch.testing.assert_close(solar.strong(_image(), gen()), solarize(plain.strong(_image(), gen())))


def test_solarize_hand_checked():
    x = torch.tensor([0.0, 0.4, 0.5, 128 / 255, 0.9, 1.0])
    torch.testing.assert_close(solarize(x), torch.tensor([0.0, 0.4, 0.5, 127 / 255, 0.1, 0.0]))


def test_gaussian_blur_of_a_point_is_the_kernel():
    image = torch.zeros(3, 15, 15)
    image[:, 7, 7] = 1.0
    sigma = 1.3
    blurred = gaussian_blur(image, sigma)
    radius = math.ceil(3 * sigma)
    weights = [math.exp(-0.5 * (d / sigma) ** 2) for d in range(-radius, radius + 1)]
    kernel_1d = torch.tensor(weights) / sum(weights)
    expected = torch.zeros(15, 15)
    expected[7 - radius : 8 + radius, 7 - radius : 8 + radius] = torch.outer(kernel_1d, kernel_1d)
    torch.testing.assert_close(blurred[0], expected)
    torch.testing.assert_close(blurred.sum(), torch.tensor(3.0))


def test_collator_draws_from_sample_seed():
    data = toy_data(4)
    rows = [dict(data[i], sample_seed=100 + i) for i in range(4)]
    collate = CLUECollator(CLUEViews(size=16), MEAN, STD)
    torch.manual_seed(0)
    first = collate(rows)["pixel_values"]
    torch.manual_seed(123)  # the global RNG does not matter
    torch.testing.assert_close(collate(rows)["pixel_values"], first, rtol=0, atol=0)
    assert first.shape == (4, 2, 3, 16, 16)
    # each row's views come from its own seed, whatever batch it lands in
    torch.testing.assert_close(collate(rows[2:3])["pixel_values"][0], first[2], rtol=0, atol=0)
    # the values are the views, normalised
    views = CLUEViews(size=16)(image_to_tensor(rows[0]["image"]), torch.Generator().manual_seed(100))
    mean, std = torch.tensor(MEAN).view(3, 1, 1), torch.tensor(STD).view(3, 1, 1)
    torch.testing.assert_close(first[0], (views - mean) / std)


def test_collator_without_sample_seed_uses_the_global_rng():
    rows = [dict(row) for row in toy_data(3)]
    collate = CLUECollator(CLUEViews(size=16), MEAN, STD)
    torch.manual_seed(7)
    a = collate(rows)["pixel_values"]
    torch.manual_seed(7)
    torch.testing.assert_close(collate(rows)["pixel_values"], a, rtol=0, atol=0)
    assert not torch.equal(collate(rows)["pixel_values"], a)


def test_collator_adds_description_embeddings():
    rows = list(toy_data(3))
    captions = sorted({row["caption"] for row in rows})
    bank = TextBank(torch.randn(len(captions), 5), {c: i for i, c in enumerate(captions)}, column="caption")
    batch = CLUECollator(CLUEViews(size=16), MEAN, STD, text_bank=bank)(rows)
    expected = torch.stack([bank.embeddings[captions.index(row["caption"])] for row in rows])
    torch.testing.assert_close(batch["text_embeds"], expected)
    with pytest.raises(ValueError, match="image"):
        CLUECollator(CLUEViews(size=16), MEAN, STD)([{"caption": "x"}])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"crop_scale": (0.5, 0.2)}, "crop_scale"),
        ({"blur_prob": 1.5}, "blur_prob"),
        ({"hue": 0.7}, "hue"),
        ({"size": 0}, "size"),
    ],
)
def test_views_reject_impossible_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CLUEViews(**kwargs)
