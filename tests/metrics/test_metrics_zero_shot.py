"""Zero-shot classification: prompt ensembling, top-k accuracy and mean per-class recall (clip_benchmark)."""

import numpy as np
import pytest
import torch

from hf_vrl.metrics import zero_shot_accuracy, zero_shot_classifier


def test_zero_shot_classifier_averages_normalised_template_embeddings():
    table = {
        "a cat": [3.0, 4.0],  # norm 5 -> [0.6, 0.8]
        "the cat!": [0.0, 2.0],  # -> [0, 1]
        "a dog": [1.0, 0.0],
        "the dog!": [5.0, 0.0],
    }
    seen = []

    def embed(prompts):
        seen.append(list(prompts))
        return torch.tensor([table[p] for p in prompts])

    w = zero_shot_classifier(embed, ["cat", "dog"], ["a {}", lambda c: f"the {c}!"])
    assert seen == [["a cat", "the cat!"], ["a dog", "the dog!"]]
    cat = np.array([0.3, 0.9]) / np.linalg.norm([0.3, 0.9])
    np.testing.assert_allclose(w, np.stack([cat, [1.0, 0.0]]), atol=1e-12)


def test_zero_shot_classifier_rejects_template_without_placeholder():
    with pytest.raises(ValueError, match="placeholder"):
        zero_shot_classifier(lambda p: torch.ones(len(p), 2), ["cat"], ["a photo"])


def test_zero_shot_accuracy_hand_case():
    classifier = np.eye(3)
    images = np.array(
        [
            [0.9, 0.1, 0.0],  # label 0: rank 0
            [0.5, 0.4, 0.1],  # label 1: rank 1
            [0.5, 0.3, 0.2],  # label 2: rank 2
            [0.1, 0.2, 0.7],  # label 2: rank 0
        ]
    )
    out = zero_shot_accuracy(images, classifier, [0, 1, 2, 2], topk=(1, 2, 3))
    # top-1 hits 1, 0, 0, 1: per class 1 (class 0), 0 (class 1), 1/2 (class 2)
    assert out == {"top1": 0.5, "top2": 0.75, "top3": 1.0, "mean_per_class_recall": 0.5}


def test_zero_shot_accuracy_ties_count_as_chance():
    """Two identical class weights: each image is right with probability 1/2 at top-1."""
    out = zero_shot_accuracy(np.ones((4, 2)), np.array([[1.0, 1.0], [1.0, 1.0]]), [0, 1, 0, 1], topk=(1, 2))
    assert out == {"top1": 0.5, "top2": 1.0, "mean_per_class_recall": 0.5}


def test_zero_shot_accuracy_matches_clip_benchmarks_formulas():
    """clip_benchmark's `accuracy` (top-k of 100 * cosine logits) and `balanced_accuracy_score` of the argmax,
    written out, on tie-free random embeddings with unbalanced classes."""
    from sklearn.metrics import balanced_accuracy_score

    rng = np.random.default_rng(0)
    classifier = rng.normal(size=(6, 8))
    labels = rng.choice(6, size=50, p=[0.4, 0.2, 0.1, 0.1, 0.1, 0.1])
    images = classifier[labels] + 1.5 * rng.normal(size=(50, 8))
    x = images / np.linalg.norm(images, axis=1, keepdims=True)
    w = classifier / np.linalg.norm(classifier, axis=1, keepdims=True)
    logits = 100.0 * x @ w.T
    expected = {}
    for k in (1, 5):
        topk = np.argsort(-logits, axis=1)[:, :k]
        expected[f"top{k}"] = float(np.mean([labels[i] in topk[i] for i in range(len(labels))]))
    expected["mean_per_class_recall"] = balanced_accuracy_score(labels, logits.argmax(axis=1))
    assert zero_shot_accuracy(images, classifier, labels, topk=(1, 5)) == pytest.approx(expected)
    assert 0.2 < expected["top1"] < 0.9  # a case with hits and misses


def test_zero_shot_accuracy_errors():
    with pytest.raises(ValueError, match="top-5"):
        zero_shot_accuracy(np.ones((2, 2)), np.eye(2), [0, 1], topk=(5,))
    with pytest.raises(ValueError, match="labels must lie"):
        zero_shot_accuracy(np.ones((2, 2)), np.eye(2), [0, 2], topk=(1,))
