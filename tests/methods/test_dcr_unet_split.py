"""The UNet split at its first cross-attention: prefix once per latent + suffix per condition is the UNet's
own forward (outputs and gradients w.r.t. the conditions), on tiny UNets of the SD-1.x, SD-2.x and hf_vrl-toy
layouts, latent sizes that divide 2^levels and ones that do not."""

from __future__ import annotations

import pytest
import torch
from dcr_helpers import UNET_COMMON as COMMON
from dcr_helpers import UNET_LAYOUTS as LAYOUTS
from dcr_helpers import tiny_unet as _unet
from diffusers import UNet2DConditionModel

from hf_vrl.methods.dcr.unet_split import SplitUNet


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("size", [8, 6])  # 6: not a multiple of 2^upsamplers (SD at 224 px: 28 latents)
def test_prefix_reuse_equals_the_unet(layout, size):
    unet = _unet(layout).double()
    split = SplitUNet(unet)
    torch.manual_seed(1)
    noisy, timesteps = torch.randn(3, 4, size, size, dtype=torch.float64), torch.tensor([3, 500, 999])
    conditions = torch.randn(5, 7, 12, dtype=torch.float64, requires_grad=True)
    latent_index, condition_index = torch.tensor([0, 0, 1, 2, 2]), torch.tensor([0, 1, 2, 3, 4])
    plain = unet(noisy[latent_index], timesteps[latent_index], encoder_hidden_states=conditions).sample
    with torch.no_grad():
        prefix = split.prefix(noisy, timesteps)  # 3 latents, not 5 passes
    reused = split.suffix(prefix.select(latent_index), conditions[condition_index])
    torch.testing.assert_close(reused, plain, rtol=1e-12, atol=1e-12)
    weights = torch.randn_like(plain)
    (grad_plain,) = torch.autograd.grad((plain * weights).sum(), conditions)
    (grad_reused,) = torch.autograd.grad((reused * weights).sum(), conditions)
    torch.testing.assert_close(grad_reused, grad_plain, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_same_batch_is_bitwise_the_unet(layout):
    """Same batch composition as the plain call: the same kernels on the same data, bit for bit."""
    unet = _unet(layout)
    torch.manual_seed(2)
    noisy, timesteps, conditions = (
        torch.randn(4, 4, 8, 8),
        torch.tensor([0, 10, 600, 999]),
        torch.randn(4, 7, 12),
    )
    with torch.no_grad():
        assert torch.equal(
            SplitUNet(unet)(noisy, timesteps, conditions), unet(noisy, timesteps, conditions).sample
        )


def test_block_checkpointing_inside_the_suffix():
    unet = _unet("sd2")
    split = SplitUNet(unet)
    torch.manual_seed(3)
    noisy, timesteps = torch.randn(2, 4, 8, 8), torch.tensor([5, 700])
    conditions = torch.randn(2, 7, 12, requires_grad=True)
    (expected,) = torch.autograd.grad(split(noisy, timesteps, conditions).sum(), conditions)
    unet.enable_gradient_checkpointing()
    (got,) = torch.autograd.grad(split(noisy, timesteps, conditions).sum(), conditions)
    torch.testing.assert_close(got, expected)


def test_unsupported_unets_are_named():
    no_cross = UNet2DConditionModel(
        **COMMON,
        block_out_channels=(8, 16),
        down_block_types=("DownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "UpBlock2D"),
        mid_block_type=None,
    )
    assert "no cross-attention" in SplitUNet.unsupported_reason(no_cross)
    assert "not a UNet2DConditionModel" in SplitUNet.unsupported_reason(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="cannot split"):
        SplitUNet(no_cross)
    assert SplitUNet.supports(_unet("sd1"))
