"""The frozen diffusion side: loading a pipeline folder, forward process and targets vs diffusers, chunked
passes."""

from __future__ import annotations

import pytest
import torch
from diffusers import DDPMScheduler

from hf_vrl.methods.dcr.diffusion import FrozenDiffusion, load_diffusion, resolve_dtype, tiny_diffusion


@pytest.fixture(scope="module")
def pipeline_dir(tmp_path_factory):
    return tiny_diffusion(tmp_path_factory.mktemp("sd"), image_size=16, cross_attention_dim=16)


@pytest.fixture(scope="module")
def diffusion(pipeline_dir):
    return load_diffusion(pipeline_dir, dtype="float32")


def test_loads_frozen_pipeline_folder(diffusion, pipeline_dir):
    assert not any(p.requires_grad for p in diffusion.parameters())
    assert not diffusion.unet.training and not diffusion.vae.training
    diffusion.train()
    assert not diffusion.unet.training  # never unfrozen by Trainer's model.train()
    assert diffusion.null_text_embeds.shape == (1, 77, 16)
    assert diffusion.prediction_type == "epsilon" and diffusion.num_train_timesteps == 1000
    reference = DDPMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear")
    torch.testing.assert_close(diffusion.alphas_cumprod, reference.alphas_cumprod.float())
    bf16 = load_diffusion(pipeline_dir, dtype="bf16")
    assert bf16.dtype == torch.bfloat16 and bf16.null_text_embeds.dtype == torch.float32


def test_vae_encodes_at_input_resolution(diffusion):
    latents = diffusion.encode(torch.rand(2, 3, 16, 16))
    assert latents.shape == (2, 4, 8, 8) and latents.dtype == torch.float32
    again = diffusion.encode(torch.rand(2, 3, 16, 16))
    assert not torch.equal(latents, again)


def test_forward_process_and_targets_match_diffusers(diffusion):
    torch.manual_seed(0)
    x0, eps = torch.randn(3, 4, 8, 8), torch.randn(3, 4, 8, 8)
    t = torch.tensor([0, 500, 999])
    scheduler = DDPMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear")
    torch.testing.assert_close(diffusion.add_noise(x0, eps, t), scheduler.add_noise(x0, eps, t))
    assert torch.equal(diffusion.target(x0, eps, t, "epsilon"), eps)
    v = diffusion.target(x0, eps, t, "v_prediction")
    torch.testing.assert_close(v, scheduler.get_velocity(x0, eps, t))
    a = diffusion.alphas_cumprod[500]
    torch.testing.assert_close(v[1], a.sqrt() * eps[1] - (1 - a).sqrt() * x0[1])  # sqrt(a) eps - sqrt(1-a) x0
    assert torch.equal(diffusion.target(x0, eps, t, "scheduler"), eps)  # this pipeline is an eps-model
    with pytest.raises(ValueError, match="target must be one of"):
        diffusion.target(x0, eps, t, "x0")


def test_scheduler_target_follows_prediction_type(tmp_path):
    v_model = load_diffusion(tiny_diffusion(tmp_path, prediction_type="v_prediction"), dtype="float32")
    x0, eps, t = torch.randn(2, 4, 8, 8), torch.randn(2, 4, 8, 8), torch.tensor([3, 700])
    assert torch.equal(v_model.target(x0, eps, t, "scheduler"), v_model.target(x0, eps, t, "v_prediction"))


def test_pair_predictions_chunked_and_checkpointed(diffusion):
    torch.manual_seed(1)
    noisy, t = torch.randn(3, 4, 8, 8), torch.tensor([10, 400, 900])
    conditions = torch.randn(6, 77, 16, requires_grad=True)
    latent_index = torch.tensor([0, 0, 1, 2, 2, 1])
    condition_index = torch.tensor([0, 5, 1, 2, 3, 4])
    full = diffusion.predict(noisy, t, conditions, latent_index, condition_index)
    direct = diffusion.unet(
        noisy[latent_index], t[latent_index], encoder_hidden_states=conditions[condition_index]
    )
    torch.testing.assert_close(full, direct.sample)
    chunked = diffusion.predict(noisy, t, conditions, latent_index, condition_index, chunk_size=4)
    torch.testing.assert_close(chunked, full)
    (grad_full,) = torch.autograd.grad(full.square().sum(), conditions)
    diffusion.gradient_checkpointing = "chunks"
    try:
        recomputed = diffusion.predict(noisy, t, conditions, latent_index, condition_index, chunk_size=2)
        (grad_ckpt,) = torch.autograd.grad(recomputed.square().sum(), conditions)
    finally:
        diffusion.gradient_checkpointing = "none"
    torch.testing.assert_close(grad_ckpt, grad_full)
    with pytest.raises(ValueError, match="unet_chunk_size"):
        diffusion.predict(noisy, t, conditions, latent_index, condition_index, chunk_size=0)


def test_block_checkpointing_and_bad_options(pipeline_dir):
    blocks = load_diffusion(pipeline_dir, dtype="float32", gradient_checkpointing="blocks")
    assert blocks.unet.is_gradient_checkpointing
    with pytest.raises(ValueError, match="gradient_checkpointing"):
        FrozenDiffusion(
            blocks.unet, blocks.vae, blocks.scheduler, blocks.null_text_embeds, gradient_checkpointing="x"
        )
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_dtype("half")
