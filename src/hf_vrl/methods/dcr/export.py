"""Export a trained DCR encoder as a plain transformers vision tower (no custom code needed to load it).

The LoRA adapters are merged (peft `merge_and_unload`) and the tower is saved with `vision_model.`-prefixed
keys: transformers 5.x loads them through CLIPVisionModel's prefix handling and 4.x expects exactly these
names, so the checkpoint works in both and drops into LLaVA (`vision_tower`) unchanged. The projector, the
null-text buffer and the diffusion model are left behind: the enhanced encoder is all a downstream user needs.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn
from transformers import CLIPVisionModelWithProjection

from hf_vrl.integrations.llava import save_vision_tower
from hf_vrl.models.dcr import DCRModel


def merge_lora(model: nn.Module) -> DCRModel:
    """A plain `DCRModel` with any LoRA adapters merged into the weights (the input is left untouched)."""
    model = copy.deepcopy(model)
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    if not isinstance(model, DCRModel):
        raise TypeError(f"expected a DCRModel or a PeftModel around one, got {type(model).__name__}")
    return model


def export_vision_tower(
    model: nn.Module, out_dir: str | Path, with_projection: bool = False, image_processor=None
) -> Path:
    """Write the enhanced encoder of a DCR model (LoRA merged) as a stock transformers checkpoint.

    `with_projection=False`: a `CLIPVisionModel` / `SiglipVisionModel` (what LLaVA's `vision_tower` loads).
    `with_projection=True` (CLIP only): a `CLIPVisionModelWithProjection`, which also carries the trained
    `visual_projection` (the image embedding DCR conditions on, e.g. for MMVP-VLM scoring).
    An `image_processor`, when given, is saved alongside so the folder is self-sufficient.
    """
    merged = merge_lora(model)
    out_dir = Path(out_dir)
    if with_projection:
        if merged.visual_projection is None:
            raise ValueError("with_projection=True needs a CLIP tower; SigLIP has no visual_projection")
        tower = CLIPVisionModelWithProjection(merged.config.vision_config)
        tower.vision_model.load_state_dict(merged.vision_model.state_dict())
        tower.visual_projection.load_state_dict(merged.visual_projection.state_dict())
        tower.save_pretrained(out_dir)
    else:
        save_vision_tower(merged.vision_model, out_dir)  # the cross-version layout (hf-conventions §2.5)
    if image_processor is not None:
        image_processor.save_pretrained(out_dir)
    return out_dir


def export_base_model(model: nn.Module, base: str | Path, out_dir: str | Path) -> Path:
    """The base checkpoint `base` (a CLIPModel / SiglipModel, or a vision tower) with the DCR model's
    enhanced tower and projection merged in, written to `out_dir` with the base's processors.

    This is what the official release saves (its LoRA merged into the whole CLIPModel): the text tower is the
    original one, so zero-shot scoring and MMVP-VLM use the enhanced image embedding against the original text
    embedding, as the paper evaluates P-ability.
    """
    from transformers import AutoImageProcessor, AutoTokenizer

    from hf_vrl.models.dcr.modeling_dcr import _load_tower

    merged = merge_lora(model)
    full = _load_tower(str(base), torch.float32)  # the base's own class: CLIPModel, SiglipModel, ...
    tower = getattr(full, "vision_model", full)  # a vision-only SigLIP base is the tower itself
    tower.load_state_dict(merged.vision_model.state_dict())
    if merged.visual_projection is not None and hasattr(full, "visual_projection"):
        full.visual_projection.load_state_dict(merged.visual_projection.state_dict())
    out_dir = Path(out_dir)
    full.save_pretrained(out_dir)
    for loader in (AutoImageProcessor, AutoTokenizer):
        try:
            loader.from_pretrained(str(base)).save_pretrained(out_dir)
        except (OSError, ValueError):
            continue  # a vision-only base has no tokenizer
    return out_dir
