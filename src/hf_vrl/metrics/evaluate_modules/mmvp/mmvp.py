"""MMVP-VLM pair accuracy (Tong et al. 2024, "Eyes Wide Shut?"), the P-ability score of DiffCLIP and DCR.

A stand-alone `evaluate` metric module (it needs `evaluate`, `datasets` and `numpy`, not hf_vrl):
`evaluate.load("path/to/mmvp")`, or `hf_vrl.metrics.evaluate_module("mmvp")` for the copy shipped in hf_vrl.
It scores as the official `scripts/evaluate_vlm.py` does, with `scores.py` beside it (which `evaluate`
copies along), the very function `hf_vrl.metrics.mmvp_score` is.
"""

import datasets
import evaluate

from .scores import mmvp_score

_DESCRIPTION = """
Each MMVP pair holds two images that CLIP-like models confuse and one statement true of each. For every
statement a softmax over the pair's two images picks the first image when its probability exceeds 0.5; a
pair counts only when both statements pick their own image (the official `evaluate_vlm.py`).
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of 2x2 `float` matrices): per pair, `logits[s][i]` is the similarity of statement `s`
        with image `i`, where statement 0 describes image 0 and statement 1 image 1 (`[n_pairs, 2, 2]`).
    categories (`list` of `str`, optional): the category of each pair for the per-category breakdown (the
        official script's nine patterns by position: pair p of the 135 is in pattern p // 15).
Returns:
    accuracy (`float`): pairs with both statements right.
    mean_category_accuracy (`float`): the mean of the per-category accuracies.
    per_category (`dict`): accuracy per category ("all" without `categories`).
    statement_accuracy (`float`): statements that picked their own image.
    n_pairs (`int`): the number of pairs.
Examples:
    >>> mmvp = evaluate.load("path/to/mmvp")
    >>> mmvp.compute(predictions=[[[2.0, 1.0], [0.0, 3.0]], [[1.0, 2.0], [0.0, 3.0]]])["accuracy"]
    0.5
"""

_CITATION = """
@inproceedings{tong2024eyes,
  title = {Eyes Wide Shut? Exploring the Visual Shortcomings of Multimodal LLMs},
  author = {Tong, Shengbang and Liu, Zhuang and Zhai, Yuexiang and Ma, Yi and LeCun, Yann and Xie, Saining},
  booktitle = {CVPR},
  year = {2024}
}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class MMVP(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Array2D(shape=(2, 2), dtype="float64")}),
        )

    def _compute(self, predictions, categories=None):
        return mmvp_score(predictions, categories)
