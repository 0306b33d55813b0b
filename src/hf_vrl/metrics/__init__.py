"""Evaluation metrics on embedding tensors/arrays: clustering, zero-shot, retrieval, probes, MMVP-VLM, RSA,
granularity (CLUE). scikit-learn and scipy (the `eval` extra) are imported on first use."""

from hf_vrl.metrics.clustering import cluster_accuracy, clustering_scores
from hf_vrl.metrics.granularity import cdnv, granularity_scores, ncc_accuracy
from hf_vrl.metrics.mmvp import MMVP_CATEGORIES, PROMPT_PREFIX, load_mmvp_vlm, mmvp_score
from hf_vrl.metrics.probe import DEFAULT_CS, few_shot_probe, linear_probe
from hf_vrl.metrics.ranking import topk_hits
from hf_vrl.metrics.retrieval import retrieval_recall
from hf_vrl.metrics.rsa import rsa_score
from hf_vrl.metrics.zero_shot import zero_shot_accuracy, zero_shot_classifier

__all__ = [
    "DEFAULT_CS",
    "MMVP_CATEGORIES",
    "PROMPT_PREFIX",
    "cdnv",
    "cluster_accuracy",
    "clustering_scores",
    "few_shot_probe",
    "granularity_scores",
    "linear_probe",
    "load_mmvp_vlm",
    "mmvp_score",
    "ncc_accuracy",
    "retrieval_recall",
    "rsa_score",
    "topk_hits",
    "zero_shot_accuracy",
    "zero_shot_classifier",
]
