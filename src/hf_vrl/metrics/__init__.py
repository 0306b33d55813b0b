"""Evaluation metrics on embedding tensors/arrays: clustering, zero-shot, retrieval, probes, MMVP-VLM, RSA,
granularity (CLUE). scikit-learn and scipy (the `eval` extra) are imported on first use. The paper metrics
also ship as `evaluate` modules: `evaluate_module("clustering")` (loaded), or
`evaluate.load(evaluate_module_path("clustering"))`."""

from hf_vrl.metrics.clip_benchmark import (
    cb_retrieval_recall,
    cb_zero_shot_accuracy,
    cb_zero_shot_classifier,
)
from hf_vrl.metrics.clustering import cluster_accuracy, clustering_scores
from hf_vrl.metrics.evaluate_modules import EVALUATE_MODULES, evaluate_module, evaluate_module_path
from hf_vrl.metrics.granularity import cdnv, granularity_scores, ncc_accuracy
from hf_vrl.metrics.mmvp import MMVP_CATEGORIES, PROMPT_PREFIX, load_mmvp_vlm, mmvp_score
from hf_vrl.metrics.probe import DEFAULT_CS, TooFewSamplesError, few_shot_probe, linear_probe
from hf_vrl.metrics.ranking import topk_hits
from hf_vrl.metrics.retrieval import retrieval_recall
from hf_vrl.metrics.rsa import rsa_score
from hf_vrl.metrics.wilds import FMOW_REGIONS, macro_f1, worst_group_accuracy
from hf_vrl.metrics.zero_shot import fill_prompt, zero_shot_accuracy, zero_shot_classifier

__all__ = [
    "TooFewSamplesError",
    "DEFAULT_CS",
    "EVALUATE_MODULES",
    "FMOW_REGIONS",
    "MMVP_CATEGORIES",
    "PROMPT_PREFIX",
    "cb_retrieval_recall",
    "cb_zero_shot_accuracy",
    "cb_zero_shot_classifier",
    "cdnv",
    "cluster_accuracy",
    "clustering_scores",
    "evaluate_module",
    "evaluate_module_path",
    "few_shot_probe",
    "fill_prompt",
    "granularity_scores",
    "linear_probe",
    "macro_f1",
    "load_mmvp_vlm",
    "mmvp_score",
    "ncc_accuracy",
    "retrieval_recall",
    "rsa_score",
    "topk_hits",
    "worst_group_accuracy",
    "zero_shot_accuracy",
    "zero_shot_classifier",
]
