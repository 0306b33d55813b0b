"""The paper metrics as `evaluate` modules: each loads offline by path (from a module cache of its own) and
computes what `hf_vrl.metrics` computes, in one call or batch by batch, and they combine."""

from __future__ import annotations

import sys

import evaluate
import numpy as np
import pytest
import torch

from hf_vrl import metrics
from hf_vrl.errors import UserError


@pytest.fixture(scope="module")
def load(tmp_path_factory):
    """`evaluate.load` of an hf_vrl module, evaluate's module and results caches in a temporary folder."""
    root = tmp_path_factory.mktemp("evaluate")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(evaluate.config, "HF_MODULES_CACHE", root / "modules")
        patch.setattr(sys, "path", list(sys.path))  # evaluate appends its module cache to sys.path
        yield lambda name: metrics.evaluate_module(name, cache_dir=str(root / "results"))


@pytest.fixture(scope="module")
def blobs():
    """Embeddings of 4 fine classes in 2 coarse classes, 15 samples each, around well separated centres."""
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(4, 8)) * 4
    fine = np.repeat(np.arange(4), 15)
    return (centres[fine] + rng.normal(size=(60, 8))).astype(np.float32), fine, fine // 2


def test_every_module_is_shipped_and_named(load):
    assert set(metrics.EVALUATE_MODULES) == {"clustering", "granularity", "mmvp", "rsa"}
    for name in metrics.EVALUATE_MODULES:
        module = load(name)
        assert isinstance(module, evaluate.EvaluationModule)
        assert module.name == name and module.description.strip() and module.citation.strip()


def test_evaluate_load_by_path_is_the_same_module(load, blobs, tmp_path):
    x, fine, _ = blobs
    by_path = evaluate.load(metrics.evaluate_module_path("clustering"), cache_dir=str(tmp_path))
    assert by_path.compute(predictions=x, references=fine) == load("clustering").compute(
        predictions=x, references=fine
    )


def test_clustering(load, blobs):
    x, fine, _ = blobs
    clustering = load("clustering")
    assert clustering.compute(predictions=x, references=fine) == metrics.clustering_scores(x, fine)
    for start in range(0, 60, 20):  # batch by batch, tensors in
        clustering.add_batch(
            predictions=torch.from_numpy(x[start : start + 20]), references=fine[start : start + 20]
        )
    assert clustering.compute(seed=3, n_clusters=2) == metrics.clustering_scores(
        x, fine, n_clusters=2, seed=3
    )


def test_granularity(load, blobs):
    x, fine, coarse = blobs
    granularity = load("granularity")
    assert granularity.compute(
        predictions=x, references=fine, coarse_labels=coarse
    ) == metrics.granularity_scores(x, fine, coarse)
    plain = granularity.compute(predictions=x, references=fine)
    assert plain == {"cdnv_all": metrics.cdnv(x, fine), "ncc_fine": metrics.ncc_accuracy(x, fine)}
    assert plain["ncc_fine"] == 1.0  # well separated blobs: a check that the numbers mean something


def test_rsa(load, blobs):
    x, _, _ = blobs
    rotated = x @ np.linalg.qr(np.random.default_rng(1).normal(size=(8, 8)))[0]
    noisy = x + np.random.default_rng(2).normal(size=x.shape) * 3
    rsa = load("rsa")
    assert rsa.compute(predictions=rotated, references=x)["rsa"] == pytest.approx(1.0)  # geometry kept
    assert rsa.compute(predictions=noisy, references=x) == {"rsa": metrics.rsa_score(x, noisy)}
    assert metrics.rsa_score(x, noisy) < 0.95


def test_mmvp(load):
    logits = np.random.default_rng(0).normal(size=(12, 2, 2))
    categories = ["colour", "count", "size"] * 4
    mmvp = load("mmvp")
    assert mmvp.compute(predictions=logits, categories=categories) == metrics.mmvp_score(logits, categories)
    mmvp.add_batch(predictions=logits[:5])
    mmvp.add_batch(predictions=logits[5:])
    assert mmvp.compute() == metrics.mmvp_score(logits)


def test_modules_combine(load, blobs):
    x, fine, _ = blobs
    combined = evaluate.combine([load("clustering"), load("granularity")])
    result = combined.compute(predictions=x, references=fine)
    assert result == {
        **metrics.clustering_scores(x, fine),
        "cdnv_all": metrics.cdnv(x, fine),
        "ncc_fine": 1.0,
    }


def test_an_unknown_module_names_those_that_exist():
    with pytest.raises(
        UserError, match="no evaluate module named 'accuracy'; choose one of: clustering, granularity"
    ):
        metrics.evaluate_module("accuracy")
    with pytest.raises(UserError, match="no evaluate module named"):
        metrics.evaluate_module_path("../rsa")
