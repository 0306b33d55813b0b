import math

import numpy as np
import pytest
import torch

from hf_vrl.metrics import rsa_score


def loop_rsa(a, b):
    """DiVE App. D written out: D_ij = 1 - cos, upper triangle without diagonal, Pearson r."""

    def cos(u, v):
        return sum(x * y for x, y in zip(u, v)) / math.sqrt(sum(x * x for x in u) * sum(y * y for y in v))

    m = len(a)
    da = [1 - cos(a[i], a[j]) for i in range(m) for j in range(i + 1, m)]
    db = [1 - cos(b[i], b[j]) for i in range(m) for j in range(i + 1, m)]
    ma, mb = sum(da) / len(da), sum(db) / len(db)
    num = sum((x - ma) * (y - mb) for x, y in zip(da, db))
    return num / math.sqrt(sum((x - ma) ** 2 for x in da) * sum((y - mb) ** 2 for y in db))


def test_rsa_is_one_for_a_rotated_rescaled_copy():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(20, 8))
    q, _ = np.linalg.qr(rng.normal(size=(8, 8)))
    b = (a @ q) * rng.uniform(0.5, 3.0, size=(20, 1))  # rotation + per-row scale keep every cosine
    assert rsa_score(torch.tensor(a), torch.tensor(b)) == pytest.approx(1.0, abs=1e-12)


def test_rsa_matches_plain_loop_on_random_data():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(15, 6)), rng.normal(size=(15, 4))  # dims may differ
    r = rsa_score(a, b)
    assert r == pytest.approx(loop_rsa(a.tolist(), b.tolist()), abs=1e-12)
    assert abs(r) < 0.5  # unrelated embeddings


def test_rsa_partial_agreement_lies_between():
    rng = np.random.default_rng(2)
    a = rng.normal(size=(30, 6))
    b = a + 0.7 * rng.normal(size=a.shape)
    r = rsa_score(a, b)
    assert 0.2 < r < 0.99
    assert r == pytest.approx(loop_rsa(a.tolist(), b.tolist()), abs=1e-12)


def test_rsa_errors():
    with pytest.raises(ValueError, match="same inputs"):
        rsa_score(np.ones((4, 2)), np.ones((5, 2)))
    with pytest.raises(ValueError, match="at least 3"):
        rsa_score(np.eye(2), np.eye(2))
    with pytest.raises(ValueError, match="constant"):
        rsa_score(np.ones((4, 3)), np.random.default_rng(0).normal(size=(4, 3)))
