"""CLUE's documented choices: VLAD on raw or L2-normalised local descriptors (paper §4.2 vs NetVLAD's code),
the split the granularity metrics measure (paper §3: the training set), and the miniature's label-blind
describer with its shuffled control."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from clue_helpers import tiny_settings, toy_data

from hf_vrl import metrics
from hf_vrl.evaluation import encode_images
from hf_vrl.methods.clue.evaluate import evaluate_clue
from hf_vrl.methods.clue.model import build_image_processor, build_model
from hf_vrl.methods.clue.settings import CLUESettings
from hf_vrl.methods.clue.toy_describer import describe_image, describe_images


def vlad_reference(f: torch.Tensor, w: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """§4.2 for one image, with loops: alpha_uk = softmax_k(w_k . f_u + b_k), p_k = sum_u alpha_uk (f_u - c_k)
    on the descriptors f_u as given."""
    n, k = f.shape[0], c.shape[0]
    parts = torch.zeros(k, f.shape[1], dtype=torch.float64)
    for u in range(n):
        logits = [float(w[j] @ f[u] + b[j]) for j in range(k)]
        top = max(logits)
        weights = [np.exp(x - top) for x in logits]
        for j in range(k):
            parts[j] += weights[j] / sum(weights) * (f[u] - c[j])
    return parts


def test_vlad_follows_the_papers_equation_unless_asked_to_normalise():
    paper, netvlad = CLUESettings(), tiny_settings(vlad_normalize_features=True)
    assert paper.vlad_normalize_features is False  # the default is the paper's formula
    assert paper.model_config()["part_normalize_descriptors"] is False
    torch.manual_seed(0)
    model = build_model(tiny_settings()).double().eval()
    assert model.config.part_normalize_descriptors is False
    extractor = model.part_extractor
    with torch.no_grad():
        extractor.centroids.normal_()
    local = 3.0 * torch.randn(2, 5, model.config.feature_dim, dtype=torch.float64)  # norms far from 1
    with torch.no_grad():
        parts, _ = extractor(local)
        w, b, c = extractor.assignment.weight, extractor.assignment.bias, extractor.centroids
        for i in range(2):
            torch.testing.assert_close(parts[i], vlad_reference(local[i], w, b, c))
        extractor.normalize_descriptors = netvlad.vlad_normalize_features  # NetVLAD's code path
        normalised, _ = extractor(local)
        unit = torch.nn.functional.normalize(local[0], dim=-1)
        torch.testing.assert_close(normalised[0], vlad_reference(unit, w, b, c))
    assert not torch.allclose(parts, normalised)


def _flat(scores: dict) -> dict[str, float]:
    return {k: v for k, v in scores.items() if not isinstance(v, dict)}


def test_granularity_is_measured_on_the_training_split_by_default():
    assert CLUESettings().granularity_split == "train"
    torch.manual_seed(0)
    settings = tiny_settings()
    model, processor = build_model(settings).eval(), build_image_processor(settings)
    train, test = toy_data(40, "train"), toy_data(30, "test")
    report = evaluate_clue(model, processor, test, train, tasks=("granularity",))
    assert report["granularity_split"] == "train"

    def scores(rows) -> dict[str, float]:
        features = torch.nn.functional.normalize(encode_images(model, processor, rows["image"]), dim=-1)
        return _flat(metrics.granularity_scores(features, rows["fine_label"], rows["label"]))

    assert _flat(report["granularity"]) == pytest.approx(scores(train))
    on_test = evaluate_clue(model, processor, test, train, tasks=("granularity",), granularity_split="test")
    assert _flat(on_test["granularity"]) == pytest.approx(scores(test))
    assert _flat(on_test["granularity"]) != pytest.approx(_flat(report["granularity"]))
    skipped = evaluate_clue(model, processor, test, tasks=("granularity",))
    assert "granularity" in skipped["skipped"] and "granularity" not in skipped
    with pytest.raises(ValueError, match="granularity_split"):
        evaluate_clue(model, processor, test, train, tasks=("granularity",), granularity_split="val")
    with pytest.raises(Exception, match="granularity_split"):
        tiny_settings(granularity_split="val")


def test_the_describer_reads_pixels_not_labels():
    """Without made-up errors its colour and position are the scene's nearly always (read from 32-pixel
    images: anti-aliased edges can tip a colour), it never names the shape, and the error and omission rates
    are those set."""
    from hf_vrl.data.toy import shapes_dataset

    data = shapes_dataset(300, seed=0, image_size=32)
    exact = describe_images(data["image"], seed=0, colour_error=0.0, colour_omission=0.0)
    named = [f"of {a['colour']} at the {a['position']}" in t for t, a in zip(exact, data["attributes"])]
    assert np.mean(named) > 0.95
    noisy = describe_images(data["image"], seed=0)
    right = np.mean([f"of {a['colour']} " in t for t, a in zip(noisy, data["attributes"])])
    missing = np.mean(["of " not in t for t in noisy])
    assert 0.6 < right < 0.8 and 0.08 < missing < 0.22  # 15 % wrong, 15 % left out
    shapes = ("circle", "square", "triangle", "star", "cross")
    assert not any(shape in text for text in noisy for shape in shapes)
    # the same pixels give the same description whatever the labels say
    rng = np.random.default_rng(0)
    assert describe_image(data["image"][0], rng, 0.0, 0.0) == exact[0]


def test_the_shuffled_control_keeps_the_texts_and_moves_them():
    data = toy_data(60)
    texts = describe_images(data["image"], seed=3)
    shuffled = describe_images(data["image"], seed=3, shuffled=True)
    assert sorted(shuffled) == sorted(texts)  # the same descriptions ...
    assert np.mean([a == b for a, b in zip(texts, shuffled)]) < 0.5  # ... mostly on other images
    assert describe_images(data["image"], seed=3) == texts  # fixed by the seed
