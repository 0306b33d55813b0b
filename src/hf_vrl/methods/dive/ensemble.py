"""WiSE-FT (Wortsman et al. 2022, Eq. 1; DiVE App. A): interpolate the fine-tuned and pre-trained weights.

    theta(a) = (1 - a) * theta_pre + a * theta_ft

with a chosen from {0.1, ..., 0.9} to maximise ID validation accuracy (following FLYP, as DiVE does). `a` is
the weight of the fine-tuned model, as in mlfoundations/wise-ft. Any result works: FLYP, DiVE, a baseline.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch
from torch import nn

from hf_vrl.methods.dive.settings import WISE_FT_GRID

__all__ = ["choose_wise_ft", "interpolate_weights"]


def interpolate_weights(pretrained: nn.Module, finetuned: nn.Module, alpha: float) -> nn.Module:
    """A copy of `finetuned` with every floating tensor set to (1 - alpha) * pre-trained + alpha * fine-tuned
    (integer buffers, e.g. position ids, are the fine-tuned model's); on the fine-tuned model's device."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    pre, ft = pretrained.state_dict(), finetuned.state_dict()
    if pre.keys() != ft.keys() or any(pre[k].shape != ft[k].shape for k in ft):
        raise ValueError(
            "the two models differ in architecture: WiSE-FT needs the same weights' names and shapes"
        )
    mixed = {
        key: torch.lerp(pre[key].to(value), value, alpha) if value.is_floating_point() else value
        for key, value in ft.items()
    }
    ensemble = copy.deepcopy(finetuned)
    ensemble.load_state_dict(mixed)
    return ensemble


def choose_wise_ft(
    pretrained: nn.Module,
    finetuned: nn.Module,
    score: Callable[[nn.Module], float],
    alphas: Sequence[float] = WISE_FT_GRID,
) -> tuple[float, dict[float, float], nn.Module]:
    """(best a, {a: score}, the ensemble at the best a): `score(model)` is the ID validation accuracy
    (higher is better; the smallest a wins a tie)."""
    scores = {float(a): float(score(interpolate_weights(pretrained, finetuned, a))) for a in alphas}
    best = max(scores, key=lambda a: (scores[a], -a))
    return best, scores, interpolate_weights(pretrained, finetuned, best)
