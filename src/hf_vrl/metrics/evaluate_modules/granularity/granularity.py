"""Granularity-aware collapse metrics (CLUE §3.1): CDNV (class-distance normalised variance, Eq. 1-2) and
nearest-class-centre accuracy (NCC, Eq. 3), with the per-coarse-class breakdown when coarse labels are given.

A stand-alone `evaluate` metric module (it needs `evaluate`, `datasets`, `numpy` and `scikit-learn`, not
hf_vrl):
`evaluate.load("path/to/granularity")`, or `hf_vrl.metrics.evaluate_module("granularity")` for the copy
shipped in hf_vrl. Its numbers equal `hf_vrl.metrics` (`cdnv`, `ncc_accuracy`, `granularity_scores`).
"""

import datasets
import evaluate
import numpy as np
from sklearn.metrics import pairwise_distances_argmin

_DESCRIPTION = """
CDNV averages, over pairs of classes, the within-class variances divided by twice the squared distance of
the class centres: low values mean compact, well separated classes. NCC accuracy classifies each embedding
by its nearest class centre. With `coarse_labels` (each fine class inside one coarse class) the module also
scores CDNV within each coarse class and NCC at both levels, as CLUE measures over- and under-clustering.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `list` of `float`): one embedding per sample, `[N, D]`.
    references (`list` of `int`): the (fine) class of each sample.
    coarse_labels (`list` of `int`, optional): the coarse class of each sample.
Returns:
    cdnv_all (`float`): CDNV over the fine classes.
    ncc_fine (`float`): NCC accuracy over the fine classes.
    with `coarse_labels` also:
    cdnv_per_coarse (`dict`): per coarse class, the CDNV of the fine classes inside it (None when it holds
        fewer than two fine classes).
    cdnv_coarse_mean (`float`): the mean of the defined `cdnv_per_coarse` values (None if none is defined).
    ncc_coarse (`float`): NCC accuracy over the coarse classes.
    ncc_fine_per_coarse (`dict`): per coarse class, the fine NCC accuracy of its samples (with the global
        fine centres).
Examples:
    >>> granularity = evaluate.load("path/to/granularity")
    >>> granularity.compute(predictions=[[0, 0], [0, 1], [4, 0], [4, 1]], references=[0, 0, 1, 1])
    {'cdnv_all': 0.015625, 'ncc_fine': 1.0}
"""

_CITATION = """
@misc{clue2026,
  title = {CLUE: Fine-grained Self-supervised Learning with Multi-level Regularization},
  note = {under review},
  year = {2026}
}
"""


def _embeddings(x):
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"predictions must be a 2-D [N, D] matrix, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError("predictions contain NaN or inf values; check the model outputs")
    return x


def _labels(y, n, name):
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {y.shape}")
    if y.size and not np.issubdtype(y.dtype, np.integer) and not np.all(np.mod(y, 1) == 0):
        raise ValueError(f"{name} must hold integer class ids, got dtype {y.dtype}")
    if y.shape[0] != n:
        raise ValueError(f"{name} has {y.shape[0]} entries but the embeddings have {n} rows")
    return y.astype(np.int64)


def _class_stats(x, y):
    """Classes, centres mu(S_c) and variances Var(S_c) = E_{x in S_c} ||x - mu(S_c)||^2."""
    classes, inv = np.unique(y, return_inverse=True)
    counts = np.bincount(inv)
    mu = np.zeros((classes.size, x.shape[1]))
    np.add.at(mu, inv, x)
    mu /= counts[:, None]
    var = np.bincount(inv, weights=((x - mu[inv]) ** 2).sum(axis=1)) / counts
    return classes, mu, var


def _cdnv(x, y):
    """Avg_{i != j} (Var(S_i) + Var(S_j)) / (2 ||mu(S_i) - mu(S_j)||^2) (CLUE Eq. 1-2)."""
    classes, mu, var = _class_stats(x, y)
    if classes.size < 2:
        raise ValueError("CDNV needs at least two classes")
    i, j = np.triu_indices(classes.size, k=1)  # symmetric: the mean over i<j equals the mean over i != j
    dist2 = ((mu[i] - mu[j]) ** 2).sum(axis=1)
    if (dist2 == 0).any():
        raise ValueError("two classes share the same centroid; CDNV is infinite")
    return float(np.mean((var[i] + var[j]) / (2.0 * dist2)))


def _ncc_hits(x, y):
    """Per sample, whether argmin_c ||x - mu(S_c)||_2 (CLUE Eq. 3) is its own class (what scikit-learn's
    `NearestCentroid` predicts, without its `fit`, which refuses a single class)."""
    classes, mu, _ = _class_stats(x, y)
    return classes[pairwise_distances_argmin(x, mu)] == y


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Granularity(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {
                    "predictions": datasets.Sequence(datasets.Value("float64")),
                    "references": datasets.Value("int64"),
                }
            ),
        )

    def _compute(self, predictions, references, coarse_labels=None):
        x = _embeddings(predictions)
        fine = _labels(references, x.shape[0], "references")
        if coarse_labels is None:
            return {"cdnv_all": _cdnv(x, fine), "ncc_fine": float(_ncc_hits(x, fine).mean())}
        coarse = _labels(coarse_labels, x.shape[0], "coarse_labels")
        parent = {}  # fine class -> its one coarse class
        for f, c in zip(fine.tolist(), coarse.tolist()):
            if parent.setdefault(f, c) != c:
                raise ValueError(f"fine class {f} appears under coarse classes {parent[f]} and {c}")
        fine_hit = _ncc_hits(x, fine)
        cdnv_per_coarse, ncc_per_coarse = {}, {}
        for a in np.unique(coarse).tolist():
            mask = coarse == a
            n_fine = sum(1 for c in parent.values() if c == a)
            cdnv_per_coarse[str(a)] = _cdnv(x[mask], fine[mask]) if n_fine >= 2 else None
            ncc_per_coarse[str(a)] = float(fine_hit[mask].mean())
        defined = [v for v in cdnv_per_coarse.values() if v is not None]
        return {
            "cdnv_all": _cdnv(x, fine),
            "cdnv_per_coarse": cdnv_per_coarse,
            "cdnv_coarse_mean": float(np.mean(defined)) if defined else None,
            "ncc_fine": float(fine_hit.mean()),
            "ncc_coarse": float(_ncc_hits(x, coarse).mean()),
            "ncc_fine_per_coarse": ncc_per_coarse,
        }
