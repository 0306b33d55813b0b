"""Granularity-aware collapse metrics (CLUE §3.1): CDNV (Eq. 1-2) and nearest-class-centre accuracy (Eq. 3).
The functions are the `granularity` evaluate module's (`evaluate_modules/granularity/scores.py`): one copy
serves both."""

from hf_vrl.metrics.evaluate_modules.granularity.scores import cdnv, granularity_scores, ncc_accuracy

__all__ = ["cdnv", "granularity_scores", "ncc_accuracy"]
