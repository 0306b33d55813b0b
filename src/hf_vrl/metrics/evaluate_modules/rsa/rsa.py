"""Representational similarity analysis (DiVE, App. D, Eq. 14; Kriegeskorte et al. 2008): how much of the
pairwise geometry of a reference model's embeddings a model keeps.

A stand-alone `evaluate` metric module (it needs `evaluate`, `datasets`, `numpy` and `scipy`, not hf_vrl):
`evaluate.load("path/to/rsa")`, or `hf_vrl.metrics.evaluate_module("rsa")` for the copy shipped in hf_vrl.
The computation is `scores.py` beside it (copied along by `evaluate`), which
`hf_vrl.metrics.rsa_score(references, predictions)` is too.
"""

import datasets
import evaluate

from .scores import rsa_score

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
        return {"rsa": rsa_score(references, predictions)}
