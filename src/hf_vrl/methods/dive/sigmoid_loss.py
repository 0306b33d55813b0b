"""SigLIP's pairwise sigmoid loss (Zhai et al., 2023, Eq. 1), so FLYP and DiVE fine-tune SiglipModel with the
objective it was pre-trained with.

For L2-normalised image / text embeddings x_i, y_j of a batch of B pairs, t = exp(t') and bias b:

    L = -1/B * sum_i sum_j log sigmoid( z_ij * (t * x_i . y_j + b) ),   z_ij = 1 if i == j else -1

(transformers' `SiglipModel(return_loss=True)` computes the same from `logits_per_text`). Over N processes
each rank scores its own images against the gathered texts of the global batch (`gather_features`, with
gradient); the mean over ranks is the global loss and DDP's gradient averaging gives its exact gradient.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from hf_vrl.contrastive import normalised_pairs

__all__ = ["sigmoid_contrastive_loss"]


def sigmoid_contrastive_loss(
    image_embeds: Tensor,
    text_embeds: Tensor,
    logit_scale: Tensor | float,
    logit_bias: Tensor | float,
    *,
    rank: int | None = None,
    world_size: int | None = None,
) -> Tensor:
    """SigLIP loss of the local images against the (global) batch's texts; ``logit_scale`` is t = exp(t')."""
    image_embeds, _, _, all_text, rank = normalised_pairs(
        image_embeds, text_embeds, rank=rank, world_size=world_size
    )
    logits = logit_scale * image_embeds @ all_text.T + logit_bias
    batch = image_embeds.shape[0]
    signs = -torch.ones_like(logits)
    signs[
        torch.arange(batch, device=logits.device), rank * batch + torch.arange(batch, device=logits.device)
    ] = 1
    return -F.logsigmoid(signs * logits).sum(dim=-1).mean()
