"""Figures, grouped by what they show: embedding geometry, benchmark results (attention maps to come).

Figures are built with matplotlib's object API on the Agg canvas (no pyplot, no global backend switch), so
they render headless and never open windows. Each `plot_*` returns the `Figure` and writes a PNG when given
`path`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

# -- shared ----------------------------------------------------------------------------------------


def new_figure(width: float, height: float, dpi: int = 100) -> Any:
    """A matplotlib `Figure` of `width` x `height` inches on its own Agg canvas (no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def _palette(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i) for i in range(n)]


def save_figure(fig: Any, path: str | Path) -> Path:
    """Write `fig` as a PNG (parent folders are created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", bbox_inches="tight")
    return path


# -- embedding geometry ----------------------------------------------------------------------------


def project_2d(embeddings: Any, method: str = "pca", seed: int = 0) -> np.ndarray:
    """`[N, 2]` projection of L2-normalised embeddings with PCA or t-SNE (scikit-learn)."""
    from hf_vrl.metrics._common import as_matrix, l2_normalize

    x = l2_normalize(as_matrix(embeddings))
    if x.shape[0] < 3:
        raise ValueError(f"a 2-D projection needs at least 3 embeddings, got {x.shape[0]}")
    if method == "pca":
        from sklearn.decomposition import PCA

        if x.shape[1] < 2:
            raise ValueError("PCA to 2-D needs embeddings of dimension >= 2")
        return PCA(n_components=2, random_state=seed).fit_transform(x)
    if method == "tsne":
        from sklearn.manifold import TSNE

        perplexity = float(min(30, max(1, (x.shape[0] - 1) // 3)))
        return TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=seed).fit_transform(x)
    raise ValueError(f"unknown projection {method!r}; use 'pca' or 'tsne'")


def plot_embedding_scatter(
    embeddings: Any,
    labels: Any = None,
    *,
    class_names: Sequence[str] | None = None,
    method: str = "pca",
    title: str | None = None,
    path: str | Path | None = None,
    seed: int = 0,
) -> Any:
    """2-D scatter of embeddings coloured by class (legend up to 20 classes, colour bar beyond)."""
    xy = project_2d(embeddings, method=method, seed=seed)
    fig = new_figure(6.5, 5.5)
    ax = fig.add_subplot()
    if labels is None:
        ax.scatter(xy[:, 0], xy[:, 1], s=8, alpha=0.7)
    else:
        y = np.asarray(labels)
        classes = np.unique(y)
        if classes.size <= 20:
            for color, c in zip(_palette(classes.size), classes):
                name = class_names[c] if class_names is not None and 0 <= c < len(class_names) else str(c)
                mask = y == c
                ax.scatter(xy[mask, 0], xy[mask, 1], s=8, alpha=0.7, color=color, label=name)
            ax.legend(fontsize=7, markerscale=2, loc="best", frameon=False)
        else:
            points = ax.scatter(xy[:, 0], xy[:, 1], c=y, s=8, alpha=0.7, cmap="viridis")
            fig.colorbar(points, ax=ax, label="class id")
    ax.set_xlabel(f"{method.upper()} 1")
    ax.set_ylabel(f"{method.upper()} 2")
    ax.set_title(title or f"embeddings ({method.upper()})")
    if path is not None:
        save_figure(fig, path)
    return fig


# -- benchmark results -----------------------------------------------------------------------------


def plot_mmvp_categories(
    mmvp_report: dict[str, Any], *, title: str | None = None, path: str | Path | None = None
) -> Any:
    """Horizontal bars of MMVP pair accuracy (%) per category, with the mean as a dashed line."""
    per_category = mmvp_report["per_category"]
    names = list(per_category)
    values = [100.0 * per_category[n] for n in names]
    fig = new_figure(7.0, 0.45 * len(names) + 1.5)
    ax = fig.add_subplot()
    ax.barh(names, values, color="tab:blue")
    mean = 100.0 * mmvp_report["mean_category_accuracy"]
    ax.axvline(mean, color="tab:red", linestyle="--", label=f"mean {mean:.1f}%")
    for i, v in enumerate(values):
        ax.text(v + 1, i, f"{v:.1f}", va="center", fontsize=8)
    ax.set_xlim(0, 105)
    ax.invert_yaxis()
    ax.set_xlabel("pair accuracy (%)")
    ax.set_title(title or f"MMVP ({mmvp_report['n_pairs']} pairs)")
    ax.legend(loc="lower right", frameon=False)
    if path is not None:
        save_figure(fig, path)
    return fig
