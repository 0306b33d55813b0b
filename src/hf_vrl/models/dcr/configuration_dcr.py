"""Configuration of the DCR vision model (Diffusion Contrastive Reconstruction, arXiv 2603.04803).

Self-contained remote code: imports only transformers.
"""

from __future__ import annotations

import transformers
from transformers import AutoConfig, PretrainedConfig

MINIMUM_TRANSFORMERS = (4, 57)
SUPPORTED_VISION_MODEL_TYPES = ("clip_vision_model", "siglip_vision_model")
CONDITION_MODES = ("official", "cls", "cls_patches")


def require_transformers(minimum: tuple[int, int] = MINIMUM_TRANSFORMERS) -> None:
    """Fail at import, naming the minimum, when the installed transformers is older than this code
    supports."""
    found = tuple(int(part) for part in transformers.__version__.split(".")[:2])
    if found < minimum:
        needed = ".".join(map(str, minimum))
        raise ImportError(
            f"DCR's model code needs transformers>={needed}, found {transformers.__version__}: "
            f"pip install -U 'transformers>={needed}'"
        )


require_transformers()


def same_config(config: PretrainedConfig, other: object) -> bool:
    """Configs are equal when their serialised forms are (transformers >= 5.17 turns config classes into
    dataclasses, whose generated `__eq__` would compare the base class's fields only)."""
    return isinstance(other, PretrainedConfig) and config.to_dict() == other.to_dict()


class DCRConfig(PretrainedConfig):
    r"""A CLIP-family vision tower f_phi plus the DCR projector h_omega that maps its image embedding into the
    cross-attention space of a Stable Diffusion UNet (DCR §3, §4.2).

    vision_config (`dict` or `CLIPVisionConfig`/`SiglipVisionConfig`, *optional*):
        The vision tower (a dict is built with its `model_type`, `"clip_vision_model"` when absent). CLIP
        towers feed the projector their *projected* image embedding (`visual_projection(pooler_output)`, width
        `vision_config.projection_dim`), SigLIP towers their attention-pooled `pooler_output` (width
        `hidden_size`), as the official code does.
    condition_dim (`int`, defaults to 1024):
        Width of the UNet's cross-attention (`unet.config.cross_attention_dim`): 1024 for SD-2.x, 768 for
        SD-1.x.
    projector_hidden_dim (`int`, *optional*):
        Hidden width of the two-layer MLP projector; defaults to `condition_dim` (official `clip_dim`).
    projector_hidden_act (`str`, defaults to `"gelu"`):
        Activation between the two projector layers.
    condition_mode (`"official"`, `"cls"` or `"cls_patches"`):
        How the UNet condition is built from the image. `"official"` (official code): the diffusion model's
        empty-prompt text embedding (`num_condition_tokens` tokens, kept in the `null_text_embeds` buffer)
        plus the projected image embedding broadcast over every token. `"cls"` (paper §5.1): the projected
        [CLS] embedding as a single token. `"cls_patches"` (Table 7): [CLS] plus `patch_token_ratio` of the
        patch tokens, each passed through the projector.
    num_condition_tokens (`int`, defaults to 77):
        Length of the empty-prompt embedding used by `"official"` mode (the text encoder's context length).
    patch_token_ratio (`float`, defaults to 0.1):
        Fraction of patch tokens kept in `"cls_patches"` mode (a random subset in training, evenly strided in
        eval).
    layer_norm_eps (`float`, defaults to 1e-5):
        Epsilon of the projector's input LayerNorm.
    initializer_range (`float`, defaults to 0.02):
        Std of the projector's linear weights at initialisation.

    Written with an explicit `__init__` (transformers 4.x style, kept as is by 5.x) so this file loads on
    transformers >= 4.57.
    """

    model_type = "dcr"
    sub_configs = {"vision_config": AutoConfig}
    __eq__ = same_config

    def __init__(
        self,
        vision_config: dict | PretrainedConfig | None = None,
        condition_dim: int = 1024,
        projector_hidden_dim: int | None = None,
        projector_hidden_act: str = "gelu",
        condition_mode: str = "official",
        num_condition_tokens: int = 77,
        patch_token_ratio: float = 0.1,
        layer_norm_eps: float = 1e-5,
        initializer_range: float = 0.02,
        **kwargs,
    ):
        if not isinstance(vision_config, PretrainedConfig):
            vision_config = dict(vision_config or {})
            vision_config = AutoConfig.for_model(
                vision_config.pop("model_type", "clip_vision_model"), **vision_config
            )
        self.vision_config = vision_config
        self.condition_dim = condition_dim
        self.projector_hidden_dim = condition_dim if projector_hidden_dim is None else projector_hidden_dim
        self.projector_hidden_act = projector_hidden_act
        self.condition_mode = condition_mode
        self.num_condition_tokens = num_condition_tokens
        self.patch_token_ratio = patch_token_ratio
        self.layer_norm_eps = layer_norm_eps
        self.initializer_range = initializer_range
        super().__init__(**kwargs)
        self.validate_architecture()

    def validate_architecture(self):
        """Reject unsupported towers and settings with a hint."""
        vision_type = getattr(self.vision_config, "model_type", None)
        if vision_type not in SUPPORTED_VISION_MODEL_TYPES:
            raise ValueError(
                f"DCRConfig.vision_config has model_type {vision_type!r}; use one of "
                f"{SUPPORTED_VISION_MODEL_TYPES} (a CLIPVisionConfig or SiglipVisionConfig)"
            )
        if self.condition_mode not in CONDITION_MODES:
            raise ValueError(f"condition_mode must be one of {CONDITION_MODES}, got {self.condition_mode!r}")
        if not 0.0 <= self.patch_token_ratio <= 1.0:
            raise ValueError(f"patch_token_ratio must lie in [0, 1], got {self.patch_token_ratio}")
        if self.condition_dim <= 0 or self.num_condition_tokens <= 0:
            raise ValueError("condition_dim and num_condition_tokens must be positive")

    @property
    def has_visual_projection(self) -> bool:
        """CLIP towers carry a `visual_projection`; SigLIP towers pool with their own head."""
        return self.vision_config.model_type == "clip_vision_model"

    @property
    def image_embed_dim(self) -> int:
        """Width of the image embedding fed to the projector."""
        if self.has_visual_projection:
            return self.vision_config.projection_dim
        return self.vision_config.hidden_size


DCRConfig.register_for_auto_class()  # save_pretrained copies this file and writes auto_map (remote code)

__all__ = ["DCRConfig"]
