"""The lean frozen UNet (`lean_unet`): the same outputs and condition gradients as the untouched UNet, bit for
bit on the CPU, with less kept for backward; and the frozen UNet runs outside the Trainer's autocast."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from dcr_helpers import UNET_LAYOUTS, tiny_unet

from hf_vrl.methods.dcr.diffusion import FrozenDiffusion, sd_ddpm_scheduler
from hf_vrl.methods.dcr.lean_unet import LeanConv2d, lean_unet
from hf_vrl.methods.dcr.memory import LiveMemory


def _assert_same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Bit for bit on the CPU. On CUDA the plain and the lean backward reach cuDNN's data-gradient kernel
    through different calls, whose algorithm choice may differ: equal to rounding."""
    if actual.device.type == "cpu":
        assert torch.equal(actual, expected)
    else:
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)


def _forward_backward(unet, noisy, timesteps, conditions, weights):
    conditions = conditions.clone().requires_grad_(True)
    with LiveMemory() as memory:
        out = unet(noisy, timesteps, encoder_hidden_states=conditions).sample
        kept = memory.live - out.untyped_storage().nbytes()
    (grad,) = torch.autograd.grad((out * weights).sum(), conditions)
    return out.detach(), grad, kept


@pytest.mark.parametrize("layout", sorted(UNET_LAYOUTS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("recompute_feedforward", [False, True])
def test_lean_unet_is_the_unet_with_less_kept(layout, dtype, recompute_feedforward, device):
    plain = tiny_unet(layout).to(device, dtype)
    lean = lean_unet(plain, recompute_feedforward)
    assert any(isinstance(m, LeanConv2d) for m in lean.modules())
    assert not any(isinstance(m, LeanConv2d) for m in plain.modules())  # a copy sharing the weights
    assert lean.conv_in.weight is plain.conv_in.weight
    generator = torch.Generator().manual_seed(1)
    noisy = torch.randn(3, 4, 6, 6, generator=generator).to(device, dtype)  # 6: not a multiple of 2^levels
    timesteps = torch.tensor([3, 500, 999], device=device)
    conditions = torch.randn(3, 7, 12, generator=generator).to(device, dtype)
    weights = torch.randn(3, 4, 6, 6, generator=generator).to(device, dtype)
    out, grad, kept = _forward_backward(plain, noisy, timesteps, conditions, weights)
    lean_out, lean_grad, lean_kept = _forward_backward(lean, noisy, timesteps, conditions, weights)
    _assert_same(lean_out, out)
    _assert_same(lean_grad, grad)
    assert lean_kept < 0.85 * kept


def test_frozen_convolution_gradient(device):
    """Hand-checkable: a 1x1 convolution's input gradient is W^T applied to the output gradient, and strided,
    padded, grouped convolutions agree with autograd's."""
    conv = LeanConv2d(2, 3, kernel_size=1, bias=False).to(device).requires_grad_(False)
    with torch.no_grad():
        conv.weight.copy_(torch.tensor([[1.0, 2.0], [0.0, -1.0], [3.0, 0.5]], device=device)[..., None, None])
    x = torch.ones(1, 2, 1, 1, device=device, requires_grad=True)
    conv(x).sum().backward()
    assert x.grad.flatten().tolist() == [4.0, 1.5]  # column sums of W

    torch.manual_seed(0)
    lean = LeanConv2d(4, 6, kernel_size=3, stride=2, padding=1, groups=2).to(device).requires_grad_(False)
    x = torch.randn(2, 4, 7, 7, device=device, requires_grad=True)
    grad_out = torch.randn(2, 6, 4, 4, device=device)
    (lean_grad,) = torch.autograd.grad((lean(x) * grad_out).sum(), x)
    plain = F.conv2d(x, lean.weight, lean.bias, 2, 1, 1, 2)
    (plain_grad,) = torch.autograd.grad((plain * grad_out).sum(), x)
    _assert_same(lean_grad, plain_grad)


def test_lean_convolution_keeps_no_input_only_when_frozen():
    conv = LeanConv2d(4, 4, kernel_size=3, padding=1).requires_grad_(False)
    x = torch.randn(2, 4, 8, 8, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        conv(x)
        assert saved == [conv.weight.shape]
        saved.clear()
        conv.weight.requires_grad_(True)  # a trainable convolution keeps its input for its weight gradient
        conv(x).sum().backward()
    assert x.shape in saved and conv.weight.grad is not None


def _diffusion(unet, **settings) -> FrozenDiffusion:
    null = torch.zeros(1, 7, 12)
    return FrozenDiffusion(unet, torch.nn.Conv2d(1, 1, 1), sd_ddpm_scheduler(), null, **settings)


@pytest.mark.parametrize("checkpointing", ["blocks", "chunks"])
def test_lean_activations_compose_with_recompute(checkpointing):
    torch.manual_seed(3)
    noisy, timesteps = torch.randn(2, 4, 8, 8), torch.tensor([10, 900])
    conditions = torch.randn(3, 7, 12)
    latent_index, condition_index = torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 1, 2])
    grads = []
    for settings in (dict(lean_activations=False), dict(gradient_checkpointing=checkpointing)):
        diffusion = _diffusion(tiny_unet("sd2"), **settings)
        leaf = conditions.clone().requires_grad_(True)
        out = diffusion.predict(noisy, timesteps, leaf, latent_index, condition_index, chunk_size=2)
        out.square().sum().backward()
        grads.append((out.detach(), leaf.grad))
    torch.testing.assert_close(grads[1][0], grads[0][0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grads[1][1], grads[0][1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("unet_autocast", [False, True])
def test_unet_runs_outside_the_surrounding_autocast(unet_autocast, device):
    """The Trainer's bf16 autocast stops at the frozen UNet (on CUDA it would run the UNet's norms in fp32 and
    keep fp32 activations), unless `unet_autocast`."""
    diffusion = _diffusion(tiny_unet("sd2"), unet_autocast=unet_autocast).to(device)
    seen = []
    hook = lambda *_: seen.append(torch.is_autocast_enabled(device.type))  # noqa: E731
    diffusion.unet.conv_out.register_forward_pre_hook(hook)  # the last module of the prefix-reusing path too
    noisy, timesteps, conditions = torch.randn(2, 4, 8, 8), torch.tensor([1, 2]), torch.randn(2, 7, 12)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        out = diffusion.predict(noisy, timesteps, conditions.requires_grad_(True))
    assert seen and set(seen) == {unet_autocast}
    assert out.dtype == torch.float32
