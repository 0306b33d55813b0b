"""Model glue for DiVE runs: the dual encoder to fine-tune (CLIPModel, SiglipModel, DiffCLIP) with its
processors, from a Hub id, a local checkpoint or a config-only folder (random weights: tests, toy runs).

Fine-tuning needs both towers and float32 weights: a checkpoint stored in half precision is upcast (exactly);
a vision-only checkpoint is refused with a message saying what to give instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from hf_vrl.data.processors import load_image_processor
from hf_vrl.errors import UserError

__all__ = ["check_dual_encoder", "is_dual_encoder", "load_dual_encoder"]

WEIGHTS = ("model.safetensors", "model.safetensors.index.json")


def check_dual_encoder(model: nn.Module) -> None:
    """Raise a UserError unless `model` has both towers and a logit scale (what DiVE / FLYP train)."""
    missing = [
        name
        for name in ("get_image_features", "get_text_features")
        if not callable(getattr(model, name, None))
    ]
    if missing or not hasattr(model, "logit_scale"):
        raise UserError(
            f"DiVE fine-tunes both towers of a CLIP-like model; {type(model).__name__} has no "
            f"{', '.join(missing) or 'logit_scale'}. Give a CLIPModel, SiglipModel or DiffCLIP checkpoint."
        )


def is_dual_encoder(config: Any) -> bool:
    """Whether a model configuration has both towers (what `check_dual_encoder` asks of the model)."""
    return hasattr(config, "text_config") and hasattr(config, "vision_config")


def _config_only(path: Path) -> bool:
    return (path / "config.json").is_file() and not any((path / name).is_file() for name in WEIGHTS)


def load_dual_encoder(name: str, *, trust_remote_code: bool = False) -> tuple[nn.Module, Any, Any]:
    """(model in float32, image processor, tokenizer) for `name`: a Hub id, a local folder, or a hub_configs
    preset (`tiny-clip`: config, processor and tokenizer without weights -> a randomly initialised model)."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    from hf_vrl.eval_inputs import load_model_and_processors, resolve_model_path

    path = Path(resolve_model_path(name))
    if path.is_dir() and _config_only(path):
        import hf_vrl.models  # noqa: F401  (registers hf_vrl's model types)

        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        model = AutoModel.from_config(config, trust_remote_code=trust_remote_code)
        image_processor = load_image_processor(path, trust_remote_code=trust_remote_code)
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    else:
        model, image_processor, tokenizer = load_model_and_processors(
            str(path), trust_remote_code=trust_remote_code
        )
    check_dual_encoder(model)
    return model.to(torch.float32), image_processor, tokenizer
