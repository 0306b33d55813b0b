"""CLUE's objectives (§4, Eq. 4-8): Sinkhorn-Knopp soft targets, soft-InfoNCE at the global and part levels,
text alignment, and their weighted sum.

Notation of the paper: a batch of m images seen in two views; S = Z^T Z' the similarities of the two views'
embeddings, D(.) the row-wise softmax with temperature tau, A the soft assignment (doubly stochastic) from
Sinkhorn-Knopp on the similarities of *backbone* features. With the momentum encoder (ReSA, CLUE §5.1) the
rows are the online branch's predictions and the columns the momentum branch's projections; over several
processes the columns (momentum features, no gradient) are all-gathered before Sinkhorn, as ReSA does, and
every process computes the rows of its own samples.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from hf_vrl.contrastive import _resolve_world, gather_features

__all__ = [
    "clue_objective",
    "identity_targets",
    "sinkhorn",
    "soft_cross_entropy",
    "soft_info_nce",
    "text_alignment_loss",
]


def _all_rows_logsumexp(log_q: Tensor, world_size: int) -> Tensor:
    """log sum_i exp(log_q[i, j]) over the rows of every process: `[1, K]`."""
    local = torch.logsumexp(log_q, dim=0, keepdim=True)
    if world_size == 1:
        return local
    slots = [torch.empty_like(local) for _ in range(world_size)]
    dist.all_gather(slots, local.contiguous())
    return torch.logsumexp(torch.cat(slots), dim=0, keepdim=True)


@torch.no_grad()
def sinkhorn(
    scores: Tensor,
    n_iters: int = 3,
    epsilon: float = 0.05,
    *,
    rank: int | None = None,
    world_size: int | None = None,
) -> Tensor:
    """Soft assignment A by Sinkhorn-Knopp (CLUE §4.1, ReSA's `sinkhorn_knopp`), in the log domain.

    `scores` `[n, K]`: similarities of n samples (rows) to K columns. Starting from exp(scores / epsilon),
    each iteration scales the columns to sum to n_total / K and then the rows to sum to 1, so the result has
    rows summing to exactly 1 and columns summing to n_total / K (1 for a square batch: doubly stochastic) up
    to the convergence of `n_iters` iterations. Over several processes, `scores` holds this process's rows
    against the gathered columns (`[n_local, K]`, n_total = world_size * n_local) and the column sums run over
    all processes. Computed in float32 (or float64) whatever the input dtype, in log space: no overflow at
    small epsilon or in half precision. Returns float32 (float64 for float64 input); no gradient.
    """
    if n_iters < 1:
        raise ValueError(f"sinkhorn needs n_iters >= 1, got {n_iters}")
    if epsilon <= 0:
        raise ValueError(f"sinkhorn needs epsilon > 0, got {epsilon}")
    if scores.dim() != 2:
        raise ValueError(f"scores must be a [n, K] matrix, got shape {tuple(scores.shape)}")
    _, world_size = _resolve_world(rank, world_size)
    log_q = scores.to(torch.promote_types(scores.dtype, torch.float32)) / epsilon
    n_total, n_cols = scores.shape[0] * world_size, scores.shape[1]
    log_col_mass, log_row_mass = math.log(n_cols), math.log(n_total)
    for _ in range(n_iters):
        log_q = log_q - _all_rows_logsumexp(log_q, world_size) - log_col_mass  # columns: 1/K each
        log_q = log_q - torch.logsumexp(log_q, dim=1, keepdim=True) - log_row_mass  # rows: 1/n each
    return (log_q + log_row_mass).exp()


def soft_cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """-1/n sum_i sum_j A_ij log D(logits)_ij: the cross-entropy of the row-softmax against soft targets A."""
    if logits.shape != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} differ in shape")
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # half precision: float32 softmax
    return -(targets * F.log_softmax(logits, dim=-1)).sum(dim=-1).mean()


def soft_info_nce(
    similarity: Tensor, targets: Tensor, temperature: float, *, similarity_t: Tensor | None = None
) -> Tensor:
    """Soft-InfoNCE (CLUE Eq. 5; Eq. 6 on part descriptors): 1/2 [CE(D(S), A) + CE(D(S^T), A)].

    Eq. 5 writes the second direction as sum_ij A_ji log D(S^T)_ji, i.e. the row-softmax of S^T against A
    itself. With a momentum encoder the two directions are two matrices (ReSA): `similarity` = online view 1
    x momentum view 2 and `similarity_t` = online view 2 x momentum view 1, both with A as target; without
    `similarity_t` the transpose of a square `similarity` is used. With A = I this is InfoNCE (Eq. 4).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if similarity_t is None:
        if similarity.shape[0] != similarity.shape[1]:
            raise ValueError(
                f"a [{similarity.shape[0]}, {similarity.shape[1]}] similarity has no square transpose: pass "
                "similarity_t (the second direction) explicitly"
            )
        similarity_t = similarity.T
    return 0.5 * (
        soft_cross_entropy(similarity / temperature, targets)
        + soft_cross_entropy(similarity_t / temperature, targets)
    )


def identity_targets(n_rows: int, *, rank: int = 0, world_size: int = 1, device=None) -> Tensor:
    """The hard targets of InfoNCE (Eq. 4): row i of this process is its own sample, column rank * n + i."""
    targets = torch.zeros(n_rows, n_rows * world_size, device=device)
    targets[:, rank * n_rows : (rank + 1) * n_rows] = torch.eye(n_rows, device=device)
    return targets


def text_alignment_loss(
    image_embeds: Tensor,
    text_embeds: Tensor,
    temperature: float,
    *,
    rank: int | None = None,
    world_size: int | None = None,
) -> Tensor:
    """CLUE Eq. 7: -1/m sum_i log softmax_j(<v_i, t_j> / tau_t)_i, both L2-normalised.

    The frozen text embeddings t are all-gathered (no gradient is needed: the text encoder is frozen), so
    every process scores its own images against the texts of the global batch; the mean over processes is
    the loss of the global batch. Identical descriptions (equal t_j) share their logits, which leaves the
    value and gradient of Eq. 7 those of a target spread evenly over them.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    rank, world_size = _resolve_world(rank, world_size)
    image = F.normalize(image_embeds, dim=-1)
    text = F.normalize(text_embeds.to(image.dtype), dim=-1)
    _, all_text = gather_features(text, text, gather_with_grad=False, rank=rank, world_size=world_size)
    logits = image @ all_text.T / temperature
    labels = torch.arange(image.shape[0], device=image.device) + rank * image.shape[0]
    return F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), labels)


def _gathered(x: Tensor, rank: int, world_size: int) -> Tensor:
    """`x` of every process (no gradient), L2-normalised."""
    x = F.normalize(x.detach(), dim=-1)
    return gather_features(x, x, gather_with_grad=False, rank=rank, world_size=world_size)[0]


def clue_objective(
    online: Mapping[str, Tensor | None],
    momentum: Mapping[str, Tensor | None],
    *,
    text_embeds: Tensor | None = None,
    alpha: float = 1.0,
    beta: float = 1.0,
    gamma: float = 1.0,
    targets: str = "sinkhorn",
    temperature: float = 0.4,
    part_temperature: float = 0.4,
    text_temperature: float = 0.1,
    sinkhorn_iterations: int = 3,
    sinkhorn_epsilon: float = 0.05,
    rank: int | None = None,
    world_size: int | None = None,
) -> dict[str, Tensor]:
    """CLUE Eq. 8: alpha L_global + beta L_local + gamma L_text, with their parts, for one batch in two views.

    `online` / `momentum` hold the model's outputs on views `[B, 2, ...]` (`features` h, `embeddings`,
    `part_descriptors`; online `text_embeds`); `text_embeds` `[B, D_t]` are the frozen description embeddings.
    A comes from Sinkhorn on h_online . h_momentum^T of the weak view (index 0; detached, L2-normalised;
    `targets="sinkhorn"`) or is the identity (`targets="identity"`: InfoNCE, Table 2 #1). A term with weight 0
    is not computed. Returns {"loss", "loss_global", "loss_local", "loss_text", "target_self_weight"}
    (the terms computed; `target_self_weight` = the mean weight A gives a sample's own column).
    """
    rank, world_size = _resolve_world(rank, world_size)
    n = online["features"].shape[0]
    if targets == "sinkhorn":
        anchors = F.normalize(online["features"][:, 0].detach(), dim=-1)
        assign = sinkhorn(
            anchors @ _gathered(momentum["features"][:, 0], rank, world_size).T,
            sinkhorn_iterations,
            sinkhorn_epsilon,
            rank=rank,
            world_size=world_size,
        )
    elif targets == "identity":
        assign = identity_targets(n, rank=rank, world_size=world_size, device=online["features"].device)
    else:
        raise ValueError(f"targets must be 'sinkhorn' or 'identity', got {targets!r}")
    terms: dict[str, Tensor] = {}
    levels = (
        ("global", "embeddings", alpha, temperature),
        ("local", "part_descriptors", beta, part_temperature),
    )
    for name, key, weight, tau in levels:
        if weight == 0:
            continue
        rows = F.normalize(online[key].flatten(2), dim=-1)
        cols = [_gathered(momentum[key][:, v].flatten(1), rank, world_size) for v in (0, 1)]
        terms[name] = soft_info_nce(rows[:, 0] @ cols[1].T, assign, tau, similarity_t=rows[:, 1] @ cols[0].T)
    if gamma != 0:
        if text_embeds is None or online.get("text_embeds") is None:
            raise ValueError(
                "the text term (gamma > 0) needs description embeddings and a model with a text head"
            )
        per_view = [
            text_alignment_loss(view, text_embeds, text_temperature, rank=rank, world_size=world_size)
            for view in online["text_embeds"].unbind(dim=1)
        ]
        terms["text"] = sum(per_view) / len(per_view)
    if not terms:
        raise ValueError("every term of Eq. 8 has weight 0: set alpha, beta or gamma above 0")
    weights = {"global": alpha, "local": beta, "text": gamma}
    out = {"loss": sum(weights[name] * value for name, value in terms.items())}
    out.update({f"loss_{name}": value for name, value in terms.items()})
    out["target_self_weight"] = assign[:, rank * n : (rank + 1) * n].diagonal().mean()
    return out
