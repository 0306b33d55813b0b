"""Building CLUE models: from a transformers ResNet/ViT checkpoint (the paper's ImageNet start), from a saved
CLUE model, from a config; the image processor."""

from __future__ import annotations

import pytest
import torch
from clue_helpers import TINY_RESNET, TINY_VIT, tiny_settings
from transformers import (
    CLIPVisionConfig,
    ConvNextImageProcessorPil,
    ResNetConfig,
    ResNetForImageClassification,
    ViTConfig,
    ViTForImageClassification,
    ViTModel,
)

from hf_vrl.errors import UserError
from hf_vrl.methods.clue.model import build_image_processor, build_model, from_backbone
from hf_vrl.models.clue import CLUEModel


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_from_an_image_classification_checkpoint(tmp_path):
    """`microsoft/resnet-50` is a ResNetForImageClassification: its `resnet.*` weights start both branches."""
    torch.manual_seed(0)
    config = {k: v for k, v in TINY_RESNET.items() if k != "model_type"}
    classifier = ResNetForImageClassification(ResNetConfig(**config, num_labels=5)).eval()
    classifier.save_pretrained(tmp_path / "resnet")
    ConvNextImageProcessorPil(image_mean=[0.1, 0.2, 0.3], image_std=[0.4, 0.5, 0.6]).save_pretrained(
        tmp_path / "resnet"
    )
    settings = tiny_settings(backbone=str(tmp_path / "resnet"), backbone_config=None)
    model = build_model(settings, text_embed_dim=7).eval()
    assert _same_weights(model.backbone, classifier.resnet)
    assert _same_weights(model.momentum_backbone, classifier.resnet)
    assert model.text_projector.out_features == 7 and model.config.projection_dim == settings.projection_dim
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(
            model.get_image_features(x).pooler_output, classifier.resnet(x).pooler_output.flatten(1)
        )
    processor = build_image_processor(settings)  # the checkpoint's own normalisation
    assert (
        list(processor.image_mean) == pytest.approx([0.1, 0.2, 0.3]) and processor.size["shortest_edge"] == 16
    )


def test_from_a_vit_leaves_its_pooler_behind():
    torch.manual_seed(0)
    vit = ViTModel(ViTConfig(**{k: v for k, v in TINY_VIT.items() if k != "model_type"}))  # with a pooler
    model = from_backbone(vit, projection_hidden_dim=32, projection_dim=8, predictor_hidden_dim=16).eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(model.get_image_features(x).pooler_output, vit(x).last_hidden_state[:, 0])
    assert not hasattr(model.backbone, "pooler") or model.backbone.pooler is None


@pytest.mark.parametrize("checkpoint", [ViTForImageClassification, ViTModel])
def test_from_a_vit_checkpoint_with_or_without_a_pooler(tmp_path, checkpoint):
    """clue-vitb16's `google/vit-base-patch16-224` is a ViTForImageClassification, which has no pooler;
    an in21k ViTModel has one. Both start CLUE, whose ViT has no pooler."""
    torch.manual_seed(0)
    saved = checkpoint(ViTConfig(**{k: v for k, v in TINY_VIT.items() if k != "model_type"}))
    saved.save_pretrained(tmp_path / "vit")
    model = build_model(tiny_settings(backbone=str(tmp_path / "vit"), backbone_config=None))
    vit = saved.vit if checkpoint is ViTForImageClassification else saved
    weights = vit.state_dict()
    assert all(torch.equal(value, weights[key]) for key, value in model.backbone.state_dict().items())


def test_continue_from_a_clue_checkpoint(tmp_path):
    settings = tiny_settings()
    trained = build_model(settings, text_embed_dim=6)
    with torch.no_grad():  # branches that differ, so the EMA moves the momentum weights
        for param in trained.backbone.parameters():
            param.add_(1.0)
    online = trained.backbone.embedder.embedder.convolution.weight.clone()
    before = trained.momentum_backbone.embedder.embedder.convolution.weight.clone()
    assert not torch.equal(online, before)
    trained.update_momentum(0.25)
    moved = trained.momentum_backbone.embedder.embedder.convolution.weight
    torch.testing.assert_close(moved, 0.25 * before + 0.75 * online)  # theta_m <- m theta_m + (1 - m) theta
    trained.save_pretrained(tmp_path)
    again = build_model(tiny_settings(backbone=str(tmp_path), backbone_config=None), text_embed_dim=6)
    assert type(again) is CLUEModel and _same_weights(again, trained)
    torch.testing.assert_close(again.momentum_backbone.embedder.embedder.convolution.weight, moved)
    with pytest.raises(UserError, match="text head of width 6"):
        build_model(tiny_settings(backbone=str(tmp_path), backbone_config=None), text_embed_dim=9)


def test_from_a_config_and_clear_errors(tmp_path):
    model = build_model(tiny_settings(num_parts=2))
    assert model.config.num_parts == 2 and model.text_projector is None
    processor = build_image_processor(tiny_settings())  # no checkpoint: ImageNet's normalisation
    assert list(processor.image_mean) == pytest.approx([0.485, 0.456, 0.406])
    with pytest.raises(UserError, match="cannot load"):
        build_model(tiny_settings(backbone=str(tmp_path / "missing"), backbone_config=None))
    CLIPVisionConfig().save_pretrained(tmp_path / "clip")
    with pytest.raises(UserError, match="must be a ResNet or ViT checkpoint"):
        build_model(tiny_settings(backbone=str(tmp_path / "clip"), backbone_config=None))
    with pytest.raises(UserError, match="ResNet or ViT backbone"):
        from_backbone(torch.nn.Linear(2, 2))
