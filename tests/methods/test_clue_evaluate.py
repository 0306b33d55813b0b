"""CLUE's evaluation: image retrieval Rank-K against a loop, the report (linear probe, retrieval, granularity)
on the CPU and CUDA, and the Fig. 6 part maps."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from clue_helpers import tiny_model, tiny_settings, toy_data

from hf_vrl.methods.clue.evaluate import evaluate_clue, image_retrieval, part_maps, plot_part_maps
from hf_vrl.methods.clue.model import build_image_processor


def retrieval_reference(x: np.ndarray, y: np.ndarray, k: int) -> float:
    """For each query, its k nearest other images by cosine similarity (ties: against the query)."""
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    hits = 0
    for i in range(len(x)):
        others = [j for j in range(len(x)) if j != i]
        matches = [float(x[i] @ x[j]) for j in others if y[j] == y[i]]
        if not matches:
            continue
        best = max(matches)
        beaten_by = sum(1 for j in others if y[j] != y[i] and float(x[i] @ x[j]) >= best)
        hits += beaten_by < k
    return hits / len(x)


def test_image_retrieval_matches_the_loop():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(30, 5)), rng.integers(0, 4, size=30)
    y[0] = 9  # a class with one image never retrieves a match
    out = image_retrieval(x, y, ks=(1, 5))
    assert out["i2i_R@1"] == pytest.approx(retrieval_reference(x, y, 1))
    assert out["i2i_R@5"] == pytest.approx(retrieval_reference(x, y, 5))


def test_image_retrieval_hand_checked():
    x = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
    assert image_retrieval(x, [0, 0, 1, 1], ks=(1,)) == {"i2i_R@1": 1.0}
    # queries 0 and 2 find their match third (cos 0), queries 1 and 3 second (cos 0.22, behind one of 0.99)
    assert image_retrieval(x, [0, 1, 0, 1], ks=(1, 2)) == {"i2i_R@1": 0.0, "i2i_R@2": 0.5}
    assert image_retrieval(np.ones((3, 2)), [0, 0, 1], ks=(1,)) == {"i2i_R@1": 0.0}  # ties count against


def test_report_on_the_device(device):
    model = tiny_model().to(device)
    processor = build_image_processor(tiny_settings())
    train, test = toy_data(40), toy_data(30, split="test")
    report = evaluate_clue(model, processor, test, train, probe_cs=(1.0,))
    assert report["label_column"] == "fine_label" and not report["skipped"]
    assert 0.0 <= report["linear_probe"]["top1"] <= 1.0
    assert set(report["retrieval"]) == {"i2i_R@1", "i2i_R@5"}
    assert {"cdnv_coarse_mean", "ncc_fine", "ncc_coarse"} <= set(report["granularity"])
    assert model.training  # the mode is restored
    coarse = evaluate_clue(model, processor, test, tasks=("retrieval", "linear_probe"), label_column="label")
    assert coarse["label_column"] == "label" and "linear_probe" in coarse["skipped"]
    with pytest.raises(ValueError, match="unknown tasks"):
        evaluate_clue(model, processor, test, tasks=("zero_shot",))


def test_part_maps(device, tmp_path):
    model = tiny_model(num_parts=3).to(device)
    processor = build_image_processor(tiny_settings(image_size=32))
    images = [row["image"] for row in toy_data(2)]
    maps = part_maps(model, processor, images)
    assert maps.shape == (2, 3, 4, 4)  # 32-px input, the tiny ResNet's 4 x 4 feature grid
    torch.testing.assert_close(maps.sum(1), torch.ones(2, 4, 4))
    fig = plot_part_maps(model, processor, images, tmp_path / "figures" / "parts.png")
    assert (tmp_path / "figures" / "parts.png").stat().st_size > 0
    assert len(fig.axes) == 2 * 4
