"""Zero-shot clustering of image embeddings (DCR's D-ability, App. E.4): k-means on the L2-normalised
embeddings, scored against the class labels with NMI, Hungarian accuracy and ARI.

A stand-alone `evaluate` metric module (it needs `evaluate`, `datasets`, `numpy`, `scikit-learn` and `scipy`,
not hf_vrl): `evaluate.load("path/to/clustering")`, or `hf_vrl.metrics.evaluate_module("clustering")` for the
copy shipped in hf_vrl. The computation is `scores.py` beside it (copied along by `evaluate`), which
`hf_vrl.metrics.clustering_scores` is too.
"""

import datasets
import evaluate

from .scores import clustering_scores

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
        return clustering_scores(predictions, references, n_clusters=n_clusters, seed=seed, n_init=n_init)
