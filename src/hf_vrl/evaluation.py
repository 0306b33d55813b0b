"""`evaluate_clip()`: the metric suite for any CLIP-like model or vision tower (`hf-vrl eval` is
`hf_vrl.eval_command`; the loaders of the models and data it scores are `hf_vrl.eval_inputs`).

A model qualifies when it exposes `get_image_features(pixel_values=...)` (and, for the text tasks,
`get_text_features(input_ids=..., attention_mask=...)`), as transformers' CLIPModel / SiglipModel and this
library's models do, or when it is a bare vision tower whose forward takes `pixel_values` and returns
`pooler_output` (CLIPVisionModel); vision towers get the vision-only tasks. Metrics live in `hf_vrl.metrics`;
this module extracts embeddings (on the model's device and dtype) and assembles the report.

Protocols of the text tasks (`protocol=`; each report entry names the one that produced it):
- "clip_benchmark" (default), the protocol published numbers use (LAION-AI/CLIP_benchmark):
  retrieval ranks *all captions of every image* (each caption belongs to its one image; repeated strings stay
  separate entries), zero-shot uses OpenAI's templates for the dataset, verbatim (`hf_vrl.data.prompts`:
  the set named by `templates`, else the dataset's own set, else ImageNet's 80, clip_benchmark's fallback).
- "hf_vrl", the earlier behaviour: retrieval over the *distinct* caption strings (one caption per image, a
  caption shared by several images matches any of them), zero-shot over hf_vrl's 8 templates with "a" ->
  "an" before vowels. On template-captioned data its retrieval numbers are far higher and not comparable.
Scoring: "clip_benchmark" computes zero-shot accuracy and recall@K exactly as clip_benchmark does
(`hf_vrl.metrics.clip_benchmark`: torch float32, ties in whatever order `torch.topk` returns), so equal
embeddings give clip_benchmark's numbers; "hf_vrl" counts ties in expectation over random orders
(`hf_vrl.metrics.ranking`).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers.utils.logging import tqdm

from hf_vrl import metrics
from hf_vrl.contrastive import as_embeddings
from hf_vrl.data import prompts as data_prompts
from hf_vrl.data.benchmarks import benchmark_name, benchmark_of, openai_class_names
from hf_vrl.data.clip_benchmark import TEMPLATES, fill_mirror_template
from hf_vrl.data.imagenet import OBJECTNET_BORDER, BorderCropped
from hf_vrl.data.imagenet_classes import IMAGENET_CLASSNAMES, IMAGENET_WNIDS, OBJECTNET_FOLDER_TO_IMAGENET
from hf_vrl.data.prompts import imagenet_family
from hf_vrl.data.schema import class_names_of
from hf_vrl.devices import module_device, module_dtype, to_device
from hf_vrl.errors import UserError

logger = logging.getLogger(__name__)

TASKS = ("zero_shot", "retrieval", "clustering", "linear_probe", "granularity", "rsa")
DEFAULT_TASKS = ("zero_shot", "retrieval", "clustering", "linear_probe")
TEXT_TASKS = ("zero_shot", "retrieval")
RECALL_KS = (1, 5, 10)  # the recall@K retrieval reports (those K <= the candidates)
LABEL_TASKS = ("zero_shot", "clustering", "linear_probe", "granularity")
PROTOCOLS = ("clip_benchmark", "hf_vrl")
DEFAULT_PROTOCOL = "clip_benchmark"
DEFAULT_PROBE_TRAIN_LIMIT = 10_000  # `hf-vrl eval`: linear-probe training images (a seeded subset)


# -- embedding extraction --------------------------------------------------------------------------


def has_text_tower(model: torch.nn.Module) -> bool:
    """Whether the model embeds text (CLIP-like) rather than being a bare vision tower."""
    return callable(getattr(model, "get_text_features", None))


def has_image_tower(model: torch.nn.Module) -> bool:
    """Whether the model embeds images: `get_image_features`, or a forward taking `pixel_values` first."""
    return (
        callable(getattr(model, "get_image_features", None))
        or getattr(model, "main_input_name", None) == "pixel_values"
    )


def check_image_model(model: torch.nn.Module) -> None:
    """Raise a one-line UserError when `model` cannot embed images (a text-only model, say)."""
    if not has_image_tower(model):
        raise UserError(
            f"{type(model).__name__} embeds no images (no get_image_features, and its forward does not take "
            "pixel_values): evaluation needs a CLIP-like model or a vision tower."
        )


def _progress(total: int, desc: str) -> Any:
    """A tqdm bar over `total` items (shown on a terminal only; transformers' switch disables it)."""
    return tqdm(total=total, desc=desc, unit="item", leave=False, disable=None)


def _model_type(model: torch.nn.Module) -> str:
    return str(getattr(getattr(model, "config", None), "model_type", "") or "")


def _text_kwargs(model: torch.nn.Module, tokenizer: Any) -> dict[str, Any]:
    """Tokenizer settings: truncate to the text tower's positions; SigLIP needs max_length padding."""
    text_config = getattr(getattr(model, "config", None), "text_config", None)
    limits = [
        getattr(text_config, "max_position_embeddings", None),
        getattr(tokenizer, "model_max_length", None),
    ]
    limits = [int(n) for n in limits if isinstance(n, int) and 0 < n < 1_000_000]
    max_length = min(limits) if limits else None
    padding: bool | str = "max_length" if _model_type(model).startswith("siglip") and max_length else True
    return {"padding": padding, "truncation": max_length is not None, "max_length": max_length}


def _rgb(image: Any) -> Any:
    return image if getattr(image, "mode", "RGB") == "RGB" else image.convert("RGB")


def _image_embedding(model: torch.nn.Module, pixels: torch.Tensor) -> torch.Tensor:
    """get_image_features for CLIP-like models; for vision towers the forward's projected `image_embeds`
    (CLIPVisionModelWithProjection) or `pooler_output` (CLIPVisionModel)."""
    if callable(getattr(model, "get_image_features", None)):
        return as_embeddings(model.get_image_features(pixel_values=pixels))
    output = model(pixel_values=pixels)
    projected = getattr(output, "image_embeds", None)
    return projected if isinstance(projected, torch.Tensor) else as_embeddings(output)


@torch.inference_mode()
def encode_images(
    model: torch.nn.Module, image_processor: Any, images: Sequence[Any], *, batch_size: int = 64
) -> torch.Tensor:
    """Embed PIL images (a list or a `datasets` column) in batches, on the model's device and dtype; returns
    float32 `[N, D]` on the CPU."""
    check_image_model(model)
    device, dtype = module_device(model), module_dtype(model)
    out = []
    with _progress(len(images), "embedding images") as bar:
        for start in range(0, len(images), batch_size):
            batch = [_rgb(im) for im in images[start : start + batch_size]]
            pixels = image_processor(images=batch, return_tensors="pt")["pixel_values"]
            out.append(_image_embedding(model, to_device(pixels, device, dtype)).float().cpu())
            bar.update(len(batch))
    if not out:
        raise ValueError("no images to embed")
    return torch.cat(out)


@torch.inference_mode()
def encode_texts(
    model: torch.nn.Module, tokenizer: Any, texts: Sequence[str], *, batch_size: int = 256
) -> torch.Tensor:
    """Embed strings in batches with `get_text_features`, on the model's device; returns float32 `[N, D]` on
    the CPU."""
    if not has_text_tower(model):
        raise TypeError(f"{type(model).__name__} has no get_text_features; text tasks need a CLIP-like model")
    if tokenizer is None:
        raise ValueError("text embedding needs a tokenizer")
    device, kwargs = module_device(model), _text_kwargs(model, tokenizer)
    out = []
    with _progress(len(texts), "embedding texts") as bar:
        for start in range(0, len(texts), batch_size):
            batch = list(texts[start : start + batch_size])
            enc = tokenizer(batch, return_tensors="pt", **kwargs)
            inputs = {k: enc[k] for k in ("input_ids", "attention_mask") if k in enc}
            out.append(as_embeddings(model.get_text_features(**to_device(inputs, device))).float().cpu())
            bar.update(len(batch))
    if not out:
        raise ValueError("no texts to embed")
    return torch.cat(out)


# -- the suite -------------------------------------------------------------------------------------


def _labels(dataset: Any) -> np.ndarray | None:
    if "label" not in dataset.column_names:
        return None
    labels = np.asarray(dataset["label"][:], dtype=np.int64)
    return None if (labels < 0).any() else labels


def captions_per_image(dataset: Any) -> list[list[str]]:
    """The captions of each image: the `caption` column holds one string, or a list of strings, per row."""
    out = []
    for i, value in enumerate(dataset["caption"][:]):
        captions = [value] if isinstance(value, str) else list(value)
        if not captions:
            raise ValueError(f"row {i} has no caption")
        out.append(captions)
    return out


def clip_benchmark_texts(captions: Sequence[Sequence[str]]) -> tuple[list[str], list[list[int]]]:
    """clip_benchmark's retrieval texts: every caption of every image in order, and per image the indices of
    its own captions (repeated strings stay separate entries, each belonging to its image)."""
    texts, mapping = [], []
    for image_captions in captions:
        mapping.append(list(range(len(texts), len(texts) + len(image_captions))))
        texts.extend(image_captions)
    return texts, mapping


def distinct_caption_texts(captions: Sequence[Sequence[str]]) -> tuple[list[str], list[list[int]]]:
    """The "hf_vrl" protocol's retrieval texts: the distinct strings of the first caption of each image, and
    per image the index of its caption (a class-prompt caption is shared by many images)."""
    index: dict[str, int] = {}
    mapping = [[index.setdefault(image_captions[0], len(index))] for image_captions in captions]
    return list(index), mapping


def mmvp_logits(
    model: torch.nn.Module,
    image_processor: Any,
    tokenizer: Any,
    pairs: Any,
    *,
    prefix: str = metrics.PROMPT_PREFIX,
    batch_size: int = 64,
) -> np.ndarray:
    """`[P, 2, 2]` cosine similarities of (statement_a, statement_b) x (image_a, image_b) per pair."""
    images_a = encode_images(model, image_processor, pairs["image_a"], batch_size=batch_size)
    images_b = encode_images(model, image_processor, pairs["image_b"], batch_size=batch_size)
    texts_a = encode_texts(
        model, tokenizer, [prefix + s for s in pairs["statement_a"]], batch_size=batch_size
    )
    texts_b = encode_texts(
        model, tokenizer, [prefix + s for s in pairs["statement_b"]], batch_size=batch_size
    )
    img = torch.nn.functional.normalize(torch.stack([images_a, images_b], dim=1), dim=-1)
    txt = torch.nn.functional.normalize(torch.stack([texts_a, texts_b], dim=1), dim=-1)
    return torch.einsum("psd,pid->psi", txt, img).numpy()


def evaluate_mmvp(
    model: torch.nn.Module,
    image_processor: Any,
    tokenizer: Any,
    pairs: Any,
    *,
    batch_size: int = 64,
    allow_partial: bool = False,
    **kwargs: Any,
) -> dict[str, Any]:
    """MMVP-VLM score on a pairs dataset or an official MMVP-VLM directory (see `hf_vrl.metrics.mmvp`; a
    directory of other than the 135 pairs is refused unless `allow_partial`)."""
    if isinstance(pairs, (str, Path)):
        pairs = metrics.load_mmvp_vlm(pairs, allow_partial=allow_partial)
    logits = mmvp_logits(model, image_processor, tokenizer, pairs, batch_size=batch_size, **kwargs)
    return metrics.mmvp_score(logits, pairs["category"][:])


def _check_tasks(tasks: Sequence[str]) -> list[str]:
    unknown = sorted(set(tasks) - set(TASKS))
    if unknown:
        raise UserError(f"unknown tasks {unknown}; choose from {list(TASKS)}")
    return list(dict.fromkeys(tasks))


def _check_protocol(protocol: str) -> str:
    if protocol not in PROTOCOLS:
        raise UserError(f"unknown protocol {protocol!r}; choose from {list(PROTOCOLS)}")
    return protocol


@dataclass(frozen=True)
class ZeroShotPrompts:
    """The prompt ensemble of a zero-shot run: templates, how they are filled, and where they come from."""

    templates: tuple[Any, ...]
    fill: Callable[[str, str], str]
    source: str  # "openai:<set>", "openai:imagenet (fallback)", "hf_vrl" or "custom"


def zero_shot_prompts(
    protocol: str = DEFAULT_PROTOCOL,
    dataset_name: str | None = None,
    templates: str | Sequence[Any] | None = None,
) -> ZeroShotPrompts:
    """The templates a zero-shot run uses: `templates` when given (a list, or the name of an OpenAI set such
    as "cifar10"), else the protocol's default: OpenAI's set for `dataset_name` (ImageNet's 80 when it has
    none) for "clip_benchmark", hf_vrl's 8 for "hf_vrl". "clip_benchmark" fills them verbatim (str.format),
    "hf_vrl" with `fill_template_with_article` ("a {}" -> "an {}" before a vowel)."""
    fill = (
        str.format
        if _check_protocol(protocol) == "clip_benchmark"
        else data_prompts.fill_template_with_article
    )
    if isinstance(templates, str):
        key = data_prompts.template_set_for(templates)
        if key is None:
            raise UserError(
                f"no template set named {templates!r}; choose from {', '.join(data_prompts.OPENAI_TEMPLATES)}"
            )
        return ZeroShotPrompts(
            data_prompts.ZERO_SHOT_SETS[key], fill, f"{data_prompts.template_source(key)}:{key}"
        )
    if templates is not None:
        if not templates:
            raise UserError("templates is empty; pass at least one prompt template or leave it unset")
        return ZeroShotPrompts(tuple(templates), fill, "custom")
    if protocol == "hf_vrl":
        return ZeroShotPrompts(data_prompts.ZERO_SHOT_TEMPLATES, fill, "hf_vrl")
    key = data_prompts.template_set_for(dataset_name)
    source = (
        f"{data_prompts.template_source(key)}:{key}"
        if key
        else f"openai:{data_prompts.DEFAULT_TEMPLATE_SET} (fallback)"
    )
    return ZeroShotPrompts(tuple(data_prompts.zero_shot_templates(dataset_name)), fill, source)


def mirror_templates(mirror: Any) -> ZeroShotPrompts:
    """A clip_benchmark mirror's own templates, filled as clip_benchmark fills them (`{c}`)."""
    filled = tuple(functools.partial(fill_mirror_template, t) for t in mirror.templates)
    return ZeroShotPrompts(filled, str.format, f"{mirror.where}/{TEMPLATES}")


def imagenet_classes(
    dataset_name: str | None, labels: np.ndarray | None, names: list[str] | None
) -> tuple[np.ndarray | None, list[str] | None, str, list[tuple[int, ...]] | None]:
    """(labels, class names, their source, projection) for zero-shot: OpenAI's curated names for
    ImageNet-family sets (`hf_vrl.data.benchmarks.openai_class_names`); ImageNet-R / -A labelled in ImageNet's
    1000 classes scored on their 200-class subset (labels renumbered); ObjectNet (class folders) scored on
    its 113 folders that map to ImageNet classes, each with the maximum logit of its ImageNet classes
    (`projection`; labels renumbered in sorted folder order, -1 for the other folders, not scored):
    WiSE-FT / FLYP's protocol. Otherwise the dataset's own."""
    member = data_prompts.imagenet_family(dataset_name)
    folders = {data_prompts._normalise(name): name for name in OBJECTNET_FOLDER_TO_IMAGENET}
    if member == "objectnet" and names and any(data_prompts._normalise(name) in folders for name in names):
        # alarm clock: alarm_clock
        names = [folders.get(data_prompts._normalise(name), name) for name in names]
        mapped = sorted(name for name in names if name in OBJECTNET_FOLDER_TO_IMAGENET)
        if labels is not None:
            position = np.array([mapped.index(n) if n in OBJECTNET_FOLDER_TO_IMAGENET else -1 for n in names])
            labels = position[labels]
        projection = [OBJECTNET_FOLDER_TO_IMAGENET[name] for name in mapped]
        return labels, list(IMAGENET_CLASSNAMES), "openai:objectnet", projection
    if member in data_prompts.IMAGENET_SUBSETS and names is not None and len(names) == 1000:
        keep = [IMAGENET_WNIDS.index(wnid) for wnid in data_prompts.imagenet_class_wnids(member)]
        if labels is not None:
            position = np.full(1000, -1, dtype=np.int64)
            position[keep] = np.arange(len(keep))
            labels = position[labels]
            if (labels < 0).any():
                raise UserError(f"{dataset_name}: labels outside the 200 classes {member} is scored on")
        return labels, data_prompts.imagenet_class_names(member), f"openai:{member}", None
    openai = openai_class_names(dataset_name, names)
    benchmark = _benchmark_names_source(dataset_name, names)
    if openai is None:
        return labels, names, benchmark or "dataset", None
    source = benchmark if member is None and benchmark else f"openai:{member or 'imagenet'}"
    return labels, openai, source, None


def _benchmark_names_source(dataset_name: str | None, names: list[str] | None) -> str | None:
    """The source of a benchmark's class names (`hf_vrl.data.benchmarks`: "openai:<set>" for the CLIP
    transfer sets, "flyp:iwildcam") when `names` are its labels; None for a user's own data."""
    benchmark = benchmark_of(dataset_name)
    if benchmark is None or names is None or list(benchmark.class_names or ()) != list(names):
        return None
    return f"{'openai' if 'OpenAI' in benchmark.class_names_source else 'flyp'}:{benchmark.templates}"


@dataclass
class _Run:
    """What every task needs: the model, its processors, the data and the test image embeddings."""

    model: torch.nn.Module
    image_processor: Any
    tokenizer: Any
    dataset: Any
    image: torch.Tensor
    labels: np.ndarray | None
    class_names: list[str] | None
    train_dataset: Any
    reference_model: torch.nn.Module | None
    prompts: ZeroShotPrompts
    protocol: str
    batch_size: int
    seed: int
    class_names_source: str = "dataset"
    probe_cs: Sequence[float] | None = None  # the probe's C values (None: CLIP's sweep, chosen on validation)
    zero_shot_labels: np.ndarray | None = None  # `labels` in the zero-shot classes (ImageNet-R / -A: 200)
    projection: list[tuple[int, ...]] | None = None  # per label, its classifier columns (ObjectNet)
    border: int = 0  # pixels cropped off every side of the set's images before preprocessing (ObjectNet)

    def texts(self, model: torch.nn.Module, texts: Sequence[str]) -> torch.Tensor:
        """Embeddings of `texts`, each distinct string embedded once (repeats get identical rows)."""
        distinct: dict[str, int] = {}
        rows = [distinct.setdefault(t, len(distinct)) for t in texts]
        embeddings = encode_texts(model, self.tokenizer, list(distinct), batch_size=self.batch_size)
        return embeddings[rows]

    def images(self, model: torch.nn.Module, dataset: Any) -> torch.Tensor:
        images = BorderCropped(dataset["image"], self.border) if self.border else dataset["image"]
        return encode_images(model, self.image_processor, images, batch_size=self.batch_size)


def _skip_reason(task: str, run: _Run) -> str | None:
    """Why `task` cannot run on these inputs (None when it can)."""
    if task in (*TEXT_TASKS, "mmvp") and not has_text_tower(run.model):
        return "the model has no text tower"
    if task in LABEL_TASKS and run.labels is None:
        return "the dataset has no class labels (column 'label' missing or -1)"
    if task == "zero_shot" and run.class_names is None:
        return "the 'label' column is not a ClassLabel with class names"
    if task == "linear_probe" and run.train_dataset is None:
        return "no train_dataset given"
    if task == "granularity" and "fine_label" not in run.dataset.column_names:
        return "the dataset has no 'fine_label' column"
    if task == "rsa" and run.reference_model is None:
        return "no reference_model given"
    return None


def _zs_labels(run: _Run) -> np.ndarray | None:
    return run.labels if run.zero_shot_labels is None else run.zero_shot_labels


def _zero_shot(run: _Run) -> dict[str, Any]:
    """CLIP prompt ensembling over `run.prompts` (see `zero_shot_prompts`), scored as the protocol says:
    clip_benchmark's torch computation (`hf_vrl.metrics.clip_benchmark`) or hf_vrl's (ties in expectation)."""
    prompts = run.prompts
    labels, image = _zs_labels(run), run.image
    scored = labels >= 0  # ObjectNet's unmapped folders are not scored
    labels, image = labels[scored], image[torch.from_numpy(scored)]
    n_classes = len(run.class_names) if run.projection is None else len(run.projection)
    topk = [k for k in (1, 5) if k <= n_classes]
    if run.protocol == "clip_benchmark":
        filled = [
            [metrics.fill_prompt(t, name, prompts.fill) for t in prompts.templates]
            for name in run.class_names
        ]
        flat = run.texts(run.model, [p for class_prompts in filled for p in class_prompts])
        blocks = torch.split(flat, [len(class_prompts) for class_prompts in filled])
        classifier = metrics.cb_zero_shot_classifier(blocks)
        scores = metrics.cb_zero_shot_accuracy(image, classifier, labels, topk, projection=run.projection)
    else:
        if run.projection is not None:
            raise UserError("ObjectNet's projection onto ImageNet classes needs protocol clip_benchmark")
        classifier = metrics.zero_shot_classifier(
            lambda t: run.texts(run.model, t), run.class_names, prompts.templates, fill=prompts.fill
        )
        scores = metrics.zero_shot_accuracy(image, classifier, labels, topk)
    out = {
        **scores,
        "n_templates": len(prompts.templates),
        "templates": prompts.source,
        "class_names": run.class_names_source,
        "protocol": run.protocol,
    }
    if not scored.all():
        out["n_scored"] = int(scored.sum())
    return out


def _retrieval(run: _Run) -> dict[str, Any]:
    """Image<->text recall@K over the protocol's texts (module docstring)."""
    captions = captions_per_image(run.dataset)
    group = clip_benchmark_texts if run.protocol == "clip_benchmark" else distinct_caption_texts
    texts, mapping = group(captions)
    n = min(len(texts), len(run.dataset))
    ks = [k for k in RECALL_KS if k <= n]
    embedded = run.texts(run.model, texts)
    if run.protocol == "clip_benchmark":
        owner = [image for image, own in enumerate(mapping) for _ in own]
        recall = metrics.cb_retrieval_recall(run.image, embedded, owner, ks, batch_size=run.batch_size)
    else:
        recall = metrics.retrieval_recall(run.image, embedded, ks, mapping)
    out = {**recall, "n_texts": len(texts), "protocol": run.protocol}
    if len(ks) < len(RECALL_KS):  # R@K is every query's hit when K reaches the candidates: not reported
        left_out = ", ".join(f"R@{k}" for k in RECALL_KS if k not in ks)
        out["not_reported"] = (
            f"{left_out}: {len(run.dataset)} images and {len(texts)} texts (K must not exceed them)"
        )
    return out


def _clustering(run: _Run) -> dict[str, Any]:
    return metrics.clustering_scores(run.image, run.labels, seed=run.seed)


def _linear_probe(run: _Run) -> dict[str, Any]:
    train_labels = _labels(run.train_dataset)
    if train_labels is None:
        raise ValueError("train_dataset needs class labels >= 0 in a 'label' column for the linear probe")
    train = run.images(run.model, run.train_dataset)
    cs = metrics.DEFAULT_CS if run.probe_cs is None else run.probe_cs
    return metrics.linear_probe(train, train_labels, run.image, run.labels, Cs=cs, seed=run.seed)


def _granularity(run: _Run) -> dict[str, Any]:
    fine = np.asarray(run.dataset["fine_label"][:], dtype=np.int64)
    return metrics.granularity_scores(torch.nn.functional.normalize(run.image, dim=-1), fine, run.labels)


def _rsa(run: _Run) -> dict[str, float]:
    """DiVE's RSA of image (and, for two CLIP-like models, caption) embeddings: reference (a) vs model (b)."""
    reference = run.reference_model.eval()
    out = {"image": metrics.rsa_score(run.images(reference, run.dataset), run.image)}
    if has_text_tower(run.model) and has_text_tower(reference):
        captions = [c[0] for c in captions_per_image(run.dataset)]
        out["text"] = metrics.rsa_score(run.texts(reference, captions), run.texts(run.model, captions))
    return out


def _mmvp(run: _Run, mmvp: Any) -> dict[str, Any]:
    return evaluate_mmvp(run.model, run.image_processor, run.tokenizer, mmvp, batch_size=run.batch_size)


_TASK_FNS = {
    "zero_shot": _zero_shot,
    "retrieval": _retrieval,
    "clustering": _clustering,
    "linear_probe": _linear_probe,
    "granularity": _granularity,
    "rsa": _rsa,
}


def headline(result: Mapping[str, Any]) -> str:
    """The float entries of a task result, for the progress log."""
    return ", ".join(f"{k} {v:.4g}" for k, v in result.items() if isinstance(v, float)) or "done"


def _run_tasks(
    run: _Run,
    tasks: list[str],
    mmvp: Any,
    on_task_end: Callable[[dict[str, Any]], None] | None,
    data: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The report: sizes, one entry per task that can run (with `data`, the record of the data it was
    measured on, when given), MMVP, and `skipped` {task: reason}; logs each task and hands the report so far
    to `on_task_end` after each."""
    report: dict[str, Any] = {"n_samples": len(run.dataset), "embedding_dim": int(run.image.shape[1])}
    report["tasks"] = tasks
    report["n_classes"] = None if run.labels is None else int(np.unique(run.labels).size)
    if run.border:
        report["border_crop"] = run.border  # ObjectNet's images, as FLYP / WiSE-FT score them
    report["skipped"] = skipped = {}
    jobs = [(task, _TASK_FNS[task]) for task in tasks]
    if mmvp is not None:
        jobs.append(("mmvp", lambda run: _mmvp(run, mmvp)))
    for number, (task, fn) in enumerate(jobs, start=1):
        reason = _skip_reason(task, run)
        if reason:
            logger.warning("[%d/%d] skipping %s: %s", number, len(jobs), task, reason)
            skipped[task] = reason
            continue
        logger.info("[%d/%d] %s ...", number, len(jobs), task)
        started = time.perf_counter()
        report[task] = fn(run)
        if data is not None and task != "mmvp":
            report[task]["data"] = dict(data)
        logger.info(
            "[%d/%d] %s: %s (%.1f s)",
            number,
            len(jobs),
            task,
            headline(report[task]),
            time.perf_counter() - started,
        )
        if on_task_end is not None:
            on_task_end(report)
    return report


def evaluate_clip(
    model: torch.nn.Module,
    image_processor: Any,
    tokenizer: Any,
    dataset: Any,
    *,
    tasks: Sequence[str] = DEFAULT_TASKS,
    train_dataset: Any = None,
    mmvp: Any = None,
    reference_model: torch.nn.Module | None = None,
    templates: str | Sequence[Any] | None = None,
    protocol: str = DEFAULT_PROTOCOL,
    dataset_name: str | None = None,
    batch_size: int = 64,
    device: str | torch.device | None = None,
    seed: int = 0,
    probe_cs: Sequence[float] | None = None,
    objectnet_border: int = OBJECTNET_BORDER,
    return_embeddings: bool = False,
    on_task_end: Callable[[dict[str, Any]], None] | None = None,
    data: Mapping[str, Any] | None = None,
    mirror: Any = None,
) -> dict[str, Any] | tuple[dict[str, Any], dict[str, Any]]:
    """Run the metric suite on `dataset` (columns image, caption, label; optional fine_label) and return a
    JSON-able report: one sub-dict per task, plus `skipped` {task: reason} for tasks the inputs do not allow.

    `tasks` from TASKS: zero_shot and retrieval (by `protocol`, module docstring; zero-shot templates from
    `templates`, a list or an OpenAI set name, else the set of `dataset_name`, by default the dataset's
    `info.dataset_name`), clustering, linear_probe (needs `train_dataset`; C chosen from `probe_cs`, default
    CLIP's sweep, on a validation split unless one is given), granularity (CLUE §3.1, needs `fine_label`),
    rsa (against `reference_model`, DiVE App. D, which moves to the model's device). `mmvp`
    (a pairs dataset or an MMVP-VLM directory) adds the MMVP score. Image metrics use L2-normalised embeddings
    except the linear probe, which sees raw features as in CLIP. Inputs go to the model's device and dtype
    (`device` moves the model first). `on_task_end(report)` is called after each task with the report so far.
    `data` (`data_record` of `dataset`) is recorded in each task's section as `"data"`. `mirror` (a
    `hf_vrl.data.clip_benchmark.WdsMirror`, `mirror_prompts`): the data are in clip_benchmark's layout, and
    zero-shot prompts its own class names with its own templates (unless `templates` is given).
    ObjectNet's images lose `objectnet_border` pixels on every side (`scored_images`; the report's
    `border_crop`).
    With `return_embeddings`, also returns {"image", "labels", "class_names"} for figures.
    """
    tasks = _check_tasks(tasks)
    check_image_model(model)
    dataset_name = benchmark_name(
        dataset_name or getattr(getattr(dataset, "info", None), "dataset_name", None)
    )
    prompts = zero_shot_prompts(protocol, dataset_name, templates)
    if mirror is not None and mirror.templates and templates is None and protocol == "clip_benchmark":
        prompts = mirror_templates(mirror)
    if device is not None:
        model.to(device)
    if reference_model is not None:
        reference_model.to(module_device(model))  # a frozen companion moves with the model it serves
    was_training = model.training
    model.eval()
    try:
        logger.info("embedding %d images", len(dataset))
        images = scored_images(dataset["image"], dataset_name, objectnet_border)
        border = images.pixels if isinstance(images, BorderCropped) else 0
        image = encode_images(model, image_processor, images, batch_size=batch_size)
        labels = _labels(dataset)
        zero_shot_labels, class_names, names_source, projection = imagenet_classes(
            dataset_name, labels, class_names_of(dataset)
        )
        if mirror is not None and mirror.class_names:  # the mirror's own names, in its own order
            zero_shot_labels, projection = None, None
            class_names, names_source = list(mirror.class_names), f"{mirror.where}/classnames.txt"
        run = _Run(
            model=model,
            image_processor=image_processor,
            tokenizer=tokenizer,
            dataset=dataset,
            image=image,
            labels=labels,
            class_names=class_names,
            class_names_source=names_source,
            zero_shot_labels=zero_shot_labels,
            projection=projection,
            train_dataset=train_dataset,
            reference_model=reference_model,
            prompts=prompts,
            protocol=protocol,
            batch_size=batch_size,
            seed=seed,
            probe_cs=probe_cs,
            border=border,
        )
        report = _run_tasks(run, tasks, mmvp, on_task_end, data)
    finally:
        model.train(was_training)
    if return_embeddings:
        return report, {"image": run.image.numpy(), "labels": run.labels, "class_names": run.class_names}
    return report


# -- reports as text ------------------------------------------------------------------------------


def report_percent(report: Mapping[str, Any], path: tuple[str, str]) -> str:
    """`report[task][metric]` (a fraction) as a percent with one decimal, "-" where the report lacks it."""
    value = report.get(path[0], {}).get(path[1])
    return "-" if value is None else f"{100 * value:.1f}"


def scored_images(images: Sequence[Any], dataset_name: str | None, objectnet_border: int = OBJECTNET_BORDER):
    """The images set `dataset_name` is scored on: ObjectNet's without `objectnet_border` pixels on every
    side (FLYP / WiSE-FT's crop, `hf_vrl.data.imagenet.border_crop`), any other set's as read. The one place
    the crop is applied: `evaluate_clip` (hf-vrl eval, the reproduce scripts) and DiVE's `classify`."""
    if imagenet_family(dataset_name) == "objectnet" and objectnet_border > 0:
        return BorderCropped(images, objectnet_border)
    return images


def text_table(rows: Sequence[Sequence[str]], left_columns: int = 0) -> str:
    """Rows of cells as aligned text: the first `left_columns` columns left-justified, the rest right."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(
            cell.ljust(w) if i < left_columns else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths))
        )
        for row in rows
    )
