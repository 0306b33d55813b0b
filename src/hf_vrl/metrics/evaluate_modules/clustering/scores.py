"""Zero-shot clustering scores (DCR's D-ability, App. E.4): k-means on the L2-normalised embeddings, scored
against the class labels with NMI, Hungarian accuracy and ARI.

Plain numpy (scikit-learn and scipy imported on first use): the one copy of these functions, imported by
`clustering.py` beside it (which `evaluate` copies along) and by `hf_vrl.metrics`.
"""

import numpy as np


def _matrix(x, name):
    """`x` (a tensor, array or nested list) as a finite float64 `[N, D]` matrix."""
    if hasattr(x, "detach"):
        x = x.detach().float().cpu().numpy()
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"{name} must be a 2-D [N, D] matrix, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError(f"{name} contains NaN or inf values; check the model outputs")
    return x


def _labels(y, n, name):
    """`y` as 1-D int64 class ids, `n` of them when `n` is given."""
    if hasattr(y, "detach"):
        y = y.detach().cpu().numpy()
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {y.shape}")
    if y.size and not np.issubdtype(y.dtype, np.integer) and not np.all(np.mod(y, 1) == 0):
        raise ValueError(f"{name} must hold integer class ids, got dtype {y.dtype}")
    if n is not None and y.shape[0] != n:
        raise ValueError(f"{name} has {y.shape[0]} entries but the embeddings have {n} rows")
    return y.astype(np.int64)


def cluster_accuracy(labels_true, labels_pred):
    """Best one-to-one matching accuracy between clusters and classes (Hungarian algorithm).

    Each cluster is matched to at most one class and vice versa; with more clusters than classes the
    unmatched clusters count as errors, with fewer some classes go unmatched.
    """
    from scipy.optimize import linear_sum_assignment

    y_true = _labels(labels_true, None, "labels_true")
    y_pred = _labels(labels_pred, y_true.shape[0], "labels_pred")
    if y_true.size == 0:
        raise ValueError("cluster_accuracy needs at least one sample")
    classes, t = np.unique(y_true, return_inverse=True)
    clusters, p = np.unique(y_pred, return_inverse=True)
    counts = np.zeros((clusters.size, classes.size), dtype=np.int64)
    np.add.at(counts, (p, t), 1)
    rows, cols = linear_sum_assignment(counts, maximize=True)
    return float(counts[rows, cols].sum() / y_true.size)


def clustering_scores(embeddings, labels, n_clusters=None, seed=0, n_init=10):
    """k-means on L2-normalised embeddings scored against `labels`: {"nmi", "acc", "ari"}.

    `n_clusters` defaults to the number of distinct labels; `seed` fixes k-means' initialisation.
    """
    from sklearn.cluster import KMeans
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    x = _matrix(embeddings, "embeddings")
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    y = _labels(labels, x.shape[0], "labels")
    k = int(np.unique(y).size) if n_clusters is None else int(n_clusters)
    if not 1 <= k <= x.shape[0]:
        raise ValueError(f"n_clusters must lie in [1, {x.shape[0]}] (the number of samples), got {k}")
    pred = KMeans(n_clusters=k, n_init=n_init, random_state=seed).fit_predict(x)
    return {
        "nmi": float(normalized_mutual_info_score(y, pred)),
        "acc": cluster_accuracy(y, pred),
        "ari": float(adjusted_rand_score(y, pred)),
    }
