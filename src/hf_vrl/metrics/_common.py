"""Input normalisation shared by the metric modules: tensors, arrays or lists in, float64/int64 numpy out."""

from __future__ import annotations

from typing import Any

import numpy as np


def as_matrix(x: Any, name: str = "embeddings") -> np.ndarray:
    """Return `x` (torch tensor, array or nested list) as a finite float64 matrix `[N, D]`."""
    if hasattr(x, "detach"):
        x = x.detach().float().cpu().numpy()
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be a 2-D [N, D] matrix, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or inf values; check the model outputs")
    return arr


def as_labels(y: Any, n: int | None = None, name: str = "labels") -> np.ndarray:
    """Return `y` as a 1-D int64 array, checking its length against `n` rows when given."""
    if hasattr(y, "detach"):
        y = y.detach().cpu().numpy()
    arr = np.asarray(y)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if not np.all(np.mod(arr, 1) == 0):
            raise ValueError(f"{name} must hold integer class ids, got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    if n is not None and arr.shape[0] != n:
        raise ValueError(f"{name} has {arr.shape[0]} entries but the embeddings have {n} rows")
    return arr


def l2_normalize(x: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """Rows of `x` divided by their L2 norm (zero rows stay zero)."""
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), eps)
