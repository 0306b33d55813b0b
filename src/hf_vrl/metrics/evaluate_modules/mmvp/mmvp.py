"""MMVP-VLM pair accuracy (Tong et al. 2024, "Eyes Wide Shut?"), the P-ability score of DiffCLIP and DCR.

A stand-alone `evaluate` metric module (it needs `evaluate`, `datasets` and `numpy`, not hf_vrl):
`evaluate.load("path/to/mmvp")`, or `hf_vrl.metrics.evaluate_module("mmvp")` for the copy shipped in hf_vrl.
It scores as the official `scripts/evaluate_vlm.py` does; its numbers equal `hf_vrl.metrics.mmvp_score`.
"""

import datasets
import evaluate
import numpy as np

_DESCRIPTION = """
Each MMVP pair holds two images that CLIP-like models confuse and one statement true of each. For every
statement a softmax over the pair's two images picks the first image when its probability exceeds 0.5; a
pair counts only when both statements pick their own image (the official `evaluate_vlm.py`).
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of 2x2 `float` matrices): per pair, `logits[s][i]` is the similarity of statement `s`
        with image `i`, where statement 0 describes image 0 and statement 1 image 1 (`[n_pairs, 2, 2]`).
    categories (`list` of `str`, optional): the category of each pair (MMVP's nine "Type" values) for the
        per-category breakdown.
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
        z = np.asarray(predictions, dtype=np.float64)
        if z.ndim != 3 or z.shape[1:] != (2, 2) or z.shape[0] == 0:
            raise ValueError(f"predictions must have shape [n_pairs, 2 statements, 2 images], got {z.shape}")
        cats = ["all"] * z.shape[0] if categories is None else [str(c) for c in categories]
        if len(cats) != z.shape[0]:
            raise ValueError(f"{len(cats)} categories for {z.shape[0]} pairs")
        z = z - z.max(axis=2, keepdims=True)  # softmax over the pair's two images, per statement
        probs = np.exp(z) / np.exp(z).sum(axis=2, keepdims=True)
        picks_first = probs[:, :, 0] > 0.5  # a tie goes to image 1, as in the official script
        statement_ok = picks_first == np.array([True, False])
        pair_ok = statement_ok.all(axis=1)
        cat_arr = np.asarray(cats)
        per_category = {c: float(pair_ok[cat_arr == c].mean()) for c in dict.fromkeys(cats)}
        return {
            "accuracy": float(pair_ok.mean()),
            "mean_category_accuracy": float(np.mean(list(per_category.values()))),
            "per_category": per_category,
            "statement_accuracy": float(statement_ok.mean()),
            "n_pairs": int(z.shape[0]),
        }
