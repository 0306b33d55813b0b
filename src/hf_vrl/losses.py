"""Every hf_vrl training objective, one import away."""

from .contrastive import clip_contrastive_loss
from .methods.dcr.loss import (
    dcr_logits,
    dcr_loss,
    gradient_cosine,
    joint_loss,
    reconstruction_loss,
    supervised_contrastive_loss,
)

__all__ = [
    "clip_contrastive_loss",
    "dcr_logits",
    "dcr_loss",
    "gradient_cosine",
    "joint_loss",
    "reconstruction_loss",
    "supervised_contrastive_loss",
]
