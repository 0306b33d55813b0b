"""Figures of viz.py: embedding scatter and MMVP bars, rendered headless."""

import numpy as np
import pytest

from hf_vrl import viz

PNG = b"\x89PNG\r\n\x1a\n"


def test_scatter_colours_classes_and_falls_back_to_a_colour_bar(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 6))
    fig = viz.plot_embedding_scatter(
        x, np.repeat([0, 1, 2, 3], 10), class_names=list("abcd"), path=tmp_path / "s.png"
    )
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list("abcd")
    assert (tmp_path / "s.png").read_bytes()[:8] == PNG
    many = viz.plot_embedding_scatter(x, np.arange(40) % 25)
    assert many.axes[0].get_legend() is None and len(many.axes) == 2  # colour bar axis
    assert viz.plot_embedding_scatter(x).axes[0].get_title() == "embeddings (PCA)"
    with pytest.raises(ValueError, match="unknown projection"):
        viz.project_2d(x, method="umap")


def test_project_2d_pca_matches_sklearn():
    from sklearn.decomposition import PCA

    x = np.random.default_rng(1).normal(size=(20, 5))
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    np.testing.assert_allclose(viz.project_2d(x), PCA(n_components=2, random_state=0).fit_transform(xn))


def test_tsne_keeps_separated_clusters_apart():
    rng = np.random.default_rng(2)
    labels = np.repeat([0, 1], 12)
    x = np.eye(8)[labels] + 0.05 * rng.normal(size=(24, 8))
    xy = viz.project_2d(x, method="tsne", seed=0)
    assert xy.shape == (24, 2) and np.isfinite(xy).all()
    centres = np.stack([xy[labels == c].mean(0) for c in (0, 1)])
    spread = max(np.linalg.norm(xy[labels == c] - centres[c], axis=1).max() for c in (0, 1))
    assert np.linalg.norm(centres[0] - centres[1]) > spread


def test_mmvp_bar_chart(tmp_path):
    report = {"per_category": {"colour": 0.5, "count": 1.0}, "mean_category_accuracy": 0.75, "n_pairs": 4}
    fig = viz.plot_mmvp_categories(report, path=tmp_path / "m.png")
    bars = fig.axes[0].patches
    assert [round(b.get_width(), 6) for b in bars] == [50.0, 100.0]
    assert (tmp_path / "m.png").read_bytes()[:8] == PNG
