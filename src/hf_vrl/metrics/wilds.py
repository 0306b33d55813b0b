"""The WILDS metrics of DiVE's Table 4: iWildCam's macro F1 and FMoW's worst-region accuracy, as the WILDS
package defines them (`wilds/common/metrics/all_metrics.py` F1, `wilds/datasets/fmow_dataset.py` eval).

- `macro_f1`: the F1 score of each class present in the labels (scikit-learn's `f1_score` with
  `labels=unique(y_true)`, `average="macro"`; a class never predicted scores 0), averaged.
- `worst_group_accuracy`: the accuracy of each group with samples, and the lowest; FMoW's worst-region
  accuracy leaves the "Other" region out (`exclude=("Other",)`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hf_vrl.metrics._common import as_labels

__all__ = ["FMOW_REGIONS", "macro_f1", "worst_group_accuracy"]

# FMoW's region metadata, in WILDS' order
FMOW_REGIONS = ("Asia", "Europe", "Africa", "Americas", "Oceania", "Other")


def macro_f1(y_true: Any, y_pred: Any) -> float:
    """Macro F1 over the classes present in `y_true` (WILDS iWildCam's `F1-macro_all`)."""
    truth, pred = as_labels(y_true, name="y_true"), as_labels(y_pred, name="y_pred")
    if truth.shape != pred.shape or truth.size == 0:
        raise ValueError(f"y_true and y_pred need the same non-zero length, got {truth.size} and {pred.size}")
    scores = []
    for c in np.unique(truth):
        tp = float(np.sum((truth == c) & (pred == c)))
        predicted, actual = float(np.sum(pred == c)), float(np.sum(truth == c))
        scores.append(0.0 if tp == 0 else 2 * tp / (predicted + actual))
    return float(np.mean(scores))


def worst_group_accuracy(
    y_true: Any, y_pred: Any, groups: Sequence[Any], exclude: Sequence[Any] = ()
) -> dict[str, Any]:
    """{"worst": the lowest accuracy over the groups with samples (those in `exclude` left out), "per_group":
    {group: accuracy}, "counts": {group: samples}} (FMoW: `groups` the regions, `exclude=("Other",)`)."""
    truth, pred = as_labels(y_true, name="y_true"), as_labels(y_pred, name="y_pred")
    groups = np.asarray(list(groups), dtype=object)
    if not truth.shape == pred.shape == groups.shape or truth.size == 0:
        raise ValueError("y_true, y_pred and groups need the same non-zero length")
    per_group, counts = {}, {}
    for g in dict.fromkeys(groups.tolist()):
        member = groups == g
        per_group[str(g)] = float(np.mean(truth[member] == pred[member]))
        counts[str(g)] = int(member.sum())
    scored = [acc for g, acc in per_group.items() if g not in {str(e) for e in exclude}]
    if not scored:
        raise ValueError("no group left to score after exclude")
    return {"worst": min(scored), "per_group": per_group, "counts": counts}
