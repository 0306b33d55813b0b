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
from hf_vrl.methods.dive.loss import difference_vectors, dive_losses, snd_loss
from hf_vrl.methods.dive.settings import DiVESettings
from hf_vrl.methods.dive.sigmoid_loss import sigmoid_contrastive_loss
from hf_vrl.trainer import ContrastiveTrainer, LogitScaleCap

__all__ = ["DiVETrainer"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class DiVETrainer(ContrastiveTrainer):
    """`ContrastiveTrainer` for DiVE and its baselines (see the module docstring).

    `settings` selects the objective and its weights; `reference_dataset` (any image-caption dataset) and
    `reference_collator` (rows -> pixel_values / input_ids / attention_mask, e.g. `ImageTextCollator`) feed
    the reference batches, B' = `settings.reference_batch_size` pairs per optimiser step over all
    processes (default: the global target batch), drawn once per step (whole-batch accumulation) or per
    micro-batch. `pretrained_model` is the frozen model; by default a copy of `model` as given, so build
    the trainer from the pre-trained weights (also when resuming: the checkpoint's weights are loaded into
    `model` later, and a resume whose frozen model differs from the run's is refused).
    Logged: `avl`, `pvl`, `snd`, `replay` (unweighted), `diff_norm` (mean ||u||), `avg_vector_norm`.
    """

    shared_outputs = frozenset({"logit_scale", "logit_bias"})

    def __init__(
        self,
        *args: Any,
        settings: DiVESettings,
        reference_dataset: Any = None,
        reference_collator: Any = None,
        pretrained_model: nn.Module | None = None,
        **kwargs: Any,
    ) -> None:
        if settings.trains_head:
            raise UserError(
                f"objective {settings.objective!r} trains an image classifier with cross-entropy: use "
                "hf_vrl.methods.dive.head.HeadTrainer on a HeadClassifier"
            )
        super().__init__(*args, **kwargs)
        self.settings = settings
        self._siglip = hasattr(self.model, "logit_bias")
        if self._siglip or settings.logit_scale == "flyp":  # SigLIP's scale, FLYP's: learned, no cap
            self.max_logit_scale = math.inf
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
            cache_size = len(self.reference_dataset)  # draws by global position reach any row
        dtype = DTYPES[self.settings.frozen_dtype] if self.settings.frozen_dtype else None
        frozen = FrozenReference(
            model, mode=self.settings.frozen_embeddings, dtype=dtype, cache_size=cache_size
        )
        frozen.follow(self.model)
        return frozen

    # -- the objective --------------------------------------------------------------------------------

    def get_decay_parameter_names(self, model: nn.Module) -> list[str]:
        """ContrastiveTrainer's rule; with `logit_scale: flyp` the logit scale decays too (FLYP's AdamW decays
        every parameter; only the scale's treatment is FLYP's here)."""
        names = super().get_decay_parameter_names(model)
        if self.settings.logit_scale != "flyp":
            return names
        scale = [n for n, _ in model.named_parameters() if n.rsplit(".", 1)[-1] == "logit_scale"]
        return names + [n for n in scale if n not in names]

    def contrastive_loss(self, image: Tensor, text: Tensor, embedded: dict[str, Tensor]) -> Tensor:
        """CLIP's InfoNCE, or SigLIP's sigmoid loss for a model with a `logit_bias`."""
        if not self._siglip:
            return super().contrastive_loss(image, text, embedded)
        world = {"rank": self.args.process_index, "world_size": self.args.world_size}
        scale, bias = embedded["logit_scale"], embedded["logit_bias"]
        return sigmoid_contrastive_loss(image, text, scale, bias, **world)

    @property
    def reference_rows(self) -> int:
        """Reference pairs per process and draw: B' (global, per optimiser step; default the global target
        batch) over the processes, and over the micro-batches under plain accumulation (a draw per
        micro-batch; whole-batch accumulation draws once per step and splits it over the micro-batches)."""
        args = self.args
        steps = args.gradient_accumulation_steps
        total = (
            self.settings.reference_batch_size or args.per_device_train_batch_size * steps * args.world_size
        )
        per_draw = args.world_size * (1 if self._whole_batch else steps)
        if total % (args.world_size * steps):
            raise UserError(
                f"dive.reference_batch_size ({total}) must be a multiple of processes x accumulation steps "
                f"({args.world_size * steps})"
            )
        return total // per_draw

    def step_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """The target batch and, for objectives with a reference term, the next reference batch."""
        if not self.settings.uses_reference:
            return inputs
        return {**inputs, "reference": self._next_reference()}

    def micro_batches(self, chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """With `separate_backward`, the reference micro-batches first, then the target ones (which reach
        every trained parameter, as DDP needs of the last); else both halves in each micro-batch."""
        parts = super().micro_batches(chunks)
        if not (self.settings.separate_backward and "reference" in parts[0]):
            return parts
        reference = [{"reference": part.pop("reference")} for part in parts]
        return reference + parts

    def embed(self, model: nn.Module, inputs: dict[str, Any]) -> dict[str, Tensor]:
        """The target pair's embeddings and logit parameters; the reference pair's (with the logit parameters
        for the replay objective, which scores it with the contrastive loss)."""
        out = super().embed(model, inputs) if "pixel_values" in inputs else {}
        reference = inputs.get("reference")
        if reference is not None:
            out["reference_image"], out["reference_text"] = embed_pair(model, reference)
            if self.settings.objective == "flyp_replay":  # scored with the contrastive loss too
                out.update(self.logit_parameters(model))
        return out

    def logit_parameters(self, model: nn.Module) -> dict[str, Tensor]:
        """The logit multiplier, and SigLIP's bias."""
        out = super().logit_parameters(model)
        if self._siglip:
            out["logit_bias"] = self.accelerator.unwrap_model(model).logit_bias
        return out

    def loss_targets(self, model: nn.Module, inputs: dict[str, Any]) -> dict[str, Tensor]:
        """The frozen model's embeddings of the reference pairs (Eq. 4-5's f_pre, g_pre), under the autocast
        the trained model's forward runs in (accelerate wraps only that forward), so that both sides of u and
        v round alike: at lr = 0, u = v = 0 exactly in any precision."""
        reference = inputs.get("reference")
        if reference is None or self.frozen is None:
            return {}
        with self.accelerator.autocast():
            image, text = self.frozen.embed(reference, self.accelerator.unwrap_model(model))
        return {"reference_image_pre": image, "reference_text_pre": text}

    def objective(
        self, embedded: dict[str, Tensor], targets: dict[str, Tensor], inputs: dict[str, Any]
    ) -> dict[str, Tensor]:
        """L_cl on the target batch plus the objective's reference term (Eq. 9, 13, 15)."""
        values = super().objective(embedded, targets, inputs) if "image_embeds" in embedded else {}
        if "reference_image" in embedded:
            reference = self._reference_term(embedded, targets)
            values["loss"] = values["loss"] + reference if values else reference
        return values

    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, Tensor | Any],
        return_outputs: bool = False,
        num_items_in_batch: Tensor | int | None = None,
    ) -> Tensor | tuple[Tensor, Any]:
        """L_cl on the target batch plus, in training, the reference term (evaluation: L_cl alone).

        With `separate_backward` (micro-batch accumulation; whole-batch accumulation back-propagates the
        reference micro-batches on their own, `micro_batches`), the reference term is back-propagated
        here, before the target batch's forward, without DDP's gradient sync (which the target backward does
        for both): the same gradient as one backward of the sum, at the peak memory of the larger batch. The
        loss returned (and logged) is the total either way.
        """
        reference = inputs.get("reference") if model.training else None
        if reference is None or not self.settings.separate_backward:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        with self.accelerator.no_sync(model):
            ref_loss = super().compute_loss(model, {"reference": reference})
            self.accelerator.backward(ref_loss / self.current_gradient_accumulation_steps)
        target = {key: value for key, value in inputs.items() if key != "reference"}
        loss, outputs = super().compute_loss(model, target, return_outputs=True)
        loss = loss + ref_loss.detach()
        return (loss, outputs) if return_outputs else loss

    def _next_reference(self) -> dict[str, Tensor]:
        if self._reference is None:
            self._reference = ReferenceLoader(
                self.reference_dataset,
                self.reference_collator,
                self.reference_rows,
                seed=self.args.seed,
                rank=self.args.process_index,
                world_size=self.args.world_size,
                num_workers=self.args.dataloader_num_workers,
                start=self._reference_start,
            )
        return next(self._reference)

    def _reference_term(self, embedded: dict[str, Tensor], targets: dict[str, Tensor]) -> Tensor:
        """The weighted reference term of the objective (stores its metrics)."""
        settings = self.settings
        image, text = embedded["reference_image"], embedded["reference_text"]
        world = {"rank": self.args.process_index, "world_size": self.args.world_size}
        if settings.objective == "flyp_replay":
            replay = self.contrastive_loss(image, text, embedded)
            self.store_metrics({"replay": replay})
            return settings.lambda_replay * replay
        image_pre, text_pre = targets["reference_image_pre"], targets["reference_text_pre"]
        diff_norm = difference_vectors(image, image_pre).norm(dim=-1).mean()  # mean ||u||, Eq. 4
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
