"""The CLIP objective (symmetric InfoNCE) and the feature gather that makes it global across processes.

CLIP (Radford et al., 2021, Fig. 3) scores every image of a batch against every caption with the cosine
similarity times a learned multiplier ``logit_scale = 1/tau`` and applies a cross-entropy in both directions;
written out (DiVE Eq. 1, DiffCLIP §3.3), for L2-normalised embeddings u_i, v_i of a batch of B pairs:

    L = -1/(2B) sum_i [ log softmax_k(s u_i.v_k)_i + log softmax_k(s u_k.v_i)_i ],   s = logit_scale

i.e. the InfoNCE loss (van den Oord et al., 2018, Eq. 4) with the paired caption as the positive. Over N
processes the local features are all-gathered (open_clip's ``gather_features``) so the negatives are the
global batch.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "ClipLogits",
    "NormalisedPairs",
    "as_embeddings",
    "clip_contrastive_loss",
    "clip_logits",
    "gather_features",
    "normalised_pairs",
]


def as_embeddings(output) -> Tensor:
    """Return the ``[B, D]`` embedding tensor from a tensor or a ``get_*_features`` output.

    transformers 5's ``get_image_features`` / ``get_text_features`` (CLIPModel's, and hf_vrl's DiffCLIP, DCR
    and CLUE models' on 5.x) return a ``BaseModelOutputWithPooling`` whose ``pooler_output`` holds the
    projected embedding; 4.x's (and hf_vrl's models' on 4.x, which follow the installed release) return the
    tensor itself.
    """
    if isinstance(output, Tensor):
        return output
    pooled = getattr(output, "pooler_output", None)
    if isinstance(pooled, Tensor):
        return pooled
    raise TypeError(
        f"Expected a tensor or a ModelOutput with a `pooler_output` tensor, got {type(output).__name__}. "
        "Call get_image_features / get_text_features with return_dict=True (the default)."
    )


def _resolve_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Fill rank / world size from torch.distributed when it is initialised, else (0, 1)."""
    initialised = dist.is_available() and dist.is_initialized()
    if world_size is None:
        world_size = dist.get_world_size() if initialised else 1
    if rank is None:
        rank = dist.get_rank() if initialised else 0
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must lie in [0, world_size); got rank={rank}, world_size={world_size}.")
    if world_size > 1 and not initialised:
        raise RuntimeError(
            f"world_size={world_size} needs an initialised torch.distributed process group "
            "(torch.distributed.init_process_group, or run under accelerate/torchrun)."
        )
    return rank, world_size


def _all_gather_with_grad(x: Tensor) -> Tensor:
    """All-gather along dim 0 with autograd: the backward sums every rank's gradient into the local slice."""
    # torch >= 2.13 gives the functional all_gather autograd support; older versions name it *_autograd.
    gather = getattr(fc, "all_gather_single", None) or fc.all_gather_tensor_autograd
    return gather(x.contiguous(), 0, dist.group.WORLD)


def gather_features(
    image_embeds: Tensor,
    text_embeds: Tensor,
    *,
    gather_with_grad: bool = True,
    rank: int,
    world_size: int,
) -> tuple[Tensor, Tensor]:
    """Concatenate every process's ``[B, D]`` features into ``[world_size * B, D]``, in rank order.

    ``gather_with_grad=True``: a differentiable all-gather; each rank's local features receive the gradient of
    every rank's loss (summed). ``gather_with_grad=False``: ``dist.all_gather`` (no autograd) with the local
    tensor put back at slot ``rank``, so the local features keep the gradient of this rank's loss (open_clip
    restores the slot only without ``local_loss``; restoring it always keeps strictly more of the exact
    gradient). All ranks must pass the same batch size.
    """
    if world_size == 1:
        return image_embeds, text_embeds
    if gather_with_grad:
        return _all_gather_with_grad(image_embeds), _all_gather_with_grad(text_embeds)
    gathered = []
    for local in (image_embeds, text_embeds):
        slots = [torch.empty_like(local) for _ in range(world_size)]
        dist.all_gather(slots, local.detach().contiguous())
        slots[rank] = local
        gathered.append(torch.cat(slots))
    return gathered[0], gathered[1]


class ClipLogits(NamedTuple):
    """Scaled similarities and the index of each row's positive."""

    logits_per_image: Tensor  # [B_rows, B_cols]: images (rows) against texts
    logits_per_text: Tensor  # [B_rows, B_cols]: texts (rows) against images
    labels: Tensor  # [B_rows]: column of each row's paired sample


class NormalisedPairs(NamedTuple):
    """L2-normalised local embeddings, the global batch's, and this process's rank."""

    image: Tensor
    text: Tensor
    all_image: Tensor
    all_text: Tensor
    rank: int


def normalised_pairs(
    image_embeds: Tensor,
    text_embeds: Tensor,
    *,
    rank: int | None = None,
    world_size: int | None = None,
    gather_with_grad: bool = True,
) -> NormalisedPairs:
    """Check a [B, D] image / text pair, L2-normalise it and gather the global batch (`gather_features`)."""
    if image_embeds.ndim != 2 or image_embeds.shape != text_embeds.shape:
        raise ValueError(
            "image_embeds and text_embeds must both be [B, D] with the same shape; got "
            f"{tuple(image_embeds.shape)} and {tuple(text_embeds.shape)}."
        )
    rank, world_size = _resolve_world(rank, world_size)
    image_embeds = F.normalize(image_embeds, dim=-1)
    text_embeds = F.normalize(text_embeds, dim=-1)
    all_image, all_text = gather_features(
        image_embeds, text_embeds, gather_with_grad=gather_with_grad, rank=rank, world_size=world_size
    )
    return NormalisedPairs(image_embeds, text_embeds, all_image, all_text, rank)


def clip_logits(
    image_embeds: Tensor,
    text_embeds: Tensor,
    logit_scale: Tensor | float,
    *,
    rank: int | None = None,
    world_size: int | None = None,
    local_loss: bool = False,
    gather_with_grad: bool = True,
) -> ClipLogits:
    """CLIP's logits ``s * u_i . v_j`` with u, v the L2-normalised embeddings (Radford et al., 2021, Fig. 3).

    ``logit_scale`` is the multiplier s = 1/tau (``model.logit_scale.exp()``), not its log. With
    world_size > 1 the columns span the global batch; with ``local_loss`` the rows are only the local samples
    (labels offset by ``rank * B``), otherwise the rows span the global batch too.
    """
    image_embeds, text_embeds, all_image, all_text, rank = normalised_pairs(
        image_embeds, text_embeds, rank=rank, world_size=world_size, gather_with_grad=gather_with_grad
    )
    batch = image_embeds.shape[0]
    if local_loss:
        logits_per_image = logit_scale * image_embeds @ all_text.T
        logits_per_text = logit_scale * text_embeds @ all_image.T
        offset = rank * batch
    else:
        logits_per_image = logit_scale * all_image @ all_text.T
        logits_per_text = logits_per_image.T
        offset = 0
    labels = torch.arange(logits_per_image.shape[0], device=image_embeds.device) + offset
    return ClipLogits(logits_per_image, logits_per_text, labels)


def clip_contrastive_loss(
    image_embeds: Tensor,
    text_embeds: Tensor,
    logit_scale: Tensor | float,
    *,
    rank: int | None = None,
    world_size: int | None = None,
    local_loss: bool = False,
    gather_with_grad: bool = True,
) -> Tensor:
    """Symmetric CLIP / InfoNCE loss (Radford et al., 2021, Fig. 3; DiVE Eq. 1): mean of both cross-entropies.

    Embeddings are L2-normalised inside; ``logit_scale`` is the multiplier 1/tau. ``rank`` / ``world_size``
    default to the initialised torch.distributed group (else a single process). Over N processes:

    * ``local_loss=False``: every rank computes the loss of the global batch (the single-process value).
    * ``local_loss=True``: each rank computes the rows of its own samples against the global batch; the
      mean over ranks is the global loss, at 1/N of the logits.

    With ``gather_with_grad=True`` (either ``local_loss``), the local embeddings receive N times the slice of
    the global-batch gradient, so after DDP's gradient averaging the model gets exactly the global-batch
    gradient. With ``gather_with_grad=False`` they receive only this rank's own gradient (open_clip's default
    behaviour).
    """
    logits = clip_logits(
        image_embeds,
        text_embeds,
        logit_scale,
        rank=rank,
        world_size=world_size,
        local_loss=local_loss,
        gather_with_grad=gather_with_grad,
    )
    return (
        F.cross_entropy(logits.logits_per_image, logits.labels)
        + F.cross_entropy(logits.logits_per_text, logits.labels)
    ) / 2
