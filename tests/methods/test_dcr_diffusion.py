"""The frozen diffusion side: loading a pipeline folder, the empty-prompt embedding, forward process and
targets vs diffusers, chunked / recomputed / prefix-reusing passes, the automatic chunk size, the device
rule."""

from __future__ import annotations

import pytest
import torch
from diffusers import DDPMScheduler

from hf_vrl.errors import UserError
from hf_vrl.methods.dcr import diffusion as diffusion_module
from hf_vrl.methods.dcr.diffusion import (
    FrozenDiffusion,
    empty_prompt_embedding,
    load_diffusion,
    resolve_dtype,
    tiny_diffusion,
)


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
    torch.testing.assert_close(diffusion.scheduler.alphas_cumprod, reference.alphas_cumprod)
    bf16 = load_diffusion(pipeline_dir, dtype="bf16")
    assert bf16.dtype == torch.bfloat16 and bf16.null_text_embeds.dtype == torch.float32


def test_vae_encodes_at_input_resolution(diffusion):
    latents = diffusion.encode(torch.rand(2, 3, 16, 16))
    assert latents.shape == (2, 4, 8, 8) and latents.dtype == torch.float32
    again = diffusion.encode(torch.rand(2, 3, 16, 16))
    assert not torch.equal(latents, again)


def test_forward_process_and_targets_match_diffusers(diffusion):
    """DCR's noising and v-target are diffusers' `add_noise` / `get_velocity`, equal to the formulas they
    replaced: x_t = sqrt(a_bar) x0 + sqrt(1 - a_bar) eps and v = sqrt(a_bar) eps - sqrt(1 - a_bar) x0."""
    torch.manual_seed(0)
    x0, eps = torch.randn(3, 4, 8, 8), torch.randn(3, 4, 8, 8)
    t = torch.tensor([0, 500, 999])
    scheduler = DDPMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear")
    a = scheduler.alphas_cumprod.float()[t].view(-1, 1, 1, 1)  # the replaced code's a_bar_t, per image
    noisy = diffusion.add_noise(x0, eps, t)
    torch.testing.assert_close(noisy, a.sqrt() * x0 + (1.0 - a).sqrt() * eps, rtol=0, atol=1e-6)
    torch.testing.assert_close(noisy, scheduler.add_noise(x0, eps, t))
    assert torch.equal(diffusion.target(x0, eps, t, "epsilon"), eps)
    v = diffusion.target(x0, eps, t, "v_prediction")
    torch.testing.assert_close(v, a.sqrt() * eps - (1.0 - a).sqrt() * x0, rtol=0, atol=1e-6)
    torch.testing.assert_close(v, scheduler.get_velocity(x0, eps, t))
    assert torch.equal(diffusion.target(x0, eps, t, "scheduler"), eps)  # this pipeline is an eps-model
    with pytest.raises(ValueError, match="target must be one of"):
        diffusion.target(x0, eps, t, "x0")


def test_scheduler_target_follows_prediction_type(tmp_path):
    v_model = load_diffusion(tiny_diffusion(tmp_path, prediction_type="v_prediction"), dtype="float32")
    x0, eps, t = torch.randn(2, 4, 8, 8), torch.randn(2, 4, 8, 8), torch.tensor([3, 700])
    assert torch.equal(v_model.target(x0, eps, t, "scheduler"), v_model.target(x0, eps, t, "v_prediction"))


def _grid():
    torch.manual_seed(1)
    noisy, t = torch.randn(3, 4, 8, 8), torch.tensor([10, 400, 900])
    conditions = torch.randn(6, 77, 16, requires_grad=True)
    latent_index = torch.tensor([0, 0, 1, 2, 2, 1])
    condition_index = torch.tensor([0, 5, 1, 2, 3, 4])
    return noisy, t, conditions, latent_index, condition_index


def test_pair_predictions_match_the_unet(diffusion):
    noisy, t, conditions, latent_index, condition_index = _grid()
    full = diffusion.predict(noisy, t, conditions, latent_index, condition_index)
    direct = diffusion.unet(
        noisy[latent_index], t[latent_index], encoder_hidden_states=conditions[condition_index]
    )
    torch.testing.assert_close(full, direct.sample)
    with pytest.raises(ValueError, match="unet_chunk_size"):
        diffusion.predict(noisy, t, conditions, latent_index, condition_index, chunk_size=0)


@pytest.mark.parametrize("reuse_prefix", [True, False])
@pytest.mark.parametrize("mode", ["none", "feedforward", "pointwise", "selective", "chunks"])
def test_chunked_and_recomputed_passes_are_exact(diffusion, mode, reuse_prefix):
    noisy, t, conditions, latent_index, condition_index = _grid()
    full = diffusion.predict(noisy, t, conditions, latent_index, condition_index)
    weights = torch.randn_like(full)
    (grad_full,) = torch.autograd.grad((full * weights).sum(), conditions)
    other = FrozenDiffusion(
        diffusion.unet,
        diffusion.vae,
        diffusion.scheduler,
        diffusion.null_text_embeds,
        gradient_checkpointing=mode,
        reuse_prefix=reuse_prefix,
    )
    assert (other.split is not None) == reuse_prefix
    chunked = other.predict(noisy, t, conditions, latent_index, condition_index, chunk_size=4)
    torch.testing.assert_close(chunked, full)
    (grad,) = torch.autograd.grad((chunked * weights).sum(), conditions)
    torch.testing.assert_close(grad, grad_full)


def test_recompute_modes_trade_memory_for_flops(pipeline_dir):
    """Kept bytes fall and recomputed FLOPs rise from none to pointwise to selective to chunks; pointwise
    recomputes no FLOP-counted op, selective the linear layers only, chunks everything. The lean UNet keeps
    less than none at none's FLOPs (its recompute is norms and activations); feedforward less again, for the
    feed-forward projections' FLOPs."""
    from torch.utils.flop_counter import FlopCounterMode

    from hf_vrl.methods.dcr.memory import measure_pair_memory

    diffusion = load_diffusion(pipeline_dir, dtype="float32", lean_activations=False)
    noisy, t, conditions, latent_index, condition_index = _grid()
    kept, executed = {}, {}
    modes = ("feedforward", "pointwise", "selective", "chunks")
    variants = {mode: dict(gradient_checkpointing=mode) for mode in modes}
    variants |= {"none": dict(lean_activations=False), "lean": dict(lean_activations=True)}
    for name, settings in variants.items():
        other = FrozenDiffusion(
            diffusion.unet, diffusion.vae, diffusion.scheduler, diffusion.null_text_embeds, **settings
        )

        def run(cond, other=other):
            return other.predict(noisy, t, cond, latent_index, condition_index)

        kept[name], _ = measure_pair_memory(run, conditions)
        with FlopCounterMode(display=False) as counter:
            run(conditions.detach().requires_grad_()).sum().backward()
        executed[name] = counter.get_total_flops()
    assert kept["none"] > kept["pointwise"] > kept["selective"] > kept["chunks"]
    assert executed["none"] == executed["pointwise"] < executed["selective"] < executed["chunks"]
    assert kept["lean"] < 0.85 * kept["none"] and executed["lean"] == executed["none"]
    assert kept["feedforward"] < kept["lean"] and executed["lean"] < executed["feedforward"]


def test_predict_follows_the_unet_device(diffusion, device):
    """Inputs on the CPU, the UNet on `device` (the device rule): the predictions come back on `device`."""
    noisy, t, conditions, latent_index, condition_index = _grid()
    expected = diffusion.predict(noisy, t, conditions, latent_index, condition_index).detach()
    moved = FrozenDiffusion(diffusion.unet, diffusion.vae, diffusion.scheduler, diffusion.null_text_embeds)
    moved = moved.to(device)
    try:
        got = moved.predict(noisy, t, conditions, latent_index, condition_index)
        assert got.device.type == device.type
        torch.testing.assert_close(got.cpu(), expected, rtol=1e-4, atol=1e-4)
        latents = moved.encode(torch.rand(2, 3, 16, 16))
        assert latents.device.type == device.type and latents.shape == (2, 4, 8, 8)
    finally:
        moved.to("cpu")


def test_auto_chunk_size_from_free_memory(diffusion, monkeypatch):
    noisy, t, conditions, latent_index, condition_index = _grid()
    full = diffusion.predict(noisy, t, conditions, latent_index, condition_index, chunk_size="auto")
    assert diffusion._chunk_sizes == {(6, (3, 4, 8, 8), (6, 77, 16), "none"): None}  # CPU: no limit known
    recompute = FrozenDiffusion(
        diffusion.unet,
        diffusion.vae,
        diffusion.scheduler,
        diffusion.null_text_embeds,
        gradient_checkpointing="chunks",
    )
    monkeypatch.setattr(diffusion_module, "free_memory", lambda device: 200_000)  # the device's answer
    got = recompute.predict(noisy, t, conditions, latent_index, condition_index, chunk_size="auto")
    (size,) = recompute._chunk_sizes.values()
    assert 1 <= size < 6  # the grid (about 80 kB a pass at once) does not fit: smaller calls
    torch.testing.assert_close(got, full)
    monkeypatch.setattr(diffusion_module, "free_memory", lambda device: 2**10)
    recompute._chunk_sizes.clear()
    with pytest.raises(UserError, match="gradient_checkpointing"):
        recompute.predict(noisy, t, conditions, latent_index, condition_index, chunk_size="auto")


def test_empty_prompt_embedding_uses_the_attention_mask(pipeline_dir, diffusion):
    """Official `uc`: the tokenizer's mask reaches the text encoder, so each padding position attends to BOS
    and EOS only (SD pipelines pass no mask: padding attends to padding)."""
    from transformers import AutoTokenizer, CLIPTextModel

    official = empty_prompt_embedding(pipeline_dir)
    unmasked = empty_prompt_embedding(pipeline_dir, attention_mask=False)
    torch.testing.assert_close(diffusion.null_text_embeds, official)  # the default, as the official code
    torch.testing.assert_close(official[:, :2], unmasked[:, :2])  # BOS and EOS see only themselves
    assert (official[0, 2:] - unmasked[0, 2:]).abs().amax(dim=-1).min() > 1e-3  # all 75 padding positions
    # position k alone: [BOS, EOS, pad] at positions [0, 1, k] with the pad masked gives the same vector
    tokenizer = AutoTokenizer.from_pretrained(pipeline_dir, subfolder="tokenizer")
    text_encoder = CLIPTextModel.from_pretrained(pipeline_dir, subfolder="text_encoder")
    ids = tokenizer([""], padding="max_length", max_length=77, return_tensors="pt").input_ids
    for k in (2, 40, 76):
        with torch.no_grad():
            alone = text_encoder(
                input_ids=ids[:, [0, 1, k]],
                attention_mask=torch.tensor([[1, 1, 0]]),
                position_ids=torch.tensor([[0, 1, k]]),
            ).last_hidden_state[0, 2]
        torch.testing.assert_close(official[0, k], alone, rtol=1e-5, atol=1e-5)
    unmasked_dir = load_diffusion(pipeline_dir, dtype="float32", empty_prompt_mask=False)
    torch.testing.assert_close(unmasked_dir.null_text_embeds, unmasked)


def test_block_checkpointing_and_bad_options(pipeline_dir):
    blocks = load_diffusion(pipeline_dir, dtype="float32", gradient_checkpointing="blocks")
    assert blocks.unet.is_gradient_checkpointing
    noisy, t, conditions, latent_index, condition_index = _grid()
    plain = FrozenDiffusion(blocks.unet, blocks.vae, blocks.scheduler, blocks.null_text_embeds)
    with_blocks = blocks.predict(noisy, t, conditions, latent_index, condition_index)
    (grad_blocks,) = torch.autograd.grad(with_blocks.sum(), conditions)
    blocks.unet.disable_gradient_checkpointing()
    (grad,) = torch.autograd.grad(
        plain.predict(noisy, t, conditions, latent_index, condition_index).sum(), conditions
    )
    torch.testing.assert_close(grad_blocks, grad)
    with pytest.raises(ValueError, match="gradient_checkpointing"):
        FrozenDiffusion(
            blocks.unet, blocks.vae, blocks.scheduler, blocks.null_text_embeds, gradient_checkpointing="x"
        )
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_dtype("half")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["none", "selective"])
def test_compiled_unet_is_exact(diffusion, mode):
    """compile_unet gives the eager predictions and condition gradients, on the lean UNet (custom autograd
    functions and checkpoints inside the compiled region) and with selective recompute (a checkpoint policy
    there). Slow: inductor compiles the UNet's forward and backward."""
    noisy, t, conditions, latent_index, condition_index = _grid()
    eager = diffusion.predict(noisy, t, conditions, latent_index, condition_index)
    (grad_eager,) = torch.autograd.grad(eager.sum(), conditions)
    compiled = FrozenDiffusion(
        diffusion.unet,
        diffusion.vae,
        diffusion.scheduler,
        diffusion.null_text_embeds,
        gradient_checkpointing=mode,
        compile_unet=True,
    )
    out = compiled.predict(noisy, t, conditions, latent_index, condition_index)
    torch.testing.assert_close(out, eager, rtol=1e-4, atol=1e-5)
    (grad,) = torch.autograd.grad(out.sum(), conditions)
    torch.testing.assert_close(grad, grad_eager, rtol=1e-4, atol=1e-6)
