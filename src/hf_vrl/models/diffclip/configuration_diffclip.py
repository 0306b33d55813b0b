"""DiffCLIP configuration (Hammoud & Ghanem, "DiffCLIP: Differential Attention Meets CLIP", TMLR 2025).

Mirrors transformers' `configuration_clip.py` field for field, plus the differential-attention options.
Self-contained (imports only transformers) so it ships as Hub remote code.

Head convention (as released by DiffCLIP): `num_attention_heads` is the *baseline CLIP* head count `H`;
adjacent heads (2m, 2m+1) pair up into `H/2` differential heads whose value vectors are `2 * head_dim` wide,
with `head_dim = hidden_size / H`. A CLIP checkpoint therefore loads into the same projection shapes.

Versions: the configs are written with explicit `__init__`s (the style transformers 4.x configs use), which
transformers 5.x keeps (it turns subclasses into dataclasses but leaves a custom `__init__` alone), so one
file loads on transformers >= 4.57 (see `MINIMUM_TRANSFORMERS`).
"""

import math

import transformers
from transformers import PretrainedConfig

MINIMUM_TRANSFORMERS = (4, 57)
LAMBDA_INIT_SCHEDULES = ("constant", "depth")
INITIALIZER_STYLES = ("clip", "release")


def require_transformers(minimum: tuple[int, int] = MINIMUM_TRANSFORMERS) -> None:
    """Fail at import, naming the minimum, when the installed transformers is older than this code
    supports."""
    found = tuple(int(part) for part in transformers.__version__.split(".")[:2])
    if found < minimum:
        needed = ".".join(map(str, minimum))
        raise ImportError(
            f"DiffCLIP's model code needs transformers>={needed}, found {transformers.__version__}: "
            f"pip install -U 'transformers>={needed}'"
        )


require_transformers()


def same_config(config: PretrainedConfig, other: object) -> bool:
    """Configs are equal when their serialised forms are (set as `__eq__` on every class: transformers >=
    5.17 turns config classes into dataclasses, whose generated `__eq__` compares the base class's fields
    only)."""
    return isinstance(other, PretrainedConfig) and config.to_dict() == other.to_dict()


class DiffCLIPTowerConfig(PretrainedConfig):
    r"""Fields shared by the text and vision towers (CLIP's, plus differential attention).

    differential_attention (`bool`, defaults to `True`):
        Use differential attention in every layer of this tower; `False` gives plain CLIP attention
        (DiffCLIP† uses `False` in the text tower).
    lambda_init (`float`, defaults to 0.8):
        λ_init of the constant schedule, used in every layer (the released DiffCLIP).
    lambda_init_schedule (`str`, defaults to `"constant"`):
        `"constant"`: λ_init = `lambda_init` in every layer. `"depth"`: λ_init(l) = 0.8 − 0.6·exp(−0.3·l) with
        `l` the **0-based** layer index, i.e. the Differential Transformer's 0.8 − 0.6·exp(−0.3·(l′−1)) for
        1-based l′ (unilm's `lambda_init_fn(depth)` is called with the 0-based layer index); the first layer
        gets 0.2. This is DiffCLIP* (DiffCLIP §4.5).
    lambda_std (`float`, defaults to 0.1):
        Standard deviation of the normal init of the λ vectors λ_q1, λ_k1, λ_q2, λ_k2.
    diff_norm_eps (`float`, defaults to 1e-5):
        Epsilon of the RMSNorm applied to each differential head's output.
    initializer_style (`str`, defaults to `"clip"`):
        How a model built from scratch is initialised. `"clip"`: transformers' CLIP init (scaled by
        `initializer_factor`). `"release"`: the released DiffCLIP's own init (OpenAI/SLIP CLIP rules in the
        text tower, timm's ViT embeddings and PyTorch's default Linear/LayerNorm init in the vision blocks);
        see `DiffCLIPPreTrainedModel._init_release_style`.
    """

    __eq__ = same_config

    def __init__(
        self,
        hidden_size: int = 512,
        intermediate_size: int = 2048,
        projection_dim: int = 512,
        num_hidden_layers: int = 12,
        num_attention_heads: int = 8,
        hidden_act: str = "quick_gelu",
        layer_norm_eps: float = 1e-5,
        attention_dropout: float = 0.0,
        initializer_range: float = 0.02,
        initializer_factor: float = 1.0,
        differential_attention: bool = True,
        lambda_init: float = 0.8,
        lambda_init_schedule: str = "constant",
        lambda_std: float = 0.1,
        diff_norm_eps: float = 1e-5,
        initializer_style: str = "clip",
        **kwargs,
    ):
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.projection_dim = projection_dim
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.hidden_act = hidden_act
        self.layer_norm_eps = layer_norm_eps
        self.attention_dropout = attention_dropout
        self.initializer_range = initializer_range
        self.initializer_factor = initializer_factor
        self.differential_attention = differential_attention
        self.lambda_init = lambda_init
        self.lambda_init_schedule = lambda_init_schedule
        self.lambda_std = lambda_std
        self.diff_norm_eps = diff_norm_eps
        self.initializer_style = initializer_style
        super().__init__(**kwargs)
        self.validate_architecture()

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def lambda_init_for_layer(self, layer_idx: int) -> float:
        """λ_init of layer `layer_idx` (0-based): constant, or DiffCLIP*'s 0.8 − 0.6·exp(−0.3·l)."""
        if self.lambda_init_schedule == "depth":
            return 0.8 - 0.6 * math.exp(-0.3 * layer_idx)
        return float(self.lambda_init)

    def validate_architecture(self):
        """Refuse shapes differential attention cannot use, saying what to change."""
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads "
                f"({self.num_attention_heads}); change one of them."
            )
        if self.lambda_init_schedule not in LAMBDA_INIT_SCHEDULES:
            raise ValueError(
                f"Unknown lambda_init_schedule {self.lambda_init_schedule!r}: use one of "
                f"{LAMBDA_INIT_SCHEDULES} "
                "('constant' uses lambda_init in every layer, 'depth' is DiffCLIP*'s 0.8 - 0.6*exp(-0.3*l))."
            )
        if self.initializer_style not in INITIALIZER_STYLES:
            raise ValueError(
                f"Unknown initializer_style {self.initializer_style!r}: use 'clip' (transformers' CLIP init) "
                "or 'release' (the released DiffCLIP's init)."
            )
        if not self.differential_attention:
            return
        if self.num_attention_heads % 2 != 0:
            raise ValueError(
                "Differential attention pairs adjacent heads (2m, 2m+1), so num_attention_heads must be "
                f"even (got {self.num_attention_heads}); use an even head count (the baseline CLIP's, "
                "e.g. 8 or 12), or set differential_attention=False for this tower."
            )
        if not 0.0 <= self.lambda_init < 1.0:
            raise ValueError(
                f"lambda_init must lie in [0, 1) (got {self.lambda_init}): the head output is scaled by "
                "(1 - lambda_init), so 1 would silence attention. The paper uses 0.8."
            )


class DiffCLIPTextConfig(DiffCLIPTowerConfig):
    r"""Text tower of DiffCLIP: CLIP's `CLIPTextConfig` fields plus the differential-attention fields of
    [`DiffCLIPTowerConfig`]. Defaults: the CLIP ViT-B/16 text transformer (512 wide, 12 layers, 8 heads).
    `pad_token_id=1` as in transformers' CLIPTextConfig (transformers PR #24773)."""

    model_type = "diffclip_text_model"
    base_config_key = "text_config"
    __eq__ = same_config

    def __init__(
        self,
        vocab_size: int = 49408,
        max_position_embeddings: int = 77,
        pad_token_id: int | None = 1,
        bos_token_id: int | None = 49406,
        eos_token_id: int | list[int] | None = 49407,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.max_position_embeddings = max_position_embeddings
        # through the base class: transformers 4.x's __init__ sets the special token ids itself
        super().__init__(
            pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id, **kwargs
        )


class DiffCLIPVisionConfig(DiffCLIPTowerConfig):
    r"""Vision tower of DiffCLIP: CLIP's `CLIPVisionConfig` fields plus the differential-attention fields of
    [`DiffCLIPTowerConfig`]. Defaults are ViT-B/16 (the architecture DiffCLIP released).

    pre_layernorm (`bool`, defaults to `True`):
        Apply CLIP's `pre_layrnorm` after the embeddings. The released DiffCLIP vision tower is a timm ViT,
        which has none (`from_official_checkpoint` sets `False`).
    """

    model_type = "diffclip_vision_model"
    base_config_key = "vision_config"
    __eq__ = same_config

    def __init__(
        self,
        hidden_size: int = 768,
        intermediate_size: int = 3072,
        num_attention_heads: int = 12,
        num_channels: int = 3,
        image_size: int = 224,
        patch_size: int = 16,
        pre_layernorm: bool = True,
        **kwargs,
    ):
        self.num_channels = num_channels
        self.image_size = image_size
        self.patch_size = patch_size
        self.pre_layernorm = pre_layernorm
        super().__init__(
            hidden_size=hidden_size,
            intermediate_size=intermediate_size,
            num_attention_heads=num_attention_heads,
            **kwargs,
        )

    def validate_architecture(self):
        super().validate_architecture()
        if self.image_size % self.patch_size != 0:
            raise ValueError(
                f"image_size ({self.image_size}) must be a multiple of patch_size ({self.patch_size}); "
                "change one of them."
            )


class DiffCLIPConfig(PretrainedConfig):
    r"""DiffCLIP: a CLIP dual encoder whose attention layers are differential (DiffCLIP §3.2).

    text_config (`dict` or `DiffCLIPTextConfig`, *optional*): the text tower.
    vision_config (`dict` or `DiffCLIPVisionConfig`, *optional*): the vision tower.
    projection_dim (`int`, *optional*): width of the joint embedding space (the dual model's projections);
        unset, the towers' value where the given towers agree, else 512. As in `CLIPConfig`, a tower's own
        `projection_dim` may differ: it sizes that tower's `*WithProjection` model only (a tower given as a
        dict without one takes the top-level value).
    logit_scale_init_value (`float`, defaults to 2.6592): initial log of the logit multiplier, log(1/0.07).
    diff_attention_in_text (`bool`, *optional*): `False` gives DiffCLIP† (differential attention in the
        vision tower only, plain CLIP attention in the text tower). `None` reads
        `text_config.differential_attention`.
    lambda_init, lambda_init_schedule, initializer_style (*optional*): when set, used by both towers (see
        [`DiffCLIPTowerConfig`]); `lambda_init_schedule="depth"` gives DiffCLIP*.

    The other top-level values are written into sub-configs given as dicts; a sub-config (dict or object)
    that already holds a different value is refused.

    Example:

    ```python
    >>> config = DiffCLIPConfig(diff_attention_in_text=False)  # DiffCLIP†
    >>> config = DiffCLIPConfig(lambda_init_schedule="depth")  # DiffCLIP*
    ```"""

    model_type = "diffclip"
    sub_configs = {"text_config": DiffCLIPTextConfig, "vision_config": DiffCLIPVisionConfig}
    __eq__ = same_config

    def __init__(
        self,
        text_config: dict | DiffCLIPTextConfig | None = None,
        vision_config: dict | DiffCLIPVisionConfig | None = None,
        projection_dim: int | None = None,
        logit_scale_init_value: float = 2.6592,
        initializer_factor: float = 1.0,
        diff_attention_in_text: bool | None = None,
        lambda_init: float | None = None,
        lambda_init_schedule: str | None = None,
        initializer_style: str | None = None,
        **kwargs,
    ):
        if projection_dim is None:
            projection_dim = _towers_value("projection_dim", text_config, vision_config, default=512)
        shared = {
            "lambda_init": lambda_init,
            "lambda_init_schedule": lambda_init_schedule,
            "initializer_style": initializer_style,
        }
        text_shared = {**shared, "differential_attention": diff_attention_in_text}
        towers = (
            (DiffCLIPTextConfig, "text_config", text_config, text_shared),
            (DiffCLIPVisionConfig, "vision_config", vision_config, shared),
        )
        self.text_config, self.vision_config = (
            _tower_config(config_class, key, tower, values, {"projection_dim": projection_dim})
            for config_class, key, tower, values in towers
        )
        self.projection_dim = projection_dim
        self.logit_scale_init_value = logit_scale_init_value
        self.initializer_factor = initializer_factor
        self.diff_attention_in_text = self.text_config.differential_attention
        self.lambda_init = lambda_init
        self.lambda_init_schedule = lambda_init_schedule
        self.initializer_style = initializer_style
        super().__init__(**kwargs)


def _towers_value(field: str, text_config, vision_config, default):
    """The value of `field` the given sub-configs agree on (a dict only where it holds the key), else
    `default` (also where they differ)."""
    values = set()
    for tower in (text_config, vision_config):
        if isinstance(tower, PretrainedConfig):
            values.add(getattr(tower, field))
        elif tower and field in tower:
            values.add(tower[field])
    return values.pop() if len(values) == 1 else default


def _tower_config(config_class: type, key: str, tower, shared: dict, defaults: dict) -> DiffCLIPTowerConfig:
    """Build sub-config `key` from a dict (filled with the top-level `shared` values that are set, and with
    `defaults` where it has no value of its own) or take the given config; a value in it contradicting a set
    `shared` value is refused."""
    values = tower.to_dict() if isinstance(tower, PretrainedConfig) else dict(tower or {})
    for field, value in shared.items():
        current = values.get(field, value)
        if value is not None and current != value:
            raise ValueError(
                f"{key}.{field}={current!r} contradicts the top-level value {value!r}; set only one of them "
                "(or make them equal)."
            )
    if isinstance(tower, PretrainedConfig):
        return tower
    return config_class(**{**defaults, **values, **{k: v for k, v in shared.items() if v is not None}})


DiffCLIPConfig.register_for_auto_class()
DiffCLIPTextConfig.register_for_auto_class()
DiffCLIPVisionConfig.register_for_auto_class()

__all__ = ["DiffCLIPConfig", "DiffCLIPTextConfig", "DiffCLIPTowerConfig", "DiffCLIPVisionConfig"]
