"""Unsupervised clustering quality of an embedding: k-means, then NMI, ACC (Hungarian) and ARI. The functions
are the `clustering` evaluate module's (`evaluate_modules/clustering/scores.py`): one copy serves both."""

from hf_vrl.metrics.evaluate_modules.clustering.scores import cluster_accuracy, clustering_scores

__all__ = ["cluster_accuracy", "clustering_scores"]
