"""Toy stand-ins for DCR's two pretrained inputs, built on the shapes world in about a minute on a CPU.

DCR starts from a pretrained CLIP and a pretrained, text-conditioned Stable Diffusion. No such weights ship
offline, so the tiny preset first makes both: a tiny CLIP trained with the CLIP loss (`pretrain_clip`) and a
"tiny SD" (`build_tiny_sd`): a random near-deterministic VAE and a UNet trained to denoise its latents
conditioned on that CLIP's text tower, with 10% empty captions, as SD's text conditioning. Real runs load
OpenAI/MetaCLIP/SigLIP and SD-2.1-base checkpoints instead and skip this module.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from hf_vrl.data.processors import load_image_processor
from hf_vrl.methods.dcr.diffusion import tiny_diffusion
from hf_vrl.methods.dcr.task import DCRCollator

logger = logging.getLogger(__name__)


def tiny_clip(
    image_size: int = 16, width: int = 32, projection_dim: int = 24, vocab_size: int = 100, seed: int = 0
):
    """A random 2-layer `CLIPModel` with 4-pixel patches (tests, benchmarks)."""
    from transformers import CLIPConfig, CLIPModel

    vision = dict(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=2, num_attention_heads=2)
    text = dict(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=1, num_attention_heads=2)
    text |= dict(vocab_size=vocab_size, bos_token_id=0, eos_token_id=1, pad_token_id=1)
    config = CLIPConfig(
        vision_config=vision | dict(image_size=image_size, patch_size=4),
        text_config=text,
        projection_dim=projection_dim,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return CLIPModel(config)


def pretrain_clip(
    config_dir: str | Path,
    train_dataset,
    out_dir: str | Path,
    steps: int,
    batch_size: int = 64,
    learning_rate: float = 2e-3,
    seed: int = 0,
) -> Path:
    """Train a `CLIPModel` from `config_dir` (config + processor + tokenizer) with the CLIP loss; save it with
    its processors to `out_dir`.

    A plain loop in this process (AdamW with weight decay on matrices, cosine schedule with 5 % warm-up, the
    logit scale clamped at 100 after each step as open_clip does), so a run under several processes can build
    this stand-in on its main process alone.
    """
    from transformers import AutoConfig, AutoTokenizer, CLIPModel
    from transformers.optimization import get_cosine_schedule_with_warmup

    from hf_vrl.contrastive import clip_contrastive_loss
    from hf_vrl.data.collate import ImageTextCollator

    out_dir = Path(out_dir)
    torch.manual_seed(seed)
    model = CLIPModel(AutoConfig.from_pretrained(config_dir)).train()
    processor, tokenizer = (
        load_image_processor(config_dir),
        AutoTokenizer.from_pretrained(config_dir),
    )
    matrices = [p for p in model.parameters() if p.ndim >= 2]
    others = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": matrices, "weight_decay": 0.1}, {"params": others, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=learning_rate)
    schedule = get_cosine_schedule_with_warmup(optimizer, max(1, steps // 20), steps)
    loader = DataLoader(
        train_dataset,
        batch_size=batch_size,
        shuffle=True,
        drop_last=True,
        generator=torch.Generator().manual_seed(seed),
        collate_fn=ImageTextCollator(processor, tokenizer),
    )
    step = 0
    while step < steps:
        for batch in loader:
            out = model(
                pixel_values=batch["pixel_values"],
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
            )
            scale = model.logit_scale.exp()  # this process alone, whatever group it belongs to:
            loss = clip_contrastive_loss(out.image_embeds, out.text_embeds, scale, rank=0, world_size=1)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            with torch.no_grad():
                model.logit_scale.clamp_(max=math.log(100.0))
            step += 1
            if step % max(1, steps // 5) == 0 or step == steps:
                logger.info("toy CLIP step %d/%d: CLIP loss %.4f", step, steps, loss.item())
            if step == steps:
                break
    for part in (model.eval(), processor, tokenizer):
        part.save_pretrained(out_dir)
    return out_dir


@torch.no_grad()
def _calibrate_vae(vae, images: torch.Tensor) -> float:
    """SD's rule: scaling_factor = 1 / std of the latents, so the diffusion sees unit-variance inputs."""
    std = vae.encode(images * 2 - 1).latent_dist.mean.std().item()
    vae.register_to_config(scaling_factor=1.0 / std)
    return 1.0 / std


def build_tiny_sd(
    out_dir: str | Path,
    clip_dir: str | Path,
    train_dataset,
    steps: int,
    image_size: int,
    batch_size: int = 64,
    learning_rate: float = 1e-3,
    caption_dropout: float = 0.1,
    seed: int = 0,
) -> Path:
    """A tiny text-conditioned latent diffusion pipeline for the toy world (epsilon-MSE on caption
    conditions)."""
    from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
    from transformers import AutoTokenizer, CLIPTextModel

    out_dir = Path(
        tiny_diffusion(
            out_dir,
            image_size=image_size,
            block_out_channels=(32, 64),
            vae_block_out_channels=(16, 32, 32),  # latents at 1/4 of the image size, as SD's 1/8 at 512 px
            text_encoder=clip_dir,
        )
    )
    unet = UNet2DConditionModel.from_pretrained(out_dir / "unet")
    vae = AutoencoderKL.from_pretrained(out_dir / "vae").requires_grad_(False).eval()
    text_encoder = CLIPTextModel.from_pretrained(out_dir / "text_encoder").requires_grad_(False).eval()
    tokenizer = AutoTokenizer.from_pretrained(out_dir / "tokenizer")
    scheduler = DDPMScheduler.from_pretrained(out_dir / "scheduler")
    max_length = min(tokenizer.model_max_length, text_encoder.config.max_position_embeddings)
    collate = DCRCollator(image_size, crop_scale=None)
    generator = torch.Generator().manual_seed(seed)
    loader = DataLoader(
        train_dataset,
        batch_size=batch_size,
        shuffle=True,
        drop_last=True,
        generator=generator,
        collate_fn=lambda rows: (collate(rows)["pixel_values"], [row["caption"] for row in rows]),
    )
    scale = _calibrate_vae(vae, next(iter(loader))[0])
    optimizer = torch.optim.AdamW(unet.parameters(), lr=learning_rate, weight_decay=0.01)
    unet.train()
    step = 0
    while step < steps:
        for images, captions in loader:
            captions = ["" if torch.rand((), generator=generator) < caption_dropout else c for c in captions]
            with torch.no_grad():
                latents = vae.encode(images * 2 - 1).latent_dist.mean * scale
                ids = tokenizer(
                    captions,
                    padding="max_length",
                    max_length=max_length,
                    truncation=True,
                    return_tensors="pt",
                )
                conditions = text_encoder(input_ids=ids.input_ids).last_hidden_state
            noise = torch.randn(latents.shape, generator=generator)
            t = torch.randint(0, scheduler.config.num_train_timesteps, (len(latents),), generator=generator)
            pred = unet(scheduler.add_noise(latents, noise, t), t, encoder_hidden_states=conditions).sample
            loss = F.mse_loss(pred, noise)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step % max(1, steps // 5) == 0 or step == steps:
                logger.info("tiny SD step %d/%d: eps-MSE %.4f", step, steps, loss.item())
            if step == steps:
                break
    unet.save_pretrained(out_dir / "unet")
    vae.save_pretrained(out_dir / "vae")
    return out_dir
