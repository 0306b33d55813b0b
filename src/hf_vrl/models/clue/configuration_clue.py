"""Configuration of the CLUE model (fine-grained self-supervised learning with multi-level clustering
regularisation).

Self-contained remote code: imports only transformers. Written in the classic `__init__` style, which loads on
transformers 4.x and 5.x alike (5.x turns config classes into dataclasses but keeps an explicit `__init__`).
"""

from __future__ import annotations

from typing import Any

from transformers import AutoConfig, PretrainedConfig

SUPPORTED_BACKBONES = ("resnet", "vit")


def _backbone_config(backbone_config: Any) -> PretrainedConfig:
    """A ResNet-50 config by default; a dict is rebuilt from its `model_type` (as saved in config.json)."""
    if backbone_config is None:
        backbone_config = {"model_type": "resnet"}
    if isinstance(backbone_config, dict):
        kwargs = dict(backbone_config)
        model_type = kwargs.pop("model_type", None)
        if model_type not in SUPPORTED_BACKBONES:
            raise ValueError(
                f"CLUEConfig.backbone_config has model_type {model_type!r}; use one of {SUPPORTED_BACKBONES}"
            )
        backbone_config = AutoConfig.for_model(model_type, **kwargs)
    if getattr(backbone_config, "model_type", None) not in SUPPORTED_BACKBONES:
        raise ValueError(
            "CLUEConfig.backbone_config must be a ResNetConfig or ViTConfig, "
            f"got {type(backbone_config).__name__}"
        )
    return backbone_config


class CLUEConfig(PretrainedConfig):
    r"""A backbone (transformers `ResNetModel` or `ViTModel`), ReSA's projector and predictor heads, the
    VLAD part extractor (CLUE §4.2) and an optional text head (§4.3); every trainable branch has a momentum
    copy (backbone, projector, part extractor) inside the model, so checkpoints carry it.

    backbone_config (`dict` or `ResNetConfig`/`ViTConfig`, defaults to ResNet-50):
        The encoder f. Global feature h: ResNet's average-pooled last feature map, ViT's final [CLS] token.
        Local descriptors f_u of the parts: the last feature map's positions (ResNet), the patch tokens (ViT).
    projection_hidden_dim (`int`, defaults to 2048), projection_dim (`int`, defaults to 512),
    projector_num_layers (`int`, defaults to 3):
        Projector g: (Linear, BatchNorm, ReLU) x (num_layers - 1), then Linear and a BatchNorm without affine
        parameters (ReSA's `get_projector`).
    predictor_hidden_dim (`int`, defaults to 2048), predictor_num_layers (`int`, defaults to 2):
        Predictor q on the online branch only: (Linear, BatchNorm, ReLU) x (num_layers - 1), then Linear.
    num_parts (`int`, defaults to 3):
        K, the number of learnable part centroids (paper: K = 3); 0 builds no part extractor.
    part_normalize_descriptors (`bool`, defaults to `True`):
        L2-normalise each local descriptor before the soft assignment, as NetVLAD does.
    part_intra_normalization (`bool`, defaults to `False`):
        L2-normalise each part descriptor p_k (NetVLAD's intra-normalisation); the paper's formula does not.
    text_embed_dim (`int`, *optional*):
        Width of the frozen CLIP text embeddings t_i of §4.3; when set, a linear text head maps h into that
        space (the image embedding v_i of Eq. 7). `None` builds no text head.
    initializer_range (`float`, defaults to 0.02):
        Std of the normal initialisation of the part centroids; the heads and the part assignment use
        PyTorch's default Linear initialisation, as ReSA does.
    """

    model_type = "clue"
    sub_configs = {"backbone_config": AutoConfig}

    def __init__(
        self,
        backbone_config: dict | PretrainedConfig | None = None,
        projection_hidden_dim: int = 2048,
        projection_dim: int = 512,
        projector_num_layers: int = 3,
        predictor_hidden_dim: int = 2048,
        predictor_num_layers: int = 2,
        num_parts: int = 3,
        part_normalize_descriptors: bool = True,
        part_intra_normalization: bool = False,
        text_embed_dim: int | None = None,
        initializer_range: float = 0.02,
        **kwargs: Any,
    ) -> None:
        self.backbone_config = _backbone_config(backbone_config)
        self.projection_hidden_dim = projection_hidden_dim
        self.projection_dim = projection_dim
        self.projector_num_layers = projector_num_layers
        self.predictor_hidden_dim = predictor_hidden_dim
        self.predictor_num_layers = predictor_num_layers
        self.num_parts = num_parts
        self.part_normalize_descriptors = part_normalize_descriptors
        self.part_intra_normalization = part_intra_normalization
        self.text_embed_dim = text_embed_dim
        self.initializer_range = initializer_range
        for name in ("projector_num_layers", "predictor_num_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"CLUEConfig.{name} must be >= 1, got {getattr(self, name)}")
        if num_parts < 0:
            raise ValueError(f"CLUEConfig.num_parts must be >= 0 (0: no part extractor), got {num_parts}")
        if text_embed_dim is not None and text_embed_dim < 1:
            raise ValueError(f"CLUEConfig.text_embed_dim must be >= 1 or None, got {text_embed_dim}")
        super().__init__(**kwargs)

    @property
    def feature_dim(self) -> int:
        """Width of the global feature h and of each local descriptor f_u."""
        backbone = self.backbone_config
        return backbone.hidden_sizes[-1] if backbone.model_type == "resnet" else backbone.hidden_size


CLUEConfig.register_for_auto_class()  # save_pretrained copies this file and writes auto_map (remote code)
