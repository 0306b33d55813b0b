"""A run's evaluation on its card: the before/after table a reader sees, and the `model-index`
(huggingface_hub `EvalResult`s) of the published model, both read from `report.json`.

`METRICS` lists what a card shows, in order; a method whose report adds a section adds its rows here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hf_vrl.hub import markdown
from hf_vrl.hub.data_names import DataName

__all__ = ["METRICS", "CardMetric", "eval_results", "protocols", "results_table"]


@dataclass(frozen=True)
class CardMetric:
    """One number of a report section on the card: `report[stage][section][key]`."""

    section: str
    key: str
    task_type: str
    task_name: str
    metric_type: str
    name: str
    percent: bool = True  # a fraction shown as a percentage; else a plain number
    labels: str | None = None  # the label column scored when it is not `label` (model-index dataset config)

    def value(self, stage: Mapping[str, Any]) -> float | None:
        value = (stage.get(self.section) or {}).get(self.key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    def format(self, value: float | None) -> str:
        if value is None:
            return "–"
        return f"{100 * value:.1f} %" if self.percent else f"{value:.3f}"


_ZS = ("zero-shot-image-classification", "Zero-shot classification")
_RET = ("image-text-retrieval", "Image-text retrieval")
_CLU = ("image-clustering", "Zero-shot clustering (k-means)")
_FINE = ("image-clustering", "Zero-shot clustering (k-means), fine labels")
_NCC = ("nearest-class-centre", "Nearest class centre (CLUE §3.1)")

METRICS: tuple[CardMetric, ...] = (
    CardMetric("zero_shot", "top1", *_ZS, "accuracy", "top-1 accuracy"),
    CardMetric("zero_shot", "top5", *_ZS, "top_5_accuracy", "top-5 accuracy"),
    CardMetric("zero_shot", "mean_per_class_recall", *_ZS, "mean_per_class_recall", "mean per-class recall"),
    CardMetric("retrieval", "i2t_R@1", *_RET, "recall@1", "image→text R@1"),
    CardMetric("retrieval", "i2t_R@5", *_RET, "recall@5", "image→text R@5"),
    CardMetric("retrieval", "t2i_R@1", *_RET, "recall@1", "text→image R@1"),
    CardMetric("retrieval", "t2i_R@5", *_RET, "recall@5", "text→image R@5"),
    CardMetric("clustering", "nmi", *_CLU, "nmi", "NMI"),
    CardMetric("clustering", "acc", *_CLU, "accuracy", "accuracy (Hungarian)"),
    CardMetric("clustering", "ari", *_CLU, "ari", "ARI"),
    CardMetric("clustering_fine", "nmi", *_FINE, "nmi", "NMI", labels="fine_label"),
    CardMetric("clustering_fine", "acc", *_FINE, "accuracy", "accuracy (Hungarian)", labels="fine_label"),
    CardMetric("clustering_fine", "ari", *_FINE, "ari", "ARI", labels="fine_label"),
    CardMetric("linear_probe", "accuracy", "image-classification", "Linear probe", "accuracy", "accuracy"),
    CardMetric("mmvp", "accuracy", "image-text-matching", "MMVP pairs", "accuracy", "pair accuracy"),
    CardMetric(
        "mmvp", "statement_accuracy", "image-text-matching", "MMVP pairs", "accuracy", "statement accuracy"
    ),
    CardMetric(
        "rsa", "image", "representation-similarity", "RSA (DiVE)", "pearsonr", "image embeddings", False
    ),
    CardMetric(
        "rsa", "text", "representation-similarity", "RSA (DiVE)", "pearsonr", "text embeddings", False
    ),
    CardMetric("granularity", "ncc_fine", *_NCC, "accuracy", "NCC accuracy, fine classes"),
    CardMetric("granularity", "ncc_coarse", *_NCC, "accuracy", "NCC accuracy, coarse classes"),
    CardMetric("granularity", "cdnv_all", *_NCC, "cdnv", "CDNV, fine classes (lower is tighter)", False),
)


def _shown(report: Mapping[str, Any]) -> list[CardMetric]:
    stages = [report.get(stage) or {} for stage in ("before", "after")]
    return [m for m in METRICS if any(m.value(stage) is not None for stage in stages)]


def results_table(report: Mapping[str, Any]) -> str | None:
    """task | metric | before | after, for the metrics the report has (None when it has none)."""
    metrics = _shown(report)
    if not metrics:
        return None
    before, after = report.get("before") or {}, report.get("after") or {}
    rows = []
    for i, m in enumerate(metrics):
        task = m.task_name if i == 0 or metrics[i - 1].task_name != m.task_name else ""
        rows.append([task, m.name, m.format(m.value(before)), m.format(m.value(after))])
    return markdown.table(["task", "metric", "before training", "after training"], rows, "llrr")


def protocols(report: Mapping[str, Any]) -> dict[str, str]:
    """{section: protocol} as the report records them (how zero-shot, retrieval and MMVP were scored)."""
    stage = report.get("after") or report.get("before") or {}
    return {
        name: str(s["protocol"]) for name, s in stage.items() if isinstance(s, Mapping) and "protocol" in s
    }


def eval_results(
    report: Mapping[str, Any], data: DataName | None, split: str, mmvp: DataName | None = None
) -> list:
    """The `model-index` of the trained model: one `EvalResult` per metric after training, on `data`
    (`split`), MMVP on `mmvp`."""
    from huggingface_hub import EvalResult

    after = report.get("after") or {}
    results = []
    for m in METRICS:
        value = m.value(after)
        if value is None:
            continue
        dataset = mmvp if m.section == "mmvp" and mmvp is not None else data
        if dataset is None:
            continue
        results.append(
            EvalResult(
                task_type=m.task_type,
                task_name=m.task_name,
                dataset_type=dataset.type,
                dataset_name=dataset.name,
                dataset_config=m.labels,
                dataset_split=None if dataset is mmvp else split,
                metric_type=m.metric_type,
                metric_name=m.name,
                metric_value=round(value, 4),
            )
        )
    return results
