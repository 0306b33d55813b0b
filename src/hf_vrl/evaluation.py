"""`evaluate_clip()`: the metric suite for any CLIP-like model or vision tower, and the `hf-vrl eval` command.

A model qualifies when it exposes `get_image_features(pixel_values=...)` (and, for the text tasks,
`get_text_features(input_ids=..., attention_mask=...)`), as transformers' CLIPModel / SiglipModel and this
library's models do, or when it is a bare vision tower whose forward returns `pooler_output`
(CLIPVisionModel); vision towers get the vision-only tasks. Metrics live in `hf_vrl.metrics`; this module
extracts embeddings and assembles the report.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hf_vrl import metrics
from hf_vrl.contrastive import as_embeddings

logger = logging.getLogger(__name__)

TASKS = ("zero_shot", "retrieval", "clustering", "linear_probe", "granularity", "rsa")
DEFAULT_TASKS = ("zero_shot", "retrieval", "clustering", "linear_probe")
TEXT_TASKS = ("zero_shot", "retrieval")
LABEL_TASKS = ("zero_shot", "clustering", "linear_probe", "granularity")


# -- embedding extraction --------------------------------------------------------------------------


def has_text_tower(model: torch.nn.Module) -> bool:
    """Whether the model embeds text (CLIP-like) rather than being a bare vision tower."""
    return callable(getattr(model, "get_text_features", None))


def _model_type(model: torch.nn.Module) -> str:
    return str(getattr(getattr(model, "config", None), "model_type", "") or "")


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


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
    """Embed PIL images (a list or a `datasets` column) in batches; returns float32 `[N, D]` on CPU."""
    device, dtype = _device(model), next(model.parameters()).dtype
    out = []
    for start in range(0, len(images), batch_size):
        batch = [_rgb(im) for im in images[start : start + batch_size]]
        pixels = image_processor(images=batch, return_tensors="pt")["pixel_values"].to(device, dtype)
        out.append(_image_embedding(model, pixels).float().cpu())
    if not out:
        raise ValueError("no images to embed")
    return torch.cat(out)


@torch.inference_mode()
def encode_texts(
    model: torch.nn.Module, tokenizer: Any, texts: Sequence[str], *, batch_size: int = 256
) -> torch.Tensor:
    """Embed strings in batches with `get_text_features`; returns float32 `[N, D]` on CPU."""
    if not has_text_tower(model):
        raise TypeError(f"{type(model).__name__} has no get_text_features; text tasks need a CLIP-like model")
    if tokenizer is None:
        raise ValueError("text embedding needs a tokenizer")
    device, kwargs = _device(model), _text_kwargs(model, tokenizer)
    out = []
    for start in range(0, len(texts), batch_size):
        enc = tokenizer(list(texts[start : start + batch_size]), return_tensors="pt", **kwargs)
        inputs = {k: enc[k].to(device) for k in ("input_ids", "attention_mask") if k in enc}
        out.append(as_embeddings(model.get_text_features(**inputs)).float().cpu())
    if not out:
        raise ValueError("no texts to embed")
    return torch.cat(out)


# -- the suite -------------------------------------------------------------------------------------


def _labels(dataset: Any) -> np.ndarray | None:
    if "label" not in dataset.column_names:
        return None
    labels = np.asarray(dataset["label"][:], dtype=np.int64)
    return None if (labels < 0).any() else labels


def _caption_map(captions: Sequence[str]) -> tuple[list[str], list[list[int]]]:
    """Unique captions and, per image, the index of its caption (class-prompt captions repeat)."""
    index: dict[str, int] = {}
    mapping = [[index.setdefault(c, len(index))] for c in captions]
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
    **kwargs: Any,
) -> dict[str, Any]:
    """MMVP-VLM score on a pairs dataset or an official MMVP-VLM directory (see `hf_vrl.metrics.mmvp`)."""
    if isinstance(pairs, (str, Path)):
        pairs = metrics.load_mmvp_vlm(pairs)
    logits = mmvp_logits(model, image_processor, tokenizer, pairs, batch_size=batch_size, **kwargs)
    return metrics.mmvp_score(logits, pairs["category"][:])


def _check_tasks(tasks: Sequence[str]) -> list[str]:
    unknown = sorted(set(tasks) - set(TASKS))
    if unknown:
        raise ValueError(f"unknown tasks {unknown}; choose from {list(TASKS)}")
    return list(dict.fromkeys(tasks))


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
    templates: Sequence[Any] | None
    batch_size: int
    seed: int

    def texts(self, model: torch.nn.Module, texts: Sequence[str]) -> torch.Tensor:
        return encode_texts(model, self.tokenizer, texts, batch_size=self.batch_size)

    def images(self, model: torch.nn.Module, dataset: Any) -> torch.Tensor:
        return encode_images(model, self.image_processor, dataset["image"], batch_size=self.batch_size)


def _skip_reason(task: str, run: _Run) -> str | None:
    """Why `task` cannot run on these inputs (None when it can)."""
    if task in TEXT_TASKS and not has_text_tower(run.model):
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


def _zero_shot(run: _Run) -> dict[str, Any]:
    """CLIP prompt ensembling; string templates are filled by `hf_vrl.data.prompts.fill_template`."""
    from hf_vrl.data.prompts import ZERO_SHOT_TEMPLATES, fill_template

    templates = ZERO_SHOT_TEMPLATES if run.templates is None else run.templates
    classifier = metrics.zero_shot_classifier(
        lambda t: run.texts(run.model, t), run.class_names, templates, fill=fill_template
    )
    topk = [k for k in (1, 5) if k <= len(run.class_names)]
    return {
        **metrics.zero_shot_accuracy(run.image, classifier, run.labels, topk),
        "n_templates": len(templates),
    }


def _retrieval(run: _Run) -> dict[str, Any]:
    texts, mapping = _caption_map(run.dataset["caption"][:])
    ks = [k for k in (1, 5, 10) if k <= min(len(texts), len(run.dataset))]
    recall = metrics.retrieval_recall(run.image, run.texts(run.model, texts), ks, mapping)
    return {**recall, "n_texts": len(texts)}


def _clustering(run: _Run) -> dict[str, Any]:
    return metrics.clustering_scores(run.image, run.labels, seed=run.seed)


def _linear_probe(run: _Run) -> dict[str, Any]:
    train_labels = _labels(run.train_dataset)
    if train_labels is None:
        raise ValueError("train_dataset needs class labels >= 0 in a 'label' column for the linear probe")
    train = run.images(run.model, run.train_dataset)
    return metrics.linear_probe(train, train_labels, run.image, run.labels, seed=run.seed)


def _granularity(run: _Run) -> dict[str, Any]:
    fine = np.asarray(run.dataset["fine_label"][:], dtype=np.int64)
    return metrics.granularity_scores(torch.nn.functional.normalize(run.image, dim=-1), fine, run.labels)


def _rsa(run: _Run) -> dict[str, float]:
    """DiVE's RSA of image (and, for two CLIP-like models, caption) embeddings: reference (a) vs model (b)."""
    reference = run.reference_model.eval()
    out = {"image": metrics.rsa_score(run.images(reference, run.dataset), run.image)}
    if has_text_tower(run.model) and has_text_tower(reference):
        captions = run.dataset["caption"][:]
        out["text"] = metrics.rsa_score(run.texts(reference, captions), run.texts(run.model, captions))
    return out


_TASK_FNS = {
    "zero_shot": _zero_shot,
    "retrieval": _retrieval,
    "clustering": _clustering,
    "linear_probe": _linear_probe,
    "granularity": _granularity,
    "rsa": _rsa,
}


def _run_tasks(run: _Run, tasks: list[str], mmvp: Any) -> dict[str, Any]:
    """The report: sizes, one entry per task that can run, MMVP, and `skipped` {task: reason}."""
    report: dict[str, Any] = {"n_samples": len(run.dataset), "embedding_dim": int(run.image.shape[1])}
    report["tasks"] = tasks
    report["n_classes"] = None if run.labels is None else int(np.unique(run.labels).size)
    skipped: dict[str, str] = {}
    for task in tasks:
        reason = _skip_reason(task, run)
        if reason:
            logger.warning("skipping %s: %s", task, reason)
            skipped[task] = reason
        else:
            report[task] = _TASK_FNS[task](run)
    if mmvp is not None:
        if has_text_tower(run.model):
            report["mmvp"] = evaluate_mmvp(
                run.model, run.image_processor, run.tokenizer, mmvp, batch_size=run.batch_size
            )
        else:
            skipped["mmvp"] = "the model has no text tower"
    report["skipped"] = skipped
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
    templates: Sequence[Any] | None = None,
    batch_size: int = 64,
    device: str | torch.device | None = None,
    seed: int = 0,
    return_embeddings: bool = False,
) -> dict[str, Any] | tuple[dict[str, Any], dict[str, Any]]:
    """Run the metric suite on `dataset` (columns image, caption, label; optional fine_label) and return a
    JSON-able report: one sub-dict per task, plus `skipped` {task: reason} for tasks the inputs do not allow.

    `tasks` from TASKS: zero_shot (prompt ensemble over `templates`, default `hf_vrl.data.prompts`),
    retrieval (captions as texts; repeated captions are merged), clustering, linear_probe (needs
    `train_dataset`), granularity (CLUE §3.1, needs `fine_label`), rsa (against `reference_model`, DiVE
    App. D). `mmvp` (a pairs dataset or an MMVP-VLM directory) adds the MMVP score. Image metrics use
    L2-normalised embeddings except the linear probe, which sees raw features as in CLIP. With
    `return_embeddings`, also returns {"image", "labels", "class_names"} for figures.
    """
    from hf_vrl.data.schema import class_names_of

    tasks = _check_tasks(tasks)
    for m in (model, reference_model):
        if m is not None and device is not None:
            m.to(device)
    was_training = model.training
    model.eval()
    try:
        image = encode_images(model, image_processor, dataset["image"], batch_size=batch_size)
        run = _Run(
            model=model,
            image_processor=image_processor,
            tokenizer=tokenizer,
            dataset=dataset,
            image=image,
            labels=_labels(dataset),
            class_names=class_names_of(dataset),
            train_dataset=train_dataset,
            reference_model=reference_model,
            templates=templates,
            batch_size=batch_size,
            seed=seed,
        )
        report = _run_tasks(run, tasks, mmvp)
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


# -- the `hf-vrl eval` command ---------------------------------------------------------------------


def _resolve_model_path(name: str) -> str:
    """A local path or hub id as given; a name of a folder in `hub_configs/` (e.g. tiny-clip) maps there."""
    if Path(name).exists():
        return name
    from hf_vrl.presets import HUB_CONFIGS

    preset = HUB_CONFIGS / name
    return str(preset) if preset.is_dir() else name


def load_model_and_processors(name: str, *, trust_remote_code: bool = False) -> tuple[Any, Any, Any]:
    """(model, image_processor, tokenizer) from a local dir or hub id; tokenizer is None for vision towers.
    hf_vrl's own model types (DiffCLIP, DCR) load with the installed classes, without remote code."""
    from transformers import AutoImageProcessor, AutoModel, AutoProcessor, AutoTokenizer, ImageProcessingMixin

    import hf_vrl.models  # noqa: F401  (registers hf_vrl's classes with the Auto classes)

    path = _resolve_model_path(name)
    model = AutoModel.from_pretrained(path, trust_remote_code=trust_remote_code)
    try:
        processor = AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError):
        processor = None
    image_processor = getattr(processor, "image_processor", None)
    if image_processor is None and isinstance(processor, ImageProcessingMixin):
        image_processor = processor
    if image_processor is None:
        image_processor = AutoImageProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)
    tokenizer = getattr(processor, "tokenizer", None)
    if tokenizer is None and has_text_tower(model):
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    return model, image_processor, tokenizer


def load_eval_dataset(
    name: str, *, split: str, limit: int | None = None, image_size: int | None = None, seed: int = 0
):
    """A map-style dataset from the `hf_vrl.data` registry (imported here: the metrics stay independent of
    it). Streamed sources (webdataset, parquet, csv) are materialised, which needs a `limit`."""
    import datasets

    from hf_vrl.data.registry import load_dataset_by_name

    ds = load_dataset_by_name(name, split=split, limit=limit, image_size=image_size, seed=seed)
    if isinstance(ds, datasets.IterableDataset):
        if limit is None:
            raise ValueError(f"{name!r} streams; pass --limit to evaluate a fixed number of its samples")
        ds = datasets.Dataset.from_list(list(ds), features=ds.features)
    return ds


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-vrl eval",
        description="Evaluate a CLIP-like model (CLIPModel, SiglipModel, DiffCLIP, ...) or a vision tower: "
        "zero-shot classification, retrieval, clustering, linear probe, CLUE granularity metrics "
        "(CDNV, NCC), RSA against a reference model and MMVP-VLM. Writes report.json and PNG figures.",
        epilog="example: hf-vrl eval --model tiny-clip --dataset digits --limit 500 --output-dir runs/eval",
    )
    parser.add_argument("--model", required=True, help="local model directory, hub_configs preset or hub id")
    parser.add_argument(
        "--trust-remote-code", action="store_true", help="allow custom model code from the model dir"
    )
    parser.add_argument(
        "--dataset",
        help="registry name or path: shapes, digits, fashion_mnist, animal_mnist, cub:<root>, "
        "imagefolder:<dir>, hf:<name>, webdataset:<glob> (see hf_vrl.data.registry)",
    )
    parser.add_argument("--split", default="test", help="split to evaluate on (default: test)")
    parser.add_argument(
        "--train-split", default="train", help="split the linear probe trains on (default: train)"
    )
    parser.add_argument("--limit", type=int, help="use at most this many evaluation samples")
    parser.add_argument("--train-limit", type=int, help="use at most this many linear-probe training samples")
    parser.add_argument("--image-size", type=int, help="resize images to this size when loading the dataset")
    parser.add_argument(
        "--tasks",
        nargs="+",
        default=list(DEFAULT_TASKS),
        choices=TASKS,
        metavar="TASK",
        help=f"tasks to run, from {', '.join(TASKS)} (default: {' '.join(DEFAULT_TASKS)})",
    )
    parser.add_argument(
        "--reference-model", help="model to compare against for the rsa task (e.g. the pre-trained)"
    )
    parser.add_argument(
        "--mmvp-dir", help="MMVP-VLM folder (Questions.csv + 'MLLM_VLM Images/') to score as well"
    )
    parser.add_argument("--output-dir", required=True, help="folder for report.json and the figures")
    parser.add_argument("--batch-size", type=int, default=64, help="embedding batch size (default: 64)")
    parser.add_argument("--device", help="torch device (default: cuda when available, else cpu)")
    parser.add_argument(
        "--seed", type=int, default=0, help="seed for subsets, k-means and the probe split (default: 0)"
    )
    parser.add_argument(
        "--scatter", choices=("pca", "tsne"), default="pca", help="2-D projection of the scatter"
    )
    parser.add_argument("--no-figures", action="store_true", help="write report.json only")
    return parser


def _write_figures(args, report: dict[str, Any], embeddings: dict[str, Any] | None, out: Path) -> list[str]:
    from hf_vrl import viz

    written = []
    if embeddings is not None:
        path = out / f"embeddings_{args.scatter}.png"
        viz.plot_embedding_scatter(
            embeddings["image"],
            embeddings["labels"],
            class_names=embeddings["class_names"],
            method=args.scatter,
            title=f"{Path(args.model).name} on {args.dataset}/{args.split}",
            path=path,
            seed=args.seed,
        )
        written.append(path.name)
    if "mmvp" in report:
        path = out / "mmvp.png"
        viz.plot_mmvp_categories(report["mmvp"], title=f"MMVP: {Path(args.model).name}", path=path)
        written.append(path.name)
    return written


def main(argv: list[str] | None = None) -> int:
    """`hf-vrl eval`: evaluate a model and write report.json (+ figures) to --output-dir."""
    args = _build_parser().parse_args(argv)
    if args.dataset is None and args.mmvp_dir is None:
        _build_parser().error("give --dataset, --mmvp-dir or both")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    remote = args.trust_remote_code
    model, image_processor, tokenizer = load_model_and_processors(args.model, trust_remote_code=remote)
    reference = None
    if "rsa" in args.tasks and args.reference_model:
        reference, _, _ = load_model_and_processors(args.reference_model, trust_remote_code=remote)
    model.to(device).eval()
    report: dict[str, Any] = {
        "model": args.model,
        "dataset": args.dataset,
        "split": args.split,
        "limit": args.limit,
        "seed": args.seed,
    }
    embeddings = None
    if args.dataset is not None:
        data = {"image_size": args.image_size, "seed": args.seed}
        dataset = load_eval_dataset(args.dataset, split=args.split, limit=args.limit, **data)
        train = None
        if "linear_probe" in args.tasks:
            train = load_eval_dataset(args.dataset, split=args.train_split, limit=args.train_limit, **data)
        result, embeddings = evaluate_clip(
            model,
            image_processor,
            tokenizer,
            dataset,
            tasks=args.tasks,
            train_dataset=train,
            mmvp=args.mmvp_dir,
            reference_model=reference,
            batch_size=args.batch_size,
            device=device,
            seed=args.seed,
            return_embeddings=True,
        )
        report.update(result)
    else:
        report["mmvp"] = evaluate_mmvp(
            model, image_processor, tokenizer, args.mmvp_dir, batch_size=args.batch_size
        )
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if not args.no_figures:
        report["figures"] = _write_figures(args, report, embeddings, out)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if isinstance(v, dict)}, indent=2))
    print(f"wrote {out / 'report.json'}")
    return 0
