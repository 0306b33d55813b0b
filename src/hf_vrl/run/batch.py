"""Batch sizes, one rule for every method: what a step holds, and what each loss term sees.

* `global_batch_size` (and DiVE's B') count samples per optimiser step over all processes: the paper's
  number, the same on any process count that divides it.
* `batch_size` is the micro-batch: samples per process and forward pass, a memory setting.
* `accumulation` says what the loss sees when a process's share of the step is several micro-batches:
  `whole_batch` (GradCache, `hf_vrl.accumulation`): the loss of the whole global batch, at the memory of a
  micro-batch; `micro_batch`: the Trainer's plain accumulation, each micro-batch's loss over its own samples
  (and those the other processes hold in the same micro-step).

The Trainer sees the plan as it is: `per_device_train_batch_size` = the micro-batch (what the DataLoader
yields), `gradient_accumulation_steps` = the micro-batches per process and step, and `accumulation` (a
`VRLTrainingArguments` field) says what the loss sees over them.

With `whole_batch` the micro-batch only trades memory for passes, so a process's share that `batch_size`
does not divide is split into the largest micro-batches below `batch_size` that divide it; with
`micro_batch` it is part of the method (DCR's B^2 grid): a share `batch_size` does not divide is refused,
and a share smaller than `batch_size` (the paper's global batch on many processes) is one micro-batch, which
the run states (`describe`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hf_vrl.errors import UserError

__all__ = ["ACCUMULATION", "BatchPlan", "batchnorm_sees", "contrastive_sees", "plan_batches", "process_count"]

ACCUMULATION = ("whole_batch", "micro_batch")


@dataclass(frozen=True)
class BatchPlan:
    """How one optimiser step is laid out over processes and micro-batches."""

    micro_batch: int  # samples per process and forward pass
    processes: int
    accumulation_steps: int  # micro-batches per process and optimiser step
    accumulation: str  # whole_batch | micro_batch

    @property
    def per_process(self) -> int:
        """Samples per process and optimiser step."""
        return self.micro_batch * self.accumulation_steps

    @property
    def global_batch(self) -> int:
        """Samples per optimiser step over all processes."""
        return self.per_process * self.processes

    @property
    def loss_batch(self) -> int:
        """Samples one evaluation of a batch-coupled loss sees when it gathers every process's samples."""
        whole = self.accumulation == "whole_batch"
        return self.global_batch if whole else self.micro_batch * self.processes

    @property
    def local_loss_batch(self) -> int:
        """Samples one evaluation of a loss sees when it stays within a process (DCR's B^2 grid)."""
        return self.per_process if self.accumulation == "whole_batch" else self.micro_batch

    def describe(self, terms: dict[str, str] | None = None) -> str:
        """Lines for `--print-config` and the run log: the layout, then what each loss term sees."""
        lines = [
            f"batch: {self.micro_batch} per process and micro-batch x {self.accumulation_steps} "
            f"micro-batches ({self.accumulation} accumulation) x {self.processes} process(es) = "
            f"{self.global_batch} per optimiser step"
        ]
        lines += [f"  {name}: {what}" for name, what in (terms or {}).items()]
        return "\n".join(lines)


def process_count() -> int:
    """The processes of this launch (torchrun / accelerate set WORLD_SIZE), 1 without a launcher."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def _largest_divisor_at_most(n: int, cap: int) -> int:
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)


def plan_batches(
    batch_size: int,
    processes: int,
    *,
    global_batch_size: int | None = None,
    gradient_accumulation_steps: int | None = None,
    accumulation: str = "whole_batch",
) -> BatchPlan:
    """The `BatchPlan` of these settings on `processes` processes (the module docstring's rule); a
    `UserError` saying what to change when the global batch cannot be laid out."""
    if accumulation not in ACCUMULATION:
        raise UserError(f"accumulation must be one of {', '.join(ACCUMULATION)}; got {accumulation!r}")
    if global_batch_size is None:
        steps = gradient_accumulation_steps or 1
        return BatchPlan(batch_size, processes, steps, accumulation)
    if global_batch_size % processes:
        raise UserError(
            f"global_batch_size {global_batch_size} cannot be shared by {processes} processes: use a process "
            "count that divides it, or another global_batch_size"
        )
    share = global_batch_size // processes
    if accumulation == "micro_batch":
        if share < batch_size:  # the global batch over many processes: the share is the micro-batch
            return BatchPlan(share, processes, 1, accumulation)
        if share % batch_size:
            raise UserError(
                f"global_batch_size {global_batch_size} over {processes} process(es) is {share} per process, "
                f"not a multiple of batch_size {batch_size} (micro_batch accumulation keeps the micro-batch "
                "exact): change batch_size or the process count"
            )
        return BatchPlan(batch_size, processes, share // batch_size, accumulation)
    micro = _largest_divisor_at_most(share, batch_size)
    return BatchPlan(micro, processes, share // micro, accumulation)


def contrastive_sees(plan: BatchPlan) -> str:
    """What a contrastive loss gathered across processes (CLIP's, FLYP's) sees under `plan`."""
    where = "the whole optimiser step" if plan.accumulation == "whole_batch" else "one micro-step"
    return (
        f"{plan.loss_batch} pairs ({plan.loss_batch - 1} negatives each): every process's samples of {where}"
    )


def batchnorm_sees(plan: BatchPlan, sync: bool) -> str:
    """How many samples a BatchNorm layer normalises over under `plan` (`sync`: SyncBatchNorm, which joins the
    processes' micro-batches on GPUs), and the layout that gives it the whole step when it sees less.

    BatchNorm normalises one forward pass: under whole-batch accumulation, one micro-batch. Its statistics
    cannot cover several micro-batches at a micro-batch's memory (each layer's statistics depend on the
    earlier layers normalised with theirs, and its gradient reaches every sample it normalised), so the
    remedy is the layout: one micro-batch per process, joined by SyncBatchNorm on GPUs."""
    micro, processes = plan.micro_batch, plan.processes
    if sync and processes > 1:
        seen = (
            f"{micro * processes} samples on GPUs (a micro-batch of {micro} x {processes} processes, "
            f"SyncBatchNorm), {micro} on CPUs (each process its own)"
        )
    else:
        seen = f"{micro} samples (one micro-batch of one process)"
    if plan.accumulation_steps > 1:
        joined = " x the processes (SyncBatchNorm on GPUs)" if sync and processes > 1 else ""
        seen += (
            f"; not the step's {plan.global_batch}: --batch-size {plan.per_process} (one micro-batch per "
            f"process{joined}) gives it all, memory permitting"
        )
    return seen
