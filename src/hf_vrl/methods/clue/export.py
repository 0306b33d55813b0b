"""Export the backbone CLUE trained as a stock transformers model (`ResNetModel` / `ViTModel`): it loads with
`AutoModel.from_pretrained(dir)` on any machine, without hf_vrl or remote code.

The online backbone is exported (the one the paper evaluates); the heads, the part extractor and the momentum
branch stay behind. A ViT is saved without a pooler, since CLUE's feature is the final [CLS] token: load it
with `ViTModel.from_pretrained(dir, add_pooling_layer=False)` (AutoModel adds a freshly initialised pooler,
which `last_hidden_state[:, 0]` does not use).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn
from transformers import PreTrainedModel

__all__ = ["export_backbone"]


def export_backbone(model: nn.Module, out_dir: str | Path, image_processor: Any = None) -> Path:
    """Save `model.backbone` (a CLUEModel's online encoder, possibly DDP/compile-wrapped) to `out_dir`, with
    the image processor when given; returns `out_dir`."""
    backbone = getattr(getattr(model, "module", model), "backbone", None)
    if not isinstance(backbone, PreTrainedModel):
        raise TypeError(f"expected a CLUEModel with a transformers backbone, got {type(model).__name__}")
    out_dir = Path(out_dir)
    backbone.save_pretrained(out_dir)
    if image_processor is not None:
        image_processor.save_pretrained(out_dir)
    return out_dir
