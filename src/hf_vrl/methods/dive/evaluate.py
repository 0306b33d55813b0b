"""DiVE's evaluation as the paper reports it (§5): ID accuracy, OOD accuracy on shifted sets of the same
classes, zero-shot accuracy on other data sets, and the RSA score against the pre-trained model (App. D).

The ID and OOD sets are classified (`classify`) as FLYP evaluates: zero-shot with the text tower as the head
(prompt ensembling over the target's caption templates, clip_benchmark's scoring: the numbers of
`evaluate_clip`'s zero_shot task), or, for the cross-entropy baselines (a `HeadClassifier`), with the learned
head, indexed by class: a set on the head's classes uses it as is, ImageNet-R / -A its rows of their 200
classes (WiSE-FT's class mask), other sets the rows of their class names; ObjectNet (its 113 folders) scores
the maximum over its ImageNet classes either way. ObjectNet images lose `objectnet_border` pixels on every
side first (FLYP / WiSE-FT: 2; `hf_vrl.evaluation.scored_images`, as every command scores them). Where asked
(`macro_f1`) or where a set has the `group_column`, its report adds the macro F1 / the worst-group accuracy of
the same predictions (Table 4: iWildCam, FMoW). The transfer sets are zero-shot with their own templates (a
HeadClassifier's encoder, the pre-trained text tower); RSA compares the pre-trained and the fine-tuned
embeddings of a held-out image-caption set (images and captions separately; the paper uses Flickr8K). The
frozen model is moved to the evaluated model's device.
The report:

    {"id": {"zero_shot.top1": ..., ["zero_shot.macro_f1", "zero_shot.worst_group"]},
     "ood": {name: {...}}, "transfer": {name: {...}}, "rsa": {"rsa.image": ..., "rsa.text": ...},
     "summary": {"id.top1", "ood.top1" (mean), "transfer.top1" (mean), "rsa.image", "rsa.text"}}

with, given each set's record (`evaluate_dive`'s `data`), "data" beside each set's numbers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from hf_vrl.data.imagenet import OBJECTNET_BORDER, border_crop
from hf_vrl.devices import module_device
from hf_vrl.errors import UserError
from hf_vrl.evaluation import encode_images, evaluate_clip, imagenet_classes, scored_images
from hf_vrl.methods.dive.head import HeadClassifier, text_classifier
from hf_vrl.metrics import cb_zero_shot_accuracy

__all__ = [
    "ClassifySettings",
    "border_crop",
    "classify",
    "evaluate_dive",
    "flatten_report",
    "id_accuracy",
    "load_evaluation_sets",
    "text_classifier",
]


def flatten_report(report: Mapping[str, Any], tasks: Sequence[str]) -> dict[str, float]:
    """`evaluate_clip`'s nested report as {"task.metric": value} for the numeric metrics of `tasks`."""
    return {
        f"{task}.{name}": float(value)
        for task in tasks
        for name, value in report.get(task, {}).items()
        if isinstance(value, (int, float)) and not name.startswith("n_")
    }


@dataclass(frozen=True)
class ClassifySettings:
    """How `classify` scores an ID / OOD set: its extra metrics and ObjectNet's border crop."""

    macro_f1: bool = False
    group_column: str | None = "region"
    group_exclude: Sequence[str] = ("Other",)
    objectnet_border: int = OBJECTNET_BORDER
    batch_size: int = 64


@dataclass
class _Classified:
    logits: torch.Tensor  # [N scored, C] (ObjectNet: projected onto its classes)
    labels: np.ndarray  # [N scored], in the logits' classes
    scored: np.ndarray  # [N] bool: the rows scored (ObjectNet's unmapped folders are not)
    image: torch.Tensor  # [N scored, D] image embeddings
    classifier: torch.Tensor  # [D, C'] (before ObjectNet's projection)
    projection: list[tuple[int, ...]] | None = None


def _head_rows(head_names: Sequence[str], names: Sequence[str], dataset_name: str | None) -> list[int]:
    """The head's rows for the classes `names` of `dataset_name`: all when they are the head's classes,
    ImageNet-R / -A's 200 by their WNIDs on a 1000-class head, else by name."""
    from hf_vrl.data import prompts
    from hf_vrl.data.imagenet_classes import IMAGENET_WNIDS

    if list(names) == list(head_names):
        return list(range(len(head_names)))
    member = prompts.imagenet_family(dataset_name)
    if member in prompts.IMAGENET_SUBSETS and len(head_names) == len(IMAGENET_WNIDS):
        return [IMAGENET_WNIDS.index(wnid) for wnid in prompts.imagenet_class_wnids(member)]
    first = {name: row for row, name in reversed(list(enumerate(head_names)))}
    missing = [name for name in names if name not in first]
    if missing:
        raise UserError(
            f"{dataset_name or 'a set'}: the classification head has no class {missing[:3]}; the "
            "cross-entropy baselines score sets of the target's classes (zero-shot sets go in transfer)"
        )
    return [first[name] for name in names]


def _classified(
    model: nn.Module,
    image_processor: Any,
    tokenizer: Any,
    dataset: Any,
    templates: Sequence[Any] | None,
    dataset_name: str | None,
    settings: ClassifySettings,
) -> _Classified:
    from hf_vrl.data.schema import class_names_of
    from hf_vrl.evaluation import zero_shot_prompts

    dataset_name = dataset_name or getattr(getattr(dataset, "info", None), "dataset_name", None)
    labels = np.asarray(dataset["label"][:], dtype=np.int64)
    labels, names, _, projection = imagenet_classes(dataset_name, labels, class_names_of(dataset))
    if names is None:
        raise UserError(f"{dataset_name or 'a set'}: its 'label' column is not a ClassLabel with class names")
    images = scored_images(dataset["image"], dataset_name, settings.objectnet_border)
    head = model if isinstance(model, HeadClassifier) else None
    encoder = model if head is None else head.encoder
    was_training = encoder.training
    encoder.eval()
    try:
        image = encode_images(encoder, image_processor, images, batch_size=settings.batch_size)
        if head is None:
            prompt_set = zero_shot_prompts("clip_benchmark", dataset_name, templates)
            classifier = text_classifier(
                model, tokenizer, names, prompt_set.templates, prompt_set.fill, settings.batch_size
            )
        else:
            rows = _head_rows(head.class_names, names, dataset_name)
            classifier = head.head.weight.detach().float().cpu()[rows].T
    finally:
        encoder.train(was_training)
    scored = labels >= 0
    image = image[torch.from_numpy(scored)]
    logits = 100.0 * torch.nn.functional.normalize(image, dim=-1) @ classifier
    if projection is not None:
        logits = torch.stack([logits[:, list(cols)].max(dim=1).values for cols in projection], dim=1)
    return _Classified(logits, labels[scored], scored, image, classifier, projection)


def classify(
    model: nn.Module,
    image_processor: Any,
    tokenizer: Any,
    dataset: Any,
    templates: Sequence[Any] | None = None,
    dataset_name: str | None = None,
    settings: ClassifySettings = ClassifySettings(),
) -> dict[str, float]:
    """{"zero_shot.top1", "zero_shot.top5", "zero_shot.mean_per_class_recall"} of an ID / OOD set (module
    docstring), with "zero_shot.macro_f1" when `settings.macro_f1` and "zero_shot.worst_group" when the set
    has `settings.group_column`."""
    from hf_vrl.metrics import macro_f1, worst_group_accuracy

    out = _classified(model, image_processor, tokenizer, dataset, templates, dataset_name, settings)
    n_classes = out.logits.shape[1]
    topk = [k for k in (1, 5) if k <= n_classes]
    scores = cb_zero_shot_accuracy(out.image, out.classifier, out.labels, topk, projection=out.projection)
    predicted = out.logits.argmax(dim=1).numpy()
    if settings.macro_f1:
        scores["macro_f1"] = macro_f1(out.labels, predicted)
    if settings.group_column and settings.group_column in dataset.column_names:
        groups = np.asarray(dataset[settings.group_column][:], dtype=object)[out.scored]
        worst = worst_group_accuracy(out.labels, predicted, groups, exclude=settings.group_exclude)
        scores["worst_group"] = worst["worst"]
    return {f"zero_shot.{name}": float(value) for name, value in scores.items()}


def id_accuracy(
    model: nn.Module,
    image_processor: Any,
    tokenizer: Any,
    dataset: Any,
    templates: Sequence[str] | None = None,
    batch_size: int = 64,
    dataset_name: str | None = None,
) -> float:
    """Top-1 accuracy on `dataset` (`classify`): the selection score on the ID validation set."""
    settings = ClassifySettings(group_column=None, batch_size=batch_size)
    report = classify(model, image_processor, tokenizer, dataset, templates, dataset_name, settings)
    return report["zero_shot.top1"]


def _mean(groups: Mapping[str, Mapping[str, float]], key: str) -> float | None:
    values = [metrics[key] for metrics in groups.values() if key in metrics]
    return float(np.mean(values)) if values else None


def evaluate_dive(
    model: nn.Module,
    image_processor: Any,
    tokenizer: Any,
    *,
    id_dataset: Any = None,
    ood_datasets: Mapping[str, Any] | None = None,
    transfer_datasets: Mapping[str, Any] | None = None,
    rsa_dataset: Any = None,
    pretrained_model: nn.Module | None = None,
    templates: Sequence[str] | None = None,
    transfer_templates: Mapping[str, Sequence[str]] | None = None,
    batch_size: int = 64,
    id_dataset_name: str | None = None,
    settings: ClassifySettings | None = None,
    data: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The paper's report for `model` (see the module docstring); sets left out are left out of it.

    `model`: a dual encoder, or a `HeadClassifier` (its head classifies the ID and OOD sets, its encoder
    does the rest). `templates`: the caption templates of the target classes (ID and OOD);
    `transfer_templates`: per transfer set (default: `hf_vrl.data.prompts`' zero-shot ensemble).
    `rsa_dataset` needs `pretrained_model`. Each set's name (`id_dataset_name`, the keys of the OOD and
    transfer mappings) picks its class names: OpenAI's curated ImageNet names for the ImageNet family,
    ImageNet-R / -A on their 200 classes (`hf_vrl.evaluation.imagenet_classes`). `settings`: the ID / OOD
    sets' extra metrics and ObjectNet's border crop (default `ClassifySettings()`; its batch_size is
    replaced by `batch_size`). `data`: the `hf_vrl.eval_inputs.data_record` of each set, shaped as the report
    ({"id": record, "ood": {name: record}, "transfer": {...}, "rsa": record}), recorded beside its numbers as
    "data".
    """
    from dataclasses import replace

    settings = replace(settings or ClassifySettings(), batch_size=batch_size)
    encoder = model.encoder if isinstance(model, HeadClassifier) else model

    def scored(dataset, name=None):
        return classify(model, image_processor, tokenizer, dataset, templates, name, settings)

    def zero_shot(dataset, prompts, name):
        report = evaluate_clip(
            encoder,
            image_processor,
            tokenizer,
            dataset,
            tasks=("zero_shot",),
            templates=prompts,
            dataset_name=name,
            batch_size=batch_size,
        )
        return flatten_report(report, ("zero_shot",))

    report: dict[str, Any] = {}
    if id_dataset is not None:
        report["id"] = scored(id_dataset, id_dataset_name)
    report["ood"] = {name: scored(ds, name) for name, ds in (ood_datasets or {}).items()}
    transfer_templates = transfer_templates or {}
    report["transfer"] = {
        name: zero_shot(ds, transfer_templates.get(name), name)
        for name, ds in (transfer_datasets or {}).items()
    }
    if rsa_dataset is not None:
        if pretrained_model is None:
            raise ValueError("the RSA score compares with the pre-trained model: pass pretrained_model")
        rsa = evaluate_clip(
            encoder,
            image_processor,
            tokenizer,
            rsa_dataset,
            tasks=("rsa",),
            reference_model=pretrained_model,
            batch_size=batch_size,
            device=module_device(encoder),
        )
        report["rsa"] = flatten_report(rsa, ("rsa",))
    _record_data(report, data or {})
    report["summary"] = _summary(report)
    return report


def _record_data(report: dict[str, Any], data: Mapping[str, Any]) -> None:
    """Each set's record as "data" beside its numbers (`evaluate_dive`'s `data`)."""
    for group in ("id", "rsa"):
        if group in report and data.get(group) is not None:
            report[group]["data"] = data[group]
    for group in ("ood", "transfer"):
        for name, numbers in report[group].items():
            if name in (data.get(group) or {}):
                numbers["data"] = data[group][name]


def _summary(report: Mapping[str, Any]) -> dict[str, float | None]:
    summary = {
        "id.top1": report.get("id", {}).get("zero_shot.top1"),
        "ood.top1": _mean(report["ood"], "zero_shot.top1"),
        "transfer.top1": _mean(report["transfer"], "zero_shot.top1"),
    }
    summary.update({key: value for key, value in report.get("rsa", {}).items() if key != "data"})
    return summary


def load_evaluation_sets(
    settings: Any,
    *,
    split: str = "test",
    limit: int | None = None,
    image_size: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """The OOD, transfer and RSA sets a `DiVESettings` names, from the data registry (map-style; streams are
    read up to `limit` samples, `settings.rsa_limit` for the RSA set), as keyword arguments of
    `evaluate_dive`, with the `data` record of each. An OOD set reads its own split and limit when
    `settings.ood_splits` / `ood_limits` name it (FLYP's protocol: each ImageNet shift is one test split of
    its own size)."""
    from hf_vrl.eval_inputs import data_record, load_eval_dataset

    def load(name: str, set_split: str, n: int | None) -> tuple[Any, dict[str, Any]]:
        rows = load_eval_dataset(name, split=set_split, limit=n, image_size=image_size, seed=seed)
        return rows, data_record(name, set_split, rows, limit=n, seed=seed)

    splits, limits = getattr(settings, "ood_splits", {}), getattr(settings, "ood_limits", {})
    groups = {
        "ood": {
            name: load(name, splits.get(name, split), limits.get(name, limit))
            for name in settings.ood_datasets
        },
        "transfer": {name: load(name, split, limit) for name in settings.zero_shot_datasets},
    }
    rsa = None if settings.rsa_dataset is None else load(settings.rsa_dataset, split, settings.rsa_limit)
    return {
        "ood_datasets": {name: rows for name, (rows, _) in groups["ood"].items()},
        "transfer_datasets": {name: rows for name, (rows, _) in groups["transfer"].items()},
        "rsa_dataset": None if rsa is None else rsa[0],
        "data": {
            **{group: {name: record for name, (_, record) in sets.items()} for group, sets in groups.items()},
            "rsa": None if rsa is None else rsa[1],
        },
    }
