"""Granularity-aware collapse metrics (CLUE §3.1): CDNV (class-distance normalised variance, Eq. 1-2) and
nearest-class-centre accuracy (NCC, Eq. 3), with the per-coarse-class breakdown when coarse labels are given.

A stand-alone `evaluate` metric module (it needs `evaluate`, `datasets`, `numpy` and `scikit-learn`, not
hf_vrl):
`evaluate.load("path/to/granularity")`, or `hf_vrl.metrics.evaluate_module("granularity")` for the copy
shipped in hf_vrl. The computation is `scores.py` beside it (copied along by `evaluate`), which
`hf_vrl.metrics` (`cdnv`, `ncc_accuracy`, `granularity_scores`) is too.
"""

import datasets
import evaluate

from .scores import cdnv, granularity_scores, ncc_accuracy

_DESCRIPTION = """
CDNV averages, over pairs of classes, the within-class variances divided by twice the squared distance of
the class centres: low values mean compact, well separated classes. NCC accuracy classifies each embedding
by its nearest class centre. With `coarse_labels` (each fine class inside one coarse class) the module also
scores CDNV within each coarse class and NCC at both levels, as CLUE measures over- and under-clustering.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `list` of `float`): one embedding per sample, `[N, D]`.
    references (`list` of `int`): the (fine) class of each sample.
    coarse_labels (`list` of `int`, optional): the coarse class of each sample.
Returns:
    cdnv_all (`float`): CDNV over the fine classes.
    ncc_fine (`float`): NCC accuracy over the fine classes.
    with `coarse_labels` also:
    cdnv_per_coarse (`dict`): per coarse class, the CDNV of the fine classes inside it (None when it holds
        fewer than two fine classes).
    cdnv_coarse_mean (`float`): the mean of the defined `cdnv_per_coarse` values (None if none is defined).
    ncc_coarse (`float`): NCC accuracy over the coarse classes.
    ncc_fine_per_coarse (`dict`): per coarse class, the fine NCC accuracy of its samples (with the global
        fine centres).
Examples:
    >>> granularity = evaluate.load("path/to/granularity")
    >>> granularity.compute(predictions=[[0, 0], [0, 1], [4, 0], [4, 1]], references=[0, 0, 1, 1])
    {'cdnv_all': 0.015625, 'ncc_fine': 1.0}
"""

_CITATION = """
@misc{clue2026,
  title = {CLUE: Fine-grained Self-supervised Learning with Multi-level Regularization},
  note = {under review},
  year = {2026}
}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Granularity(evaluate.Metric):
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

    def _compute(self, predictions, references, coarse_labels=None):
        if coarse_labels is None:
            return {
                "cdnv_all": cdnv(predictions, references),
                "ncc_fine": ncc_accuracy(predictions, references),
            }
        return granularity_scores(predictions, references, coarse_labels)
