"""CLUETrainer: two views per image through the online and momentum branches, CLUE's Eq. 8 objective, and the
momentum update after every optimiser step.

The momentum branch lives inside `CLUEModel` (no gradient), so every checkpoint holds it and a resumed run
continues it exactly; the momentum coefficient is a function of the global step (constant, or ReSA's cosine
schedule to 1), which the checkpoint restores too. Over several processes the momentum features are
all-gathered before Sinkhorn and every process scores its own samples (`loss.clue_objective`).
"""

from __future__ import annotations

import logging
import math
from typing import Any

from torch import Tensor, nn
from transformers import TrainerCallback

from hf_vrl.errors import UserError
from hf_vrl.methods.clue.augment import CLUECollator
from hf_vrl.methods.clue.loss import clue_objective
from hf_vrl.methods.clue.settings import CLUESettings
from hf_vrl.trainer import VRLTrainer

__all__ = ["CLUETrainer", "momentum_at"]

logger = logging.getLogger(__name__)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
SGD_MOMENTUM = "momentum=0.9"  # ReSA's (and so CLUE's) SGD


def momentum_at(step: int, total_steps: int, base: float, schedule: str = "constant") -> float:
    """The EMA coefficient after `step` optimiser steps: `base` (CLUE: 0.999), or ReSA/DINO's cosine schedule
    m = 1 - (1 - base) (1 + cos(pi step / total_steps)) / 2, rising from `base` at step 0 to 1 at the end."""
    if schedule == "constant":
        return base
    if schedule != "cosine":
        raise ValueError(f"momentum schedule must be 'constant' or 'cosine', got {schedule!r}")
    progress = min(step, total_steps) / max(total_steps, 1)
    return 1.0 - (1.0 - base) * (1.0 + math.cos(math.pi * progress)) / 2.0


class _MomentumUpdate(TrainerCallback):
    """theta_m <- m theta_m + (1 - m) theta once per optimiser step (after it, before the checkpoint)."""

    def __init__(self, trainer: CLUETrainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        self.trainer.update_momentum(state.global_step, state.max_steps)


class CLUETrainer(VRLTrainer):
    """Trainer for `CLUEModel` (CLUE §4, Eq. 8) with `CLUESettings`.

    Batches: `pixel_values` `[B, 2, 3, S, S]` (weak, strong view) and, for the text term, `text_embeds`
    `[B, D]`; without a `data_collator` the trainer builds `CLUECollator` from the settings, the
    `image_processor`'s mean/std (ImageNet's without one) and the `text_bank`. Logged per step: `loss_global`,
    `loss_local`, `loss_text` (the terms computed), `target_self_weight` (mean A_ii: 1 for InfoNCE, lower as
    Sinkhorn spreads the targets) and `momentum`.

    Optimiser: with `optim="sgd"` and no momentum in `optim_args` it sets momentum 0.9 (ReSA's SGD), with a
    warning; weight decay applies to every parameter, as in ReSA (transformers would spare biases).
    """

    def __init__(
        self,
        *args: Any,
        settings: CLUESettings,
        text_bank: Any = None,
        image_processor: Any = None,
        **kwargs: Any,
    ) -> None:
        if kwargs.get("data_collator") is None:
            kwargs["data_collator"] = CLUECollator(
                settings.views(),
                getattr(image_processor, "image_mean", None) or IMAGENET_MEAN,
                getattr(image_processor, "image_std", None) or IMAGENET_STD,
                text_bank if settings.uses_text else None,
            )
        super().__init__(*args, **kwargs)
        self.settings = settings
        self.current_momentum = settings.momentum
        self._check_model_and_data(text_bank)
        if self.args.optim == "sgd" and "momentum" not in (self.args.optim_args or ""):
            logger.warning(
                "CLUETrainer uses SGD with momentum 0.9 (ReSA's); pass optim_args to choose another."
            )
            self.args.optim_args = ",".join(filter(None, [self.args.optim_args, SGD_MOMENTUM]))
        self.add_callback(_MomentumUpdate(self))

    def _check_model_and_data(self, text_bank: Any) -> None:
        model, settings = self.model, self.settings
        if settings.beta > 0 and getattr(model, "part_extractor", None) is None:
            raise UserError("clue.beta > 0 needs a model with a part extractor (CLUEConfig.num_parts >= 1)")
        if settings.uses_text:
            if text_bank is None:
                raise UserError(
                    "clue.gamma > 0 needs description embeddings: pass text_bank=build_text_bank(...)"
                )
            if getattr(model, "text_projector", None) is None:
                raise UserError("clue.gamma > 0 needs a model with a text head (CLUEConfig.text_embed_dim)")
            if model.config.text_embed_dim != text_bank.dim:
                raise UserError(
                    f"the model's text head has width {model.config.text_embed_dim} but the description "
                    f"embeddings {text_bank.dim}: build the model with text_embed_dim={text_bank.dim}"
                )
            dataset = self.train_dataset
            if hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__") and len(dataset):
                text_bank.description(dataset[0])  # a missing column or id fails here, not mid-epoch

    def get_decay_parameter_names(self, model: nn.Module) -> list[str]:
        """Every trainable parameter decays, as with ReSA's `torch.optim.SGD(params, weight_decay=wd)`."""
        return [name for name, param in model.named_parameters() if param.requires_grad]

    def update_momentum(self, step: int, total_steps: int) -> None:
        """Move the momentum branch towards the online one with the coefficient of `step`."""
        s = self.settings
        self.current_momentum = momentum_at(step, total_steps, s.momentum, s.momentum_schedule)
        self.accelerator.unwrap_model(self.model).update_momentum(self.current_momentum)

    def embed(self, model: nn.Module, inputs: dict[str, Any]) -> dict[str, Tensor]:
        """The online branch's outputs on both views (h, embeddings, part descriptors, text embeddings)."""
        return _tensors(model(pixel_values=_views(inputs)))

    def loss_targets(self, model: nn.Module, inputs: dict[str, Any]) -> dict[str, Tensor]:
        """The momentum branch's outputs on both views (no gradient)."""
        return _tensors(model(pixel_values=_views(inputs), momentum=True))

    def objective(
        self, embedded: dict[str, Tensor], targets: dict[str, Tensor], inputs: dict[str, Any]
    ) -> dict[str, Tensor]:
        """Eq. 8 on the per-process batch (the momentum side gathered across processes); the mean loss."""
        s = self.settings
        losses = clue_objective(
            embedded,
            targets,
            text_embeds=inputs.get("text_embeds"),
            alpha=s.alpha,
            beta=s.beta,
            gamma=s.gamma,
            targets=s.targets,
            temperature=s.temperature,
            part_temperature=s.part_temperature,
            text_temperature=s.text_temperature,
            sinkhorn_iterations=s.sinkhorn_iterations,
            sinkhorn_epsilon=s.sinkhorn_epsilon,
            rank=self.accelerator.process_index,
            world_size=self.accelerator.num_processes,
        )
        self.store_metrics(
            {**{k: v for k, v in losses.items() if k != "loss"}, "momentum": self.current_momentum}
        )
        return losses


def _views(inputs: dict[str, Any]) -> Tensor:
    views = inputs.get("pixel_values")
    if views is None or views.dim() != 5 or views.shape[1] != 2:
        raise KeyError(
            "CLUETrainer needs pixel_values [B, 2, 3, H, W] (weak and strong view) in every batch; use "
            "hf_vrl.methods.clue.augment.CLUECollator"
        )
    return views


def _tensors(output: Any) -> dict[str, Tensor]:
    """The tensors of a model output, by name."""
    return {key: value for key, value in output.items() if isinstance(value, Tensor)}
