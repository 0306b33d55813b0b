"""Zero-shot classification with prompt templates (CLIP §3.1.4), as clip_benchmark computes it: a class
weight per class from the prompt ensemble, top-k accuracy and mean per-class recall of cosine scores.
Ties count in expectation over random orders (`hf_vrl.metrics.ranking`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hf_vrl.metrics._common import as_labels, as_matrix, l2_normalize
from hf_vrl.metrics.ranking import cosine_scores, topk_hits

Template = str | Callable[[str], str]


def fill_prompt(template: Template, name: str, fill: Callable[[str, str], str] = str.format) -> str:
    """The prompt of `template` for class `name`: `template(name)` for a callable, else `fill(template, name)`
    (the template must hold "{}")."""
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
        prompts = [fill_prompt(t, name, fill) for t in templates]
        emb = l2_normalize(as_matrix(text_embed_fn(prompts), name="text embeddings"))
        if emb.shape[0] != len(prompts):
            raise ValueError(f"text_embed_fn returned {emb.shape[0]} rows for {len(prompts)} prompts")
        weights.append(emb.mean(axis=0))
    return l2_normalize(np.stack(weights))


def zero_shot_accuracy(
    image_embeds: Any, classifier: Any, labels: Any, topk: Sequence[int] = (1, 5)
) -> dict[str, float]:
    """Top-k accuracy of cosine-similarity classification against `classifier` rows, and the mean per-class
    recall (top-1 accuracy averaged over the classes present, clip_benchmark's balanced accuracy):
    {"top1", "top5", ..., "mean_per_class_recall"}.

    Without top-1 ties the recall is scikit-learn's `balanced_accuracy_score` of the argmax; it is written out
    because a tie counts in expectation here, which that function of hard predictions cannot express."""
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
    hits = topk_hits(cosine_scores(x, w), np.eye(n_classes, dtype=bool)[y], sorted({1, *topk}))
    out = {f"top{k}": float(hits[k].mean()) for k in topk}
    out["mean_per_class_recall"] = float(np.mean([hits[1][y == c].mean() for c in np.unique(y)]))
    return out
