"""Top-k hits of rankings by cosine similarity, the core of zero-shot accuracy and retrieval recall@K.

Ties (hf_vrl's rule): equal scores are ordered uniformly at random, and a query scores the *probability* that
one of its positives is among the k best, so the number does not depend on the order of the data. With g
scores above the query's best positive and m scores equal to it, p of which positive:

    hit@k = 0 if g >= k,   1 if g + m <= k,   else 1 - C(m - p, k - g) / C(m, k - g)

(hypergeometric: no positive among the k - g tied items drawn). A collapsed model (all scores equal) thus
scores chance level. clip_benchmark ranks with `torch.topk`, whose order among equal scores is whatever the
kernel returns; the two agree wherever scores do not tie. `cosine_scores` makes identical keys (the same
caption or class prompt embedded twice, e.g. template captions shared by many images) score exactly equal,
so they tie instead of being ordered by floating-point noise of the matrix product.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np


def distinct_rows(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct rows of `keys`, the index of each row of `keys` among them)."""
    distinct, index = np.unique(keys, axis=0, return_inverse=True)
    return distinct, index.reshape(-1)


def cosine_scores(queries: np.ndarray, keys: np.ndarray | tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """`queries @ keys.T` for L2-normalised rows, computed once per distinct key row so that equal keys get
    bit-identical scores (a matrix product may round the same dot product differently across columns).
    `keys` may be given as `distinct_rows(keys)` already."""
    distinct, index = distinct_rows(keys) if isinstance(keys, np.ndarray) else keys
    return (queries @ distinct.T)[:, index]


def topk_hits(scores: np.ndarray, positive: np.ndarray, ks: Sequence[int]) -> dict[int, np.ndarray]:
    """Per row of `scores` `[Q, N]`, the probability that a `positive` (bool `[Q, N]`, >= 1 per row) entry is
    among the k highest, ties in random order (module docstring): {k: float array [Q]}."""
    best = np.where(positive, scores, -np.inf).max(axis=1, keepdims=True)
    above = (scores > best).sum(axis=1)
    tied = scores == best
    n_tied = tied.sum(axis=1)
    n_tied_positive = (tied & positive).sum(axis=1)
    out = {}
    for k in ks:
        slots = k - above  # places left in the top k for the tied group
        miss = np.ones(len(slots))  # probability that no positive is drawn into those places
        for i in range(int(max(0, slots.max(initial=0)))):
            drawing = (i < slots) & (slots < n_tied)
            miss *= np.where(drawing, (n_tied - n_tied_positive - i) / np.maximum(n_tied - i, 1), 1.0)
        out[k] = np.where(slots <= 0, 0.0, np.where(slots >= n_tied, 1.0, 1.0 - miss))
    return out


def row_chunks(n_rows: int, n_cols: int, max_elements: int = 2**24) -> Iterator[slice]:
    """Row slices whose `[rows, n_cols]` score block holds at most `max_elements` (128 MiB of float64)."""
    step = max(1, max_elements // max(1, n_cols))
    for start in range(0, n_rows, step):
        yield slice(start, min(start + step, n_rows))
