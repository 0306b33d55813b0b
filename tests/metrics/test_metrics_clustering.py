import itertools

import numpy as np
import pytest
import torch
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

from hf_vrl.metrics import cluster_accuracy, clustering_scores


def brute_force_accuracy(y_true, y_pred):
    """Best accuracy over every one-to-one map clusters -> classes (padded so both sides can go unmatched)."""
    classes, clusters = sorted(set(y_true)), sorted(set(y_pred))
    size = max(len(classes), len(clusters))
    best = 0
    for perm in itertools.permutations(range(size), len(clusters)):
        mapping = {c: classes[p] if p < len(classes) else None for c, p in zip(clusters, perm)}
        best = max(best, sum(mapping[p] == t for t, p in zip(y_true, y_pred)))
    return best / len(y_true)


@pytest.mark.parametrize("n_classes,n_clusters", [(3, 3), (3, 5), (5, 3), (4, 4), (2, 6)])
def test_cluster_accuracy_matches_brute_force(n_classes, n_clusters):
    rng = np.random.default_rng(n_classes * 10 + n_clusters)
    for _ in range(5):
        y_true = rng.integers(0, n_classes, size=30)
        y_pred = rng.integers(0, n_clusters, size=30)
        assert cluster_accuracy(y_true, y_pred) == pytest.approx(brute_force_accuracy(y_true, y_pred))


def test_cluster_accuracy_is_invariant_to_cluster_ids():
    y = np.array([0, 0, 1, 1, 2, 2, 2])
    assert cluster_accuracy(y, np.array([7, 7, 3, 3, 9, 9, 9])) == 1.0
    # one sample in the wrong cluster: 6 of 7
    assert cluster_accuracy(y, np.array([7, 7, 3, 3, 9, 9, 3])) == pytest.approx(6 / 7)
    # everything in one cluster: only the largest class can be matched
    assert cluster_accuracy(y, np.zeros(7, dtype=int)) == pytest.approx(3 / 7)


def test_cluster_accuracy_rejects_length_mismatch():
    with pytest.raises(ValueError, match="entries"):
        cluster_accuracy([0, 1, 1], [0, 1])


def test_clustering_scores_clusters_directions_not_norms():
    """Classes are directions at wildly different radii: only k-means on L2-normalised rows separates them."""
    rng = np.random.default_rng(0)
    directions = np.eye(3) + 0.02 * rng.normal(size=(3, 3))
    labels = np.repeat(np.arange(3), 20)
    radii = rng.choice([0.1, 100.0], size=60)
    x = directions[labels] * radii[:, None] + 0.01 * rng.normal(size=(60, 3)) * radii[:, None]
    scores = clustering_scores(torch.tensor(x), labels)
    assert scores == {"nmi": pytest.approx(1.0), "acc": 1.0, "ari": pytest.approx(1.0)}


def test_clustering_scores_agree_with_sklearn_on_noisy_data():
    from sklearn.cluster import KMeans

    rng = np.random.default_rng(1)
    labels = rng.integers(0, 4, size=80)
    x = rng.normal(size=(4, 8))[labels] + 0.8 * rng.normal(size=(80, 8))
    scores = clustering_scores(x, labels, seed=3)
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    pred = KMeans(n_clusters=4, n_init=10, random_state=3).fit_predict(xn)
    assert scores["nmi"] == pytest.approx(normalized_mutual_info_score(labels, pred))
    assert scores["ari"] == pytest.approx(adjusted_rand_score(labels, pred))
    assert scores["acc"] == pytest.approx(brute_force_accuracy(labels.tolist(), pred.tolist()))
    assert 0.0 < scores["acc"] < 1.0


def test_clustering_scores_n_clusters_override_and_errors():
    x = np.random.default_rng(2).normal(size=(12, 4))
    y = np.repeat([0, 1], 6)
    assert set(clustering_scores(x, y, n_clusters=4)) == {"nmi", "acc", "ari"}
    with pytest.raises(ValueError, match="n_clusters"):
        clustering_scores(x, y, n_clusters=13)
    with pytest.raises(ValueError, match="2-D"):
        clustering_scores(x[0], y)
