"""Granularity-aware collapse metrics (CLUE §3.1): CDNV (Eq. 1-2, Galanti et al. 2021) overall and within each
coarse class, and nearest-class-centre (NCC, Eq. 3) accuracy for fine and coarse labels."""

from __future__ import annotations

from typing import Any

import numpy as np

from hf_vrl.metrics._common import as_labels, as_matrix


def _class_stats(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Classes, centroids mu(S_c) and variances Var(S_c) = E_{x in S_c} ||x - mu(S_c)||^2."""
    classes, inv = np.unique(y, return_inverse=True)
    counts = np.bincount(inv)
    mu = np.zeros((classes.size, x.shape[1]))
    np.add.at(mu, inv, x)
    mu /= counts[:, None]
    var = np.bincount(inv, weights=((x - mu[inv]) ** 2).sum(axis=1)) / counts
    return classes, mu, var


def cdnv(embeddings: Any, labels: Any) -> float:
    """CDNV = Avg_{i != j} (Var(S_i) + Var(S_j)) / (2 ||mu(S_i) - mu(S_j)||^2) (CLUE Eq. 1-2)."""
    x = as_matrix(embeddings)
    y = as_labels(labels, n=x.shape[0])
    classes, mu, var = _class_stats(x, y)
    if classes.size < 2:
        raise ValueError("CDNV needs at least two classes")
    i, j = np.triu_indices(classes.size, k=1)  # V is symmetric: the mean over i<j equals the mean over i != j
    dist2 = ((mu[i] - mu[j]) ** 2).sum(axis=1)
    if (dist2 == 0).any():
        raise ValueError("two classes share the same centroid; CDNV is infinite")
    return float(np.mean((var[i] + var[j]) / (2.0 * dist2)))


def _ncc_hits(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per sample, whether h(x) = argmin_c ||x - mu(S_c)||_2 (CLUE Eq. 3) returns its own class:
    scikit-learn's `NearestCentroid.predict`, without its `fit` (which refuses one class or collapsed
    embeddings)."""
    from sklearn.metrics import pairwise_distances_argmin

    classes, mu, _ = _class_stats(x, y)
    return classes[pairwise_distances_argmin(x, mu)] == y


def ncc_accuracy(embeddings: Any, labels: Any) -> float:
    """Nearest-class-centre accuracy over all samples (CLUE Eq. 3)."""
    x = as_matrix(embeddings)
    return float(_ncc_hits(x, as_labels(labels, n=x.shape[0])).mean())


def _fine_to_coarse(fine: np.ndarray, coarse: np.ndarray) -> dict[int, int]:
    """The mapping pi: fine class -> coarse class; each fine class must sit in exactly one coarse class."""
    mapping: dict[int, int] = {}
    for f, c in zip(fine.tolist(), coarse.tolist()):
        if mapping.setdefault(f, c) != c:
            raise ValueError(f"fine class {f} appears under coarse classes {mapping[f]} and {c}")
    return mapping


def granularity_scores(embeddings: Any, fine_labels: Any, coarse_labels: Any) -> dict[str, Any]:
    """CLUE §3.1 suite: {"cdnv_all", "cdnv_per_coarse" {A: CDNV_A}, "cdnv_coarse_mean", "ncc_fine",
    "ncc_coarse", "ncc_fine_per_coarse" {A: NCC_fine on S_A}}.

    CDNV_A is the CDNV over the fine classes inside coarse class A; it is None when A holds fewer than two
    fine classes (undefined), and such classes are left out of `cdnv_coarse_mean`. `ncc_fine_per_coarse`
    scores the samples of S_A with the global fine centroids (the per-coarse breakdown of CLUE Fig. 2).
    """
    x = as_matrix(embeddings)
    fine = as_labels(fine_labels, n=x.shape[0], name="fine_labels")
    coarse = as_labels(coarse_labels, n=x.shape[0], name="coarse_labels")
    pi = _fine_to_coarse(fine, coarse)
    fine_hit = _ncc_hits(x, fine)
    per_coarse: dict[str, float | None] = {}
    ncc_per_coarse: dict[str, float] = {}
    for a in np.unique(coarse).tolist():
        mask = coarse == a
        n_fine = sum(1 for c in pi.values() if c == a)
        per_coarse[str(a)] = cdnv(x[mask], fine[mask]) if n_fine >= 2 else None
        ncc_per_coarse[str(a)] = float(fine_hit[mask].mean())
    defined = [v for v in per_coarse.values() if v is not None]
    return {
        "cdnv_all": cdnv(x, fine),
        "cdnv_per_coarse": per_coarse,
        "cdnv_coarse_mean": float(np.mean(defined)) if defined else None,
        "ncc_fine": float(fine_hit.mean()),
        "ncc_coarse": float(_ncc_hits(x, coarse).mean()),
        "ncc_fine_per_coarse": ncc_per_coarse,
    }
