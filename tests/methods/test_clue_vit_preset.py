"""The `clue-vitb16` preset (Table 1's CLUE (ViT-B) row): it resolves, builds a ViT-backed CLUE model from a
ViT checkpoint offline, and says how its checkpoint differs from the paper's."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from clue_helpers import TINY_HEADS, TINY_VIT
from transformers import ViTConfig, ViTImageProcessor, ViTModel

from hf_vrl.methods.clue.method import CLUERunConfig
from hf_vrl.methods.clue.model import build_image_processor, build_model
from hf_vrl.models.clue import CLUEConfig
from hf_vrl.presets import load_preset
from hf_vrl.run.config import resolve


@pytest.fixture(scope="module")
def config() -> CLUERunConfig:
    return resolve(CLUERunConfig, load_preset("clue-vitb16"), source="clue-vitb16")


def test_the_preset_is_the_r50_recipe_on_a_vit_base(config):
    r50 = resolve(CLUERunConfig, load_preset("clue-r50"))
    assert config.model.backbone == "google/vit-base-patch16-224" and config.model.backbone_config is None
    assert config.clue == r50.clue and config.data == r50.data and config.eval == r50.eval  # as ResNet-50
    assert config.model.text_encoder == r50.model.text_encoder
    assert (config.optim.optimizer, config.optim.global_batch_size) == ("sgd", 512)
    assert config.optim.learning_rate == pytest.approx(0.005 * config.optim.global_batch_size / 256)
    assert (config.optim.weight_decay, config.optim.max_grad_norm) == (0.0, 1.0)  # ViT's SGD fine-tuning
    # ViT-B/16 at the preset's 224 px: 768-d [CLS] feature, 14 x 14 patch tokens for the part term
    architecture = CLUEConfig(backbone_config={"model_type": "vit", **ViTConfig().to_dict()})
    assert architecture.feature_dim == 768 and config.clue.image_size // ViTConfig().patch_size == 14


def test_the_notes_name_the_checkpoint_difference():
    preset = load_preset("clue-vitb16")
    backbone_note = preset["notes"][0]
    assert "official TensorFlow" in backbone_note and "google/vit-base-patch16-224" in backbone_note
    assert "ImageNet-21k" in backbone_note and "not the paper's exact" in backbone_note
    assert "(ViT-B)" in preset["description"]


def test_the_preset_builds_a_vit_clue_model_from_a_vit_checkpoint(config, tmp_path):
    """The preset's settings with its checkpoint replaced by a tiny ViT saved locally (no download)."""
    torch.manual_seed(0)
    vit = ViTModel(ViTConfig(**{k: v for k, v in TINY_VIT.items() if k != "model_type"})).eval()
    vit.save_pretrained(tmp_path / "vit")
    ViTImageProcessor(image_mean=[0.5] * 3, image_std=[0.5] * 3).save_pretrained(tmp_path / "vit")
    tiny = dict(backbone=str(tmp_path / "vit"), image_size=16, text_encoder="tiny-clip", **TINY_HEADS)
    settings = dataclasses.replace(config.settings(), **tiny)
    model = build_model(settings, text_embed_dim=8).eval()
    assert type(model.backbone) is ViTModel and type(model.momentum_backbone) is ViTModel
    assert model.config.num_parts == 3 and model.text_projector.out_features == 8
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(model.get_image_features(x).pooler_output, vit(x).last_hidden_state[:, 0])
        out = model(pixel_values=x, output_part_assignments=True)
    assert out.part_assignments.shape == (2, 3, 4, 4)  # K = 3 parts over the 4 x 4 patch grid
    assert list(build_image_processor(settings).image_mean) == pytest.approx([0.5] * 3)
