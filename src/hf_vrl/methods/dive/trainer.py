"""DiVETrainer: FLYP's contrastive fine-tuning (Eq. 1) plus DiVE's constraint (Eq. 9) or a baseline's term.

Every step trains on a target batch (labelled images captioned from templates) with the model's own
contrastive loss (CLIP's InfoNCE; SigLIP's sigmoid loss for models with a `logit_bias`) and, for every
objective but FLYP, on a reference batch drawn beside it:

    dive         L_cl + lambda * (AVL + PVL)             Eq. 9
    dive_avl     L_cl + lambda * AVL                     Table 5
    dive_pvl     L_cl + lambda * PVL                     Table 5
    dive_cosine  Eq. 9 on the cosine differences         Table 7
    flyp_replay  L_cl + lambda_aux * L_cl(reference)     Eq. 15 (App. E, the ARF proxy)
    snd          L_cl + lambda_snd * L_snd               Eq. 13 (App. B)

The frozen pre-trained model lives in the trainer (`FrozenReference`), not in the trained model: it gets no
gradient, is never saved, and follows the trained model's device. The average vector m, the number of
reference batches drawn and a fingerprint of the frozen weights are the method's training state
(`extra_state`): a resumed run draws the same reference batches and continues m exactly, and a resume whose
frozen model is not the pre-trained one is refused.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import Tensor, nn

from hf_vrl.errors import UserError
from hf_vrl.methods.dive.data import ReferenceLoader
from hf_vrl.methods.dive.frozen import FrozenReference, embed_pair
from hf_vrl.methods.dive.loss import dive_losses, snd_loss
from hf_vrl.methods.dive.settings import DiVESettings
from hf_vrl.methods.dive.sigmoid_loss import sigmoid_contrastive_loss
from hf_vrl.trainer import ContrastiveTrainer, LogitScaleCap

__all__ = ["DiVETrainer"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class DiVETrainer(ContrastiveTrainer):
    """`ContrastiveTrainer` for DiVE and its baselines (see the module docstring).

    `settings` selects the objective and its weights; `reference_dataset` (any image-caption dataset) and
    `reference_collator` (rows -> pixel_values / input_ids / attention_mask, e.g. `ImageTextCollator`) feed
    the reference batches, B' = `settings.reference_batch_size` (default: the target batch size) per device
    and micro-batch. `pretrained_model` is the frozen model; by default a copy of `model` as given, so build
    the trainer from the pre-trained weights (also when resuming: the checkpoint's weights are loaded into
    `model` later, and a resume whose frozen model differs from the run's is refused).
    Logged: `avl`, `pvl`, `snd`, `replay` (unweighted), `diff_norm` (mean ||u||), `avg_vector_norm`.
    """

    def __init__(
        self,
        *args: Any,
        settings: DiVESettings,
        reference_dataset: Any = None,
        reference_collator: Any = None,
        pretrained_model: nn.Module | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.settings = settings
        if hasattr(self.model, "logit_bias"):  # SigLIP: its own objective, and no CLIP cap on its scale
            self.loss_fn, self.max_logit_scale = self._sigmoid_loss, math.inf
            self.remove_callback(LogitScaleCap)
        self.avg_vector: Tensor | None = None
        self.frozen: FrozenReference | None = None
        self._reference: ReferenceLoader | None = None
        self._reference_start = 0
        if settings.uses_reference:
            if reference_dataset is None or reference_collator is None:
                raise UserError(
                    f"objective {settings.objective!r} trains on a reference image-caption set: pass "
                    "reference_dataset and reference_collator to DiVETrainer."
                )
            self.reference_dataset, self.reference_collator = reference_dataset, reference_collator
            if settings.objective != "flyp_replay":
                self.frozen = self._frozen_reference(pretrained_model)

    def _frozen_reference(self, pretrained_model: nn.Module | None) -> FrozenReference:
        model = pretrained_model if pretrained_model is not None else copy.deepcopy(self.model)
        cache_size = None
        if self.settings.frozen_embeddings == "cache":
            if not hasattr(self.reference_dataset, "__getitem__") or not hasattr(
                self.reference_dataset, "__len__"
            ):
                raise UserError(
                    "frozen_embeddings='cache' needs a map-style reference set (a stream has no sample "
                    "index): save_to_disk a subset, or use frozen_embeddings='forward'."
                )
            cache_size = len(self.reference_dataset) // self.args.world_size
        dtype = DTYPES[self.settings.frozen_dtype] if self.settings.frozen_dtype else None
        frozen = FrozenReference(
            model, mode=self.settings.frozen_embeddings, dtype=dtype, cache_size=cache_size
        )
        frozen.follow(self.model)
        return frozen

    # -- the objective --------------------------------------------------------------------------------

    def _sigmoid_loss(
        self, image: Tensor, text: Tensor, logit_scale: Tensor, *, rank: int, world_size: int
    ) -> Tensor:
        bias = self.accelerator.unwrap_model(self.model).logit_bias
        return sigmoid_contrastive_loss(image, text, logit_scale, bias, rank=rank, world_size=world_size)

    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, Tensor | Any],
        return_outputs: bool = False,
        num_items_in_batch: Tensor | int | None = None,
    ) -> Tensor | tuple[Tensor, Any]:
        """L_cl on the target batch plus, in training, the objective's reference term (evaluation: L_cl).

        With `separate_backward`, the reference term is back-propagated here, before the target batch's
        forward (without DDP's gradient sync, which the target backward then does for both): the same
        gradient as one backward of the sum, at the peak memory of the larger batch. The loss returned (and
        logged) is the total either way.
        """
        reference = None
        if model.training and self.settings.uses_reference:
            if self.settings.separate_backward:
                with self.accelerator.no_sync(model):
                    reference = self._reference_loss(model)
                    self.accelerator.backward(reference / self.current_gradient_accumulation_steps)
                reference = reference.detach()
            else:
                reference = self._reference_loss(model)
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True)
        if reference is not None:
            loss = loss + reference
        return (loss, outputs) if return_outputs else loss

    def _next_reference(self) -> dict[str, Tensor]:
        if self._reference is None:
            self._reference = ReferenceLoader(
                self.reference_dataset,
                self.reference_collator,
                self.settings.reference_batch_size or self.args.per_device_train_batch_size,
                seed=self.args.seed,
                rank=self.args.process_index,
                world_size=self.args.world_size,
                num_workers=self.args.dataloader_num_workers,
                start=self._reference_start,
            )
        return self._prepare_inputs(next(self._reference))

    def _reference_loss(self, model: nn.Module) -> Tensor:
        """The weighted reference term of the objective on the next reference batch (stores its metrics)."""
        settings, batch = self.settings, self._next_reference()
        image, text = embed_pair(model, batch)
        world = {"rank": self.args.process_index, "world_size": self.args.world_size}
        if settings.objective == "flyp_replay":
            scale = self.accelerator.unwrap_model(model).logit_scale.exp()  # capped by LogitScaleCap
            replay = self.loss_fn(image, text, scale, **world)
            self.store_metrics({"replay": replay})
            return settings.lambda_replay * replay
        image_pre, text_pre = self.frozen.embed(batch, self.accelerator.unwrap_model(model))
        diff_norm = (nn.functional.normalize(image.float(), dim=-1) - image_pre).norm(dim=-1).mean()
        if settings.objective == "snd":
            snd = snd_loss(image, image_pre)
            self.store_metrics({"snd": snd, "diff_norm": diff_norm})
            return settings.lambda_snd * snd
        m = self._average_vector(image_pre)
        avl, pvl, self.avg_vector = dive_losses(
            image, image_pre, text, text_pre, m, settings.alpha, difference=settings.difference, **world
        )
        self.store_metrics(
            {"avl": avl, "pvl": pvl, "diff_norm": diff_norm, "avg_vector_norm": self.avg_vector.norm()}
        )
        terms = {"avl": avl, "pvl": pvl}
        return settings.lambda_dive * sum(terms[name] for name in settings.dive_terms)

    def _average_vector(self, like: Tensor) -> Tensor:
        """m of the previous batch: zeros ([D], or [1] for the cosine variant) before the first (Eq. 6)."""
        if self.avg_vector is None:
            dim = 1 if self.settings.difference == "cosine" else like.shape[1]
            self.avg_vector = torch.zeros(dim, device=like.device)
        return self.avg_vector

    # -- training state that must survive resume -------------------------------------------------------

    def extra_state(self) -> dict[str, Tensor]:
        """m, the number of reference batches drawn, and the frozen weights' fingerprint."""
        if not self.settings.uses_reference:
            return {}
        drawn = self._reference.drawn if self._reference is not None else self._reference_start
        state = {"reference_batches": torch.tensor(drawn, dtype=torch.int64)}
        if self.frozen is not None:
            state["pretrained_fingerprint"] = self.frozen.fingerprint
        if self.avg_vector is not None:
            state["avg_vector"] = self.avg_vector
        return state

    def load_extra_state(self, state: dict[str, Tensor]) -> None:
        if self.frozen is not None and "pretrained_fingerprint" in state:
            saved = state["pretrained_fingerprint"].cpu()
            if not torch.allclose(saved, self.frozen.fingerprint, rtol=1e-9, atol=0):
                raise UserError(
                    "the frozen model is not the pre-trained model this run started from (its weights "
                    "differ): build DiVETrainer from the pre-trained weights, then resume."
                )
        self.avg_vector = state["avg_vector"].float() if "avg_vector" in state else None
        self._reference_start = int(state["reference_batches"])
        self._reference = None
