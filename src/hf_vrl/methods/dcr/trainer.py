"""DCRTrainer and the two-stage protocol of DCR §4.2 (Stage-1 projector alignment, Stage-2 encoder
enhancement).

The Trainer's `model` is the trainable `DCRModel` (stage 2: LoRA-wrapped `PeftModel`); the frozen UNet/VAE
live in the `DCRTask`, outside the saved model, so checkpoints hold only what is trained (plus the frozen
tower in stage 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from hf_vrl.methods.dcr.task import DCRTask
from hf_vrl.trainer import VRLTrainer

STAGES = ("projector", "encoder", "end_to_end")
LORA_BIAS = ("none", "lora_only")


@dataclass
class LoraSettings:
    """Stage-2 LoRA (paper §5.1: rank 16). The official code also trains the adapted layers' biases
    (`bias="lora_only"`); the default trains only the low-rank factors."""

    r: int = 16
    alpha: int = 16
    dropout: float = 0.1
    bias: str = "none"

    def __post_init__(self):
        if self.bias not in LORA_BIAS:
            raise ValueError(f"lora bias must be one of {LORA_BIAS}, got {self.bias!r}")


def lora_target_modules(model: nn.Module) -> list[str]:
    """Every `nn.Linear` of the vision tower plus `visual_projection` (the vision half of the official
    `target_modules="all-linear"`), never the projector; linears owned by `nn.MultiheadAttention` (SigLIP's
    pooling head) are skipped because that module reads their weights directly, bypassing an adapter."""
    owned = {
        f"{name}.{child}"
        for name, module in model.named_modules()
        if isinstance(module, nn.MultiheadAttention)
        for child, _ in module.named_children()
    }
    return [
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear)
        and (name.startswith("vision_model.") or name == "visual_projection")
        and name not in owned
    ]


def prepare_stage(model: nn.Module, stage: str, lora: LoraSettings | None = None) -> nn.Module:
    """Freeze/unfreeze for a stage and return the model to train.

    `"projector"` (Stage-1): only h_omega trains, f_phi frozen. `"encoder"` (Stage-2): LoRA adapters on f_phi
    (vision tower + visual projection) train, h_omega frozen; returns a `PeftModel`. `"end_to_end"` (Table
    4b): LoRA adapters and the projector train together from the start.
    """
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
    model.requires_grad_(False)
    if stage == "projector":
        model.projector.requires_grad_(True)
        return model
    from peft import LoraConfig, get_peft_model

    lora = lora or LoraSettings()
    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        bias=lora.bias,
        target_modules=lora_target_modules(model),
        modules_to_save=["projector"] if stage == "end_to_end" else None,
    )
    return get_peft_model(model, config)


class DCRTrainer(VRLTrainer):
    """Trainer for DCR: `compute_loss` runs the `DCRTask` with the (wrapped) trainable model and logs its
    metrics (`sim_positive`, `sim_target`, `sim_negative`, `contrastive_acc`, `recon_mse`; `loss_con`,
    `loss_rec`, `grad_cos` for the naive joint baseline)."""

    def __init__(self, *args: Any, task: DCRTask, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.task = task.to(self.accelerator.device)

    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, Tensor | Any],
        return_outputs: bool = False,
        num_items_in_batch: Tensor | int | None = None,
    ) -> Tensor | tuple[Tensor, dict[str, Tensor]]:
        if "pixel_values" not in inputs:
            raise KeyError(
                f"DCRTrainer needs pixel_values in [0, 1] in every batch, got keys {sorted(inputs)}"
            )
        self.task.train(model.training)
        outputs = self.task(inputs["pixel_values"], encoder=model)
        loss = outputs.pop("loss")
        self.store_metrics(outputs)
        return (loss, outputs) if return_outputs else loss
