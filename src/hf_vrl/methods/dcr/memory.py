"""Memory of DCR's UNet grid: live-tensor accounting on any device and the automatic UNet chunk size.

`LiveMemory` counts the bytes of the tensors that ops create while it is active (views and in-place results
share their input's storage and are not counted twice) and records the peak, the same on the CPU and on CUDA.
`choose_chunk_size` decides how many (latent, condition) pairs one UNet call may take from the memory free on
the device and what one pair keeps (`measure_pair_memory`): all pairs in one call when the grid fits.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from hf_vrl.errors import UserError


class LiveMemory(TorchDispatchMode):
    """Bytes of the tensors created inside the `with` block that are still alive (`live`), and the `peak`."""

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self._storages: dict[int, weakref.ref] = {}

    def _release(self, key: int, nbytes: int) -> None:
        self.live -= nbytes
        self._storages.pop(key, None)

    def _track(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self._storages and self._storages[key]() is storage:
            return
        nbytes = storage.nbytes()
        self._storages[key] = weakref.ref(storage, lambda _, key=key, n=nbytes: self._release(key, n))
        self.live += nbytes
        self.peak = max(self.peak, self.live)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage()._cdata for t in tree_flatten((args, kwargs))[0] if _is_tensor(t)}
        for tensor in tree_flatten(out)[0]:
            if _is_tensor(tensor) and tensor.untyped_storage()._cdata not in inputs:
                self._track(tensor)
        return out


def _is_tensor(obj) -> bool:
    return isinstance(obj, torch.Tensor) and not obj.is_sparse


def measure_pair_memory(
    run: Callable[[torch.Tensor], torch.Tensor], conditions: torch.Tensor, passes: int | None = None
) -> tuple[int, int]:
    """(kept, transient) bytes per UNet pass: what `run(conditions)` keeps for backward, and what its
    backward adds on top, divided by the number of passes it runs (default `len(conditions)`: one pass per
    condition; a probe of two grid pairs over all the step's conditions says 2)."""
    probe = conditions.detach().requires_grad_(True)
    with LiveMemory() as memory:
        out = run(probe)
        kept = memory.live - out.untyped_storage().nbytes()
        out.float().square().mean().backward()
    pairs = passes or len(probe)
    return math.ceil(kept / pairs), math.ceil(max(memory.peak - kept, 0) / pairs)


def free_memory(device: torch.device) -> int | None:
    """Bytes the caching allocator could still hand out on a CUDA device (free + reserved-but-unused); None
    elsewhere (no limit known: the grid runs in one call)."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def choose_chunk_size(
    num_pairs: int, kept_per_pair: int, transient_per_pair: int, free_bytes: int, fraction: float = 0.9
) -> int | None:
    """UNet passes per call so that `num_pairs * kept + chunk * transient <= fraction * free_bytes`.

    None when all pairs fit in one call; otherwise the largest such chunk, evened out over the calls it needs
    (e.g. 272 pairs at most 100 a call -> 3 calls of 91). Raises `UserError` when not even one pass fits.
    """
    if min(num_pairs, kept_per_pair + transient_per_pair, free_bytes) <= 0:
        raise ValueError("num_pairs, the per-pair bytes and free_bytes must be positive")
    budget = fraction * free_bytes
    if num_pairs * (kept_per_pair + transient_per_pair) <= budget:
        return None
    room = budget - num_pairs * kept_per_pair
    if room < max(transient_per_pair, 1):
        need = (num_pairs * kept_per_pair + transient_per_pair) / 2**30
        raise UserError(
            f"the {num_pairs} UNet passes of a step need {need:.1f} GiB even one call at a time, "
            f"{budget / 2**30:.1f} GiB are free: use gradient_checkpointing 'feedforward' or 'chunks', "
            "or fewer images per step (batch size, num_negatives)"
        )
    chunk = min(num_pairs, int(room // max(transient_per_pair, 1)))
    calls = math.ceil(num_pairs / chunk)
    return math.ceil(num_pairs / calls)
