"""Build a `CLUEModel` and its image processor from `CLUESettings`: from a transformers ResNet/ViT checkpoint
(the paper starts from ImageNet weights: `microsoft/resnet-50`), from a saved CLUE model, or from a backbone
config (random initialisation, the tiny presets).

Only what the objective reads is trained: a term switched off leaves its modules out (no part extractor with
beta = 0, no text head with gamma = 0) or frozen where the model must have them (projector and predictor with
alpha = 0; a loaded CLUE model's unused heads), so several processes (DDP) never wait for a gradient that
does not come. `to_sync_batchnorm` / `to_plain_batchnorm` switch the BatchNorm layers for training on
several processes (ReSA's SyncBatchNorm) and back for everything that is saved or evaluated.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from transformers import AutoConfig, AutoImageProcessor, AutoModel, ConvNextImageProcessorPil

from hf_vrl.errors import UserError
from hf_vrl.methods.clue.settings import BACKBONES, CLUESettings
from hf_vrl.methods.clue.trainer import IMAGENET_MEAN, IMAGENET_STD
from hf_vrl.models.clue import CLUEConfig, CLUEModel
from hf_vrl.weights import load_pretrained

__all__ = [
    "build_image_processor",
    "build_model",
    "freeze_unused",
    "from_backbone",
    "to_plain_batchnorm",
    "to_sync_batchnorm",
]

EVAL_CROP_PCT = 0.875  # evaluation: shorter side to size / 0.875, then a centre crop (224 from 256)


def from_backbone(backbone: torch.nn.Module, **config_kwargs: Any) -> CLUEModel:
    """A CLUE model whose online and momentum backbones start from `backbone`'s weights (a `ResNetModel` or
    `ViTModel`; a ViT's pooler, which CLUE does not use, is left out). Heads and parts start fresh."""
    model_type = getattr(getattr(backbone, "config", None), "model_type", None)
    if model_type not in BACKBONES:
        raise UserError(f"CLUE builds on a ResNet or ViT backbone, got model_type {model_type!r}")
    model = CLUEModel(CLUEConfig(backbone_config=backbone.config.to_dict(), **config_kwargs))
    missing, unexpected = model.backbone.load_state_dict(backbone.state_dict(), strict=False)
    unexpected = [key for key in unexpected if not key.startswith("pooler.")]
    if missing or unexpected:
        raise ValueError(f"backbone weights do not fit: missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.reset_momentum()
    return model


def build_model(settings: CLUESettings, *, text_embed_dim: int | None = None) -> CLUEModel:
    """The model the settings describe; `text_embed_dim` (the text encoder's width) adds the text head.

    `settings.backbone` may name a ResNet/ViT checkpoint (any head: `ResNetForImageClassification` loads
    through AutoModel) or a saved CLUE model, which is loaded as is (its text head must match when the text
    term is on). What the settings leave unused is not built or is frozen (`freeze_unused`).
    """
    return freeze_unused(_build(settings, text_embed_dim), settings)


def _build(settings: CLUESettings, text_embed_dim: int | None) -> CLUEModel:
    kwargs = {**settings.model_config(), "text_embed_dim": text_embed_dim}
    if settings.backbone_config is not None:
        return CLUEModel(CLUEConfig(backbone_config=dict(settings.backbone_config), **kwargs))
    try:
        config = AutoConfig.from_pretrained(settings.backbone)
    except (OSError, ValueError) as err:
        raise UserError(f"cannot load model.backbone {settings.backbone!r}: {err}") from err
    if config.model_type == CLUEConfig.model_type:
        model = load_pretrained(CLUEModel, settings.backbone, dtype=torch.float32)
        if text_embed_dim is not None and model.config.text_embed_dim != text_embed_dim:
            raise UserError(
                f"{settings.backbone} has a text head of width {model.config.text_embed_dim}, the text "
                f"encoder gives {text_embed_dim}: use the text_encoder it was trained with (or gamma = 0)"
            )
        return model
    if config.model_type not in BACKBONES:
        raise UserError(
            f"model.backbone must be a ResNet or ViT checkpoint, {settings.backbone} is {config.model_type!r}"
        )
    # CLUE's ViT has no pooler, and a ViT image classifier's checkpoint (google/vit-base-patch16-224) none
    unused = {"add_pooling_layer": False} if config.model_type == "vit" else {}
    backbone = load_pretrained(
        AutoModel, settings.backbone, extra_allowed=True, dtype=torch.float32, **unused
    )
    return from_backbone(backbone, **kwargs)


def freeze_unused(model: CLUEModel, settings: CLUESettings) -> CLUEModel:
    """Freeze (requires_grad False: no gradient, no optimiser step, nothing for DDP to wait for) the modules
    no term of Eq. 8 reads: the projector and predictor with alpha = 0 (only L_global reads `embeddings`;
    Sinkhorn's targets use the backbone features), a part extractor with beta = 0 and a text head with
    gamma = 0 (a loaded CLUE model's; built from settings, those two are left out). Returns `model`."""
    unused = []
    if settings.alpha == 0:
        unused += [model.projector, model.predictor]
    if settings.beta == 0:
        unused.append(model.part_extractor)
    if settings.gamma == 0:
        unused.append(model.text_projector)
    for module in unused:
        if module is not None:
            module.requires_grad_(False)
    return model


def to_sync_batchnorm(model: nn.Module, process_group: Any = None) -> nn.Module:
    """Turn every BatchNorm layer of `model` (backbone, heads, momentum branch) into a
    `torch.nn.SyncBatchNorm`, so batch statistics and running averages cover the micro-batches of every
    process (ReSA converts its whole model the same way). In place: each layer keeps its identity, parameters
    and buffers (`nn.SyncBatchNorm.convert_sync_batchnorm` makes new layers), so optimiser, DDP/FSDP and
    hooks stay valid; `to_plain_batchnorm` undoes it. Returns `model`."""
    for module in model.modules():
        if isinstance(module, _BatchNorm) and not isinstance(module, nn.SyncBatchNorm):
            module.plain_class = type(module)
            module.__class__ = nn.SyncBatchNorm
            module.process_group = process_group
    return model


def to_plain_batchnorm(model: nn.Module) -> nn.Module:
    """Undo `to_sync_batchnorm` in place: each layer it converted is its BatchNorm class again (same module,
    parameters, buffers, training mode), so saved models and exports hold stock layers. Returns `model`."""
    for module in model.modules():
        if isinstance(module, nn.SyncBatchNorm):
            plain_class = getattr(module, "plain_class", None)
            if plain_class is None:
                raise TypeError(
                    "a SyncBatchNorm that to_sync_batchnorm did not make: its BatchNorm class is unknown"
                )
            module.__class__ = plain_class
            del module.plain_class, module.process_group
    return model


def _checkpoint_normalisation(name: str | None) -> tuple[list[float], list[float]]:
    """The mean/std of the checkpoint's own image processor (ImageNet's when it has none or is random)."""
    if name is not None:
        try:
            processor = AutoImageProcessor.from_pretrained(name)
            return list(processor.image_mean), list(processor.image_std)
        except (OSError, ValueError, AttributeError, TypeError):
            pass
    return list(IMAGENET_MEAN), list(IMAGENET_STD)


def build_image_processor(
    settings: CLUESettings, normalisation_from: str | None = None
) -> ConvNextImageProcessorPil:
    """Evaluation preprocessing at `settings.image_size` (resize to size / 0.875, centre crop) with the
    normalisation of `normalisation_from`'s image processor (default: the backbone checkpoint's); its
    mean/std also normalise the training views."""
    mean, std = _checkpoint_normalisation(normalisation_from or settings.backbone)
    size = settings.image_size
    return ConvNextImageProcessorPil(
        size={"shortest_edge": size}, crop_pct=EVAL_CROP_PCT, image_mean=mean, image_std=std
    )
