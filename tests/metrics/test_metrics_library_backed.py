"""Three metrics against the libraries they match, checked by hand: mean per-class recall (scikit-learn's
balanced accuracy without ties; ties count in expectation), NCC (scikit-learn's nearest-centroid argmin, also
where NearestCentroid's fit refuses) and RSA (scipy's cosine pdist, numpy's corrcoef)."""

import numpy as np
import pytest

from hf_vrl.metrics import granularity_scores, ncc_accuracy, rsa_score, zero_shot_accuracy


def test_mean_per_class_recall_counts_top1_ties_in_expectation_over_the_classes_present():
    """Hand case, 4 classes (class 3 in no label, class 1 never predicted right): image 0 ties its class 0
    with class 1 (a hit with probability 1/2). Recalls: class 0 (1/2 + 1) / 2, class 1 0, class 2 1 -> 7/12.
    scikit-learn's balanced_accuracy_score of the argmax (ties to the first class) would give 2/3."""
    from sklearn.metrics import balanced_accuracy_score

    images = np.array([[1.0, 1.0, 0, 0], [1.0, 0, 0, 0], [1.0, 0, 0, 0], [0, 0, 1.0, 0]])
    labels = np.array([0, 0, 1, 2])
    out = zero_shot_accuracy(images, np.eye(4), labels, topk=(1,))
    assert out["top1"] == pytest.approx((0.5 + 1 + 0 + 1) / 4)
    assert out["mean_per_class_recall"] == pytest.approx(7 / 12)
    assert balanced_accuracy_score(labels, images.argmax(axis=1)) == pytest.approx(2 / 3)


@pytest.mark.filterwarnings("ignore:y_pred contains classes not in y_true")  # scikit-learn, on purpose
def test_mean_per_class_recall_is_balanced_accuracy_without_ties():
    """Tie-free scores: exactly scikit-learn's balanced_accuracy_score of the argmax, also when a class is
    never predicted, a predicted class has no label, or only one class is present."""
    from sklearn.metrics import balanced_accuracy_score

    rng = np.random.default_rng(3)
    classifier = rng.normal(size=(5, 6))
    for labels in (rng.choice([0, 1, 3], size=40), np.full(7, 2)):
        images = classifier[labels] + 2.0 * rng.normal(size=(len(labels), 6))
        pred = (images @ (classifier / np.linalg.norm(classifier, axis=1, keepdims=True)).T).argmax(axis=1)
        out = zero_shot_accuracy(images, classifier, labels, topk=(1,))
        assert out["mean_per_class_recall"] == pytest.approx(balanced_accuracy_score(labels, pred), abs=1e-12)
        assert 0.0 < out["mean_per_class_recall"] < 1.0
        assert set(pred) - set(labels)  # some misses go to classes that no label holds


@pytest.mark.filterwarnings("error")
def test_ncc_hand_case_and_what_nearest_centroid_would_refuse():
    """Centroids 0 (class 0: -1, 1) and 10 (class 1: 4, 16): 4 is nearer 0 than 10 -> 3 of 4 right. A single
    class is always the nearest; collapsed embeddings tie every centroid (the first class wins); one sample
    per class is its own centroid. NearestCentroid's fit raises on the first two and warns on the third."""
    x = np.array([[-1.0], [1.0], [4.0], [16.0]])
    assert ncc_accuracy(x, [0, 0, 1, 1]) == 0.75
    assert ncc_accuracy(x, [5, 5, 5, 5]) == 1.0
    out = granularity_scores(x, [0, 0, 1, 1], [7, 7, 7, 7])  # one coarse class
    assert out["ncc_coarse"] == 1.0 and out["ncc_fine"] == 0.75
    assert ncc_accuracy(np.ones((4, 3)), [0, 1, 1, 1]) == 0.25
    assert ncc_accuracy(np.eye(3), [0, 1, 2]) == 1.0


def test_rsa_hand_case_and_a_zero_row():
    """Distances (pairs 01, 02, 12): a [0, 1, 1], b [1, 1, 0] -> Pearson r = -1/2. A zero row is at
    cosine distance 1 from every row, in both sets alike."""
    a = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    b = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    assert rsa_score(a, b) == pytest.approx(-0.5, abs=1e-12)
    c = np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 2.0]])
    rotated = c @ np.array([[0.0, 1.0], [-1.0, 0.0]])
    assert rsa_score(c, rotated * 3.0) == pytest.approx(1.0, abs=1e-12)
    same = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    assert rsa_score(same, 2 * same) == 1.0  # exactly: scipy's pearsonr gives 0.9999999999999999 here


def test_clip_benchmark_mean_per_class_recall_is_scikit_learns_balanced_accuracy():
    """`cb_zero_shot_accuracy` calls scikit-learn's balanced_accuracy_score; equal to the formula it replaced
    (the mean over the classes in the labels, sorted, of each one's recall), also when a class no label holds
    is predicted."""
    from hf_vrl.metrics.clip_benchmark import cb_zero_shot_accuracy

    rng = np.random.default_rng(5)
    classifier = rng.normal(size=(8, 6))
    labels = rng.choice([0, 2, 3, 5], size=60)
    images = classifier.T[labels] + 1.5 * rng.normal(size=(60, 8))
    out = cb_zero_shot_accuracy(images, classifier, labels, topk=(1,))
    normed = images / np.linalg.norm(images, axis=1, keepdims=True)
    pred = (normed @ classifier).argmax(axis=1)
    assert set(pred) - set(labels)  # some predictions fall on classes without labels
    recalls = [np.sum((labels == c) & (pred == c)) / np.sum(labels == c) for c in np.unique(labels)]
    assert out["mean_per_class_recall"] == pytest.approx(float(np.mean(recalls)), abs=1e-12)
    assert 0.0 < out["mean_per_class_recall"] < 1.0
