"""FSDP (PyTorch's FSDP2, `fully_shard`) for models that do not fit one GPU, through `accelerate launch`.

`accelerate launch --config_file examples/accelerate/fsdp.yaml -m hf_vrl.cli train <method> ...` (or
`--use_fsdp --fsdp_version 2`) sets `ACCELERATE_USE_FSDP`; the Trainer's `Accelerator` then shards the model
when it prepares it. hf_vrl adds what the stock path lacks, around each stage (`runner.execute`):

* before training (`prepare`): FSDP2 shards parameters along dim 0 and refuses 0-dim ones, so scalar
  parameters (CLIP's `logit_scale`, temperatures) train as shape `[1]` (broadcasting is unchanged).
  accelerate 1.15 shards `model.get_input_embeddings()` as a unit of its own, which transformers raises for
  dual encoders (CLIPModel, DiffCLIPModel) and which fails for a vision tower (its patch embedding sits in an
  embeddings block already sharded): the models answer None while they train (the embeddings stay in their
  block's unit). Its default wrapping policy shards each class named in `_no_split_modules` and refuses names
  the model lacks (transformers 5 merges the sub-models' lists: a vision tower names CLIPTextEmbeddings), so
  those lists keep the present classes.
* after training (`gather`, collective): the sharded model becomes a plain module again on every process,
  with the full weights and the scalars back to shape `[]`, so the main process saves `final/` with an
  ordinary `save_pretrained` (full state dict, safetensors), evaluates and exports it alone, and the next
  stage starts from a plain model.

Checkpoints during training are accelerate's default for FSDP2, `SHARDED_STATE_DICT`: each process writes its
shard of the model and optimizer (`pytorch_model_fsdp_0/`, `optimizer_0/`, torch.distributed.checkpoint) into
the checkpoint, which `VRLTrainer` writes under `.staging/` and renames into place once every process has
written; `--resume` loads them back exactly (same values, same shards). The run folder must be on a
filesystem every process sees.
"""

from __future__ import annotations

import logging
import os

import torch
from torch import nn

from hf_vrl.errors import UserError

__all__ = ["fsdp_requested", "gather", "prepare"]

logger = logging.getLogger("hf_vrl.run")

_SCALARS = "_hf_vrl_fsdp_scalars"  # names of a module's scalar parameters trained as shape [1]
_NO_SPLIT = "_hf_vrl_fsdp_no_split"  # a module's `_no_split_modules` before `prepare` kept the present ones
_FROM_CLASS = object()  # ... when it was the class's


def fsdp_requested() -> bool:
    """Whether the launcher asked for FSDP (`accelerate launch` with an FSDP config or `--use_fsdp`);
    refuses FSDP1, which hf_vrl does not support."""
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true":
        return False
    version = os.environ.get("FSDP_VERSION", "1")
    import accelerate

    if version != "2":
        raise UserError(
            f"FSDP version {version}: hf_vrl trains with FSDP2; set `fsdp_version: 2` in the accelerate "
            "config (see examples/accelerate/fsdp.yaml) or pass --fsdp_version 2"
        )
    if not torch.cuda.is_available():
        logger.warning(
            "FSDP was asked for without a GPU: accelerate %s shards on GPU process groups only, so this CPU "
            "run trains as plain data parallel",
            accelerate.__version__,
        )
    return True


def prepare(model: nn.Module) -> nn.Module:
    """Make `model` shardable by accelerate's FSDP2 (module docstring); in place, returns it."""
    for module in model.modules():
        scalars = [
            name for name, param in module._parameters.items() if param is not None and param.ndim == 0
        ]
        for name in scalars:
            param = module._parameters[name]
            module._parameters[name] = nn.Parameter(
                param.detach().reshape(1), requires_grad=param.requires_grad
            )
        if scalars:
            setattr(module, _SCALARS, tuple(getattr(module, _SCALARS, ())) + tuple(scalars))
    present = {type(module).__name__ for module in model.modules()}
    for module in model.modules():  # accelerate wraps `_no_split_modules` and refuses a name it cannot find
        names = module.__dict__.get("_no_split_modules", getattr(type(module), "_no_split_modules", None))
        if names and not set(names) <= present:
            module.__dict__[_NO_SPLIT] = module.__dict__.get("_no_split_modules", _FROM_CLASS)
            module._no_split_modules = type(names)(name for name in names if name in present)
    for module in model.modules():
        if hasattr(module, "get_input_embeddings"):
            module.get_input_embeddings = _no_input_embeddings
    return model


def _no_input_embeddings() -> None:
    return None


def gather(model: nn.Module) -> nn.Module:
    """The trained `model` as a plain module with its full weights, on every process (a collective: every
    process calls it); a model that was not sharded is returned as it is, apart from `prepare`'s changes."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    sharded = [module for module in model.modules() if isinstance(module, FSDPModule)]
    for module in sharded:
        module.reshard()  # every parameter registered as its sharded DTensor
    full: dict[int, nn.Parameter] = {}  # tied parameters stay tied
    for module in model.modules():  # the same order on every process: the all-gathers match
        for name, param in module._parameters.items():
            if isinstance(param, DTensor):
                if id(param) not in full:
                    value = param.full_tensor().detach().clone()
                    full[id(param)] = nn.Parameter(value, requires_grad=param.requires_grad)
                module._parameters[name] = full[id(param)]
    for module in sharded:
        _strip(module)
    for module in model.modules():
        for flag in ("_is_fsdp_managed_module", "_fsdp_use_orig_params"):
            module.__dict__.pop(flag, None)
        if module.__dict__.get("get_input_embeddings") is _no_input_embeddings:
            del module.get_input_embeddings
        if _NO_SPLIT in module.__dict__:
            module.__dict__["_no_split_modules"] = module.__dict__.pop(_NO_SPLIT)
            if module.__dict__["_no_split_modules"] is _FROM_CLASS:
                del module.__dict__["_no_split_modules"]
        for name in module.__dict__.pop(_SCALARS, ()):
            param = module._parameters[name]
            module._parameters[name] = nn.Parameter(
                param.detach().reshape(()), requires_grad=param.requires_grad
            )
    return model


def _strip(module: nn.Module) -> None:
    """Undo `fully_shard` on one module: its hooks, its state and its FSDP class."""
    from torch.distributed._composable.contract import REGISTRY_KEY, STATE_KEY
    from torch.distributed._composable_state import _module_state_mapping

    state = module._get_fsdp_state()
    for handle in {
        id(h): h for h in (state._pre_forward_hook_handle, state._post_forward_hook_handle)
    }.values():
        handle.remove()
    module.__dict__.pop(STATE_KEY, None)
    module.__dict__.pop(REGISTRY_KEY, None)
    _module_state_mapping.pop(module, None)
    cls = type(module)
    module.__class__ = cls.__mro__[cls._orig_cls_mro_index]
