"""hf_vrl's tie rule: top-k hits in expectation over random orders of equal scores."""

import itertools
import math

import numpy as np
import pytest

from hf_vrl.metrics.ranking import cosine_scores, row_chunks, topk_hits


def hits_over_all_orders(scores, positive, k):
    """Plain reference: for every order of the keys, sort by score (ties in that order) and check whether a
    positive is among the first k; the mean over all orders."""
    n, hits = len(scores), []
    for order in itertools.permutations(range(n)):
        rank = {key: position for position, key in enumerate(order)}
        ranked = sorted(range(n), key=lambda j: (-scores[j], rank[j]))
        hits.append(any(positive[j] for j in ranked[:k]))
    return float(np.mean(hits))


def test_topk_hits_equal_the_mean_over_all_orders():
    rng = np.random.default_rng(0)
    for _ in range(12):
        scores = rng.integers(0, 3, size=6).astype(float)  # many ties
        positive = rng.random(6) < 0.35
        positive[rng.integers(6)] = True
        hits = topk_hits(scores[None], positive[None], range(1, 7))
        for k in range(1, 7):
            assert hits[k][0] == pytest.approx(hits_over_all_orders(scores, positive, k))


def test_topk_hits_hand_cases():
    scores = np.array([[3.0, 2.0, 2.0, 2.0, 1.0], [1.0, 1.0, 1.0, 1.0, 1.0]])
    positive = np.array([[False, False, True, True, False], [False, False, True, False, False]])
    hits = topk_hits(scores, positive, (1, 2, 3, 5))
    # row 0: one score above the best positive, three tied with it (two positive)
    #   k=1: 0;  k=2: one tied slot, 2 of 3 tied are positive -> 2/3;  k=3: 1 - C(1,2)/C(3,2) = 1
    # row 1: all five tied, one positive -> k/5
    np.testing.assert_allclose(hits[1], [0.0, 1 / 5])
    np.testing.assert_allclose(hits[2], [2 / 3, 2 / 5])
    np.testing.assert_allclose(hits[3], [1.0, 3 / 5])
    np.testing.assert_allclose(hits[5], [1.0, 1.0])
    # the hypergeometric form of row 1 at k=2: 1 - C(4, 2) / C(5, 2)
    assert hits[2][1] == pytest.approx(1 - math.comb(4, 2) / math.comb(5, 2))


def test_identical_keys_score_identically():
    rng = np.random.default_rng(0)
    keys = rng.normal(size=(40, 67))
    keys[[5, 17, 33, 39]] = keys[2]
    queries = rng.normal(size=(9, 67))
    scores = cosine_scores(queries, keys)
    np.testing.assert_allclose(scores, queries @ keys.T, rtol=1e-12, atol=1e-12)
    for column in (5, 17, 33, 39):
        assert np.array_equal(scores[:, column], scores[:, 2])


def test_row_chunks_cover_the_rows_within_the_budget():
    chunks = list(row_chunks(10, 3, max_elements=7))
    assert [(c.start, c.stop) for c in chunks] == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10)]
    assert [(c.start, c.stop) for c in row_chunks(4, 100, max_elements=7)] == [(i, i + 1) for i in range(4)]
