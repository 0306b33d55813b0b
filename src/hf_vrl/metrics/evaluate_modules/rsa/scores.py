"""Representational similarity analysis (DiVE, App. D, Eq. 14; Kriegeskorte et al. 2008).

Plain numpy (scipy imported on first use): the one copy of `rsa_score`, imported by `rsa.py` beside it (which
`evaluate` copies along) and by `hf_vrl.metrics`.
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


def _rdm_upper(x):
    """Upper triangle (diagonal excluded, row by row) of the cosine-distance matrix D_ij = 1 - cos(x_i, x_j):
    scipy's condensed `pdist(x, "cosine")`, where a zero row (cosine 0/0) is at distance 1 from every row."""
    from scipy.spatial.distance import pdist

    return np.nan_to_num(pdist(x, "cosine"), nan=1.0)


def rsa_score(emb_a, emb_b):
    """Pearson correlation between the upper triangles of the two sets' cosine-distance matrices (Eq. 14).

    Row i of `emb_a` and row i of `emb_b` must embed the same input (e.g. pre-trained vs fine-tuned model);
    the dimensions may differ. 1 means the pairwise geometry is preserved exactly (up to affine rescaling).
    """
    a, b = _matrix(emb_a, "emb_a"), _matrix(emb_b, "emb_b")
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
