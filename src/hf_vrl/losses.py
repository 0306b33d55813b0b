"""Every hf_vrl training objective, one import away."""

from .contrastive import clip_contrastive_loss
from .methods.clue.loss import (
    clue_objective,
    identity_targets,
    sinkhorn,
    soft_cross_entropy,
    soft_info_nce,
    text_alignment_loss,
)
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
    "clue_objective",
    "dcr_logits",
    "dcr_loss",
    "gradient_cosine",
    "identity_targets",
    "joint_loss",
    "reconstruction_loss",
    "sinkhorn",
    "soft_cross_entropy",
    "soft_info_nce",
    "supervised_contrastive_loss",
    "text_alignment_loss",
]
