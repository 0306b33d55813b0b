"""The result of DiVE as stock transformers checkpoints: the dual encoder as itself (a plain CLIPModel /
SiglipModel: the frozen pre-trained model lives in the trainer and is never part of it) and its vision tower
alone as a CLIPVisionModel / SiglipVisionModel (what LLaVA's `vision_tower` loads). DiffCLIP's vision tower is
already a DiffCLIPVisionModel and is saved as one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn
from transformers import CLIPVisionModel, PreTrainedModel, SiglipVisionModel

from hf_vrl.integrations.llava import save_vision_tower

__all__ = ["export_model", "export_vision_tower", "vision_tower"]

VISION_TOWERS = {"clip": CLIPVisionModel, "siglip": SiglipVisionModel}


def _save_processors(out_dir: Path, *processors: Any) -> None:
    for processor in processors:
        if processor is not None:
            processor.save_pretrained(out_dir)


def export_model(
    model: PreTrainedModel, out_dir: str | Path, image_processor: Any = None, tokenizer: Any = None
) -> Path:
    """Save the fine-tuned dual encoder (and its processors) so that `from_pretrained` loads it as is."""
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    _save_processors(out_dir, image_processor, tokenizer)
    return out_dir


def vision_tower(model: nn.Module) -> PreTrainedModel:
    """The vision half of a CLIP / SigLIP / DiffCLIP dual encoder as a standalone transformers model."""
    tower = getattr(model, "vision_model", None)
    if isinstance(tower, PreTrainedModel):  # DiffCLIP
        return tower
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if tower is None or model_type not in VISION_TOWERS:
        raise TypeError(
            f"cannot export the vision tower of {type(model).__name__} (model_type {model_type!r}); "
            f"supported: {', '.join(VISION_TOWERS)} and DiffCLIP"
        )
    standalone = VISION_TOWERS[model_type](model.config.vision_config)
    standalone.vision_model.load_state_dict(tower.state_dict())
    return standalone.to(next(model.parameters()).dtype)


def export_vision_tower(model: nn.Module, out_dir: str | Path, image_processor: Any = None) -> Path:
    """Save the fine-tuned vision tower as a CLIPVisionModel / SiglipVisionModel (DiffCLIPVisionModel), in the
    layout every supported transformers reads (`save_vision_tower`)."""
    out_dir = Path(out_dir)
    save_vision_tower(vision_tower(model), out_dir)
    _save_processors(out_dir, image_processor)
    return out_dir
