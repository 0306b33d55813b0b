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
from .methods.dive.loss import (
    average_vector_loss,
    difference_vectors,
    dive_losses,
    pairwise_vector_loss,
    snd_loss,
    update_average_vector,
)
from .methods.dive.sigmoid_loss import sigmoid_contrastive_loss

__all__ = [
    "average_vector_loss",
    "clip_contrastive_loss",
    "clue_objective",
    "dcr_logits",
    "dcr_loss",
    "difference_vectors",
    "dive_losses",
    "gradient_cosine",
    "identity_targets",
    "joint_loss",
    "pairwise_vector_loss",
    "reconstruction_loss",
    "sigmoid_contrastive_loss",
    "sinkhorn",
    "snd_loss",
    "soft_cross_entropy",
    "soft_info_nce",
    "supervised_contrastive_loss",
    "text_alignment_loss",
    "update_average_vector",
]
