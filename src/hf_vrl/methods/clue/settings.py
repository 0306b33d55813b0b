"""CLUE's settings as two run-configuration sections: `CLUEModelFields` (the `model` section: backbone, text
encoder, description source) and `CLUEMethodFields` (the `clue` section: heads, loss, momentum, views).
`CLUESettings` joins both and validates them together; shared fields such as the batch size, learning rate and
optimiser belong to the run layer."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from hf_vrl.errors import UserError
from hf_vrl.run.config import MEASURED, Defines, setting

TARGETS = ("sinkhorn", "identity")
MOMENTUM_SCHEDULES = ("constant", "cosine")
GRANULARITY_SPLITS = ("train", "test")
BACKBONES = ("resnet", "vit")
_VIEW_SIZE = "size"  # CLUEViews.size comes from image_size, never from `augment`


def _help(text: str, *, identity: Defines = True, **kwargs: Any) -> Any:
    return setting(help=text, identity=identity, **kwargs)


@dataclass
class CLUEModelFields:
    """What CLUE starts from: the backbone and the frozen text side (the run's `model` section)."""

    backbone: str | None = _help(
        "Hub id or folder of a transformers ResNet/ViT checkpoint to start from (paper: ResNet-50 with "
        "supervised ImageNet-1k weights), or of a saved CLUE model to continue; None with backbone_config.",
        default="microsoft/resnet-50",
    )
    backbone_config: dict | None = _help(
        "A ResNetConfig/ViTConfig as a dict ({'model_type': 'resnet', ...}) for a randomly initialised "
        "backbone (tiny presets); set backbone to None with it.",
        default=None,
    )
    text_encoder: str = _help(
        "Frozen CLIP-like model whose get_text_features embeds the descriptions (Hub id, folder, tiny-clip).",
        default="openai/clip-vit-base-patch16",
    )
    text_source: str = _help(
        "Where each image's description comes from: a dataset column, a .json file {image id: description} "
        "written by hf_vrl.methods.clue.describe, or in the toy world pixel_describer / "
        "pixel_describer_shuffled (methods/clue/toy_describer.py). The caption column of CUB-200, "
        "FGVC-Aircraft and Stanford Cars is a class-name template (the label) and is refused.",
        default="description",
    )
    text_id_column: str = _help(
        "Dataset column holding the image id that keys the .json descriptions.", default="key"
    )


@dataclass
class CLUEMethodFields:
    """CLUE's own hyperparameters (the run's `clue` section); defaults are the paper's values (ReSA's where
    CLUE builds on it unchanged)."""

    image_size: int = _help(
        "Side of the training crops in pixels (the paper does not state it; 224 is ReSA's and the usual "
        "ImageNet crop of a ResNet-50).",
        default=224,
    )
    projection_hidden_dim: int = _help("Hidden width of the 3-layer projector (ReSA: 2048).", default=2048)
    projection_dim: int = _help("Output width of projector and predictor (ReSA: 512).", default=512)
    predictor_hidden_dim: int = _help("Hidden width of the 2-layer predictor (ReSA: 2048).", default=2048)
    num_parts: int = _help(
        "K, the learnable part centroids of the VLAD part extractor (paper: 3); with beta = 0 no part "
        "extractor is built.",
        default=3,
    )
    vlad_normalize_features: bool = _help(
        "L2-normalise each local descriptor f_u before the soft assignment and the residuals f_u - c_k, as "
        "NetVLAD's code does; the paper's p_k = sum_u alpha_uk (f_u - c_k) (§4.2) uses f_u as it is (false).",
        default=False,
    )
    part_intra_normalization: bool = _help(
        "L2-normalise each part descriptor before concatenation (NetVLAD); the paper's Eq. 6 does not.",
        default=False,
    )
    targets: str = _help(
        "Targets A of the global and part terms: 'sinkhorn' (soft assignment, Eq. 5-6) or 'identity' "
        "(InfoNCE, Eq. 4: Table 2 #1).",
        default="sinkhorn",
    )
    alpha: float = _help("Weight of L_global in Eq. 8 (0 switches the term off).", default=1.0)
    beta: float = _help("Weight of L_local, the part-level term, in Eq. 8 (0 switches it off).", default=1.0)
    gamma: float = _help(
        "Weight of L_text, the VLM-description term, in Eq. 8 (0 switches it off). The image embedding v_i "
        "of Eq. 7 is a linear head on the backbone feature h (the paper does not say how v_i is formed), "
        "and L_text is Eq. 7 averaged over the two views.",
        default=1.0,
    )
    temperature: float = _help("tau of the global soft-InfoNCE (ReSA: 0.4).", default=0.4)
    part_temperature: float = _help(
        "tau of the part-level term (not given in the paper: ReSA's 0.4).", default=0.4
    )
    text_temperature: float = _help("tau_t of Eq. 7 (not given in the paper).", default=0.1)
    sinkhorn_iterations: int = _help("Sinkhorn-Knopp iterations (ReSA: 3).", default=3)
    sinkhorn_epsilon: float = _help("Sinkhorn-Knopp temperature epsilon (ReSA: 0.05).", default=0.05)
    momentum: float = _help(
        "Momentum encoder coefficient m (paper: 0.999; the cosine schedule starts here, ReSA: 0.996).",
        default=0.999,
    )
    momentum_schedule: str = _help(
        "'constant' (paper) or 'cosine': m rises to 1 over training (ReSA, DINO).", default="constant"
    )
    sync_batchnorm: bool = _help(
        "Train with every BatchNorm layer (backbone, heads, momentum branch) converted to "
        "torch.nn.SyncBatchNorm, so batch statistics and running averages cover the micro-batches of all "
        "processes, as ReSA does. Only matters with several processes, and only on GPUs (torch's "
        "SyncBatchNorm does not run on CPUs, where each process keeps its own statistics); saved models "
        "and exports keep plain BatchNorm.",
        default=True,
    )
    augment: dict = _help(
        "Overrides of the weak/strong view parameters (CLUEViews fields: crop_scale, blur_prob, ...).",
        default_factory=dict,
    )
    granularity_split: str = _help(
        "Split whose features the granularity metrics (CDNV, NCC fine / coarse) measure: 'train' (paper §3: "
        "'all reported results are computed on the training set') or 'test'.",
        default="train",
        identity=MEASURED,
    )
    eval_label_column: str | None = _help(
        "Label column of the linear probe and retrieval (default: fine_label where present, else label).",
        default=None,
        identity=MEASURED,
    )
    part_map_images: int = _help(
        "Test images shown in the part-cluster response maps (Fig. 6) and the Grad-CAM maps (Fig. 9).",
        default=4,
        identity=False,
    )
    probe_cs: list[float] | None = _help(
        "Inverse L2 strengths C the linear probe chooses from on a held-out part of the train split "
        "(default: 13 values, 1e-6 to 1e6).",
        default=None,
        identity=MEASURED,
    )


@dataclass
class CLUESettings(CLUEMethodFields, CLUEModelFields):
    """Both sections together, validated on construction (a `UserError` names what to change)."""

    def __post_init__(self) -> None:
        self._check_choices()
        self._check_ranges()
        self._check_backbone()
        self._check_terms()
        self.views()  # validates `augment`

    def _check_choices(self) -> None:
        choices_of = (
            ("targets", TARGETS),
            ("momentum_schedule", MOMENTUM_SCHEDULES),
            ("granularity_split", GRANULARITY_SPLITS),
        )
        for name, choices in choices_of:
            if getattr(self, name) not in choices:
                raise UserError(f"clue.{name} must be one of {choices}, got {getattr(self, name)!r}")

    def _check_ranges(self) -> None:
        positive = (
            "image_size", "projection_hidden_dim", "projection_dim", "predictor_hidden_dim", "temperature",
            "part_temperature", "text_temperature", "sinkhorn_iterations", "sinkhorn_epsilon",
        )  # fmt: skip
        for name in positive:
            if not getattr(self, name) > 0:
                raise UserError(f"clue.{name} must be > 0, got {getattr(self, name)}")
        for name in ("num_parts", "part_map_images", "alpha", "beta", "gamma"):
            if getattr(self, name) < 0:
                raise UserError(f"clue.{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.momentum <= 1.0:
            raise UserError(f"clue.momentum must lie in [0, 1], got {self.momentum}")

    def _check_backbone(self) -> None:
        if (self.backbone is None) == (self.backbone_config is None):
            raise UserError(
                "set exactly one of model.backbone (a checkpoint) and model.backbone_config (a config)"
            )
        if self.backbone_config is not None and self.backbone_config.get("model_type") not in BACKBONES:
            raise UserError(
                f"model.backbone_config needs 'model_type' in {BACKBONES}, "
                f"got {self.backbone_config.get('model_type')!r}"
            )

    def _check_terms(self) -> None:
        if self.alpha == self.beta == self.gamma == 0:
            raise UserError("clue.alpha, beta and gamma are all 0: Eq. 8 has no term left; set one above 0")
        if self.beta > 0 and self.num_parts == 0:
            raise UserError(
                "clue.beta > 0 needs part centroids: set clue.num_parts >= 1 (paper: 3) or beta = 0"
            )
        if self.gamma > 0 and not self.text_source:
            raise UserError("clue.gamma > 0 needs descriptions: set model.text_source, or clue.gamma = 0")

    def views(self) -> Any:
        """The `CLUEViews` of these settings (image_size plus the `augment` overrides)."""
        from hf_vrl.methods.clue.augment import CLUEViews

        known = {f.name for f in dataclasses.fields(CLUEViews)} - {_VIEW_SIZE}
        unknown = sorted(set(self.augment) - known)
        if unknown:
            raise UserError(f"clue.augment has unknown keys {unknown}; choose from {sorted(known)}")
        overrides = {k: tuple(v) if isinstance(v, list) else v for k, v in self.augment.items()}
        try:
            return CLUEViews(size=self.image_size, **overrides)
        except ValueError as err:
            raise UserError(f"clue.augment: {err}") from err

    @property
    def uses_text(self) -> bool:
        return self.gamma > 0

    def model_config(self) -> dict[str, Any]:
        """CLUEConfig arguments (besides the backbone) from these settings; text_embed_dim is set by the
        model builder from the text encoder. No part extractor with beta = 0: nothing would train it (and
        DDP would wait for its gradients)."""
        return {
            "projection_hidden_dim": self.projection_hidden_dim,
            "projection_dim": self.projection_dim,
            "predictor_hidden_dim": self.predictor_hidden_dim,
            "num_parts": self.num_parts if self.beta > 0 else 0,  # only L_local reads the parts
            "part_normalize_descriptors": self.vlad_normalize_features,
            "part_intra_normalization": self.part_intra_normalization,
        }
