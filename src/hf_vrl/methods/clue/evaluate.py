"""CLUE's evaluation (§5.1.2, §3.1, Fig. 6): linear probe top-1 and image retrieval Rank-1/5 on the fine
labels, the granularity metrics (CDNV within each coarse class, NCC fine / coarse; on the training split by
default, as the paper's §3) and the part-cluster response maps.

Features are the online backbone's global feature h (`CLUEModel.get_image_features`), embedded with
`hf_vrl.evaluation.encode_images` (which moves the images to the model's device and dtype). Retrieval follows
the usual fine-grained protocol: every test image queries the other test images by cosine similarity and a
query scores at K when an image of its class is among its K nearest (ties count against it, as in
`hf_vrl.metrics`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hf_vrl import metrics
from hf_vrl.devices import module_device, module_dtype
from hf_vrl.evaluation import encode_images
from hf_vrl.metrics._common import as_labels, as_matrix, l2_normalize

__all__ = [
    "TASKS",
    "display_images",
    "evaluate_clue",
    "eval_label_column",
    "image_retrieval",
    "part_maps",
    "pixels_of",
    "plot_part_maps",
]

TASKS = ("linear_probe", "retrieval", "granularity")
FINE, COARSE = "fine_label", "label"


def image_retrieval(embeddings: Any, labels: Any, ks: Sequence[int] = (1, 5)) -> dict[str, float]:
    """Rank-K accuracy of image-to-image retrieval: {"i2i_R@1", "i2i_R@5"} (each image against all others)."""
    x = l2_normalize(as_matrix(embeddings))
    y = as_labels(labels, n=x.shape[0])
    if x.shape[0] < 2:
        raise ValueError("retrieval needs at least two images")
    sim = x @ x.T
    np.fill_diagonal(sim, -np.inf)  # a query never retrieves itself
    same = (y[:, None] == y[None, :]) & ~np.eye(y.size, dtype=bool)
    best = np.where(same, sim, -np.inf).max(axis=1, keepdims=True)
    ranks = ((sim >= best) & ~same).sum(axis=1)  # other-class images at least as close as the nearest match
    ranks = np.where(np.isfinite(best[:, 0]), ranks, np.iinfo(np.int64).max)  # a class of one: no match
    return {f"i2i_R@{k}": float((ranks < k).mean()) for k in ks}


def _labels(dataset: Any, column: str) -> np.ndarray:
    if column not in dataset.column_names:
        raise ValueError(f"the evaluation data has no {column!r} column")
    return np.asarray(dataset[column], dtype=np.int64)


def eval_label_column(dataset: Any, label_column: str | None = None) -> str:
    """The label the probe and retrieval recognise: `label_column`, else `fine_label` where present, else
    `label`."""
    return label_column or (FINE if FINE in dataset.column_names else COARSE)


def evaluate_clue(
    model: torch.nn.Module,
    image_processor: Any,
    test_dataset: Any,
    train_dataset: Any = None,
    *,
    tasks: Sequence[str] = TASKS,
    label_column: str | None = None,
    batch_size: int = 64,
    seed: int = 0,
    probe_cs: Sequence[float] = metrics.DEFAULT_CS,
    granularity_split: str = "train",
    data: dict[str, Any] | None = None,
    train_data: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """{"linear_probe": {"top1", "C"}, "retrieval": {"i2i_R@1", "i2i_R@5"}, "granularity": {...}, "skipped"}.

    `label_column` (default: `fine_label` when present, else `label`) is what the probe and retrieval
    recognise. Granularity (§3.1: CDNV within each coarse class, NCC fine / coarse) needs both `fine_label`
    and the coarse `label` and measures `granularity_split`: "train" (the paper's §3: `train_dataset`) or
    "test". The probe trains on `train_dataset`; what needs it is skipped without one. `data` / `train_data`
    (`hf_vrl.eval_inputs.data_record`s of the two sets) go into each section as "data": the probe and
    retrieval score the test rows, granularity the rows of its split.
    """
    if granularity_split not in ("train", "test"):
        raise ValueError(f"granularity_split must be 'train' or 'test', got {granularity_split!r}")
    unknown = sorted(set(tasks) - set(TASKS))
    if unknown:
        raise ValueError(f"unknown tasks {unknown}; choose from {TASKS}")
    label_column = eval_label_column(test_dataset, label_column)
    was_training = model.training
    model.eval()
    try:
        test = encode_images(model, image_processor, test_dataset["image"], batch_size=batch_size)
        report: dict[str, Any] = {"n_test": len(test_dataset), "label_column": label_column, "skipped": {}}
        y = _labels(test_dataset, label_column)
        needs_train = "linear_probe" in tasks or ("granularity" in tasks and granularity_split == "train")
        train = None
        if needs_train and train_dataset is not None:
            train = encode_images(model, image_processor, train_dataset["image"], batch_size=batch_size)
        if "linear_probe" in tasks:
            if train is None:
                report["skipped"]["linear_probe"] = "no train_dataset given"
            else:
                probe = metrics.linear_probe(
                    train, _labels(train_dataset, label_column), test, y, seed=seed, Cs=probe_cs
                )
                report["linear_probe"] = {"top1": probe["accuracy"], "C": probe["C"]}
        if "retrieval" in tasks:
            report["retrieval"] = image_retrieval(test, y)
        if "granularity" in tasks:
            measured, rows = (train, train_dataset) if granularity_split == "train" else (test, test_dataset)
            if measured is None:
                report["skipped"]["granularity"] = "granularity_split 'train' needs train_dataset"
            elif FINE in rows.column_names and COARSE in rows.column_names:
                features = torch.nn.functional.normalize(measured, dim=-1)
                report["granularity"] = metrics.granularity_scores(
                    features, _labels(rows, FINE), _labels(rows, COARSE)
                )
                report["granularity_split"] = granularity_split
            else:
                report["skipped"]["granularity"] = "needs fine_label and label (coarse) columns"
    finally:
        model.train(was_training)
    scored = {"linear_probe": data, "retrieval": data}
    scored["granularity"] = train_data if granularity_split == "train" else data
    for section, record in scored.items():
        if record is not None and section in report:
            recognised = section != "granularity" and label_column != COARSE
            report[section]["data"] = {**record, **({"labels": label_column} if recognised else {})}
    return report


def pixels_of(image_processor: Any, images: Sequence[Any]) -> torch.Tensor:
    """PIL images as the model sees them: `[N, 3, H, W]` pixel values from `image_processor`."""
    return image_processor(images=[im.convert("RGB") for im in images], return_tensors="pt")["pixel_values"]


def display_images(image_processor: Any, pixels: torch.Tensor) -> np.ndarray:
    """`pixels_of`'s output de-normalised for display: `[N, H, W, 3]` in [0, 1]."""
    mean = torch.tensor(image_processor.image_mean).view(1, 3, 1, 1)
    std = torch.tensor(image_processor.image_std).view(1, 3, 1, 1)
    return (pixels.float() * std + mean).clamp(0, 1).permute(0, 2, 3, 1).numpy()


@torch.inference_mode()
def part_maps(model: torch.nn.Module, image_processor: Any, images: Sequence[Any]) -> torch.Tensor:
    """The soft assignment of every feature-grid location to every part centroid, `[N, K, h, w]` (Fig. 6)."""
    pixels = pixels_of(image_processor, images).to(module_device(model), module_dtype(model))
    was_training = model.training
    model.eval()
    try:
        return model(pixel_values=pixels, output_part_assignments=True).part_assignments.float().cpu()
    finally:
        model.train(was_training)


def plot_part_maps(
    model: torch.nn.Module, image_processor: Any, images: Sequence[Any], path: str | Path | None = None
):
    """Fig. 6: per image (rows), the image and the response map of each part cluster over it (warmer = more
    strongly assigned); returns the matplotlib Figure and writes a PNG when `path` is given."""
    from hf_vrl.viz import new_figure, save_figure

    maps = part_maps(model, image_processor, images)
    pixels = pixels_of(image_processor, images)
    shown_all = display_images(image_processor, pixels)  # what the model saw
    upsampled = torch.nn.functional.interpolate(
        maps, size=pixels.shape[-2:], mode="bilinear", align_corners=False
    )
    n_parts = maps.shape[1]
    fig = new_figure(2.0 * (n_parts + 1), 2.0 * len(images))
    axes = fig.subplots(len(images), n_parts + 1, squeeze=False)
    for row, shown in enumerate(shown_all):
        axes[row, 0].imshow(shown)
        for k in range(n_parts):
            axes[row, k + 1].imshow(shown)
            axes[row, k + 1].imshow(upsampled[row, k].numpy(), cmap="jet", alpha=0.5, vmin=0.0, vmax=1.0)
            if row == 0:
                axes[row, k + 1].set_title(f"Cluster {k}")
        for ax in axes[row]:
            ax.set_axis_off()
    axes[0, 0].set_title("image")
    if path is not None:
        save_figure(fig, path)
    return fig
