"""Zero-shot classification with prompt templates (CLIP §3.1.4) and image-text retrieval recall@K.

Ranks are tie-pessimistic: a target ranked equal with a competitor counts as beaten by it, so a collapsed
model (all scores equal) scores 0 rather than an arbitrary tie-break.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hf_vrl.metrics._common import as_labels, as_matrix, l2_normalize

Template = str | Callable[[str], str]


def _fill(template: Template, name: str, fill: Callable[[str, str], str]) -> str:
    if callable(template):
        return template(name)
    if "{}" not in template:
        raise ValueError(f"prompt template {template!r} has no '{{}}' placeholder for the class name")
    return fill(template, name)


def zero_shot_classifier(
    text_embed_fn: Callable[[list[str]], Any],
    class_names: Sequence[str],
    templates: Sequence[Template],
    fill: Callable[[str, str], str] = str.format,
) -> np.ndarray:
    """Class weights `[C, D]`: per class, the mean of its L2-normalised template embeddings, renormalised.

    `text_embed_fn` maps a list of prompts to `[N, D]` embeddings; a template is a string with one `{}`,
    filled by `fill(template, name)`, or a callable `name -> prompt`. This is CLIP's prompt ensembling.
    """
    if not class_names:
        raise ValueError("zero_shot_classifier needs at least one class name")
    if not templates:
        raise ValueError("zero_shot_classifier needs at least one prompt template")
    weights = []
    for name in class_names:
        prompts = [_fill(t, name, fill) for t in templates]
        emb = l2_normalize(as_matrix(text_embed_fn(prompts), name="text embeddings"))
        if emb.shape[0] != len(prompts):
            raise ValueError(f"text_embed_fn returned {emb.shape[0]} rows for {len(prompts)} prompts")
        weights.append(emb.mean(axis=0))
    return l2_normalize(np.stack(weights))


def _target_ranks(scores: np.ndarray, positive: np.ndarray) -> np.ndarray:
    """Per row, how many negatives score >= the best positive (0 = retrieved first). `positive` is a mask."""
    best = np.where(positive, scores, -np.inf).max(axis=1, keepdims=True)
    return ((scores >= best) & ~positive).sum(axis=1)


def zero_shot_accuracy(
    image_embeds: Any, classifier: Any, labels: Any, topk: Sequence[int] = (1, 5)
) -> dict[str, float]:
    """Top-k accuracy of cosine-similarity classification against `classifier` rows: {"top1", "top5", ...}."""
    x = l2_normalize(as_matrix(image_embeds, name="image_embeds"))
    w = l2_normalize(as_matrix(classifier, name="classifier"))
    y = as_labels(labels, n=x.shape[0])
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"image embeddings have dim {x.shape[1]} but the classifier has dim {w.shape[1]}")
    n_classes = w.shape[0]
    if y.size and (y.min() < 0 or y.max() >= n_classes):
        raise ValueError(f"labels must lie in [0, {n_classes}) for a {n_classes}-class classifier")
    for k in topk:
        if not 1 <= k <= n_classes:
            raise ValueError(
                f"top-{k} is undefined with {n_classes} classes; pass topk values <= {n_classes}"
            )
    ranks = _target_ranks(x @ w.T, np.eye(n_classes, dtype=bool)[y])
    return {f"top{k}": float((ranks < k).mean()) for k in topk}


def _positives(image_to_text_map: Sequence[Sequence[int]] | None, n_images: int, n_texts: int) -> np.ndarray:
    """Boolean `[n_images, n_texts]` matrix of matching pairs; every image and every text needs a match."""
    if image_to_text_map is None:
        if n_images != n_texts:
            raise ValueError(
                f"{n_images} images but {n_texts} texts: pass image_to_text_map (image -> captions)"
            )
        return np.eye(n_images, dtype=bool)
    if len(image_to_text_map) != n_images:
        raise ValueError(f"image_to_text_map has {len(image_to_text_map)} entries for {n_images} images")
    pos = np.zeros((n_images, n_texts), dtype=bool)
    for i, texts in enumerate(image_to_text_map):
        idx = np.asarray(list(texts), dtype=np.int64)
        if idx.size == 0:
            raise ValueError(f"image {i} has no caption in image_to_text_map")
        if idx.min() < 0 or idx.max() >= n_texts:
            raise ValueError(f"image_to_text_map[{i}] points outside the {n_texts} texts")
        pos[i, idx] = True
    orphans = np.flatnonzero(~pos.any(axis=0))
    if orphans.size:
        raise ValueError(
            f"texts {orphans[:5].tolist()} belong to no image; drop them or map them to an image"
        )
    return pos


def retrieval_recall(
    image_embeds: Any,
    text_embeds: Any,
    ks: Sequence[int] = (1, 5, 10),
    image_to_text_map: Sequence[Sequence[int]] | None = None,
) -> dict[str, float]:
    """Image->text and text->image recall@K on cosine similarity: {"i2t_R@1", ..., "t2i_R@1", ...}.

    Image i is a hit at K when any of its captions (`image_to_text_map[i]`, default: caption i) is among
    the K most similar texts; a text is a hit when any image it belongs to is among the K most similar
    images (a caption shared by several images, e.g. a class prompt, may match any of them).
    """
    img = l2_normalize(as_matrix(image_embeds, name="image_embeds"))
    txt = l2_normalize(as_matrix(text_embeds, name="text_embeds"))
    if img.shape[1] != txt.shape[1]:
        raise ValueError(f"image embeddings have dim {img.shape[1]}, text embeddings {txt.shape[1]}")
    pos = _positives(image_to_text_map, img.shape[0], txt.shape[0])
    sim = img @ txt.T
    i2t = _target_ranks(sim, pos)
    t2i = _target_ranks(sim.T, pos.T)
    out = {f"i2t_R@{k}": float((i2t < k).mean()) for k in ks}
    out.update({f"t2i_R@{k}": float((t2i < k).mean()) for k in ks})
    return out
