"""A run's record (`report.json`, `hf_vrl.run.report`) in the sentences of its card: the data trained on and
how it was drawn, the in-run pre-trainings, the steps each stage really ran, and the claims about an effect,
each printed with the measured before → after that supports it, or "not shown in this run".

Nothing here reads the configuration: a sentence says what the record says ran.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hf_vrl.hub import markdown
from hf_vrl.hub.data_names import describe_dataset
from hf_vrl.hub.results import METRICS, CardMetric, samples_text

__all__ = [
    "NOT_SHOWN",
    "compute_table",
    "data_text",
    "duration",
    "effect",
    "eval_record",
    "input_rows",
    "labelled_inputs",
    "pairs_text",
    "pretraining_text",
    "stage_steps",
]

NOT_SHOWN = "not shown in this run"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def data_text(record: Mapping[str, Any] | None, link: bool = True) -> str | None:
    """A data record as a sentence part: "[Fashion-MNIST](…) (train split, 64 samples, a seeded random subset
    (seed 0))"; None without a record."""
    if not isinstance(record, Mapping) or not record.get("dataset"):
        return None
    data = describe_dataset(record["dataset"])
    name = data.name if data else str(record["dataset"])
    if link and data and data.hub_id:
        name = f"[{data.name}](https://huggingface.co/datasets/{data.hub_id})"
    details = [f"{record['split']} split" if record.get("split") else None, samples_text(record)]
    details = [d for d in details if d]
    return f"{name} ({', '.join(details)})" if details else name


def eval_record(report: Mapping[str, Any], dataset: str | None) -> Mapping[str, Any] | None:
    """The data record of the first section measured on `dataset` (the run's evaluation set)."""
    for stage in ("after", "before"):
        for section in (report.get(stage) or {}).values():
            record = section.get("data") if isinstance(section, Mapping) else None
            if isinstance(record, Mapping) and record.get("dataset") == dataset and dataset is not None:
                return record
    return None


def stage_steps(report: Mapping[str, Any]) -> dict[str, int | None]:
    """{stage: the optimiser steps it really ran}, as the record has them."""
    stages = (report.get("train") or {}).get("stages") or {}
    return {name: stage.get("steps") for name, stage in stages.items()}


def _records(data: Any) -> list[Mapping[str, Any]]:
    return [data] if isinstance(data, Mapping) else [d for d in data or [] if isinstance(d, Mapping)]


def pretraining_text(report: Mapping[str, Any]) -> str | None:
    """The in-run pre-trainings (`report["inputs"]`) as markdown bullets: the model, its objective and labels,
    the steps it ran and the data it learnt from (None when the run trained none)."""
    lines = []
    for name, record in (report.get("inputs") or {}).items():
        data = "; ".join(filter(None, (data_text(d, link=False) for d in _records(record.get("data")))))
        model, steps = record.get("model", "a model"), record.get("steps", "–")
        lines.append(
            f"- `{name}`: {model}, trained for {steps} steps with "
            f"{record.get('objective', 'an objective not recorded')} on {data or 'data not recorded'}; "
            f"labels: {record.get('labels', 'not recorded')}."
        )
    return "\n".join(lines) or None


def labelled_inputs(report: Mapping[str, Any]) -> list[str]:
    """The in-run pre-trainings that learnt from labels other than captions, as "`backbone` on shape labels
    for 100 steps"."""
    return [
        f"`{name}` on {record['labels']} for {record.get('steps', '–')} steps"
        for name, record in (report.get("inputs") or {}).items()
        if record.get("labels") and not str(record["labels"]).startswith("captions")
    ]


def input_rows(report: Mapping[str, Any]) -> list[list[Any]]:
    """Rows of the training-compute table for the in-run pre-trainings (stage, steps, time, hardware)."""
    return [
        [
            f"in-run pre-training: {name}",
            record.get("steps", "–"),
            duration(record.get("runtime_s")),
            record.get("hardware", "not recorded"),
        ]
        for name, record in (report.get("inputs") or {}).items()
    ]


def _metric(section: str, key: str) -> CardMetric:
    return next(m for m in METRICS if (m.section, m.key) == (section, key))


def effect(report: Mapping[str, Any], claim: str, metrics: Sequence[tuple[str, str]]) -> str:
    """`claim` as the card may print it: with the before → after of each of `metrics` ((section, key)) the
    run measured, when every one rose; else "not shown in this run" with what was measured."""
    before, after = report.get("before") or {}, report.get("after") or {}
    measured = []
    for section, key in metrics:
        m = _metric(section, key)
        first, last = m.value(before), m.value(after)
        if first is not None and last is not None:
            measured.append((f"{m.task_name}, {m.name}: {m.format(first)} → {m.format(last)}", last > first))
    if not measured:
        return f"{claim}: {NOT_SHOWN} (it was not measured before and after training)"
    numbers = "; ".join(text for text, _ in measured)
    if all(rose for _, rose in measured):
        return f"{claim}, as this run measured it ({numbers})"
    return f"{claim}: {NOT_SHOWN} ({numbers})"


def pairs_text(report: Mapping[str, Any]) -> str | None:
    """The pairs a P-ability number was measured on and its step: "50 pairs in 5 categories, steps of 2.0
    points" (None when no pairs were scored)."""
    for stage in ("after", "before"):
        section = (report.get(stage) or {}).get("mmvp") or (report.get(stage) or {}).get("pairs")
        if isinstance(section, Mapping) and section.get("n_pairs"):
            n, categories = int(section["n_pairs"]), len(section.get("per_category") or {})
            where = f" in {categories} categories" if categories else ""
            return f"{n} pairs{where}, so pair accuracy moves in steps of {100 / n:.1f} points"
    return None


def compute_table(report: Mapping[str, Any]) -> str:
    """Per training stage and in-run pre-training: optimiser steps, training time (over all resumes) and
    hardware, as the record has them."""
    stages = (report.get("train") or {}).get("stages") or {}
    rows = input_rows(report) + [
        [
            name,
            stage.get("steps", "–"),
            duration(stage.get("runtime_s")),
            stage.get("hardware", "not recorded"),
        ]
        for name, stage in stages.items()
    ]
    return markdown.table(["stage", "optimiser steps", "training time", "hardware"], rows, "lrrl")
