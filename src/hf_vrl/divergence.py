"""A training that turns non-finite stops at that step, with its last finite checkpoint kept (issue 37).

`VRLTrainer` checks the loss of every micro-batch it trains (the Trainer reads it on the host at each step
already, for `logging_nan_inf_filter`, so the check adds no synchronisation) and the weights before every
checkpoint is written: a NaN or inf stops training with `Diverged`, before the optimiser step of a non-finite
loss and before a checkpoint of non-finite weights, so that no such checkpoint is written and the rotation of
checkpoints never removes the finite ones for it. Every process learns the verdict at the same step (one
small all-reduce where there are several), so none waits for the others at a collective.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from hf_vrl.errors import UserError
from hf_vrl.run.layout import last_complete_checkpoint

__all__ = ["Diverged", "stop_if_not_finite"]


class Diverged(UserError):
    """Training turned non-finite (a NaN or inf loss or weight): the run stopped at that step."""


def _all_agree(bad: bool, accelerator: Any, device: torch.device) -> bool:
    """Whether any process found a non-finite value (`bad` on this one)."""
    if accelerator.num_processes == 1:
        return bad
    flag = torch.tensor(float(bad), device=device)
    return bool(accelerator.reduce(flag, reduction="sum").item() > 0)


def _weights_finite(parameters: Iterable[Tensor]) -> bool:
    checks = [p.detach().isfinite().all() for p in parameters]
    return bool(torch.stack(checks).all().item()) if checks else True


def stop_if_not_finite(
    trainer: Any, *, loss: Tensor | None = None, parameters: Iterable[Tensor] | None = None
) -> None:
    """Raise `Diverged` when the micro-batch `loss` or the model's `parameters` (checked before a checkpoint
    is written) hold a NaN or inf on any process; the message names the step, the stage's checkpoints folder
    and the newest complete checkpoint, which is the last finite one."""
    device = trainer.args.device
    bad = (loss is not None and not bool(torch.isfinite(loss).all().item())) or (
        parameters is not None and not _weights_finite(parameters)
    )
    if not _all_agree(bad, trainer.accelerator, device):
        return
    # a loss is of the step being trained, weights are checked once their step is done
    step = trainer.state.global_step + (loss is not None)
    what = f"the loss turned {_kind(loss)}" if loss is not None else "the weights turned non-finite"
    folder = Path(trainer.args.output_dir)
    kept = last_complete_checkpoint(folder)
    keeps = f"{kept} is the last checkpoint, kept" if kept else f"no checkpoint in {folder} was written"
    raise Diverged(
        f"{what} at step {step}: training stopped there and {keeps}. Lower "
        f"--learning-rate ({trainer.args.learning_rate:g} now) or add warm-up, in another --output-dir"
    )


def _kind(loss: Tensor) -> str:
    """NaN or infinite (non-finite: on another process)."""
    if bool(torch.isnan(loss).any().item()):
        return "NaN"
    return "non-finite" if bool(torch.isfinite(loss).all().item()) else "infinite"
