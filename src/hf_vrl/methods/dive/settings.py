"""DiVESettings: the method section of a DiVE run (defaults = the paper's values, ViT-B/16 on ImageNet).

The shared run fields (dataset, batch_size, learning_rate, ...) belong to the run layer; this dataclass holds
only what is DiVE's own: which objective (DiVE or one of its baselines), its weights, the reference set, the
caption templates of the target classes, how the frozen pre-trained embeddings are obtained, WiSE-FT and the
paper's evaluation sets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hf_vrl.errors import UserError

# objective -> (uses the reference batch, the DiVE terms it adds). "dive_*" rows are Table 5 and Table 7.
OBJECTIVES: dict[str, tuple[bool, tuple[str, ...]]] = {
    "dive": (True, ("avl", "pvl")),
    "dive_avl": (True, ("avl",)),
    "dive_pvl": (True, ("pvl",)),
    "dive_cosine": (True, ("avl", "pvl")),
    "flyp": (False, ()),
    "flyp_replay": (True, ()),
    "snd": (True, ()),
}
FROZEN_EMBEDDINGS = ("forward", "cache")
FROZEN_DTYPES = ("float32", "bfloat16", "float16")
WISE_FT_GRID = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]


def _help(text: str, default: Any = None, **kwargs: Any) -> Any:
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": text}, **kwargs)
    return field(default=default, metadata={"help": text}, **kwargs)


@dataclass
class DiVESettings:
    """DiVE's hyperparameters (Suzuki et al., AAAI 2026, §4-5 and App. A-E)."""

    objective: str = _help(
        "dive (Eq. 9: FLYP + AVL + PVL), dive_avl / dive_pvl (Table 5 ablations), dive_cosine (Table 7: "
        "cosine constraint), flyp (contrastive loss only), flyp_replay (App. E: FLYP + contrastive loss on "
        "the reference set, the ARF proxy), snd (App. B: FLYP + image feature distillation)",
        "dive",
    )
    lambda_dive: float = _help("lambda of Eq. 9, the weight of AVL + PVL (paper: 1000)", 1000.0)
    alpha: float = _help("EMA coefficient of the average vector m, Eq. 6 (paper: 0.99)", 0.99)
    lambda_snd: float = _help("lambda_snd of Eq. 13 (paper: 1, after Yu et al. 2024)", 1.0)
    lambda_replay: float = _help("lambda_aux of Eq. 15 (paper: 1, after Han et al. 2024)", 1.0)
    reference_dataset: str | None = _help(
        "reference image-caption set, a hf_vrl.data registry name or path (paper: CC3M, e.g. "
        "webdataset:/data/cc3m/{00000..00331}.tar; COCO or Flickr captions work too). Needed by every "
        "objective but flyp"
    )
    reference_split: str = _help("split of the reference set", "train")
    reference_limit: int | None = _help("use at most this many reference samples (default: all)")
    reference_batch_size: int | None = _help(
        "B', reference pairs per device and micro-batch (default: the target batch size, B' = B as in the "
        "paper; B' = B/4 brings the step time within 1.25x of FLYP's)"
    )
    templates: list[str] | None = _help(
        "caption templates turning target class names into captions ('{}' = the class name); default: "
        "hf_vrl.data.prompts' caption templates (the paper: OpenAI's 80 ImageNet templates)"
    )
    frozen_embeddings: str = _help(
        "how the frozen model's reference embeddings are obtained: forward (every step, no gradient) or "
        "cache (computed the first time each reference sample is drawn, then reused; exact because the "
        "reference preprocessing is deterministic; needs a map-style reference set)",
        "forward",
    )
    frozen_dtype: str | None = _help(
        "dtype of the frozen pre-trained model: float32, bfloat16 or float16 (default: the trained model's). "
        "Reduced precision halves its memory but is not exact: its rounding is of the order of the "
        "difference vectors themselves"
    )
    separate_backward: bool = _help(
        "back-propagate the reference terms before the target batch's forward: the same gradient, with the "
        "peak memory of the larger of the two batches instead of both",
        True,
    )
    wise_ft: bool = _help(
        "also write the WiSE-FT ensemble (App. A): weights (1 - a) * pre-trained + a * fine-tuned, with a "
        "chosen on the ID validation set",
        False,
    )
    wise_ft_alphas: list[float] = _help(
        "the WiSE-FT coefficients a tried (paper: 0.1, ..., 0.9)", WISE_FT_GRID
    )
    ood_datasets: list[str] = _help(
        "OOD test sets of the target classes (registry names or paths; paper: ImageNet-V2/-R/-A/-Sketch, "
        "ObjectNet)",
        [],
    )
    zero_shot_datasets: list[str] = _help(
        "other classification sets for zero-shot accuracy (paper: Caltech, Flowers, Food, SUN, DTD, "
        "Aircraft, Cars, Pets, EuroSAT, UCF)",
        [],
    )
    rsa_dataset: str | None = _help("held-out image-caption set for the RSA score (paper: Flickr8K)")
    rsa_limit: int = _help("image-caption pairs of the RSA set used (RSA is quadratic in this)", 1000)

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise UserError(f"objective must be one of {', '.join(OBJECTIVES)}; got {self.objective!r}.")
        for name in ("lambda_dive", "lambda_snd", "lambda_replay"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise UserError(f"{name} must be a finite number >= 0; got {value!r}.")
        if not 0.0 <= self.alpha <= 1.0:
            raise UserError(f"alpha (Eq. 6) must lie in [0, 1]; got {self.alpha!r} (paper: 0.99).")
        if self.uses_reference and not self.reference_dataset:
            raise UserError(
                f"objective {self.objective!r} needs a reference image-caption set: set reference_dataset "
                "(the paper uses CC3M shards: webdataset:/path/cc3m/{00000..00331}.tar) or use objective "
                "flyp."
            )
        for name in ("reference_limit", "reference_batch_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise UserError(f"{name} must be >= 1 (or unset); got {value!r}.")
        if self.rsa_limit < 3:
            raise UserError(f"rsa_limit must be >= 3 (RSA needs pairwise distances); got {self.rsa_limit}.")
        self._check_templates()
        if self.frozen_embeddings not in FROZEN_EMBEDDINGS:
            raise UserError(
                f"frozen_embeddings must be one of {', '.join(FROZEN_EMBEDDINGS)}; "
                f"got {self.frozen_embeddings!r}."
            )
        if self.frozen_dtype is not None and self.frozen_dtype not in FROZEN_DTYPES:
            raise UserError(
                f"frozen_dtype must be one of {', '.join(FROZEN_DTYPES)} (or unset); "
                f"got {self.frozen_dtype!r}."
            )
        if not self.wise_ft_alphas or any(not 0.0 <= a <= 1.0 for a in self.wise_ft_alphas):
            raise UserError(
                f"wise_ft_alphas must be a non-empty list in [0, 1]; got {self.wise_ft_alphas!r}."
            )

    def _check_templates(self) -> None:
        if self.templates is None:
            return
        if not self.templates:
            raise UserError("templates is empty: give at least one caption template, or leave it unset.")
        bad = [t for t in self.templates if not isinstance(t, str) or t.count("{}") != 1]
        if bad:
            raise UserError(
                f"each caption template needs exactly one '{{}}' for the class name; got {bad[:3]}."
            )

    @property
    def uses_reference(self) -> bool:
        """Whether the objective draws reference batches."""
        return OBJECTIVES[self.objective][0]

    @property
    def dive_terms(self) -> tuple[str, ...]:
        """The DiVE terms ("avl", "pvl") the objective adds to L_cl."""
        return OBJECTIVES[self.objective][1]

    @property
    def difference(self) -> str:
        """The difference of Eq. 4/5 ("vector") or of the cosine variant, Eq. 10/11 ("cosine")."""
        return "cosine" if self.objective == "dive_cosine" else "vector"
