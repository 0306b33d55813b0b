"""DiVE's objective (Suzuki et al., AAAI 2026): difference vectors, AVL, PVL; the cosine variant; SnD's term.

For a reference image-caption batch {(x_j, t_j)} of size B', with L2-normalised embeddings of the model being
fine-tuned (f_ft, g_ft) and of the frozen pre-trained model (f_pre, g_pre):

    u(x) = f_ft(x) - f_pre(x),   v(t) = g_ft(t) - g_pre(t)                                    (Eq. 4, 5)
    m    = alpha * m_p + (1 - alpha)/B' * sum_j (u(x_j) + v(t_j)) / 2                        (Eq. 6)
    AVL  = 1/B' * sum_j ( ||u(x_j) - m||^2 + ||v(t_j) - m||^2 )                              (Eq. 7)
    PVL  = 1/B' * sum_j ||u(x_j) - v(t_j)||^2                                                (Eq. 8)
    L    = L_cl + lambda * (AVL + PVL),   lambda = 1000                                      (Eq. 9)

One average vector m is shared by the image and the text differences (Eq. 6 averages (u + v)/2 and Eq. 7
compares both to the same m). m starts at zero, is updated with the current batch before AVL uses it, and
never receives a gradient. Over several processes the batch term of Eq. 6 is the mean over the global
reference batch (an all-reduce), so every rank holds the same m.

The cosine variant (Table 7) replaces u, v in Eq. 6-8 by scalars built from f_ft . f_pre (Eq. 10, 11); see
`difference_vectors`. SnD as the paper adapts it (App. B, Eq. 12) pulls the fine-tuned image embeddings of
the reference batch onto the pre-trained ones.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from hf_vrl.contrastive import _resolve_world

__all__ = [
    "DIFFERENCES",
    "average_vector_loss",
    "difference_vectors",
    "dive_losses",
    "pairwise_vector_loss",
    "snd_loss",
    "update_average_vector",
]

DIFFERENCES = ("vector", "cosine")


def difference_vectors(finetuned: Tensor, pretrained: Tensor, difference: str = "vector") -> Tensor:
    """Per-sample differences `[B, D]` (Eq. 4/5) or `[B, 1]` (cosine variant, Eq. 10/11), in float32 or wider.

    Both inputs are L2-normalised here. ``difference="vector"``: f_ft(x) - f_pre(x). ``"cosine"``: the
    cosine distance 1 - f_ft(x) . f_pre(x). Table 7 writes the scalar as f_ft . f_pre with m from zero;
    that m would sit near 0 while every cosine starts at 1, so AVL would first pull the fine-tuned embeddings
    away from the pre-trained ones at weight 1000. Eq. 6-8 are affine in u, v and m, so 1 - cos with m from
    zero is exactly the paper's scalar with m started at 1, the value every cosine has before fine-tuning.
    """
    if difference not in DIFFERENCES:
        raise ValueError(f"difference must be one of {DIFFERENCES}, got {difference!r}")
    if finetuned.shape != pretrained.shape or finetuned.ndim != 2:
        raise ValueError(
            "finetuned and pretrained embeddings must both be [B, D]; got "
            f"{tuple(finetuned.shape)} and {tuple(pretrained.shape)}"
        )
    dtype = torch.promote_types(torch.promote_types(finetuned.dtype, pretrained.dtype), torch.float32)
    finetuned = F.normalize(finetuned.to(dtype), dim=-1)
    pretrained = F.normalize(pretrained.to(dtype), dim=-1)
    if difference == "vector":
        return finetuned - pretrained
    return 1.0 - (finetuned * pretrained).sum(dim=-1, keepdim=True)


def _global_mean(local: Tensor, *, rank: int | None, world_size: int | None) -> Tensor:
    """Mean over the rows of every process's `local` (all-reduced sums and counts); no gradient."""
    _, world_size = _resolve_world(rank, world_size)
    total = torch.cat([local.detach().sum(dim=0), local.new_tensor([local.shape[0]])])
    if world_size > 1:
        dist.all_reduce(total)
    return total[:-1] / total[-1]


def update_average_vector(
    avg_vector: Tensor,
    image_diff: Tensor,
    text_diff: Tensor,
    alpha: float = 0.99,
    *,
    rank: int | None = None,
    world_size: int | None = None,
) -> Tensor:
    """Eq. 6: m = alpha * m_p + (1 - alpha) * mean_j (u_j + v_j) / 2 over the (global) batch; detached."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    batch_mean = _global_mean((image_diff + text_diff) / 2, rank=rank, world_size=world_size)
    return alpha * avg_vector.detach().to(batch_mean) + (1.0 - alpha) * batch_mean


def average_vector_loss(image_diff: Tensor, text_diff: Tensor, avg_vector: Tensor) -> Tensor:
    """Eq. 7: mean over the batch of ||u_j - m||^2 + ||v_j - m||^2 (m is a constant)."""
    m = avg_vector.detach()
    return ((image_diff - m).pow(2).sum(dim=-1) + (text_diff - m).pow(2).sum(dim=-1)).mean()


def pairwise_vector_loss(image_diff: Tensor, text_diff: Tensor) -> Tensor:
    """Eq. 8: mean over the batch of ||u_j - v_j||^2."""
    return (image_diff - text_diff).pow(2).sum(dim=-1).mean()


def dive_losses(
    image_ft: Tensor,
    image_pre: Tensor,
    text_ft: Tensor,
    text_pre: Tensor,
    avg_vector: Tensor,
    alpha: float = 0.99,
    *,
    difference: str = "vector",
    rank: int | None = None,
    world_size: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(AVL, PVL, new m) of a reference batch (Eq. 6-8); the caller adds lambda * (AVL + PVL) (Eq. 9).

    ``avg_vector`` is m_p, the average vector of the previous batch (zeros at the start: ``[D]`` for
    ``difference="vector"``, ``[1]`` for ``"cosine"``). The returned m includes this batch, is the one AVL
    used, and has no gradient. ``rank`` / ``world_size`` default to the initialised process group; every
    process passes its local rows and gets the same m. The frozen embeddings get no gradient either.
    """
    image_diff = difference_vectors(image_ft, image_pre.detach(), difference)
    text_diff = difference_vectors(text_ft, text_pre.detach(), difference)
    if avg_vector.shape != image_diff.shape[1:]:
        raise ValueError(
            f"avg_vector must have shape {tuple(image_diff.shape[1:])} (one entry per embedding dimension, "
            f"1 for the cosine variant); got {tuple(avg_vector.shape)}"
        )
    new_avg = update_average_vector(
        avg_vector, image_diff, text_diff, alpha, rank=rank, world_size=world_size
    )
    avl = average_vector_loss(image_diff, text_diff, new_avg)
    pvl = pairwise_vector_loss(image_diff, text_diff)
    return avl, pvl, new_avg


def snd_loss(image_ft: Tensor, image_pre: Tensor) -> Tensor:
    """Eq. 12 (SnD as adapted in DiVE App. B): mean_j ||f_ft(x_j) - f_pre(x_j)||^2 on L2-normalised image
    embeddings; the caller adds lambda_snd * this to L_cl (Eq. 13, lambda_snd = 1)."""
    return difference_vectors(image_ft, image_pre.detach()).pow(2).sum(dim=-1).mean()
