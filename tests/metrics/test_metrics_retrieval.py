"""Retrieval recall@K: hand-counted cases, a plain loop, clip_benchmark's formula, and ties."""

import numpy as np
import pytest

from hf_vrl.metrics import retrieval_recall


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


def clip_benchmark_recall(img, txt, texts_image_index, k):
    """clip_benchmark's `evaluate` + `recall_at_k`, written out: scores = texts x images; a text (image) query
    is a hit when the count of its positives among its top-k is > 0; "image_retrieval" is text->image."""
    img = img / np.linalg.norm(img, axis=1, keepdims=True)
    txt = txt / np.linalg.norm(txt, axis=1, keepdims=True)
    scores = txt @ img.T
    positive = np.zeros(scores.shape, dtype=bool)
    positive[np.arange(len(txt)), texts_image_index] = True
    image_retrieval = [positive[t, np.argsort(-scores[t])[:k]].sum() > 0 for t in range(len(txt))]
    text_retrieval = [positive[np.argsort(-scores[:, i])[:k], i].sum() > 0 for i in range(len(img))]
    return float(np.mean(text_retrieval)), float(np.mean(image_retrieval))


def test_retrieval_recall_matches_clip_benchmarks_formula():
    """All captions of each image (1 to 4 per image), each caption with its single image."""
    rng = np.random.default_rng(3)
    img = rng.normal(size=(9, 6))
    texts_image_index = [i for i in range(9) for _ in range(1 + i % 4)]
    txt = img[texts_image_index] + 1.2 * rng.normal(size=(len(texts_image_index), 6))
    mapping = [[t for t, i in enumerate(texts_image_index) if i == image] for image in range(9)]
    out = retrieval_recall(img, txt, ks=(1, 5), image_to_text_map=mapping)
    for k in (1, 5):
        i2t, t2i = clip_benchmark_recall(img, txt, texts_image_index, k)
        assert out[f"i2t_R@{k}"] == pytest.approx(i2t) and out[f"t2i_R@{k}"] == pytest.approx(t2i)
    assert 0.0 < out["i2t_R@1"] < 1.0 and 0.0 < out["t2i_R@1"] < 1.0  # hits and misses


def test_repeated_captions_tie_and_count_in_expectation():
    """Two images per class, both captioned with the class's one string (template captions): image i's own
    caption ties with the other image's identical one, so i2t R@1 = 1/2 for every image; a caption's own
    image beats the other image of its class for one caption of each pair, so t2i R@1 = 1/2."""
    img = np.array([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [0.6, 0.8]])  # cat, cat, dog, dog
    txt = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])  # "cat", "cat", "dog", "dog"
    mapping = [[0], [1], [2], [3]]
    # i1: "cat" .8, .8 (tied, one is its own), "dog" .6, .6 -> 1/2 at R@1, 1 at R@2;
    # t1 ("cat" of i1): i0 1.0 > i1 .8 -> 0 at R@1, 1 at R@2; t0: i0 first -> 1
    assert retrieval_recall(img, txt, ks=(1, 2), image_to_text_map=mapping) == {
        "i2t_R@1": 0.5,
        "i2t_R@2": 1.0,
        "t2i_R@1": 0.5,
        "t2i_R@2": 1.0,
    }


def test_row_blocks_do_not_change_the_result(monkeypatch):
    from hf_vrl.metrics import ranking, retrieval

    rng = np.random.default_rng(1)
    img, txt = rng.normal(size=(7, 4)), rng.normal(size=(7, 4))
    whole = retrieval_recall(img, txt, ks=(1, 3))
    monkeypatch.setattr(retrieval, "row_chunks", lambda n, m: ranking.row_chunks(n, m, max_elements=10))
    assert retrieval_recall(img, txt, ks=(1, 3)) == whole
