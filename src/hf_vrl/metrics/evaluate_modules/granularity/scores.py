"""Granularity-aware collapse scores (CLUE §3.1): CDNV (Eq. 1-2, Galanti et al. 2021) overall and within each
coarse class, and nearest-class-centre (NCC, Eq. 3) accuracy for fine and coarse labels.

Plain numpy (scikit-learn imported on first use): the one copy of these functions, imported by
`granularity.py` beside it (which `evaluate` copies along) and by `hf_vrl.metrics`.
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
    """`y` as `n` int64 class ids."""
    if hasattr(y, "detach"):
        y = y.detach().cpu().numpy()
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {y.shape}")
    if y.size and not np.issubdtype(y.dtype, np.integer) and not np.all(np.mod(y, 1) == 0):
        raise ValueError(f"{name} must hold integer class ids, got dtype {y.dtype}")
    if y.shape[0] != n:
        raise ValueError(f"{name} has {y.shape[0]} entries but the embeddings have {n} rows")
    return y.astype(np.int64)


def _class_stats(x, y):
    """Classes, centroids mu(S_c) and variances Var(S_c) = E_{x in S_c} ||x - mu(S_c)||^2."""
    classes, inv = np.unique(y, return_inverse=True)
    counts = np.bincount(inv)
    mu = np.zeros((classes.size, x.shape[1]))
    np.add.at(mu, inv, x)
    mu /= counts[:, None]
    var = np.bincount(inv, weights=((x - mu[inv]) ** 2).sum(axis=1)) / counts
    return classes, mu, var


def _cdnv(x, y):
    classes, mu, var = _class_stats(x, y)
    if classes.size < 2:
        raise ValueError("CDNV needs at least two classes")
    i, j = np.triu_indices(classes.size, k=1)  # V is symmetric: the mean over i<j equals the mean over i != j
    dist2 = ((mu[i] - mu[j]) ** 2).sum(axis=1)
    if (dist2 == 0).any():
        raise ValueError("two classes share the same centroid; CDNV is infinite")
    return float(np.mean((var[i] + var[j]) / (2.0 * dist2)))


def _ncc_hits(x, y):
    """Per sample, whether h(x) = argmin_c ||x - mu(S_c)||_2 (CLUE Eq. 3) returns its own class:
    scikit-learn's `NearestCentroid.predict`, without its `fit` (which refuses one class or collapsed
    embeddings)."""
    from sklearn.metrics import pairwise_distances_argmin

    classes, mu, _ = _class_stats(x, y)
    return classes[pairwise_distances_argmin(x, mu)] == y


def cdnv(embeddings, labels):
    """CDNV = Avg_{i != j} (Var(S_i) + Var(S_j)) / (2 ||mu(S_i) - mu(S_j)||^2) (CLUE Eq. 1-2)."""
    x = _matrix(embeddings, "embeddings")
    return _cdnv(x, _labels(labels, x.shape[0], "labels"))


def ncc_accuracy(embeddings, labels):
    """Nearest-class-centre accuracy over all samples (CLUE Eq. 3)."""
    x = _matrix(embeddings, "embeddings")
    return float(_ncc_hits(x, _labels(labels, x.shape[0], "labels")).mean())


def _fine_to_coarse(fine, coarse):
    """The mapping pi: fine class -> coarse class; each fine class must sit in exactly one coarse class."""
    mapping = {}
    for f, c in zip(fine.tolist(), coarse.tolist()):
        if mapping.setdefault(f, c) != c:
            raise ValueError(f"fine class {f} appears under coarse classes {mapping[f]} and {c}")
    return mapping


def granularity_scores(embeddings, fine_labels, coarse_labels):
    """CLUE §3.1 suite: {"cdnv_all", "cdnv_per_coarse" {A: CDNV_A}, "cdnv_coarse_mean", "ncc_fine",
    "ncc_coarse", "ncc_fine_per_coarse" {A: NCC_fine on S_A}}.

    CDNV_A is the CDNV over the fine classes inside coarse class A; it is None when A holds fewer than two
    fine classes (undefined), and such classes are left out of `cdnv_coarse_mean`. `ncc_fine_per_coarse`
    scores the samples of S_A with the global fine centroids (the per-coarse breakdown of CLUE Fig. 2).
    """
    x = _matrix(embeddings, "embeddings")
    fine = _labels(fine_labels, x.shape[0], "fine_labels")
    coarse = _labels(coarse_labels, x.shape[0], "coarse_labels")
    pi = _fine_to_coarse(fine, coarse)
    fine_hit = _ncc_hits(x, fine)
    per_coarse, ncc_per_coarse = {}, {}
    for a in np.unique(coarse).tolist():
        mask = coarse == a
        n_fine = sum(1 for c in pi.values() if c == a)
        per_coarse[str(a)] = _cdnv(x[mask], fine[mask]) if n_fine >= 2 else None
        ncc_per_coarse[str(a)] = float(fine_hit[mask].mean())
    defined = [v for v in per_coarse.values() if v is not None]
    return {
        "cdnv_all": _cdnv(x, fine),
        "cdnv_per_coarse": per_coarse,
        "cdnv_coarse_mean": float(np.mean(defined)) if defined else None,
        "ncc_fine": float(fine_hit.mean()),
        "ncc_coarse": float(_ncc_hits(x, coarse).mean()),
        "ncc_fine_per_coarse": ncc_per_coarse,
    }
