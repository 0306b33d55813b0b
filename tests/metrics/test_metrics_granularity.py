import numpy as np
import pytest

from hf_vrl.metrics import cdnv, granularity_scores, ncc_accuracy


def loop_cdnv(x, y):
    """CLUE Eq. 1-2 as written: mean over ordered pairs i != j of (Var_i + Var_j) / (2 ||mu_i - mu_j||^2)."""
    classes = sorted(set(y))
    mu, var = {}, {}
    for c in classes:
        members = [x[n] for n in range(len(y)) if y[n] == c]
        mu[c] = [sum(col) / len(members) for col in zip(*members)]
        var[c] = sum(sum((a - b) ** 2 for a, b in zip(m, mu[c])) for m in members) / len(members)
    vals = []
    for i in classes:
        for j in classes:
            if i != j:
                vals.append((var[i] + var[j]) / (2 * sum((a - b) ** 2 for a, b in zip(mu[i], mu[j]))))
    return sum(vals) / len(vals)


def loop_ncc(x, y):
    classes = sorted(set(y))
    mu = {c: np.mean([x[n] for n in range(len(y)) if y[n] == c], axis=0) for c in classes}
    hits = [min(classes, key=lambda c: np.linalg.norm(x[n] - mu[c])) == y[n] for n in range(len(y))]
    return sum(hits) / len(hits)


def test_cdnv_hand_case():
    # class 0 {-1, 1}: mean 0, var 1; class 1 {9, 11}: mean 10, var 1 -> (1 + 1) / (2 * 100)
    x = np.array([[-1.0], [1.0], [9.0], [11.0]])
    assert cdnv(x, [0, 0, 1, 1]) == pytest.approx(0.01)


def test_cdnv_and_ncc_match_plain_loops():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 5, size=60)
    x = rng.normal(size=(5, 4))[y] + 0.7 * rng.normal(size=(60, 4))
    assert cdnv(x, y) == pytest.approx(loop_cdnv(x.tolist(), y.tolist()), rel=1e-10)
    acc = ncc_accuracy(x, y)
    assert acc == pytest.approx(loop_ncc(x, y))
    assert 0.3 < acc < 1.0


def test_granularity_scores_per_coarse_class():
    rng = np.random.default_rng(1)
    fine = np.repeat(np.arange(6), 8)
    pi = np.array([0, 0, 0, 1, 1, 2])  # coarse 2 holds a single fine class
    coarse = pi[fine]
    x = 3 * rng.normal(size=(3, 5))[coarse] + rng.normal(size=(6, 5))[fine] + 0.5 * rng.normal(size=(48, 5))
    out = granularity_scores(x, fine, coarse)
    assert out["cdnv_all"] == pytest.approx(loop_cdnv(x.tolist(), fine.tolist()))
    for a in (0, 1):
        m = coarse == a
        assert out["cdnv_per_coarse"][str(a)] == pytest.approx(loop_cdnv(x[m].tolist(), fine[m].tolist()))
    assert out["cdnv_per_coarse"]["2"] is None  # undefined with one fine class
    assert out["cdnv_coarse_mean"] == pytest.approx(np.mean([out["cdnv_per_coarse"][a] for a in ("0", "1")]))
    assert out["ncc_fine"] == pytest.approx(loop_ncc(x, fine))
    assert out["ncc_coarse"] == pytest.approx(loop_ncc(x, coarse))
    # per-coarse NCC_fine uses the global fine centroids on the samples of S_A
    mu = np.stack([x[fine == c].mean(0) for c in range(6)])
    pred = np.argmin(((x[:, None] - mu[None]) ** 2).sum(-1), axis=1)
    for a in (0, 1, 2):
        m = coarse == a
        assert out["ncc_fine_per_coarse"][str(a)] == pytest.approx(np.mean(pred[m] == fine[m]))


def test_granularity_rejects_fine_class_in_two_coarse_classes():
    x = np.random.default_rng(2).normal(size=(4, 2))
    with pytest.raises(ValueError, match="fine class 0"):
        granularity_scores(x, [0, 0, 1, 1], [0, 1, 1, 1])


def test_cdnv_errors():
    with pytest.raises(ValueError, match="two classes"):
        cdnv(np.ones((3, 2)), [0, 0, 0])
    with pytest.raises(ValueError, match="same centroid"):
        cdnv(np.array([[0.0], [2.0], [1.0], [1.0]]), [0, 0, 1, 1])
