"""DCRTask: the trainable DCR vision model + the frozen diffusion model + the objective, as one module.

`forward(pixel_values in [0, 1]) -> {"loss": ..., <metrics>}`; the trainer only calls it. Objectives:
"dcr" (Eq. 12, Algorithm 1), "reconstruction" (Eq. 8, DIVA-style baseline) and "joint" (Eq. 9, naive baseline,
with the gradient-conflict cosine of Eq. 11 logged each step). `DCRCollator` makes the batches: the official
data pipeline's random crop of each original image.

Where the paper is silent and hf_vrl picks (the official release in brackets):
- the projector's linears start from N(0, 0.02) with zero biases (`DCRConfig.initializer_range`) [PyTorch's
  defaults for `nn.Linear`: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases];
- the empty-prompt embedding is encoded with the tokenizer's attention mask [the same; SD pipelines use none:
  `load_diffusion(empty_prompt_mask=False)`].
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from hf_vrl.data.crop import random_resized_crop_box
from hf_vrl.devices import module_device, module_dtype
from hf_vrl.methods.dcr.augment import DCRAugment
from hf_vrl.methods.dcr.diffusion import PREDICTION_TARGETS, FrozenDiffusion
from hf_vrl.methods.dcr.loss import (
    dcr_logits,
    dcr_loss,
    gradient_cosine,
    joint_loss,
    reconstruction_loss,
    supervised_contrastive_loss,
)

OBJECTIVES = ("dcr", "reconstruction", "joint")
REDUCTIONS = ("sum", "mean")
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass
class DCRTaskConfig:
    """Settings of the DCR objective; defaults follow the paper, the official code's choices are options.

    objective: "dcr" (Eq. 12), "reconstruction" (Eq. 8) or "joint" (Eq. 9 with lambda_con, lambda_rec).
    temperature: tau of Eq. 12 (and of L_con in "joint"); official 0.1.
    target: the ground-truth positive eps_gt: "epsilon" (paper), "v_prediction" (official code) or
        "scheduler" (the pipeline's prediction_type).
    num_negatives: K random negatives per anchor instead of all B-1 (B(1+K)+B UNet passes instead of B^2+B).
    unet_chunk_size: UNet evaluations per call (None: one call, as the official code; "auto": as many as the
        free CUDA memory allows, see `FrozenDiffusion.resolve_chunk_size`).
    reconstruction_reduction: L_rec of Eq. 8 per sample: "sum" (the paper's squared L2 norm over the D latent
        values) or "mean" (their mean, as DIVA's `F.mse_loss`: the same loss / D, i.e. lambda_rec / D). Batch
        mean either way.
    augment: keyword arguments of `DCRAugment` (the official recipe by default).
    official_augment: augment after CLIP normalisation, clamping there (official behaviour).
    input_crop_scale: the data pipeline's RandomResizedCrop scale on the original image (official (0.9, 1));
        None for a centre crop. Applied by the collator (`DCRTask.collator`).
    image_mean, image_std: the encoder's normalisation (SigLIP: 0.5 / 0.5).
    """

    objective: Literal["dcr", "reconstruction", "joint"] = "dcr"
    temperature: float = 0.1
    target: Literal["epsilon", "v_prediction", "scheduler"] = "epsilon"
    num_negatives: int | None = None
    unet_chunk_size: int | Literal["auto"] | None = None
    reconstruction_reduction: Literal["sum", "mean"] = "sum"
    lambda_con: float = 1.0
    lambda_rec: float = 1.0
    augment: dict[str, Any] = field(default_factory=dict)
    official_augment: bool = False
    input_crop_scale: tuple[float, float] | None = (0.9, 1.0)
    image_mean: tuple[float, float, float] = OPENAI_CLIP_MEAN
    image_std: tuple[float, float, float] = OPENAI_CLIP_STD

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        if self.target not in PREDICTION_TARGETS:
            raise ValueError(f"target must be one of {PREDICTION_TARGETS}, got {self.target!r}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be positive, got {self.temperature}")
        if self.num_negatives is not None and self.num_negatives < 1:
            raise ValueError(
                f"num_negatives must be >= 1 (or None for the whole batch), got {self.num_negatives}"
            )
        chunk = self.unet_chunk_size
        if chunk not in (None, "auto") and (
            isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1
        ):
            raise ValueError(f"unet_chunk_size must be >= 1, None (one UNet call) or 'auto', got {chunk!r}")
        if self.reconstruction_reduction not in REDUCTIONS:
            raise ValueError(
                f"reconstruction_reduction must be one of {REDUCTIONS}, got {self.reconstruction_reduction!r}"
            )


@dataclass
class DCRStep:
    """One batch's diffusion inputs: embeddings z and conditions c of `[clean; augmented]` views (`[2B, ...]`,
    `[B, ...]` for reconstruction), the noisy latents x_t, timesteps t and the ground-truth target."""

    embeds: torch.Tensor
    conditions: torch.Tensor
    noisy: torch.Tensor
    timesteps: torch.Tensor
    target: torch.Tensor


class DCRTask(nn.Module):
    """Owns the trainable `DCRModel` (possibly LoRA-wrapped), the `FrozenDiffusion` and the objective.

    Randomness (timesteps, noise, VAE sampling, augmentation) uses torch's global RNG only, so the Trainer's
    RNG checkpointing makes resumed runs exact; the input crop is the collator's (`DCRCollator`). Inputs go to
    the device of the model (and the frozen diffusion model moves with the task).
    """

    def __init__(self, model: nn.Module, diffusion: FrozenDiffusion, config: DCRTaskConfig | None = None):
        super().__init__()
        self.config = config or DCRTaskConfig()
        self.model = model
        self.diffusion = diffusion
        self.augment = DCRAugment(**self.config.augment)
        self.register_buffer(
            "image_mean", torch.tensor(self.config.image_mean).view(1, 3, 1, 1), persistent=False
        )
        self.register_buffer(
            "image_std", torch.tensor(self.config.image_std).view(1, 3, 1, 1), persistent=False
        )
        model_config = model.config
        unet_width = diffusion.unet.config.cross_attention_dim
        if model_config.condition_dim != unet_width:
            raise ValueError(
                f"DCRModel.condition_dim={model_config.condition_dim} but the UNet's cross_attention_dim is "
                f"{unet_width}: build the model with condition_dim={unet_width}"
            )
        if getattr(model, "null_text_embeds", None) is not None:  # "official" and "cls_patches" conditions
            model.set_null_text_embeds(diffusion.null_text_embeds)

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        return (images - self.image_mean) / self.image_std

    def positive_view(self, images: torch.Tensor) -> torch.Tensor:
        """Normalised x+ = a(x); the official mode augments the normalised tensor (colour ops clamp there)."""
        if self.config.official_augment:
            return self.augment(self.normalize(images))
        return self.normalize(self.augment(images))

    def collator(self, image_size: int) -> DCRCollator:
        """The collator making this task's batches: `input_crop_scale` random crops of the original images."""
        return DCRCollator(image_size, crop_scale=self.config.input_crop_scale)

    def prepare_inputs(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Check the [0, 1] range and move to the model's device (the crop is the collator's)."""
        if pixel_values.dim() != 4 or pixel_values.shape[1] != 3:
            raise ValueError(f"pixel_values must be [B, 3, H, W], got {tuple(pixel_values.shape)}")
        low, high = pixel_values.aminmax()
        if low < -1e-3 or high > 1 + 1e-3:
            raise ValueError(
                f"DCRTask expects un-normalised images in [0, 1], got values in [{low:.3f}, {high:.3f}]: "
                "pass the images before CLIP normalisation (the task normalises them itself)"
            )
        return pixel_values.to(module_device(self.model), torch.float32)

    def prepare_step(self, pixel_values: torch.Tensor, encoder: nn.Module | None = None) -> DCRStep:
        """Encode the clean (and, unless reconstruction-only, augmented) views in one encoder call, then draw
        t, eps and x_t for each image (Algorithm 1, lines 5-9)."""
        encoder = self.model if encoder is None else encoder
        images = self.prepare_inputs(pixel_values)
        views = [self.normalize(images)]
        if self.config.objective != "reconstruction":
            views.append(self.positive_view(images))
        outputs = encoder(pixel_values=torch.cat(views).to(module_dtype(self.model)))
        latents = self.diffusion.encode(images)
        noise = torch.randn_like(latents)
        timesteps = self.diffusion.sample_timesteps(len(images), latents.device)
        return DCRStep(
            embeds=outputs.image_embeds,
            conditions=outputs.conditions,
            noisy=self.diffusion.add_noise(latents, noise, timesteps),
            timesteps=timesteps,
            target=self.diffusion.target(latents, noise, timesteps, self.config.target),
        )

    def forward(
        self, pixel_values: torch.Tensor, encoder: nn.Module | None = None
    ) -> dict[str, torch.Tensor]:
        """One step on a batch; `encoder` is the (possibly DDP-wrapped) trainable model, default
        `self.model`."""
        step = self.prepare_step(pixel_values, encoder)
        if self.config.objective == "dcr":
            return self.dcr_objective(step)
        batch = len(step.noisy)
        pred = self.diffusion.predict(
            step.noisy, step.timesteps, step.conditions[:batch], chunk_size=self.config.unet_chunk_size
        )
        loss_rec = reconstruction_loss(pred, step.target, self.config.reconstruction_reduction)
        recon_mse = reconstruction_loss(pred.detach(), step.target, "mean")
        if self.config.objective == "reconstruction":
            return {"loss": loss_rec, "recon_mse": recon_mse}
        return self._joint(step.embeds, loss_rec, recon_mse)

    def negative_columns(self, batch: int, device: torch.device) -> tuple[torch.Tensor, int | None]:
        """Condition columns per anchor row: the whole batch (anchor on the diagonal), or the anchor in column
        0 followed by `num_negatives` distinct random other images."""
        k = self.config.num_negatives
        if k is None or k >= batch - 1:
            return torch.arange(batch, device=device).expand(batch, batch), None
        scores = torch.rand(batch, batch, device=device)
        scores.fill_diagonal_(float("inf"))
        negatives = scores.argsort(dim=1)[:, :k]
        return torch.cat([torch.arange(batch, device=device).unsqueeze(1), negatives], dim=1), 0

    def dcr_objective(self, step: DCRStep) -> dict[str, torch.Tensor]:
        """Eq. 12 over the B x M grid of (noisy latent i, condition j) UNet passes plus the B positives,
        batched in chunks of `unet_chunk_size` (Algorithm 1 computes the same predictions anchor by
        anchor)."""
        noisy, target = step.noisy, step.target
        batch = len(noisy)
        columns, anchor_index = self.negative_columns(batch, noisy.device)
        width = columns.shape[1]
        rows = torch.arange(batch, device=noisy.device)
        latent_index = torch.cat([rows.repeat_interleave(width), rows])
        condition_index = torch.cat([columns.flatten(), rows + batch])  # conditions = [c_1..c_B, c+_1..c+_B]
        preds = self.diffusion.predict(
            noisy, step.timesteps, step.conditions, latent_index, condition_index, self.config.unet_chunk_size
        )
        pred = preds[: batch * width].view(batch, width, *noisy.shape[1:])
        pred_pos = preds[batch * width :]
        tau = self.config.temperature
        loss = dcr_loss(pred, pred_pos, target, tau, anchor_index)
        with torch.no_grad():
            pos_logits, neg_logits = dcr_logits(pred, pred_pos, target, tau, anchor_index)
            anchor = pred[rows, 0 if anchor_index is not None else rows]
            metrics = {
                "sim_positive": pos_logits[:, 0].mean() * tau,
                "sim_target": pos_logits[:, 1].mean() * tau,
                "recon_mse": reconstruction_loss(anchor, target, "mean"),
            }
            if neg_logits.shape[1]:
                metrics["sim_negative"] = neg_logits.mean() * tau
                hardest = neg_logits.max(dim=1).values
                metrics["contrastive_acc"] = (pos_logits.min(dim=1).values > hardest).float().mean()
        return {"loss": loss, **metrics}

    def _joint(
        self, embeds: torch.Tensor, loss_rec: torch.Tensor, recon_mse: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Eq. 9 with L_con (Eq. 7) over the clean and augmented embeddings, each image its own class; Eq.
        11's cosine over the clean rows, the representation z both losses share (L_rec sees no augmented
        view)."""
        batch = len(embeds) // 2
        labels = torch.arange(batch, device=embeds.device).repeat(2)
        loss_con = supervised_contrastive_loss(embeds, labels, self.config.temperature)
        loss = joint_loss(loss_con, loss_rec, self.config.lambda_con, self.config.lambda_rec)
        metrics = {"loss_con": loss_con.detach(), "loss_rec": loss_rec.detach(), "recon_mse": recon_mse}
        if embeds.requires_grad and torch.is_grad_enabled():
            metrics["grad_cos"] = gradient_cosine(loss_con, loss_rec, embeds, rows=slice(0, batch))
        return {"loss": loss, **metrics}


@dataclass
class DCRCollator:
    """Rows with a PIL `image` -> `{"pixel_values": [B, 3, S, S] in [0, 1]}`.

    With `crop_scale` (training): the official data pipeline's `RandomResizedCrop(S, scale=crop_scale,
    ratio=(3/4, 4/3), bicubic)` on the original, possibly non-square image (PIL crop + bicubic resize, as
    torchvision does on PIL images). With `crop_scale=None` (evaluation): the centred square of the shorter
    side, resized to S.

    Crop randomness comes from a `torch.Generator` seeded with the row's `sample_seed` (`seed_column`) when it
    has one, a function of the sample, not of the order in which DataLoader workers prefetch; from torch's
    global RNG otherwise.
    """

    image_size: int
    crop_scale: tuple[float, float] | None = (0.9, 1.0)
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    seed_column: str = "sample_seed"

    def __post_init__(self):
        if self.crop_scale is not None and not 0 < self.crop_scale[0] <= self.crop_scale[1] <= 1:
            raise ValueError(f"crop_scale must satisfy 0 < low <= high <= 1, got {self.crop_scale}")

    def _resize(self, image, box: tuple[int, int, int, int]) -> torch.Tensor:
        from PIL import Image

        size = (self.image_size, self.image_size)
        crop = image.convert("RGB").crop(box).resize(size, Image.BICUBIC)
        return torch.from_numpy(np.asarray(crop, dtype=np.float32) / 255.0).permute(2, 0, 1)

    def centre_crop(self, image) -> torch.Tensor:
        """The centred square of the shorter side, resized to S (bicubic): `[3, S, S]` in [0, 1]."""
        side = min(image.width, image.height)
        left, top = (image.width - side) // 2, (image.height - side) // 2
        return self._resize(image, (left, top, left + side, top + side))

    def random_crop(self, image, generator: torch.Generator | None = None) -> torch.Tensor:
        """RandomResizedCrop of the original image: `[3, S, S]` in [0, 1]."""
        top, left, h, w = random_resized_crop_box(
            image.height, image.width, tuple(self.crop_scale), tuple(self.crop_ratio), generator
        )
        return self._resize(image, (left, top, left + w, top + h))

    def crop(self, row: dict[str, Any]) -> torch.Tensor:
        if self.crop_scale is None:
            return self.centre_crop(row["image"])
        seed = row.get(self.seed_column)
        generator = None if seed is None else torch.Generator().manual_seed(int(seed))
        return self.random_crop(row["image"], generator)

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if not rows or "image" not in rows[0]:
            raise ValueError("DCRCollator needs rows with an 'image' column (see hf_vrl.data.schema)")
        return {"pixel_values": torch.stack([self.crop(row) for row in rows])}
