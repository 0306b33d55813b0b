"""Zero-shot accuracy and retrieval recall@K computed the way LAION-AI/CLIP_benchmark computes them
(`clip_benchmark/metrics/zeroshot_classification.py`, `zeroshot_retrieval.py`), so that equal embeddings
give equal numbers: the `evaluate_clip(protocol="clip_benchmark")` path.

Everything runs in torch float32 on the CPU, in the order clip_benchmark uses:
- zero-shot: a class weight is the mean of the L2-normalised prompt embeddings, divided by its norm; logits
  are `100 * normalize(image) @ weights`; top-k accuracy takes the indices of one `topk(max k, sorted)` call
  and counts the first k; the mean per-class recall is scikit-learn's balanced accuracy of the `argmax`
  predictions (the recall of each class present in the labels, averaged).
- retrieval: scores are `normalize(texts) @ normalize(images).T`; a query is a hit at K when one of its
  positives is among the indices `torch.topk` returns, in row blocks of `batch_size` as clip_benchmark's
  `batchify`. Image->text (clip_benchmark's "text_retrieval_recall") ranks the rows of the transposed scores.

Ties are ordered however `torch.topk` orders them (not by index, and not necessarily as `argmax` does),
which is what clip_benchmark reports. hf_vrl's own rule (ties in expectation, `hf_vrl.metrics.ranking`) is
the "hf_vrl" protocol's.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["cb_retrieval_recall", "cb_zero_shot_accuracy", "cb_zero_shot_classifier"]


def _tensor(x: Any, name: str) -> torch.Tensor:
    t = torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x).detach().cpu().float()
    if t.ndim != 2:
        raise ValueError(f"{name} must be a 2-D [N, D] matrix, got shape {tuple(t.shape)}")
    if not torch.isfinite(t).all():
        raise ValueError(f"{name} contains NaN or inf values; check the model outputs")
    return t


def cb_zero_shot_classifier(class_prompt_embeds: Sequence[Any]) -> torch.Tensor:
    """Class weights `[D, C]` (clip_benchmark's layout) from one `[T, D]` prompt-embedding block per class."""
    if not class_prompt_embeds:
        raise ValueError("cb_zero_shot_classifier needs at least one class")
    weights = []
    for block in class_prompt_embeds:
        mean = F.normalize(_tensor(block, "prompt embeddings"), dim=-1).mean(dim=0)
        weights.append(mean / mean.norm())
    return torch.stack(weights, dim=1)


def cb_zero_shot_accuracy(
    image_embeds: Any,
    classifier: Any,
    labels: Any,
    topk: Sequence[int] = (1, 5),
    projection: Sequence[Sequence[int]] | None = None,
) -> dict[str, float]:
    """{"top1", "top5", ..., "mean_per_class_recall"} of `classifier` (`[D, C]`, as
    `cb_zero_shot_classifier` builds it). `projection[j]` lists the classifier columns of label j: its
    logit is their maximum (ObjectNet's classes over ImageNet's, WiSE-FT's `project_logits`); the mean
    per-class recall is scikit-learn's `balanced_accuracy_score` of the argmax."""
    from sklearn.metrics import balanced_accuracy_score

    images = F.normalize(_tensor(image_embeds, "image_embeds"), dim=-1)
    weights = torch.as_tensor(classifier).detach().cpu().float()
    target = torch.as_tensor(np.asarray(labels, dtype=np.int64))
    if images.shape[1] != weights.shape[0]:
        raise ValueError(f"image embeddings have dim {images.shape[1]} but the classifier {weights.shape[0]}")
    if target.shape != (images.shape[0],):
        raise ValueError(f"{tuple(target.shape)} labels for {images.shape[0]} images")
    n_classes = weights.shape[1] if projection is None else len(projection)
    if target.numel() and (int(target.min()) < 0 or int(target.max()) >= n_classes):
        raise ValueError(f"labels must lie in [0, {n_classes}) for a {n_classes}-class classifier")
    for k in topk:
        if not 1 <= k <= n_classes:
            raise ValueError(
                f"top-{k} is undefined with {n_classes} classes; pass topk values <= {n_classes}"
            )
    logits = 100.0 * images @ weights
    if projection is not None:
        logits = torch.stack([logits[:, list(columns)].max(dim=1).values for columns in projection], dim=1)
    order = logits.topk(max(topk), 1, True, True)[1].t()
    correct = order.eq(target.view(1, -1).expand_as(order))
    n = len(target)
    out = {f"top{k}": float(correct[:k].reshape(-1).float().sum(0).item()) / n for k in topk}
    with warnings.catch_warnings():  # classes no label holds are predicted by design (a subset's labels)
        warnings.filterwarnings("ignore", "y_pred contains classes not in y_true")
        recall = balanced_accuracy_score(target.numpy(), logits.argmax(dim=1).numpy())
    out["mean_per_class_recall"] = float(recall)
    return out


def _hits(scores: torch.Tensor, positive: torch.Tensor, k: int, batch_size: int) -> torch.Tensor:
    """Per query row, whether `torch.topk` puts one of its positives among the k best (row blocks)."""
    out = []
    for start in range(0, len(scores), batch_size):
        block, pos = scores[start : start + batch_size], positive[start : start + batch_size]
        top = torch.topk(block, k, dim=1)[1]
        out.append(pos.gather(1, top).any(dim=1))
    return torch.cat(out)


def cb_retrieval_recall(
    image_embeds: Any,
    text_embeds: Any,
    text_image_index: Sequence[int],
    ks: Sequence[int] = (1, 5, 10),
    batch_size: int = 64,
) -> dict[str, float]:
    """{"i2t_R@k", ..., "t2i_R@k", ...}: `text_image_index[j]` is the image of text j (each image needs a
    text); `batch_size` the row blocks of the ranking (clip_benchmark uses its data loader's batch size)."""
    images = F.normalize(_tensor(image_embeds, "image_embeds"), dim=-1)
    texts = F.normalize(_tensor(text_embeds, "text_embeds"), dim=-1)
    if images.shape[1] != texts.shape[1]:
        raise ValueError(f"image embeddings have dim {images.shape[1]}, text embeddings {texts.shape[1]}")
    index = torch.as_tensor(np.asarray(text_image_index, dtype=np.int64))
    if index.shape != (texts.shape[0],):
        raise ValueError(f"text_image_index has {index.numel()} entries for {texts.shape[0]} texts")
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= images.shape[0]):
        raise ValueError(f"text_image_index points outside the {images.shape[0]} images")
    scores = texts @ images.t()
    positive = torch.zeros_like(scores, dtype=torch.bool)
    positive[torch.arange(len(scores)), index] = True
    if not positive.any(dim=0).all():
        raise ValueError("every image needs at least one text in text_image_index")
    out = {}
    for k in ks:
        out[f"i2t_R@{k}"] = _hits(scores.T, positive.T, k, batch_size).float().mean().item()
    for k in ks:
        out[f"t2i_R@{k}"] = _hits(scores, positive, k, batch_size).float().mean().item()
    return out
