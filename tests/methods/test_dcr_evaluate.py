"""Before/after evaluation: the vision-only pair-discrimination score on hand-checkable encoders, the
D-/P-ability report layout (the text-tower MMVP protocol when the CLIP has a text side), the device rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from hf_vrl.contrastive import as_embeddings
from hf_vrl.data.toy import shapes_dataset, shapes_mmvp_pairs
from hf_vrl.devices import module_device
from hf_vrl.methods.dcr.augment import DCRAugment
from hf_vrl.methods.dcr.evaluate import DCREvalModel, embed_images, evaluate_encoder, pair_discrimination
from hf_vrl.methods.dcr.task import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
from hf_vrl.methods.dcr.toy import tiny_clip
from hf_vrl.models.dcr import DCRModel

MEAN, STD = OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

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
    assert set(vision_only) == {"clustering", "clustering_fine", "pairs"}  # no text tower: no MMVP-VLM
    assert vision_only["pairs"]["protocol"].startswith("image-image")
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


def test_eval_model_follows_the_encoder(device):
    """The original CLIP stays where it was loaded (CPU); the encoder runs on `device` in float64: the wrapper
    brings the CLIP along and every call moves its inputs to the tower it calls (the device rule)."""
    clip = tiny_clip(image_size=16).eval()
    ids = torch.tensor([[0, 5, 7, 1]])
    with torch.no_grad():
        text = as_embeddings(clip.get_text_features(input_ids=ids, attention_mask=torch.ones_like(ids)))
    encoder = (
        DCRModel.from_clip(clip, condition_dim=16, num_condition_tokens=4).eval().to(device, torch.float64)
    )
    wrapper = DCREvalModel(encoder, clip)
    try:
        assert module_device(wrapper.clip).type == device.type
        x = torch.rand(2, 3, 16, 16)  # float32 on the CPU
        with torch.no_grad():
            image = wrapper.get_image_features(x)
            torch.testing.assert_close(image, encoder.get_image_features(x.to(device, torch.float64)))
            got = wrapper.get_text_features(ids, torch.ones_like(ids))
        torch.testing.assert_close(got.cpu(), text)
        z = embed_images(encoder, list(shapes_dataset(3, seed=0, image_size=16)["image"]), 16, MEAN, STD)
        assert z.shape == (3, 24) and z.dtype == torch.float32 and z.device.type == "cpu"
    finally:
        clip.to("cpu")


def test_mmvp_protocol_on_the_encoder_device(device):
    """MMVP-VLM through hf_vrl.evaluation: token ids follow the encoder's device to the original CLIP's text
    tower, which stayed on the CPU until the evaluation (the crash on CUDA before the device rule)."""
    from transformers import AutoConfig, AutoImageProcessor, AutoTokenizer, CLIPModel

    from hf_vrl.presets import preset_path

    folder = preset_path("tiny-clip")
    torch.manual_seed(0)
    clip = CLIPModel(AutoConfig.from_pretrained(folder)).eval()
    encoder = DCRModel.from_clip(clip, condition_dim=16, num_condition_tokens=4).to(device, torch.float64)
    pairs = shapes_mmvp_pairs(n_per_category=1, image_size=32)
    data = shapes_dataset(12, seed=0, image_size=32, split="test")
    try:
        report = evaluate_encoder(
            encoder,
            data,
            pairs,
            clip=clip,
            image_processor=AutoImageProcessor.from_pretrained(folder),
            tokenizer=AutoTokenizer.from_pretrained(folder),
            image_size=32,
            image_mean=MEAN,
            image_std=STD,
        )
        assert report["mmvp"]["protocol"].startswith("MMVP-VLM") and report["mmvp"]["n_pairs"] == 5
        assert report["pairs"]["n_pairs"] == 5  # the image-image score comes with it
    finally:
        clip.to("cpu")


class LinearEncoder(nn.Module):
    """z = x W on the flattened pixels, in float64, with no cast of its own (CLIP casts its pixels)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3 * 16 * 16, 8, dtype=torch.float64))

    def get_image_features(self, pixel_values):
        return pixel_values.flatten(1) @ self.weight


def test_inputs_follow_the_encoder_dtype(pairs, device):
    encoder = LinearEncoder().to(device)
    x = torch.rand(2, 3, 16, 16)
    wrapper = DCREvalModel(encoder, tiny_clip(image_size=16))
    torch.testing.assert_close(
        wrapper.get_image_features(x), encoder.get_image_features(x.to(device, torch.float64))
    )
    images = list(pairs["image_a"])
    z = embed_images(encoder, images, 16, MEAN, STD)
    pixels = torch.stack(
        [torch.from_numpy(np.asarray(im, dtype=np.float32) / 255).permute(2, 0, 1) for im in images]
    )
    mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
    expected = encoder.get_image_features(((pixels - mean) / std).to(device, torch.float64)).float().cpu()
    torch.testing.assert_close(
        z, expected, rtol=1e-5, atol=1e-5
    )  # 16-px images: the crop/resize is the identity
    assert pair_discrimination(encoder, pairs, 16, MEAN, STD, augment=NO_OP)["accuracy"] == 1.0
