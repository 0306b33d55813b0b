"""Unsupervised clustering quality of an embedding: k-means, then NMI, ACC (Hungarian) and ARI."""

from __future__ import annotations

from typing import Any

import numpy as np

from hf_vrl.metrics._common import as_labels, as_matrix, l2_normalize


def cluster_accuracy(labels_true: Any, labels_pred: Any) -> float:
    """Best one-to-one matching accuracy between clusters and classes (Hungarian algorithm).

    Each cluster is matched to at most one class and vice versa; with more clusters than classes the
    unmatched clusters count as errors, with fewer some classes go unmatched.
    """
    from scipy.optimize import linear_sum_assignment

    y_true = as_labels(labels_true, name="labels_true")
    y_pred = as_labels(labels_pred, n=y_true.shape[0], name="labels_pred")
    if y_true.size == 0:
        raise ValueError("cluster_accuracy needs at least one sample")
    classes, t = np.unique(y_true, return_inverse=True)
    clusters, p = np.unique(y_pred, return_inverse=True)
    counts = np.zeros((clusters.size, classes.size), dtype=np.int64)
    np.add.at(counts, (p, t), 1)
    rows, cols = linear_sum_assignment(counts, maximize=True)
    return float(counts[rows, cols].sum() / y_true.size)


def clustering_scores(
    embeddings: Any, labels: Any, n_clusters: int | None = None, seed: int = 0, n_init: int = 10
) -> dict[str, float]:
    """k-means on L2-normalised embeddings scored against `labels`: {"nmi", "acc", "ari"}.

    `n_clusters` defaults to the number of distinct labels; `seed` fixes k-means' initialisation.
    """
    from sklearn.cluster import KMeans
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    x = l2_normalize(as_matrix(embeddings))
    y = as_labels(labels, n=x.shape[0])
    k = int(np.unique(y).size) if n_clusters is None else int(n_clusters)
    if not 1 <= k <= x.shape[0]:
        raise ValueError(f"n_clusters must lie in [1, {x.shape[0]}] (the number of samples), got {k}")
    pred = KMeans(n_clusters=k, n_init=n_init, random_state=seed).fit_predict(x)
    return {
        "nmi": float(normalized_mutual_info_score(y, pred)),
        "acc": cluster_accuracy(y, pred),
        "ari": float(adjusted_rand_score(y, pred)),
    }
