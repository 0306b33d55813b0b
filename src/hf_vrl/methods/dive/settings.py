"""DiVESettings: the method section of a DiVE run (defaults = the paper's values, ViT-B/16 on ImageNet).

The shared run fields (dataset, batch_size, learning_rate, ...) belong to the run layer; this dataclass holds
only what is DiVE's own: which objective (DiVE or one of its baselines), its weights, the reference set, the
target classes and caption templates, how the frozen pre-trained embeddings are obtained, WiSE-FT and the
paper's evaluation sets. Each field's `check` (and its Literal type) is validated on construction, so a
`DiVESettings` built by hand and the `dive` section of a run configuration fail the same way (UserError).
Whether the objective has its reference set is the run's rule (`reference_problems`): the trainer takes the
set itself.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from dataclasses import dataclass
from typing import Any, Literal

from hf_vrl.errors import UserError
from hf_vrl.methods.dive.shifts import SHIFTS
from hf_vrl.run.config import MEASURED, at_least, setting

__all__ = ["DiVESettings", "HEAD_OBJECTIVES", "OBJECTIVES", "WISE_FT_GRID"]

# objective -> (uses the reference batch, the DiVE terms it adds). "dive_*" rows are Table 5 and Table 7;
# ft and lp_ft (HEAD_OBJECTIVES) train an image classifier with cross-entropy (`head.py`), the rest
# contrastively.
OBJECTIVES: dict[str, tuple[bool, tuple[str, ...]]] = {
    "dive": (True, ("avl", "pvl")),
    "dive_avl": (True, ("avl",)),
    "dive_pvl": (True, ("pvl",)),
    "dive_cosine": (True, ("avl", "pvl")),
    "flyp": (False, ()),
    "flyp_replay": (True, ()),
    "snd": (True, ()),
    "ft": (False, ()),
    "lp_ft": (False, ()),
}
HEAD_OBJECTIVES = frozenset({"ft", "lp_ft"})
Objective = Literal[
    "dive", "dive_avl", "dive_pvl", "dive_cosine", "flyp", "flyp_replay", "snd", "ft", "lp_ft"
]
WISE_FT_GRID = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]


def _weight(value: float) -> str | None:
    return None if math.isfinite(value) and value >= 0 else f"must be a finite number >= 0, got {value!r}"


def _unit(value: float) -> str | None:
    return None if 0.0 <= value <= 1.0 else f"must lie in [0, 1], got {value!r}"


def _templates(value: list[str] | None) -> str | None:
    if value is None:
        return None
    if not value:
        return "templates is empty: give at least one caption template, or leave it unset"
    bad = [t for t in value if not isinstance(t, str) or t.count("{}") != 1]
    return (
        f"each caption template needs exactly one '{{}}' for the class name; got {bad[:3]}" if bad else None
    )


def _alphas(value: list[float]) -> str | None:
    if value and all(0.0 <= a <= 1.0 for a in value):
        return None
    return f"must be a non-empty list in [0, 1]; got {value!r}"


def _shifts(value: list[str]) -> str | None:
    bad = [v for v in value if v not in SHIFTS]
    return f"unknown shift(s) {bad}; choose from {', '.join(SHIFTS)}" if bad else None


def _splits(value: dict[str, str]) -> str | None:
    bad = {k: v for k, v in value.items() if not isinstance(v, str) or not v}
    return f"each OOD set's split must be a split name; got {bad}" if bad else None


def _limits(value: dict[str, int | None]) -> str | None:
    bad = {k: v for k, v in value.items() if v is not None and (not isinstance(v, int) or v < 1)}
    return f"each OOD set's limit must be an integer >= 1 or null; got {bad}" if bad else None


def _crop_scale(value: list[float] | None) -> str | None:
    if value is None:
        return None
    if len(value) != 2 or not 0 < value[0] <= value[1] <= 1:
        return f"must be [low, high] with 0 < low <= high <= 1 (FLYP: [0.9, 1.0]), got {value!r}"
    return None


@dataclass
class DiVESettings:
    """DiVE's hyperparameters (Suzuki et al., AAAI 2026, §4-5 and App. A-E)."""

    objective: Objective = setting(
        "dive",
        "dive (Eq. 9: FLYP + AVL + PVL), dive_avl / dive_pvl (Table 5 ablations), dive_cosine (Table 7: "
        "cosine constraint), flyp (contrastive loss only), flyp_replay (App. E: FLYP + contrastive loss on "
        "the reference set, the ARF proxy), snd (App. B: FLYP + image feature distillation), ft (vanilla FT: "
        "image tower + a zero-shot-initialised linear head, cross-entropy) or lp_ft (LP-FT: the head alone, "
        "then both)",
    )
    lp_steps: int | None = setting(
        None,
        "lp_ft: optimiser steps of the linear-probing stage (default: as many as the fine-tuning stage; at "
        "most --step-limit); the paper gives neither its length nor its learning rate",
        check=at_least(1),
    )
    lp_learning_rate: float | None = setting(
        None,
        "lp_ft: learning rate of the linear-probing stage (default: optim.learning_rate)",
        check=at_least(1e-12),
    )
    lambda_dive: float = setting(
        1000.0, "lambda of Eq. 9, the weight of AVL + PVL (paper: 1000)", check=_weight
    )
    alpha: float = setting(0.99, "EMA coefficient of the average vector m, Eq. 6 (paper: 0.99)", check=_unit)
    lambda_snd: float = setting(1.0, "lambda_snd of Eq. 13 (paper: 1, after Yu et al. 2024)", check=_weight)
    lambda_replay: float = setting(
        1.0, "lambda_aux of Eq. 15 (paper: 1, after Han et al. 2024)", check=_weight
    )
    reference_dataset: str | list[str] | None = setting(
        None,
        "reference image-caption set: a hf_vrl.data registry name or path, or a list of them (concatenated) "
        "(paper: CC3M, cc3m:<img2dataset folder>; COCO or Flickr captions work too). "
        "Needed by every objective but flyp",
    )
    reference_split: str = setting("train", "split of the reference set")
    reference_limit: int | None = setting(
        None, "use at most this many reference samples per set (default: all)", check=at_least(1)
    )
    reference_batch_size: int | None = setting(
        None,
        "B', reference pairs per optimiser step over all processes, like global_batch_size (default: the "
        "global target batch, B' = B as in the paper; B' = B/4 brings the step time within 1.25x of FLYP's)",
        check=at_least(1),
    )
    classes: list[int] | None = setting(
        None, "fine-tune on these classes of the training (and ID test) set only, relabelled in this order"
    )
    held_out_classes: list[int] | None = setting(
        None, "classes of the ID data set kept out of fine-tuning, evaluated zero-shot as a transfer set"
    )
    val_size: int = setting(
        0,
        "training rows held out (seeded) as the ID validation set WiSE-FT picks its coefficient on",
        check=at_least(0),
    )
    templates: list[str] | None = setting(
        None,
        "caption templates turning target class names into captions ('{}' = the class name, filled "
        "verbatim); default: OpenAI's 80 ImageNet templates for an ImageNet-family dataset (the paper, "
        "FLYP), else hf_vrl.data.prompts' caption templates",
        check=_templates,
    )
    crop_scale: list[float] | None = setting(
        None,
        "RandomResizedCrop of the target images with this area range (bicubic, aspect 3/4-4/3, one draw per "
        "sample from its sample_seed): FLYP's training augmentation is [0.9, 1.0]; default (null): none, the "
        "image processor's resize and centre crop",
        check=_crop_scale,
    )
    logit_scale: Literal["capped", "flyp"] = setting(
        "capped",
        "the contrastive logit scale: capped (hf_vrl's ContrastiveTrainer: clamped at 100 as open_clip, not "
        "weight-decayed) or flyp (FLYP's code: learned, uncapped and weight-decayed with the weights)",
    )
    frozen_embeddings: Literal["forward", "cache"] = setting(
        "forward",
        "how the frozen model's reference embeddings are obtained: forward (every step, no gradient) or "
        "cache (computed the first time each reference sample is drawn, then reused; exact because the "
        "reference preprocessing is deterministic; needs a map-style reference set)",
    )
    frozen_dtype: Literal["float32", "bfloat16", "float16"] | None = setting(
        None,
        "dtype of the frozen pre-trained model: float32, bfloat16 or float16 (default: the trained model's). "
        "Reduced precision halves its memory but is not exact: its rounding is of the order of the "
        "difference vectors themselves",
    )
    separate_backward: bool = setting(
        True,
        "back-propagate the reference terms apart from the target batch's (before its forward, or as micro-"
        "batches of their own with whole_batch accumulation): the same gradient, with the peak memory of the "
        "larger of the two batches instead of both",
    )
    select_best_epoch: bool = setting(
        False,
        "score the ID validation set (val_size rows) at every epoch's end and finish with the best epoch's "
        "weights (the paper's early stopping, §5.2); the selected weights are kept in "
        "checkpoints/train/best-epoch/, apart from the rotating checkpoints",
    )
    wise_ft: bool = setting(
        False,
        "also write the WiSE-FT ensemble (App. A): weights (1 - a) * pre-trained + a * fine-tuned, with a "
        "chosen on the ID validation set (val_size)",
    )
    wise_ft_alphas: list[float] = setting(
        help="the WiSE-FT coefficients a tried (paper: 0.1, ..., 0.9)",
        check=_alphas,
        default_factory=lambda: list(WISE_FT_GRID),
    )
    ood_datasets: list[str] = setting(
        help="OOD test sets of the target classes (registry names or paths; paper: ImageNet-V2/-R/-A/"
        "-Sketch, ObjectNet)",
        default_factory=list,
        identity=MEASURED,
    )
    ood_splits: dict[str, str] = setting(
        help="the split read from each OOD set, by its name in ood_datasets (default: eval.eval_split); the "
        "ImageNet shifts each ship one test split",
        check=_splits,
        default_factory=dict,
        identity=MEASURED,
    )
    ood_limits: dict[str, int | None] = setting(
        help="samples read from each OOD set, by its name in ood_datasets (default: eval.eval_limit; null: "
        "all)",
        check=_limits,
        default_factory=dict,
        identity=MEASURED,
    )
    ood_shifts: list[str] = setting(
        help="style shifts of the ID test set evaluated as OOD sets: inverted, blurred, recoloured",
        check=_shifts,
        default_factory=list,
        identity=MEASURED,
    )
    zero_shot_datasets: list[str] = setting(
        help="other classification sets for zero-shot accuracy (paper: Caltech, Flowers, Food, SUN, DTD, "
        "Aircraft, Cars, Pets, EuroSAT, UCF)",
        default_factory=list,
        identity=MEASURED,
    )
    objectnet_border: int = setting(
        2,
        "pixels cropped off every border of ObjectNet images before preprocessing (FLYP / WiSE-FT's "
        "objectnet.py `crop`: 2, which removes the red frame of ObjectNet's images); 0 keeps them whole",
        check=at_least(0),
        identity=MEASURED,
    )
    macro_f1: bool = setting(
        False,
        "also report the macro F1 of the ID and OOD predictions (iWildCam's metric in Table 4, "
        "hf_vrl.metrics.macro_f1)",
        identity=MEASURED,
    )
    group_column: str = setting(
        "region",
        "a column of the ID / OOD sets naming each sample's group (FMoW: the region): a set that has it also "
        "reports its worst-group accuracy (Table 4's FMoW OOD metric, hf_vrl.metrics.worst_group_accuracy)",
        identity=MEASURED,
    )
    group_exclude: list[str] = setting(
        help="groups left out of the worst-group accuracy (FMoW: the 'Other' region, as WILDS)",
        default_factory=lambda: ["Other"],
        identity=MEASURED,
    )
    transfer_templates: Literal["dataset", "target"] = setting(
        "dataset",
        "prompts of the zero-shot transfer sets: dataset (each set's own ensemble, as the paper) or target "
        "(the target's caption templates)",
        identity=MEASURED,
    )
    rsa_dataset: str | None = setting(
        None, "held-out image-caption set for the RSA score (paper: Flickr8K)", identity=MEASURED
    )
    rsa_limit: int = setting(
        1000,
        "image-caption pairs of the RSA set used (RSA is quadratic in this)",
        check=at_least(3),
        identity=MEASURED,
    )

    def __post_init__(self) -> None:
        if isinstance(self.reference_dataset, str) and self.reference_dataset.startswith("["):
            try:  # a list from the command line
                self.reference_dataset = json.loads(self.reference_dataset)
            except ValueError:
                raise UserError(f"reference_dataset {self.reference_dataset!r} is not a JSON list") from None
        problems = field_problems(self)
        if self.select_best_epoch and not self.val_size:
            problems.append("select_best_epoch scores the ID validation set: set val_size > 0")
        for name in ("ood_splits", "ood_limits"):
            unknown = sorted(set(getattr(self, name)) - set(self.ood_datasets))
            if unknown:
                problems.append(f"{name}: {unknown} are not in ood_datasets {self.ood_datasets}")
        if problems:
            raise UserError("DiVE settings: " + "; ".join(problems))

    def reference_problems(self) -> list[str]:
        """The run's rule: an objective with a reference term needs a reference set."""
        if self.uses_reference and not self.reference_dataset:
            return [
                f"dive.reference_dataset: objective {self.objective!r} needs a reference image-caption "
                "set (the paper uses CC3M: cc3m:<img2dataset folder>); or use "
                "objective flyp"
            ]
        return []

    @property
    def uses_reference(self) -> bool:
        """Whether the objective draws reference batches."""
        return OBJECTIVES[self.objective][0]

    @property
    def trains_head(self) -> bool:
        """Whether the objective trains an image classifier with cross-entropy (ft, lp_ft)."""
        return self.objective in HEAD_OBJECTIVES

    @property
    def dive_terms(self) -> tuple[str, ...]:
        """The DiVE terms ("avl", "pvl") the objective adds to L_cl."""
        return OBJECTIVES[self.objective][1]

    @property
    def difference(self) -> str:
        """The difference of Eq. 4/5 ("vector") or of the cosine variant, Eq. 10/11 ("cosine")."""
        return "cosine" if self.objective == "dive_cosine" else "vector"


def field_problems(settings: Any) -> list[str]:
    """Every field's Literal and `check` problem, as "name: what is wrong"."""
    problems = []
    hints = typing.get_type_hints(type(settings))
    for f in dataclasses.fields(settings):
        value, allowed = getattr(settings, f.name), _literal_values(hints[f.name])
        if allowed and value not in allowed:
            problems.append(f"{f.name} must be one of {', '.join(map(str, allowed))}; got {value!r}")
            continue
        check = f.metadata.get("check")
        message = check(value) if check else None
        if message:
            problems.append(f"{f.name}: {message}")
    return problems


def _literal_values(tp: Any) -> tuple[Any, ...]:
    """The values a Literal (or Literal | None) type allows; () for other types."""
    if typing.get_origin(tp) is Literal:
        return typing.get_args(tp)
    args = typing.get_args(tp)
    literals = [a for a in args if typing.get_origin(a) is Literal]
    return (*typing.get_args(literals[0]), *([None] if type(None) in args else [])) if literals else ()
