"""Before/after evaluation: the vision-only pair-discrimination score on hand-checkable encoders, and the
D-/P-ability report layout (the text-tower MMVP protocol when the CLIP has a text side)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hf_vrl.data.toy import shapes_dataset, shapes_mmvp_pairs
from hf_vrl.methods.dcr.augment import DCRAugment
from hf_vrl.methods.dcr.evaluate import DCREvalModel, evaluate_encoder, pair_discrimination
from hf_vrl.methods.dcr.task import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
from hf_vrl.methods.dcr.toy import tiny_clip
from hf_vrl.models.dcr import DCRModel

NO_OP = DCRAugment(
    brightness=0, contrast=0, saturation=0, hue=0, hflip_prob=0, vflip_prob=0, crop_scale=(1, 1)
)
NO_OP.crop_ratio = (1.0, 1.0)


class PixelEncoder(nn.Module):
    """z = the normalised pixels themselves: every detail is in the embedding."""

    def __init__(self, constant: bool = False):
        super().__init__()
        self.constant = constant
        self.dummy = nn.Parameter(torch.zeros(1))

    def get_image_features(self, pixel_values):
        z = pixel_values.flatten(1)
        return torch.ones_like(z) if self.constant else z


@pytest.fixture(scope="module")
def pairs():
    return shapes_mmvp_pairs(n_per_category=2, image_size=16)


def test_pair_discrimination_hand_cases(pairs):
    perfect = pair_discrimination(PixelEncoder(), pairs, 16, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, augment=NO_OP)
    assert perfect["accuracy"] == 1.0 and perfect["n_pairs"] == 10  # a' == a: always nearer a than b
    blind = pair_discrimination(PixelEncoder(constant=True), pairs, 16, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD)
    assert blind["accuracy"] == 0.0 and blind["statement_accuracy"] == 0.5  # ties: MMVP picks image 1


def test_evaluate_encoder_protocols(pairs):
    clip = tiny_clip(image_size=16).eval()
    encoder = DCRModel.from_clip(clip, condition_dim=16, num_condition_tokens=4)
    data = shapes_dataset(24, seed=0, image_size=16, split="test")
    vision_only = evaluate_encoder(
        encoder, data, pairs, image_size=16, image_mean=OPENAI_CLIP_MEAN, image_std=OPENAI_CLIP_STD
    )
    assert set(vision_only) == {"clustering", "clustering_fine", "mmvp"}
    assert vision_only["mmvp"]["protocol"].startswith("image-image")
    assert 0 <= vision_only["clustering"]["nmi"] <= 1
    assert encoder.training  # the mode is restored

    wrapper = DCREvalModel(encoder, clip)
    x = torch.rand(2, 3, 16, 16)
    torch.testing.assert_close(wrapper.get_image_features(x), encoder.get_image_features(x))
    ids = torch.tensor([[0, 5, 7, 1]])
    expected = clip.get_text_features(input_ids=ids, attention_mask=torch.ones_like(ids))
    torch.testing.assert_close(
        wrapper.get_text_features(ids, torch.ones_like(ids)), getattr(expected, "pooler_output", expected)
    )
