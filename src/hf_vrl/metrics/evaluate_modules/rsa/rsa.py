"""Representational similarity analysis (DiVE, App. D, Eq. 14; Kriegeskorte et al. 2008): how much of the
pairwise geometry of a reference model's embeddings a model keeps.

A stand-alone `evaluate` metric module (it needs `evaluate`, `datasets`, `numpy` and `scipy`, not hf_vrl):
`evaluate.load("path/to/rsa")`, or `hf_vrl.metrics.evaluate_module("rsa")` for the copy shipped in hf_vrl.
Its number equals `hf_vrl.metrics.rsa_score(references, predictions)`.
"""

import datasets
import evaluate
import numpy as np
from scipy.spatial.distance import pdist

_DESCRIPTION = """
The Pearson correlation between the upper triangles of two cosine-distance matrices: one over the model's
embeddings of N inputs, one over a reference model's embeddings of the same N inputs (DiVE compares a
fine-tuned CLIP with the pre-trained one). 1 means the pairwise geometry is kept exactly; the embedding
widths may differ.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `list` of `float`): the model's embedding of each input, `[N, D]`.
    references (`list` of `list` of `float`): the reference model's embedding of the same inputs, `[N, D']`.
Returns:
    rsa (`float`): the RSA correlation, in [-1, 1].
Examples:
    >>> rsa = evaluate.load("path/to/rsa")
    >>> rsa.compute(predictions=[[1, 0], [0, 1], [1, 1]], references=[[2, 0], [0, 2], [2, 2]])
    {'rsa': 1.0}
"""

_CITATION = """
@inproceedings{suzuki2026dive,
  title = {Difference Vector Equalization for Robust Fine-tuning of Vision-Language Models},
  author = {Suzuki, Satoshi and Yamaguchi, Shin'ya and Takeda, Shoichiro and Yamane, Taiga and
            Makishima, Naoki and Kawata, Naotaka and Ihori, Mana and Tanaka, Tomohiro and
            Orihashi, Shota and Masumura, Ryo},
  booktitle = {AAAI},
  year = {2026}
}
"""


def _cosine_distances(x, name):
    """Upper triangle (diagonal excluded, row by row) of D_ij = 1 - cos(x_i, x_j) over the rows of `x`; a zero
    row (cosine 0/0) is at distance 1 from every row."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"{name} must be a 2-D [N, D] matrix, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError(f"{name} contain NaN or inf values; check the model outputs")
    if x.shape[0] < 3:
        raise ValueError("RSA needs at least 3 embeddings (2 pairwise distances) per set")
    return np.nan_to_num(pdist(x, "cosine"), nan=1.0)


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class RSA(evaluate.Metric):
    def _info(self):
        embedding = datasets.Sequence(datasets.Value("float64"))
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": embedding, "references": embedding}),
        )

    def _compute(self, predictions, references):
        reference = _cosine_distances(references, "references")
        model = _cosine_distances(predictions, "predictions")
        if np.ptp(reference) == 0 or np.ptp(model) == 0:
            raise ValueError(
                "a cosine-distance matrix is constant (collapsed embeddings); Pearson r is undefined"
            )
        return {"rsa": float(np.corrcoef(reference, model)[0, 1])}
