"""Representational similarity analysis (DiVE, App. D, Eq. 14; Kriegeskorte et al. 2008)."""

from __future__ import annotations

from typing import Any

import numpy as np

from hf_vrl.metrics._common import as_matrix


def _rdm_upper(x: np.ndarray) -> np.ndarray:
    """Upper triangle (diagonal excluded, row by row) of the cosine-distance matrix D_ij = 1 - cos(x_i, x_j):
    scipy's condensed `pdist(x, "cosine")`, where a zero row (cosine 0/0) is at distance 1 from every row."""
    from scipy.spatial.distance import pdist

    return np.nan_to_num(pdist(x, "cosine"), nan=1.0)


def rsa_score(emb_a: Any, emb_b: Any) -> float:
    """Pearson correlation between the upper triangles of the two sets' cosine-distance matrices (Eq. 14).

    Row i of `emb_a` and row i of `emb_b` must embed the same input (e.g. pre-trained vs fine-tuned model);
    the dimensions may differ. 1 means the pairwise geometry is preserved exactly (up to affine rescaling).
    """
    a, b = as_matrix(emb_a, name="emb_a"), as_matrix(emb_b, name="emb_b")
    if a.shape[0] != b.shape[0]:
        raise ValueError(
            f"emb_a has {a.shape[0]} rows and emb_b {b.shape[0]}; both must embed the same inputs"
        )
    if a.shape[0] < 3:
        raise ValueError("rsa_score needs at least 3 embeddings (2 pairwise distances) per set")
    da, db = _rdm_upper(a), _rdm_upper(b)
    if np.ptp(da) == 0 or np.ptp(db) == 0:
        raise ValueError(
            "a cosine-distance matrix is constant (collapsed embeddings); Pearson r is undefined"
        )
    return float(np.corrcoef(da, db)[0, 1])  # not scipy's pearsonr: it gives 1 - 1e-16 for equal vectors
