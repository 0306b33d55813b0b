"""DiVE's evaluation as the paper reports it (§5): ID accuracy, OOD accuracy on shifted sets of the same
classes, zero-shot accuracy on other data sets, and the RSA score against the pre-trained model (App. D).

Every accuracy is zero-shot classification with the text tower as the head (`evaluate_clip`'s zero_shot task,
prompt ensembling), as FLYP evaluates: the ID and OOD sets with the target's caption templates, the transfer
sets with their own templates. RSA compares the pre-trained and the fine-tuned embeddings of a held-out
image-caption set (images and captions separately; the paper uses Flickr8K). The frozen model is moved to the
evaluated model's device. The report:

    {"id": {"zero_shot.top1": ...}, "ood": {name: {...}}, "transfer": {name: {...}},
     "rsa": {"rsa.image": ..., "rsa.text": ...},
     "summary": {"id.top1", "ood.top1" (mean), "transfer.top1" (mean), "rsa.image", "rsa.text"}}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from torch import nn

from hf_vrl.devices import module_device
from hf_vrl.evaluation import evaluate_clip

__all__ = ["evaluate_dive", "flatten_report", "id_accuracy", "load_evaluation_sets"]


def flatten_report(report: Mapping[str, Any], tasks: Sequence[str]) -> dict[str, float]:
    """`evaluate_clip`'s nested report as {"task.metric": value} for the numeric metrics of `tasks`."""
    return {
        f"{task}.{name}": float(value)
        for task in tasks
        for name, value in report.get(task, {}).items()
        if isinstance(value, (int, float)) and not name.startswith("n_")
    }


def _zero_shot(
    model, image_processor, tokenizer, dataset, templates, batch_size, dataset_name=None
) -> dict[str, float]:
    report = evaluate_clip(
        model,
        image_processor,
        tokenizer,
        dataset,
        tasks=("zero_shot",),
        templates=templates,
        dataset_name=dataset_name,
        batch_size=batch_size,
    )
    return flatten_report(report, ("zero_shot",))


def id_accuracy(
    model: nn.Module,
    image_processor: Any,
    tokenizer: Any,
    dataset: Any,
    templates: Sequence[str] | None = None,
    batch_size: int = 64,
    dataset_name: str | None = None,
) -> float:
    """Zero-shot top-1 accuracy on `dataset`: the WiSE-FT selection score on the ID validation set."""
    report = _zero_shot(model, image_processor, tokenizer, dataset, templates, batch_size, dataset_name)
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
) -> dict[str, Any]:
    """The paper's report for `model` (see the module docstring); sets left out are left out of it.

    `templates`: the caption templates of the target classes (ID and OOD); `transfer_templates`: per
    transfer set (default: `hf_vrl.data.prompts`' zero-shot ensemble). `rsa_dataset` needs `pretrained_model`.
    Each set's name (`id_dataset_name`, the keys of the OOD and transfer mappings) picks its class names:
    OpenAI's curated ImageNet names for the ImageNet family, ImageNet-R / -A on their 200 classes
    (`hf_vrl.evaluation.imagenet_classes`).
    """

    def zero_shot(dataset, prompts, name=None):
        return _zero_shot(model, image_processor, tokenizer, dataset, prompts, batch_size, name)

    report: dict[str, Any] = {}
    if id_dataset is not None:
        report["id"] = zero_shot(id_dataset, templates, id_dataset_name)
    report["ood"] = {name: zero_shot(ds, templates, name) for name, ds in (ood_datasets or {}).items()}
    transfer_templates = transfer_templates or {}
    report["transfer"] = {
        name: zero_shot(ds, transfer_templates.get(name), name)
        for name, ds in (transfer_datasets or {}).items()
    }
    if rsa_dataset is not None:
        if pretrained_model is None:
            raise ValueError("the RSA score compares with the pre-trained model: pass pretrained_model")
        rsa = evaluate_clip(
            model,
            image_processor,
            tokenizer,
            rsa_dataset,
            tasks=("rsa",),
            reference_model=pretrained_model,
            batch_size=batch_size,
            device=module_device(model),
        )
        report["rsa"] = flatten_report(rsa, ("rsa",))
    report["summary"] = _summary(report)
    return report


def _summary(report: Mapping[str, Any]) -> dict[str, float | None]:
    summary = {
        "id.top1": report.get("id", {}).get("zero_shot.top1"),
        "ood.top1": _mean(report["ood"], "zero_shot.top1"),
        "transfer.top1": _mean(report["transfer"], "zero_shot.top1"),
    }
    summary.update(report.get("rsa", {}))
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
    `evaluate_dive`. An OOD set reads its own split and limit when `settings.ood_splits` / `ood_limits` name
    it (FLYP's protocol: each ImageNet shift is one test split of its own size)."""
    from hf_vrl.evaluation import load_eval_dataset

    def load(name: str, n: int | None) -> Any:
        return load_eval_dataset(name, split=split, limit=n, image_size=image_size, seed=seed)

    def load_ood(name: str) -> Any:  # each OOD set its own split and limit where the settings give them
        splits, limits = getattr(settings, "ood_splits", {}), getattr(settings, "ood_limits", {})
        n = limits.get(name, limit)
        return load_eval_dataset(
            name, split=splits.get(name, split), limit=n, image_size=image_size, seed=seed
        )

    rsa = settings.rsa_dataset
    return {
        "ood_datasets": {name: load_ood(name) for name in settings.ood_datasets},
        "transfer_datasets": {name: load(name, limit) for name in settings.zero_shot_datasets},
        "rsa_dataset": None if rsa is None else load(rsa, settings.rsa_limit),
    }
