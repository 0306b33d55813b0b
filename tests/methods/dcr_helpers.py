"""Shared pieces of the DCR tests: a tiny stage-1 model with fixed weights and the toy data it trains on."""

from __future__ import annotations

import torch
from diffusers import UNet2DConditionModel

from hf_vrl.data.toy import shapes_dataset
from hf_vrl.methods.dcr.toy import tiny_clip
from hf_vrl.models.dcr import DCRModel


def fixed_model() -> DCRModel:
    """The same weights every call (stage 2 resumes on top of a fixed stage-1 model, projector included)."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return DCRModel.from_clip(tiny_clip(seed=0), condition_dim=16, num_condition_tokens=8)


def toy_data():
    """Twelve 16-px shapes-world images with the per-sample crop seed the run layer gives every row
    (`sample_seed`: `DCRCollator` crops from it, so resumed runs see the same crops whatever the prefetch)."""
    data = shapes_dataset(12, seed=0, image_size=16)
    return data.add_column("sample_seed", [1000 + i for i in range(len(data))])


UNET_COMMON = dict(sample_size=8, in_channels=4, out_channels=4, cross_attention_dim=12, norm_num_groups=4)
UNET_LAYOUTS = {
    # SD-1.x: cross-attention in the first three levels, conv proj_in/proj_out, one head width everywhere
    "sd1": dict(
        block_out_channels=(8, 16, 16),
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
        attention_head_dim=4,
        layers_per_block=2,
    ),
    # SD-2.x: linear proj_in/proj_out, head widths per level
    "sd2": dict(
        block_out_channels=(8, 16, 16),
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
        attention_head_dim=(2, 4, 4),
        use_linear_projection=True,
        layers_per_block=2,
    ),
    # hf_vrl's tiny_diffusion: a plain down block before the first cross-attention
    "toy": dict(
        block_out_channels=(8, 16),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=4,
        layers_per_block=1,
    ),
}


def tiny_unet(layout: str) -> UNet2DConditionModel:
    """A frozen tiny UNet of one of `UNET_LAYOUTS`, the same weights every call."""
    torch.manual_seed(0)
    return UNet2DConditionModel(**UNET_COMMON, **UNET_LAYOUTS[layout]).eval().requires_grad_(False)
