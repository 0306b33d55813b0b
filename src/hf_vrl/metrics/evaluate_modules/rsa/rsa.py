"""Representational similarity analysis (DiVE, App. D, Eq. 14; Kriegeskorte et al. 2008): how much of the
pairwise geometry of a reference model's embeddings a model keeps.

An `evaluate` module shipped inside hf_vrl: `hf_vrl.metrics.evaluate_module("rsa")`. It
computes with `hf_vrl.metrics.rsa_score`; evaluate copies this file into its module cache, so the import is
absolute.
"""

import evaluate

from hf_vrl.metrics import rsa_score
from hf_vrl.metrics.evaluate_modules import embedding_features

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
    >>> rsa = hf_vrl.metrics.evaluate_module("rsa")
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
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=embedding_features("embedding"),
        )

    def _compute(self, predictions, references):
        return {"rsa": rsa_score(references, predictions)}
