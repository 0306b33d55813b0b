"""DCRTask: the trainable DCR vision model + the frozen diffusion model + the objective, as one module.

`forward(pixel_values in [0, 1]) -> {"loss": ..., <metrics>}`; the trainer only calls it. Objectives:
"dcr" (Eq. 12, Algorithm 1), "reconstruction" (Eq. 8, DIVA-style baseline) and "joint" (Eq. 9, naive baseline,
with the gradient-conflict cosine of Eq. 11 logged each step).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from hf_vrl.methods.dcr.augment import DCRAugment, random_resized_crop, resize
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
    unet_chunk_size: UNet evaluations per call (None: one call, as the official code).
    augment: keyword arguments of `DCRAugment` (the official recipe by default).
    official_augment: augment after CLIP normalisation, clamping there (official behaviour).
    input_crop_scale: the data pipeline's RandomResizedCrop scale (official (0.9, 1)); None to disable.
    image_mean, image_std: the encoder's normalisation (SigLIP: 0.5 / 0.5).
    """

    objective: Literal["dcr", "reconstruction", "joint"] = "dcr"
    temperature: float = 0.1
    target: Literal["epsilon", "v_prediction", "scheduler"] = "epsilon"
    num_negatives: int | None = None
    unet_chunk_size: int | None = None
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
        if self.unet_chunk_size is not None and self.unet_chunk_size < 1:
            raise ValueError(
                f"unet_chunk_size must be >= 1 (or None for one UNet call), got {self.unet_chunk_size}"
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

    Randomness (timesteps, noise, VAE sampling, augmentation, crops) uses torch's global RNG only, so the
    Trainer's RNG checkpointing makes resumed runs exact.
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
        if model_config.condition_mode == "official":
            model.set_null_text_embeds(diffusion.null_text_embeds)

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        return (images - self.image_mean) / self.image_std

    def positive_view(self, images: torch.Tensor) -> torch.Tensor:
        """Normalised x+ = a(x); the official mode augments the normalised tensor (colour ops clamp there)."""
        if self.config.official_augment:
            return self.augment(self.normalize(images))
        return self.normalize(self.augment(images))

    def prepare_inputs(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Check the [0, 1] range and apply the dataset-level crop (official RandomResizedCrop, scale
        0.9-1)."""
        if pixel_values.dim() != 4 or pixel_values.shape[1] != 3:
            raise ValueError(f"pixel_values must be [B, 3, H, W], got {tuple(pixel_values.shape)}")
        low, high = pixel_values.aminmax()
        if low < -1e-3 or high > 1 + 1e-3:
            raise ValueError(
                f"DCRTask expects un-normalised images in [0, 1], got values in [{low:.3f}, {high:.3f}]: "
                "pass the images before CLIP normalisation (the task normalises them itself)"
            )
        if not self.training or self.config.input_crop_scale is None:
            return pixel_values
        size = tuple(pixel_values.shape[-2:])
        return torch.stack(
            [random_resized_crop(img, size, self.config.input_crop_scale) for img in pixel_values]
        )

    def prepare_step(self, pixel_values: torch.Tensor, encoder: nn.Module | None = None) -> DCRStep:
        """Encode the clean (and, unless reconstruction-only, augmented) views in one encoder call, then draw
        t, eps and x_t for each image (Algorithm 1, lines 5-9)."""
        encoder = self.model if encoder is None else encoder
        images = self.prepare_inputs(pixel_values)
        views = [self.normalize(images)]
        if self.config.objective != "reconstruction":
            views.append(self.positive_view(images))
        outputs = encoder(pixel_values=torch.cat(views))
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
        loss_rec = reconstruction_loss(pred, step.target)
        if self.config.objective == "reconstruction":
            return {"loss": loss_rec, "recon_mse": loss_rec.detach()}
        return self._joint(step.embeds, loss_rec)

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
                "recon_mse": reconstruction_loss(anchor, target),
            }
            if neg_logits.shape[1]:
                metrics["sim_negative"] = neg_logits.mean() * tau
                hardest = neg_logits.max(dim=1).values
                metrics["contrastive_acc"] = (pos_logits.min(dim=1).values > hardest).float().mean()
        return {"loss": loss, **metrics}

    def _joint(self, embeds: torch.Tensor, loss_rec: torch.Tensor) -> dict[str, torch.Tensor]:
        """Eq. 9 with L_con (Eq. 7) over the clean and augmented embeddings, each image its own class."""
        batch = len(embeds) // 2
        labels = torch.arange(batch, device=embeds.device).repeat(2)
        loss_con = supervised_contrastive_loss(embeds, labels, self.config.temperature)
        loss = joint_loss(loss_con, loss_rec, self.config.lambda_con, self.config.lambda_rec)
        metrics = {
            "loss_con": loss_con.detach(),
            "loss_rec": loss_rec.detach(),
            "recon_mse": loss_rec.detach(),
        }
        if embeds.requires_grad and torch.is_grad_enabled():
            metrics["grad_cos"] = gradient_cosine(loss_con, loss_rec, embeds)
        return {"loss": loss, **metrics}


@dataclass
class DCRCollator:
    """Rows with a PIL `image` -> `{"pixel_values": [B, 3, S, S] in [0, 1]}` (shorter side to S, centre crop).

    Deterministic on purpose: the random crop of the official data pipeline is applied by the task
    (`input_crop_scale`) on the torch RNG that the Trainer checkpoints.
    """

    image_size: int

    def to_tensor(self, image) -> torch.Tensor:
        array = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
        tensor = torch.from_numpy(array).permute(2, 0, 1)
        height, width = tensor.shape[-2:]
        side = min(height, width)
        top, left = (height - side) // 2, (width - side) // 2
        return resize(
            tensor[:, top : top + side, left : left + side], (self.image_size, self.image_size), "bicubic"
        )

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if not rows or "image" not in rows[0]:
            raise ValueError("DCRCollator needs rows with an 'image' column (see hf_vrl.data.schema)")
        return {"pixel_values": torch.stack([self.to_tensor(row["image"]) for row in rows])}
