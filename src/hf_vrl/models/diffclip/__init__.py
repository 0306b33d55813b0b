"""DiffCLIP (CLIP with differential attention) as transformers models; these two files ship as Hub remote
code."""

from .configuration_diffclip import DiffCLIPConfig, DiffCLIPTextConfig, DiffCLIPVisionConfig
from .modeling_diffclip import (
    DiffCLIPModel,
    DiffCLIPPreTrainedModel,
    DiffCLIPTextModel,
    DiffCLIPTextModelWithProjection,
    DiffCLIPVisionModel,
    DiffCLIPVisionModelWithProjection,
)

__all__ = [
    "DiffCLIPConfig",
    "DiffCLIPModel",
    "DiffCLIPPreTrainedModel",
    "DiffCLIPTextConfig",
    "DiffCLIPTextModel",
    "DiffCLIPTextModelWithProjection",
    "DiffCLIPVisionConfig",
    "DiffCLIPVisionModel",
    "DiffCLIPVisionModelWithProjection",
]
