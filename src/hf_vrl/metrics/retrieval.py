"""Image-text retrieval recall@K, CLIP-paper style, as clip_benchmark computes it (`zeroshot_retrieval.py`).

Image->text: image i is a hit at K when any of its captions is among the K texts most similar to it. Text->
image: a caption is a hit when its image is among the K images most similar to it. clip_benchmark's datasets
give every image its own captions (several per image in COCO / Flickr), so each text has one image; the
mapping may also let a text belong to several images (then any of them is a hit). Ties count in expectation
over random orders (`hf_vrl.metrics.ranking`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hf_vrl.metrics._common import as_matrix, l2_normalize
from hf_vrl.metrics.ranking import cosine_scores, distinct_rows, row_chunks, topk_hits


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


def _recall(
    queries: np.ndarray, keys: np.ndarray, positive: np.ndarray, ks: Sequence[int]
) -> dict[int, float]:
    """Mean top-k hit of each query row against the keys, in row blocks of bounded memory."""
    totals, distinct = dict.fromkeys(ks, 0.0), distinct_rows(keys)
    for rows in row_chunks(len(queries), len(keys)):
        hits = topk_hits(cosine_scores(queries[rows], distinct), positive[rows], ks)
        for k in ks:
            totals[k] += float(hits[k].sum())
    return {k: total / len(queries) for k, total in totals.items()}


def retrieval_recall(
    image_embeds: Any,
    text_embeds: Any,
    ks: Sequence[int] = (1, 5, 10),
    image_to_text_map: Sequence[Sequence[int]] | None = None,
) -> dict[str, float]:
    """Image->text and text->image recall@K on cosine similarity: {"i2t_R@1", ..., "t2i_R@1", ...}.

    `image_to_text_map[i]` lists the captions of image i (default: caption i); clip_benchmark's `recall@k`
    over all captions of each image, with each caption's image, is this with disjoint lists.
    """
    img = l2_normalize(as_matrix(image_embeds, name="image_embeds"))
    txt = l2_normalize(as_matrix(text_embeds, name="text_embeds"))
    if img.shape[1] != txt.shape[1]:
        raise ValueError(f"image embeddings have dim {img.shape[1]}, text embeddings {txt.shape[1]}")
    pos = _positives(image_to_text_map, img.shape[0], txt.shape[0])
    i2t = _recall(img, txt, pos, ks)
    t2i = _recall(txt, img, pos.T, ks)
    out = {f"i2t_R@{k}": i2t[k] for k in ks}
    out.update({f"t2i_R@{k}": t2i[k] for k in ks})
    return out
