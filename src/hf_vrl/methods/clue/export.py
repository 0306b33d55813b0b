"""Export the backbone CLUE trained as a stock transformers model (`ResNetModel` / `ViTModel`): it loads with
`AutoModel.from_pretrained(dir)` on any machine, without hf_vrl or remote code, every tensor from the file.

The online backbone is exported (the one the paper evaluates); the heads, the part extractor and the momentum
branch stay behind. CLUE's ViT feature is the final [CLS] token and its ViT has no pooler; a stock `ViTModel`
has one, so the export carries a pooler of zeros (CLUE trains none: `pooler_output` is 0, never a random
layer drawn anew at each load). Each backbone comes with its checkpoints' own image-processor class: a
ResNet with the run's `ConvNextImageProcessor` (microsoft/resnet-50's), a ViT with a `ViTImageProcessor`
(google/vit-base-patch16-224's: a resize to the run's image size) with the run's normalisation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

__all__ = ["export_backbone"]


def _stock(backbone: PreTrainedModel) -> PreTrainedModel:
    """`backbone` as its stock class loads it: a ViT without a pooler gains one of zeros."""
    if backbone.config.model_type != "vit" or getattr(backbone, "pooler", None) is not None:
        return backbone
    from transformers import ViTModel

    stock = ViTModel(backbone.config).to(dtype=backbone.dtype)
    zeros = {f"pooler.{name}": torch.zeros_like(value) for name, value in stock.pooler.state_dict().items()}
    stock.load_state_dict({**backbone.state_dict(), **zeros})
    return stock


def _image_processor(backbone: PreTrainedModel, image_processor: Any) -> Any:
    """The image processor of `backbone`'s stock class, at the run's size and normalisation."""
    if backbone.config.model_type != "vit":
        return image_processor
    from hf_vrl.data.processors import image_processor_class

    size = backbone.config.image_size
    return image_processor_class("ViTImageProcessor")(
        size={"height": size, "width": size},
        image_mean=list(image_processor.image_mean),
        image_std=list(image_processor.image_std),
    )


def export_backbone(model: nn.Module, out_dir: str | Path, image_processor: Any = None) -> Path:
    """Save `model.backbone` (a CLUEModel's online encoder, possibly DDP/compile-wrapped) to `out_dir` as its
    stock class, with its image processor when the run's is given; returns `out_dir`."""
    backbone = getattr(getattr(model, "module", model), "backbone", None)
    if not isinstance(backbone, PreTrainedModel):
        raise TypeError(f"expected a CLUEModel with a transformers backbone, got {type(model).__name__}")
    out_dir = Path(out_dir)
    _stock(backbone).save_pretrained(out_dir)
    if image_processor is not None:
        _image_processor(backbone, image_processor).save_pretrained(out_dir)
    return out_dir
