"""Zero-shot clustering of image embeddings (DCR's D-ability, App. E.4): k-means on the L2-normalised
embeddings, scored against the class labels with NMI, Hungarian accuracy and ARI.

A stand-alone `evaluate` metric module (it needs `evaluate`, `datasets`, `numpy`, `scikit-learn` and `scipy`,
not hf_vrl): `evaluate.load("path/to/clustering")`, or `hf_vrl.metrics.evaluate_module("clustering")` for the
copy shipped in hf_vrl. Its numbers equal `hf_vrl.metrics.clustering_scores` on the same inputs.
"""

import datasets
import evaluate
import numpy as np
from scipy.optimize import linear_sum_assignment
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

_DESCRIPTION = """
k-means with one cluster per class (or `n_clusters`) on the L2-normalised embeddings, then three scores of
the clusters against the labels: normalised mutual information (NMI), the best one-to-one cluster-to-class
accuracy (ACC, Hungarian algorithm) and the adjusted Rand index (ARI). DCR (CVPR 2026) reports them as
D-ability; they need no classifier and no text tower.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `list` of `float`): one embedding per image, `[N, D]`.
    references (`list` of `int`): the class of each image.
    n_clusters (`int`, optional): number of k-means clusters; defaults to the number of classes.
    seed (`int`, optional, defaults to 0): k-means initialisation seed.
    n_init (`int`, optional, defaults to 10): k-means restarts.
Returns:
    nmi (`float`): normalised mutual information, in [0, 1].
    acc (`float`): Hungarian clustering accuracy, in [0, 1].
    ari (`float`): adjusted Rand index, in [-0.5, 1] (0 for chance).
Examples:
    >>> clustering = evaluate.load("path/to/clustering")
    >>> clustering.compute(predictions=[[1, 0], [0.9, 0.1], [0, 1], [0.1, 0.9]], references=[0, 0, 1, 1])
    {'nmi': 1.0, 'acc': 1.0, 'ari': 1.0}
"""

_CITATION = """
@inproceedings{han2026dcr,
  title = {Guiding Diffusion-based Reconstruction with Contrastive Signals for Balanced Visual
           Representation},
  author = {Han, Boyu and Xu, Qianqian and Bao, Shilong and Yang, Zhiyong and Cui, Ruochen and Zhao, Xilin and
            Huang, Qingming},
  booktitle = {CVPR},
  year = {2026}
}
"""


def _embeddings(x):
    """`[N, D]` float64 rows divided by their L2 norm (zero rows stay zero); NaN or inf refused."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"predictions must be a 2-D [N, D] matrix, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError("predictions contain NaN or inf values; check the model outputs")
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def _labels(y):
    y = np.asarray(y)
    if y.size and not np.issubdtype(y.dtype, np.integer) and not np.all(np.mod(y, 1) == 0):
        raise ValueError(f"references must hold integer class ids, got dtype {y.dtype}")
    return y.astype(np.int64)


def _hungarian_accuracy(y_true, y_pred):
    """Best one-to-one cluster-to-class matching accuracy; unmatched clusters count as errors."""
    classes, t = np.unique(y_true, return_inverse=True)
    clusters, p = np.unique(y_pred, return_inverse=True)
    counts = np.zeros((clusters.size, classes.size), dtype=np.int64)
    np.add.at(counts, (p, t), 1)
    rows, cols = linear_sum_assignment(counts, maximize=True)
    return float(counts[rows, cols].sum() / y_true.size)


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Clustering(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {
                    "predictions": datasets.Sequence(datasets.Value("float64")),
                    "references": datasets.Value("int64"),
                }
            ),
        )

    def _compute(self, predictions, references, n_clusters=None, seed=0, n_init=10):
        x, y = _embeddings(predictions), _labels(references)
        k = int(np.unique(y).size) if n_clusters is None else int(n_clusters)
        if not 1 <= k <= x.shape[0]:
            raise ValueError(f"n_clusters must lie in [1, {x.shape[0]}] (the number of samples), got {k}")
        pred = KMeans(n_clusters=k, n_init=n_init, random_state=seed).fit_predict(x)
        return {
            "nmi": float(normalized_mutual_info_score(y, pred)),
            "acc": _hungarian_accuracy(y, pred),
            "ari": float(adjusted_rand_score(y, pred)),
        }
