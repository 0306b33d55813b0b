"""Hub-facing transformers models of hf_vrl; each folder is self-contained remote code.

Importing this package registers the models with the transformers Auto classes (`auto.register_auto_classes`).
"""

from .auto import register_auto_classes
from .clue import CLUEConfig, CLUEModel
from .diffclip import (
    DiffCLIPConfig,
    DiffCLIPModel,
    DiffCLIPTextConfig,
    DiffCLIPTextModel,
    DiffCLIPTextModelWithProjection,
    DiffCLIPVisionConfig,
    DiffCLIPVisionModel,
    DiffCLIPVisionModelWithProjection,
)

register_auto_classes()

__all__ = [
    "CLUEConfig",
    "CLUEModel",
    "DiffCLIPConfig",
    "DiffCLIPModel",
    "DiffCLIPTextConfig",
    "DiffCLIPTextModel",
    "DiffCLIPTextModelWithProjection",
    "DiffCLIPVisionConfig",
    "DiffCLIPVisionModel",
    "DiffCLIPVisionModelWithProjection",
    "register_auto_classes",
]
