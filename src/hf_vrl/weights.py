"""hf_vrl's own weights loaded back exactly, or refused in one line.

transformers renames checkpoint keys while `from_pretrained` loads a file (5.x: `conversion_mapping.py`, e.g.
ViT's `encoder.layer.0.attention.attention.query` -> `layers.0.attention.q_proj`) and reverses the renaming
when `save_pretrained` writes one; a model's own `state_dict()` holds the new names. Two rules follow:

* `load_pretrained`: `from_pretrained`, refusing a folder any of whose tensors the model does not take, or
  that leaves a tensor of the model unset (transformers would only warn and initialise it randomly).
* `restore_weights`: a checkpoint into a model being trained (resume), through the same conversion
  (`from_pretrained` of the model's own class), then `load_state_dict(strict=True)`: a resume never continues
  on a partly loaded model.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from hf_vrl.errors import UserError

__all__ = ["check_keys", "check_state_dict", "load_pretrained", "restore_weights"]


def _keys(keys: Iterable[Any]) -> list[str]:
    return sorted(key if isinstance(key, str) else str(key[0]) for key in keys)  # mismatched: (key, shapes)


def check_keys(
    source: Any, what: str, missing: Iterable[Any], unexpected: Iterable[Any], mismatched: Iterable[Any] = ()
) -> None:
    """Refuse in one line, naming the first key of each kind, when a key of `source` does not meet `what`."""
    kinds = {
        "missing": _keys(missing),
        "unexpected": _keys(unexpected),
        "of another shape": _keys(mismatched),
    }
    found = [f"{len(keys)} {kind} (e.g. {keys[0]})" for kind, keys in kinds.items() if keys]
    if found:
        raise UserError(
            f"{source} does not fit {what}: {', '.join(found)} tensor name(s); it was written by another "
            "model or an incompatible transformers, or altered: nothing was loaded from it"
        )


def check_state_dict(model: nn.Module, state: Mapping[str, torch.Tensor], source: Any) -> None:
    """`model.load_state_dict(state, strict=True)`, a key that does not meet refused in one line."""
    own = model.state_dict()
    mismatched = [key for key in own.keys() & state.keys() if own[key].shape != state[key].shape]
    check_keys(source, type(model).__name__, own.keys() - state.keys(), state.keys() - own.keys(), mismatched)
    model.load_state_dict(state, strict=True)


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' own load report (a table of MISSING / UNEXPECTED keys): the refusal says it in a line."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


def _from_pretrained(model_class: Any, folder: str | os.PathLike, **kwargs: Any) -> tuple[Any, dict]:
    with _quiet_transformers():
        return model_class.from_pretrained(folder, output_loading_info=True, **kwargs)


def load_pretrained(
    model_class: Any, folder: str | os.PathLike, *, extra_allowed: bool = False, **kwargs: Any
) -> Any:
    """`model_class.from_pretrained(folder, **kwargs)` (a model class or an Auto class), refusing in one line
    a folder with missing, reshaped or (unless `extra_allowed`: a checkpoint of the model with a head loaded
    into its base model) unexpected tensors."""
    model, info = _from_pretrained(model_class, folder, **kwargs)
    unexpected = () if extra_allowed else info.get("unexpected_keys", ())
    check_keys(
        folder,
        type(model).__name__,
        info.get("missing_keys", ()),
        unexpected,
        info.get("mismatched_keys", ()),
    )
    return model


def restore_weights(model: nn.Module, folder: str | os.PathLike) -> None:
    """Load the weights `save_pretrained` wrote into `folder` into `model` (in place), under the names this
    transformers gives them: the file is read by `from_pretrained` of the model's class (its key conversion),
    and every tensor of `model` must come from the file, every tensor of the file must reach `model` (a part
    the class builds by default but `model` was built without, such as a ViT's pooler, is left out)."""
    from safetensors.torch import load_file
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel):
        check_state_dict(model, load_file(os.path.join(folder, "model.safetensors")), folder)
        return
    loaded, info = _from_pretrained(type(model), folder, dtype=next(model.parameters()).dtype)
    unset = set(info.get("missing_keys", ())) | {key for key, *_ in info.get("mismatched_keys", ())}
    read = {key: value for key, value in loaded.state_dict().items() if key not in unset}
    own = model.state_dict()
    unexpected = [*info.get("unexpected_keys", ()), *(read.keys() - own.keys())]
    check_keys(folder, type(model).__name__, own.keys() - read.keys(), unexpected)
    check_state_dict(model, {key: read[key] for key in own}, folder)
