"""DCR objectives: the DCR loss (Eq. 12) and the ablation baselines (Eq. 7, Eq. 8, Eq. 9, Eq. 11).

Paper: "Guiding Diffusion-based Reconstruction with Contrastive Signals for Balanced Visual Representation"
(DCR, arXiv 2603.04803).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _flat_unit(x: torch.Tensor, start_dim: int) -> torch.Tensor:
    """Flatten trailing dims from `start_dim` and L2-normalise them (cosine similarity as a dot product)."""
    return F.normalize(x.flatten(start_dim).float(), dim=-1)


def _anchor_columns(pred: torch.Tensor, anchor_index: int | torch.Tensor | None) -> torch.Tensor:
    """Column of the anchor in each row of `pred` as a `[B]` long tensor (default: the diagonal)."""
    batch, columns = pred.shape[:2]
    if anchor_index is None:
        if columns != batch:
            raise ValueError(
                f"pred has shape [B={batch}, {columns}, ...]: without anchor_index it must be [B, B, ...] "
                "with the anchor on the diagonal; pass anchor_index for subsampled negatives"
            )
        return torch.arange(batch, device=pred.device)
    index = torch.as_tensor(anchor_index, device=pred.device, dtype=torch.long).expand(batch)
    if (index < 0).any() or (index >= columns).any():
        raise ValueError(f"anchor_index must lie in [0, {columns}), got {index.tolist()}")
    return index


def dcr_logits(
    pred: torch.Tensor,
    pred_pos: torch.Tensor,
    target: torch.Tensor,
    temperature: float = 0.1,
    anchor_index: int | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Similarity logits of Eq. 12: `(positives [B, 2], negatives [B, M-1])`, each sim(anchor, .)/tau.

    `pred[i, j]` is the prediction from image i's noisy latent under image j's condition; the anchor of row i
    is `pred[i, anchor_index[i]]` (diagonal by default) and the other columns are its negatives. `pred_pos[i]`
    is the prediction under the augmented view's condition and `target[i]` the ground-truth diffusion target;
    they form the positive set P = {eps_hat+, eps_gt}.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if pred.dim() < 3 or pred_pos.shape != target.shape or pred.shape[0] != pred_pos.shape[0]:
        raise ValueError(
            f"expected pred [B, M, ...] and pred_pos/target [B, ...] with matching trailing dims, got "
            f"{tuple(pred.shape)}, {tuple(pred_pos.shape)}, {tuple(target.shape)}"
        )
    if pred.shape[2:] != target.shape[1:]:
        raise ValueError(
            f"pred trailing dims {tuple(pred.shape[2:])} differ from target's {tuple(target.shape[1:])}"
        )
    anchors = _anchor_columns(pred, anchor_index)
    rows = torch.arange(pred.shape[0], device=pred.device)
    cand = _flat_unit(pred, 2)  # [B, M, D]
    anchor = cand[rows, anchors]  # [B, D]
    positives = torch.stack([_flat_unit(pred_pos, 1), _flat_unit(target, 1)], dim=1)  # [B, 2, D]
    pos_logits = torch.einsum("bd,bkd->bk", anchor, positives) / temperature
    all_logits = torch.einsum("bd,bmd->bm", anchor, cand) / temperature
    keep = torch.ones_like(all_logits, dtype=torch.bool)
    keep[rows, anchors] = False
    neg_logits = all_logits[keep].view(pred.shape[0], pred.shape[1] - 1)
    return pos_logits, neg_logits


def dcr_loss(
    pred: torch.Tensor,
    pred_pos: torch.Tensor,
    target: torch.Tensor,
    temperature: float = 0.1,
    anchor_index: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """DCR loss, Eq. 12, averaged over the batch (Algorithm 1, line 20).

    L_i = -1/2 sum_{p in P} log( d(a_i, p) / sum_{c in P u N} d(a_i, c) ),  d(u, v) = exp(cos(u, v) / tau),
    with one denominator over both positives and all negatives (computed with logsumexp).

    Shapes: `pred [B, M, ...]` (M = B with the anchor on the diagonal, or M = 1 + K subsampled negatives with
    `anchor_index` naming the anchor column, an int or a `[B]` tensor), `pred_pos` and `target` `[B, ...]`.
    """
    pos_logits, neg_logits = dcr_logits(pred, pred_pos, target, temperature, anchor_index)
    log_denominator = torch.logsumexp(torch.cat([pos_logits, neg_logits], dim=1), dim=1)
    return (log_denominator - pos_logits.mean(dim=1)).mean()


def reconstruction_loss(pred: torch.Tensor, target: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
    """L_rec, Eq. 8: E ||eps_theta - eps_gt||_2^2, the squared error between prediction and diffusion target.

    `"sum"` (Eq. 8): the squared L2 norm over each sample's values, averaged over the batch. `"mean"`: the
    mean over every value (DIVA's `F.mse_loss`), i.e. the `"sum"` loss divided by the D values per sample.
    """
    if reduction not in ("sum", "mean"):
        raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")
    squared = (pred.float() - target.float()).square()
    if reduction == "mean":
        return squared.mean()
    return squared.flatten(1).sum(dim=1).mean()


def supervised_contrastive_loss(
    features: torch.Tensor, labels: torch.Tensor, temperature: float = 0.1
) -> torch.Tensor:
    """L_con, Eq. 7: for each i, -log( sum_{j in P(i)} e^{sim_ij/tau} / sum_{k != i} e^{sim_ik/tau} ), batch
    mean.

    P(i) = {j != i : y_j = y_i}. Anchors without any positive are left out of the mean; at least one is
    needed.
    """
    if features.dim() != 2 or labels.shape != features.shape[:1]:
        raise ValueError(
            f"expected features [N, D] and labels [N], got {tuple(features.shape)}, {tuple(labels.shape)}"
        )
    z = F.normalize(features.float(), dim=-1)
    logits = z @ z.T / temperature
    eye = torch.eye(len(z), dtype=torch.bool, device=z.device)
    positive = (labels[:, None] == labels[None, :]) & ~eye
    has_positive = positive.any(dim=1)
    if not has_positive.any():
        raise ValueError("supervised_contrastive_loss: no sample has a positive (every label is unique)")
    others = logits.masked_fill(eye, float("-inf"))
    log_num = torch.logsumexp(others.masked_fill(~positive, float("-inf")), dim=1)
    log_den = torch.logsumexp(others, dim=1)
    return (log_den - log_num)[has_positive].mean()


def joint_loss(
    loss_con: torch.Tensor, loss_rec: torch.Tensor, lambda_con: float = 1.0, lambda_rec: float = 1.0
) -> torch.Tensor:
    """The naive combination L_joint = lambda_con * L_con + lambda_rec * L_rec, Eq. 9."""
    return lambda_con * loss_con + lambda_rec * loss_rec


def gradient_cosine(
    loss_a: torch.Tensor,
    loss_b: torch.Tensor,
    features: torch.Tensor,
    rows: slice | torch.Tensor | None = None,
) -> torch.Tensor:
    """cos(g_a, g_b) with g = d loss / d z, Eq. 11 (the gradient-conflict diagnostic of §4.1).

    `rows` picks the rows of `features` that are the shared representation z (default: all); rows only one
    loss depends on would add to one norm and nothing to the dot product. Keeps the graph so the caller can
    still backpropagate either loss. Returns NaN when a gradient is zero.
    """
    grad_a = torch.autograd.grad(loss_a, features, retain_graph=True, allow_unused=True)[0]
    grad_b = torch.autograd.grad(loss_b, features, retain_graph=True, allow_unused=True)[0]
    if grad_a is None or grad_b is None:
        return torch.tensor(float("nan"), device=features.device)
    if rows is not None:
        grad_a, grad_b = grad_a[rows], grad_b[rows]
    grad_a, grad_b = grad_a.flatten().float(), grad_b.flatten().float()
    denominator = grad_a.norm() * grad_b.norm()
    if denominator == 0:
        return torch.tensor(float("nan"), device=features.device)
    return (grad_a @ grad_b / denominator).detach()
