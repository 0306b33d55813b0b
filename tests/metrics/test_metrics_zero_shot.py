import numpy as np
import pytest
import torch

from hf_vrl.metrics import retrieval_recall, zero_shot_accuracy, zero_shot_classifier


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
    assert out == {"top1": 0.5, "top2": 0.75, "top3": 1.0}


def test_zero_shot_accuracy_ties_count_against_the_target():
    out = zero_shot_accuracy(np.ones((4, 2)), np.array([[1.0, 1.0], [1.0, 1.0]]), [0, 1, 0, 1], topk=(1, 2))
    assert out == {"top1": 0.0, "top2": 1.0}


def test_zero_shot_accuracy_errors():
    with pytest.raises(ValueError, match="top-5"):
        zero_shot_accuracy(np.ones((2, 2)), np.eye(2), [0, 1], topk=(5,))
    with pytest.raises(ValueError, match="labels must lie"):
        zero_shot_accuracy(np.ones((2, 2)), np.eye(2), [0, 2], topk=(1,))


def test_retrieval_recall_hand_counted_4x4():
    images = np.eye(4)
    texts = np.array([[0.6, 0.8, 0, 0], [0.8, 0.6, 0, 0], [0, 0, 0.6, 0.8], [0, 0, 0, 1.0]])
    # similarity[i, t] = texts[t, i]:
    # i0: t0 .6 < t1 .8 -> miss@1; i1: t1 .6 < t0 .8 -> miss@1; i2: t2 .6 best; i3: t3 1.0 best
    # t0: i0 .6 < i1 .8 -> miss@1; t1: i1 .6 < i0 .8 -> miss@1; t2: i2 .6 < i3 .8 -> miss@1; t3: i3 best
    out = retrieval_recall(images, texts, ks=(1, 2, 4))
    assert out == {
        "i2t_R@1": 0.5,
        "i2t_R@2": 1.0,
        "i2t_R@4": 1.0,
        "t2i_R@1": 0.25,
        "t2i_R@2": 1.0,
        "t2i_R@4": 1.0,
    }


def loop_recall(img, txt, owner_of_text, k):
    """Plain loops: sort by cosine similarity, check the positives in the top k."""
    img = img / np.linalg.norm(img, axis=1, keepdims=True)
    txt = txt / np.linalg.norm(txt, axis=1, keepdims=True)
    i2t = []
    for i in range(len(img)):
        order = sorted(range(len(txt)), key=lambda t: -float(img[i] @ txt[t]))
        i2t.append(any(owner_of_text[t] == i for t in order[:k]))
    t2i = []
    for t in range(len(txt)):
        order = sorted(range(len(img)), key=lambda i: -float(img[i] @ txt[t]))
        t2i.append(owner_of_text[t] in order[:k])
    return np.mean(i2t), np.mean(t2i)


def test_retrieval_recall_several_captions_per_image_matches_loop():
    rng = np.random.default_rng(0)
    img = rng.normal(size=(6, 5))
    owner = [0, 0, 1, 2, 2, 2, 3, 4, 5, 5, 1, 3]
    txt = img[owner] + 0.9 * rng.normal(size=(len(owner), 5))
    mapping = [[t for t, o in enumerate(owner) if o == i] for i in range(6)]
    out = retrieval_recall(img, txt, ks=(1, 3), image_to_text_map=mapping)
    for k in (1, 3):
        i2t, t2i = loop_recall(img, txt, owner, k)
        assert out[f"i2t_R@{k}"] == pytest.approx(i2t)
        assert out[f"t2i_R@{k}"] == pytest.approx(t2i)


def test_retrieval_recall_shared_caption_matches_any_of_its_images():
    img = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]])
    txt = np.array([[1.0, 0.05], [0.0, 1.0]])
    out = retrieval_recall(img, txt, ks=(1,), image_to_text_map=[[0], [0], [1]])
    assert out == {"i2t_R@1": 1.0, "t2i_R@1": 1.0}


def test_retrieval_recall_errors():
    with pytest.raises(ValueError, match="image_to_text_map"):
        retrieval_recall(np.eye(3), np.ones((4, 3)), ks=(1,))
    with pytest.raises(ValueError, match="belong to no image"):
        retrieval_recall(np.eye(2), np.eye(3)[:, :2], ks=(1,), image_to_text_map=[[0], [1]])
