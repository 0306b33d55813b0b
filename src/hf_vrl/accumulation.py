"""Whole-batch gradient accumulation: k micro-batches, one loss over all of them (GradCache).

Plain gradient accumulation computes the loss of each micro-batch on its own samples, so a loss that couples
the samples of a batch (CLIP's negatives, Sinkhorn's targets, DiVE's average vector) sees B samples where the
paper's batch is kB. GradCache (Gao et al., 2021, "Scaling Deep Contrastive Learning Batch Size under Memory
Limited Setup"; open_clip's ``--accum-freq``) keeps the loss of the whole batch at the memory of one
micro-batch:

    1. embed every micro-batch without gradient and keep the outputs (a few floats per sample);
    2. compute the loss over all of them, with the cached outputs as leaves: g = dL/d(output);
    3. embed each micro-batch again, with gradient, and back-propagate sum(output * g) through it.

Step 3's parameter gradient is exactly dL/d(theta) of the whole batch: the chain rule through each
micro-batch's outputs, summed. The recomputation sees the RNG state of step 1 (dropout draws the same
masks), and the module buffers (BatchNorm running statistics) are restored after step 1, so they are updated
once per micro-batch as with plain accumulation. BatchNorm itself still normalises each micro-batch with its
own statistics, as each process does under DDP.

The pieces a trainer provides (`hf_vrl.trainer.VRLTrainer`): `embed(model, chunk)` -> the outputs that carry
gradient, `loss_targets(model, chunk)` -> per-sample values computed once without gradient (a frozen or
momentum model's embeddings), and `objective(embedded, targets, batch)` -> {"loss": ...}. Outputs that are
the same for every micro-batch (the logit scale) are "shared": taken once, their gradient back-propagated
with the last micro-batch that produces them. Under DDP every micro-batch but the last runs without gradient
synchronisation, so the last one must reach every trained parameter (put the shared outputs there).

The micro-batches may live on the host: `prepare` moves one to the device when it is embedded (step 1, then
again in step 3), so the device holds the inputs of one micro-batch at a time, and `JoinedBatch` is the whole
batch the objective reads (labels, text embeddings), each entry joined and moved when it is read.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

__all__ = [
    "JoinedBatch",
    "concat_outputs",
    "own_draws",
    "preserved_buffers",
    "reseed",
    "rng_state",
    "split_batch",
    "whole_batch_backward",
]

Outputs = dict[str, Tensor]


def split_batch(batch: Mapping[str, Any], chunks: int) -> list[dict[str, Any]]:
    """`chunks` micro-batches of `batch`: each tensor (nested mappings too) cut into equal slices along dim 0.

    0-dim tensors and other values are repeated in every micro-batch. Raises when a tensor's first dimension
    is not a multiple of `chunks`.
    """
    if chunks < 1:
        raise ValueError(f"chunks must be >= 1, got {chunks}")
    out: list[dict[str, Any]] = [{} for _ in range(chunks)]
    for key, value in batch.items():
        if isinstance(value, Mapping):
            parts = split_batch(value, chunks)
        elif isinstance(value, Tensor) and value.ndim > 0:
            if value.shape[0] % chunks:
                raise ValueError(
                    f"batch entry {key!r} has {value.shape[0]} rows, not a multiple of {chunks} micro-batches"
                )
            parts = list(value.chunk(chunks))
        else:
            parts = [value] * chunks
        for chunk, part in zip(out, parts):
            chunk[key] = part
    return out


def concat_outputs(per_chunk: Sequence[Mapping[str, Tensor]], shared: Collection[str]) -> Outputs:
    """One mapping of the micro-batches' outputs: per-sample entries concatenated along dim 0 (over the
    micro-batches that produced them, in order), `shared` entries taken from the first that has them."""
    keys: list[str] = []
    for outputs in per_chunk:
        keys += [key for key in outputs if key not in keys]
    merged: Outputs = {}
    for key in keys:
        values = [outputs[key] for outputs in per_chunk if key in outputs]
        merged[key] = values[0] if key in shared else torch.cat(values)
    return merged


class JoinedBatch(Mapping):
    """The whole batch of a list of micro-batches, read lazily: `batch[key]` concatenates that entry's tensors
    along dim 0 (nested mappings join the same way; other values come from the first micro-batch that has
    them) and passes the result through `prepare` (e.g. to the device); entries never read are never
    joined."""

    def __init__(self, chunks: Sequence[Mapping[str, Any]], prepare: Callable[[Any], Any] = lambda x: x):
        self.chunks, self.prepare = list(chunks), prepare

    def __getitem__(self, key: str) -> Any:
        values = [chunk[key] for chunk in self.chunks if key in chunk]
        if not values:
            raise KeyError(key)
        if isinstance(values[0], Mapping):
            return JoinedBatch(values, self.prepare)
        if isinstance(values[0], Tensor) and values[0].ndim > 0:
            return self.prepare(torch.cat(values))
        return values[0]

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys(key for chunk in self.chunks for key in chunk))

    def __len__(self) -> int:
        return sum(1 for _ in self)


class _RNGState:
    """The CPU generator's and the current accelerator generator's state, to draw the same numbers again."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state(self.cuda, self.device)


def rng_state(device: torch.device) -> _RNGState:
    """Capture the RNG state that a forward pass on `device` draws from (`.restore()` to replay it)."""
    return _RNGState(torch.device(device))


def reseed(seed: int, device: torch.device) -> None:
    """Seed the generators a forward pass on `device` draws from (the CPU's, and that device's)."""
    device = torch.device(device)
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        index = torch.cuda.current_device() if device.index is None else device.index
        torch.cuda.default_generators[index].manual_seed(seed)


@contextlib.contextmanager
def own_draws(device: torch.device) -> Iterator[None]:
    """Leave the RNG state a forward pass on `device` draws from as it was before the block (what is drawn
    inside, after `reseed`, neither consumes nor changes the run's random stream)."""
    state = rng_state(device)
    try:
        yield
    finally:
        state.restore()


@contextlib.contextmanager
def preserved_buffers(model: nn.Module) -> Iterator[None]:
    """Leave the module buffers (BatchNorm running statistics, counters) as they were before the block."""
    saved = [(buffer, buffer.detach().clone()) for buffer in model.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in saved:
                buffer.copy_(value)


def _leaf(value: Tensor) -> Tensor:
    leaf = value.detach()
    return leaf.requires_grad_(leaf.is_floating_point())


def whole_batch_backward(
    model: nn.Module,
    chunks: Sequence[Mapping[str, Any]],
    batch: Mapping[str, Any],
    *,
    embed: Callable[[nn.Module, Mapping[str, Any]], Outputs],
    loss_targets: Callable[[nn.Module, Mapping[str, Any]], Outputs],
    objective: Callable[[Outputs, Outputs, Mapping[str, Any]], Mapping[str, Tensor]],
    backward: Callable[[Tensor], None],
    no_sync: Callable[[], contextlib.AbstractContextManager],
    shared: Collection[str] = (),
    device: torch.device | str = "cpu",
    prepare: Callable[[Mapping[str, Any]], Mapping[str, Any]] = lambda chunk: chunk,
    seed: Callable[[int], None] | None = None,
) -> dict[str, Tensor]:
    """Back-propagate `objective` over all `chunks` at the memory of one (the module docstring's steps 1-3).

    `batch` is the whole batch (what `objective` reads besides the outputs, e.g. labels; a `JoinedBatch` of
    the chunks); `backward` runs a backward pass (the Trainer's ``accelerator.backward``: loss scaling,
    DeepSpeed); `no_sync` is the DDP context without gradient synchronisation, entered for every micro-batch
    but the last; `prepare` moves a chunk to the device (once per pass over it); `seed(i)` seeds what the
    i-th chunk draws (dropout's masks), before its first pass, which its recomputation replays. Returns the
    objective's values, detached.
    """
    per_chunk_targets, states, cached = [], [], []
    with torch.no_grad():
        for index, chunk in enumerate(chunks):
            chunk = prepare(chunk)
            if seed is not None:
                seed(index)
            per_chunk_targets.append(loss_targets(model, chunk))
            states.append(rng_state(device))
            with preserved_buffers(model):  # the recomputation updates them, once per micro-batch
                cached.append(embed(model, chunk))
        after = rng_state(device)
    targets = concat_outputs(per_chunk_targets, shared)
    leaves = {key: _leaf(value) for key, value in concat_outputs(cached, shared).items()}
    with torch.enable_grad():
        values = objective(leaves, targets, batch)
        trained = {key: leaf for key, leaf in leaves.items() if leaf.requires_grad}
        grads = torch.autograd.grad(values["loss"], list(trained.values()), allow_unused=True)
    grad_of = {key: grad for key, grad in zip(trained, grads) if grad is not None}
    last_shared = {
        key: max(i for i, out in enumerate(cached) if key in out) for key in shared if key in leaves
    }
    offsets = dict.fromkeys(grad_of, 0)
    for index, (chunk, state) in enumerate(zip(chunks, states)):
        state.restore()
        sync = index == len(chunks) - 1
        with contextlib.nullcontext() if sync else no_sync():
            outputs = embed(model, prepare(chunk))
            surrogate = []
            for key, value in outputs.items():
                if key not in grad_of:
                    continue
                if key in shared:
                    if last_shared[key] == index:
                        surrogate.append((value * grad_of[key]).sum())
                    continue
                rows = slice(offsets[key], offsets[key] + value.shape[0])
                offsets[key] = rows.stop
                surrogate.append((value * grad_of[key][rows]).sum())
            if surrogate:
                backward(torch.stack([s.float() for s in surrogate]).sum())
    after.restore()
    return {key: value.detach() for key, value in values.items()}
