"""Best-epoch selection on the ID validation set, the paper's early stopping (§5.2: "early stopping on the
basis of the ID validation performance"), with a save policy that keeps what it selects.

`BestEpoch` scores the model at the end of every epoch (`score(model) -> float`, DiVE's: zero-shot top-1 on
the `val_size` rows held out of training) and, when the score beats every earlier epoch's, writes the
weights to `folder` (safetensors, with `best_epoch.json`: epoch, step, score, every epoch's score), atomically
and apart from the Trainer's rotating checkpoints, so `save_total_limit` never deletes the selected epoch. A
resumed run reads `best_epoch.json` back and goes on comparing with it. `restore(model)` loads the selected
weights at the end of training. Every process scores (the same rows, the same number); the main process
writes. Not for FSDP-sharded models (the run gathers them only after the stage).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import TrainerCallback

__all__ = ["BestEpoch"]

WEIGHTS, RECORD = "model.safetensors", "best_epoch.json"


class BestEpoch(TrainerCallback):
    def __init__(
        self,
        score: Callable[[nn.Module], float],
        folder: str | Path,
        unwrap: Callable[[nn.Module], nn.Module] = lambda m: m,
    ) -> None:
        self.score, self.folder, self.unwrap = score, Path(folder), unwrap
        record = self.folder / RECORD
        self.record: dict[str, Any] = (
            json.loads(record.read_text()) if record.is_file() else {"best": None, "scores": {}}
        )

    @property
    def best(self) -> float | None:
        return None if self.record["best"] is None else self.record["best"]["score"]

    def on_epoch_end(
        self, args: Any, state: Any, control: Any, model: nn.Module | None = None, **kwargs: Any
    ):
        if model is None:
            return control
        model = self.unwrap(model)
        epoch = round(float(state.epoch or 0))
        score = float(self.score(model))
        self.record["scores"][str(epoch)] = score
        improved = self.best is None or score > self.best
        if improved:
            self.record["best"] = {"epoch": epoch, "step": int(state.global_step), "score": score}
        if state.is_world_process_zero:
            self._write(model if improved else None)
        return control

    def _write(self, model: nn.Module | None) -> None:
        from safetensors.torch import save_file

        from hf_vrl.run.layout import atomic_dir

        previous = self.folder / WEIGHTS
        with atomic_dir(self.folder) as staging:
            if model is not None:
                weights = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
                save_file(_untied(weights), str(staging / WEIGHTS))
            elif previous.is_file():
                (staging / WEIGHTS).write_bytes(previous.read_bytes())
            (staging / RECORD).write_text(json.dumps(self.record, indent=2) + "\n")

    def restore(self, model: nn.Module) -> dict[str, Any] | None:
        """Load the selected epoch's weights into `model` (in place); returns the record, None when no epoch
        was scored."""
        from safetensors.torch import load_file

        from hf_vrl.weights import check_state_dict

        weights = self.folder / WEIGHTS
        if self.record["best"] is None or not weights.is_file():
            return None
        check_state_dict(model, load_file(str(weights)), weights)
        return self.record


def _untied(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Clone tensors that share storage (safetensors refuses tied weights)."""
    seen: set[int] = set()
    out = {}
    for name, tensor in weights.items():
        pointer = tensor.untyped_storage().data_ptr()
        out[name] = tensor.clone() if pointer in seen else tensor
        seen.add(pointer)
    return out
