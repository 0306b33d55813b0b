"""Representational similarity analysis (DiVE, App. D, Eq. 14). The function is the `rsa` evaluate module's
(`evaluate_modules/rsa/scores.py`): one copy serves both."""

from hf_vrl.metrics.evaluate_modules.rsa.scores import rsa_score

__all__ = ["rsa_score"]
