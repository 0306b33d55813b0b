"""Hub-facing transformers models of hf_vrl; each folder is self-contained remote code.

Importing this package registers the models with the transformers Auto classes (`auto.register_auto_classes`).
"""

from .auto import register_auto_classes
from .clue import CLUEConfig, CLUEModel, CLUEPreTrainedModel
from .dcr import DCRConfig, DCRModel, DCRPreTrainedModel
from .diffclip import (
    DiffCLIPConfig,
    DiffCLIPModel,
    DiffCLIPPreTrainedModel,
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
    "CLUEPreTrainedModel",
    "DCRConfig",
    "DCRModel",
    "DCRPreTrainedModel",
    "DiffCLIPConfig",
    "DiffCLIPModel",
    "DiffCLIPPreTrainedModel",
    "DiffCLIPTextConfig",
    "DiffCLIPTextModel",
    "DiffCLIPTextModelWithProjection",
    "DiffCLIPVisionConfig",
    "DiffCLIPVisionModel",
    "DiffCLIPVisionModelWithProjection",
    "register_auto_classes",
]
