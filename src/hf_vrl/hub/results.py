"""A run's evaluation on its card: the before/after table a reader sees, and the `model-index`
(huggingface_hub `EvalResult`s) of the published model, both read from `report.json`.

`METRICS` lists what a card shows, in order; a method whose report adds a section adds its rows here.

The model-index follows the model card spec: task types are Hub task ids, dataset types Hub dataset ids,
metric types Hub metric ids. Each entry's data is the data its number was measured on, as the report's
section records it (`"data"`, `hf_vrl.eval_inputs.data_record`): the Hub id of that data, its split, the label
column as `config`, and as `args` the classes kept and the sample limit where the number is not on the whole
split. So the index records the numbers measured on data that is on the Hub (`DataName.hub_id`), unchanged
(no synthetic shift), with a metric the Hub names (`HUB_METRICS`); the rest (a section that records no data;
local data such as the shapes world, CUB-200 or webdataset shards; image-text retrieval on captions hf_vrl
wrote (the record's `texts`: Fashion-MNIST has none of its own); NMI, ARI, CDNV, which have no Hub metric;
another subset of data the index already holds for the same task, which its format cannot tell apart) stays
in the card's table (`data_table` says what each section measured) and `run/report.json`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hf_vrl.hub import markdown
from hf_vrl.hub.data_names import DataName, describe_dataset, describe_mmvp

__all__ = [
    "HUB_METRICS",
    "METRICS",
    "PER_DATASET",
    "CardMetric",
    "data_table",
    "eval_results",
    "index_names",
    "protocols",
    "results_table",
]


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
    metric_config: str | None = None  # how `metric_type` was computed (top-k, recall at k, averaging)
    # in `model-index`: not a mean over several sets (each set is, on its own), nor a metric without a Hub id
    indexed: bool = True
    captions: bool = False  # measured with the data's captions: indexed only where they are the data's own

    def value(self, stage: Mapping[str, Any]) -> float | None:
        value = (stage.get(self.section) or {}).get(self.key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    def format(self, value: float | None) -> str:
        if value is None:
            return "–"
        return f"{100 * value:.1f} %" if self.percent else f"{value:.3f}"


HUB_METRICS = frozenset({"accuracy", "recall", "pearsonr", "f1"})  # hf.co/metrics ids hf_vrl reports

# `task_type`s are Hub task ids (the pipeline tags hf.co/tasks lists); embedding-quality scores (retrieval,
# clustering, class centres, RSA, pair discrimination) belong to image-feature-extraction, the task of the
# published encoders. `metric_type`s are Hub metric ids where one fits (accuracy, recall, pearsonr), with
# `metric_config` saying which variant.
_ZS = ("zero-shot-image-classification", "Zero-shot classification")
_OOD = ("zero-shot-image-classification", "Zero-shot classification, distribution shifts")
_TRANSFER = ("zero-shot-image-classification", "Zero-shot classification, transfer datasets")
_RET = ("image-feature-extraction", "Image-text retrieval")
_I2I = ("image-feature-extraction", "Image-image retrieval")
_CLU = ("image-feature-extraction", "Zero-shot clustering (k-means)")
_FINE = ("image-feature-extraction", "Zero-shot clustering (k-means), fine labels")
_NCC = ("image-feature-extraction", "Nearest class centre (CLUE §3.1)")
_PROBE = ("image-classification", "Linear probe")
_MMVP = ("zero-shot-image-classification", "MMVP pairs")
_PAIRS = ("image-feature-extraction", "MMVP image pairs (DCR P-ability, vision only)")
_RSA = ("image-feature-extraction", "RSA (DiVE)")

METRICS: tuple[CardMetric, ...] = (
    CardMetric("zero_shot", "top1", *_ZS, "accuracy", "top-1 accuracy"),
    CardMetric("zero_shot", "top5", *_ZS, "accuracy", "top-5 accuracy", metric_config="top_k=5"),
    CardMetric(
        "zero_shot",
        "mean_per_class_recall",
        *_ZS,
        "recall",
        "mean per-class recall",
        metric_config="average=macro",
    ),
    CardMetric("ood", "top1", *_OOD, "accuracy", "top-1 accuracy, mean over the sets", indexed=False),
    CardMetric(
        "transfer", "top1", *_TRANSFER, "accuracy", "top-1 accuracy, mean over the sets", indexed=False
    ),
    CardMetric("retrieval", "i2t_R@1", *_RET, "recall", "image→text R@1", metric_config="k=1", captions=True),
    CardMetric("retrieval", "i2t_R@5", *_RET, "recall", "image→text R@5", metric_config="k=5", captions=True),
    CardMetric("retrieval", "t2i_R@1", *_RET, "recall", "text→image R@1", metric_config="k=1", captions=True),
    CardMetric("retrieval", "t2i_R@5", *_RET, "recall", "text→image R@5", metric_config="k=5", captions=True),
    CardMetric("retrieval", "i2i_R@1", *_I2I, "recall", "image→image R@1", metric_config="k=1"),
    CardMetric("retrieval", "i2i_R@5", *_I2I, "recall", "image→image R@5", metric_config="k=5"),
    CardMetric("clustering", "nmi", *_CLU, "nmi", "NMI", indexed=False),
    CardMetric("clustering", "acc", *_CLU, "accuracy", "accuracy (Hungarian)"),
    CardMetric("clustering", "ari", *_CLU, "ari", "ARI", indexed=False),
    CardMetric("clustering_fine", "nmi", *_FINE, "nmi", "NMI", labels="fine_label", indexed=False),
    CardMetric("clustering_fine", "acc", *_FINE, "accuracy", "accuracy (Hungarian)", labels="fine_label"),
    CardMetric("clustering_fine", "ari", *_FINE, "ari", "ARI", labels="fine_label", indexed=False),
    CardMetric("linear_probe", "accuracy", *_PROBE, "accuracy", "accuracy"),
    CardMetric("linear_probe", "top1", *_PROBE, "accuracy", "top-1 accuracy"),  # CLUE's evaluation
    CardMetric("mmvp", "accuracy", *_MMVP, "accuracy", "pair accuracy"),
    CardMetric("mmvp", "statement_accuracy", *_MMVP, "accuracy", "statement accuracy"),
    CardMetric("pairs", "accuracy", *_PAIRS, "accuracy", "pair accuracy"),
    CardMetric("pairs", "statement_accuracy", *_PAIRS, "accuracy", "view accuracy"),
    CardMetric("rsa", "image", *_RSA, "pearsonr", "image embeddings", False),
    CardMetric("rsa", "text", *_RSA, "pearsonr", "text embeddings", False),
    CardMetric("granularity", "ncc_fine", *_NCC, "accuracy", "NCC accuracy, fine classes"),
    CardMetric("granularity", "ncc_coarse", *_NCC, "accuracy", "NCC accuracy, coarse classes"),
    CardMetric(
        "granularity",
        "cdnv_all",
        *_NCC,
        "cdnv",
        "CDNV, fine classes (lower is tighter)",
        False,
        indexed=False,
    ),
)
# the model-index groups results by task type and dataset and keeps one task name per group: the names it
# records (`index_names`)
TASK_NAMES = {
    "zero-shot-image-classification": "Zero-shot image classification",
    "image-classification": "Image classification",
    "image-feature-extraction": "Image features",
}


def index_names(metric: CardMetric) -> tuple[str, str]:
    """(task name, metric name) of `metric` in the model-index: the task type's name, and the card table's
    task and metric, so that every number keeps its meaning in its task-and-dataset group."""
    return TASK_NAMES[metric.task_type], f"{metric.task_name}: {metric.name}"


# the sections scored on several datasets, one number per dataset beside the mean (DiVE's ood / transfer)
PER_DATASET = {"ood": _OOD, "transfer": _TRANSFER}


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


def _dataset(record: Mapping[str, Any], section: str) -> DataName | None:
    """The card's name of the data a section `record`s (MMVP pairs by their setting)."""
    name = record.get("dataset")
    return describe_mmvp(name) if section in ("mmvp", "pairs") else describe_dataset(name)


def _index_data(record: Any, section: str, labels: str | None) -> dict[str, Any] | None:
    """The model-index `dataset` fields of the data `record` (None when it cannot be named there: no record,
    not on the Hub, or changed by a transform)."""
    if not isinstance(record, Mapping) or record.get("transform"):
        return None
    data = _dataset(record, section)
    if data is None or data.hub_id is None:
        return None
    args = {key: record[key] for key in ("classes", "limit", "drawn", "seed") if key in record}
    if args.get("drawn") == "whole split" or "limit" not in args:
        args.pop("drawn", None)
    return {
        "dataset_type": data.hub_id,
        "dataset_name": data.name,
        "dataset_config": record.get("labels", labels),
        "dataset_split": record.get("split"),
        "dataset_args": args or None,
    }


def eval_results(report: Mapping[str, Any]) -> list:
    """The `model-index` of the trained model: one `EvalResult` per metric after training, on the data its
    section records (module docstring)."""
    from huggingface_hub import EvalResult

    after = report.get("after") or {}
    results = []
    for m in METRICS:
        value = m.value(after)
        record = (after.get(m.section) or {}).get("data")
        data = _index_data(record, m.section, m.labels)
        if value is None or not m.indexed or data is None or (m.captions and record.get("texts")):
            continue
        task_name, metric_name = index_names(m)
        results.append(
            EvalResult(
                task_type=m.task_type,
                task_name=task_name,
                metric_type=m.metric_type,
                metric_name=metric_name,
                metric_config=m.metric_config,
                metric_value=round(value, 4),
                **data,
            )
        )
    for section, (task_type, task_name) in PER_DATASET.items():
        numbers = after.get(section) or {}
        records = numbers.get("data") or {}
        for name, value in numbers.items():
            data = _index_data(records.get(name), section, None)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or data is None:
                continue
            results.append(
                EvalResult(
                    task_type=task_type,
                    task_name=TASK_NAMES[task_type],
                    metric_type="accuracy",
                    metric_name=f"{task_name}: top-1 accuracy",
                    metric_value=round(float(value), 4),
                    **data,
                )
            )
    return _one_dataset_per_group(results)


def _one_dataset_per_group(results: list) -> list:
    """The results that keep their data in the model-index: the spec (and huggingface_hub) writes one
    `dataset` per (task type, dataset, config, split), so a result whose other fields (name, args: classes
    kept, sample limit) differ from the group's first would be filed under the first's; it stays on the
    card's table (DiVE's held-out classes beside the fine-tuning classes of the same split)."""
    first: dict[tuple, tuple] = {}
    kept = []
    for result in results:
        data = (result.dataset_name, result.dataset_args)
        if first.setdefault(result.unique_identifier, data) == data:
            kept.append(result)
    return kept


def _describe(record: Mapping[str, Any], section: str) -> str:
    """A data record as the card's data table shows it."""
    data = _dataset(record, section)
    name = data.name if data else str(record.get("dataset"))
    details = [f"{record['split']} split" if record.get("split") else None]
    if record.get("classes"):
        details.append(f"{len(record['classes'])} classes: {', '.join(map(str, record['classes']))}")
    if record.get("labels"):
        details.append(f"labels `{record['labels']}`")
    if record.get("transform"):
        details.append(f"images changed by `{record['transform']}`")
    if record.get("texts") and section == "retrieval":  # the task that reads the captions
        details.append(TEXTS[record["texts"]])
    return f"{name} ({'; '.join(d for d in [*details, samples_text(record)] if d)})"


# where the captions come from (`data_record`'s `texts`), as the card says it
TEXTS = {
    "generated": "captions generated by hf_vrl from each image's factors",
    "templates": "captions written by hf_vrl from the class names (the dataset has none)",
}


def samples_text(record: Mapping[str, Any]) -> str | None:
    """How many samples a data `record` holds and how they were drawn (`hf_vrl.data.registry.how_drawn`),
    as the card says it: "500 samples, generated (seed 0)", "64 samples, a seeded random subset (seed 0)",
    "100 samples, the first rows of the stream"."""
    n, drawn, seed = record.get("n_samples"), record.get("drawn"), record.get("seed")
    count = f"{n:,} samples" if isinstance(n, int) else None
    if drawn is None and record.get("limit") is not None:  # a record written before `drawn`
        drawn = "seeded subset"
    how = {
        "generated": f"generated (seed {seed})",
        "whole split": "the whole split",
        "stream start": "the first rows of the stream, in its order",
        "shuffled stream start": f"the first rows of the stream through a shuffle buffer of "
        f"{record.get('shuffle_buffer')} (seed {seed})",
        "seeded subset": f"a seeded random subset (seed {seed})",
    }.get(drawn)
    if count is None and record.get("limit") is not None and drawn != "whole split":
        count = f"{record['limit']:,} samples"
    return ", ".join(part for part in (count, how) if part) or None


def data_table(report: Mapping[str, Any]) -> str | None:
    """task | data: what each section of the run's evaluation after training was measured on (None when no
    section records its data)."""
    after = report.get("after") or {}
    rows = []
    for section, numbers in after.items():
        record = numbers.get("data") if isinstance(numbers, Mapping) else None
        if not isinstance(record, Mapping):
            continue
        task = section.replace("_", " ")
        if section in PER_DATASET:
            rows += [[f"{task}: {name}", _describe(each, section)] for name, each in record.items()]
        else:
            rows.append([task, _describe(record, section)])
    return markdown.table(["task", "data"], rows) if rows else None
