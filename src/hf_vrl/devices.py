"""The device rule of hf_vrl, in code (see ARCHITECTURE.md, "Devices").

Every inference or evaluation helper moves its inputs to the device (and floating dtype) of the model it
calls; frozen companion models (the original CLIP of DCR's evaluation, DiVE's frozen reference, ...) move
with the model they serve. Device and dtype are never assumed: they are read off the model with these helpers.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

__all__ = ["default_device", "describe_hardware", "module_device", "module_dtype", "to_device"]


def default_device() -> torch.device:
    """Where a command runs when the user names no device: CUDA when available, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def describe_hardware(processes: int = 1) -> str:
    """What this run trains on, for its report and card: "2 × NVIDIA H100 80GB HBM3" (one device per process)
    or "CPU (16 cores), 1 process"."""
    if torch.cuda.is_available():
        return f"{processes} × {torch.cuda.get_device_name()}"
    return f"CPU ({os.cpu_count()} cores), {processes} process{'es' if processes > 1 else ''}"


def module_device(module: nn.Module) -> torch.device:
    """The device of a module's first parameter (or buffer); the CPU for a module that holds neither."""
    for tensor in (*module.parameters(), *module.buffers()):
        return tensor.device
    return torch.device("cpu")


def module_dtype(module: nn.Module) -> torch.dtype:
    """The dtype of a module's first floating-point parameter (float32 when it has none)."""
    for tensor in module.parameters():
        if tensor.is_floating_point():
            return tensor.dtype
    return torch.float32


def to_device(obj: Any, device: torch.device | str, dtype: torch.dtype | None = None) -> Any:
    """`obj` with every tensor moved to `device` (floating tensors also cast to `dtype` when given), through
    dicts (BatchEncoding and other mappings become dicts), lists and tuples; anything else as is."""
    if isinstance(obj, torch.Tensor):
        cast = dtype if dtype is not None and obj.is_floating_point() else None
        return obj.to(device=device, dtype=cast)
    if isinstance(obj, Mapping):
        return {key: to_device(value, device, dtype) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(value, device, dtype) for value in obj)
    return obj
