"""Every hf_vrl training objective, one import away."""

from .contrastive import clip_contrastive_loss

__all__ = ["clip_contrastive_loss"]
