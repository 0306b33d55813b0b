"""DCRModel.build_conditions: Table 7's patch-token conditions start from the official (empty-prompt)
condition, so 0% patches is the main row; SigLIP patch tokens reach the projector in the pooled output's
space."""

from __future__ import annotations

import pytest
import torch
from transformers import SiglipVisionConfig, SiglipVisionModel

from hf_vrl.methods.dcr.toy import tiny_clip
from hf_vrl.models.dcr import DCRModel


def _pair(tower, ratio: float, tokens: int = 5) -> tuple[DCRModel, DCRModel]:
    """An official-mode and a cls_patches-mode model with the same weights and empty-prompt embedding."""
    official = DCRModel.from_clip(tower, condition_dim=16, num_condition_tokens=tokens).eval()
    patches = DCRModel.from_clip(
        tower,
        condition_dim=16,
        num_condition_tokens=tokens,
        condition_mode="cls_patches",
        patch_token_ratio=ratio,
    ).eval()
    patches.projector.load_state_dict(official.projector.state_dict())
    null = torch.randn(1, tokens, 16)
    official.set_null_text_embeds(null)
    patches.set_null_text_embeds(null)
    return official, patches


def test_zero_patches_is_the_official_condition():
    official, patches = _pair(tiny_clip(image_size=16), ratio=0.0)
    x = torch.rand(2, 3, 16, 16)
    assert torch.equal(patches(x).conditions, official(x).conditions)  # Table 7's 0% row = the main result


def test_clip_patches_follow_the_official_tokens():
    clip = tiny_clip(image_size=16)
    official, patches = _pair(clip, ratio=0.25)
    x = torch.rand(2, 3, 16, 16)
    out = patches(x)
    assert out.conditions.shape == (2, 5 + 4, 16)  # 16 patches of 4 px, 25% kept
    torch.testing.assert_close(out.conditions[:, :5], official(x).conditions)
    # eval keeps evenly strided patches 0, 5, 10, 15; each goes through post-LN + projection, as [CLS] does
    hidden = clip.vision_model(pixel_values=x).last_hidden_state[:, 1:]
    kept = clip.visual_projection(clip.vision_model.post_layernorm(hidden[:, [0, 5, 10, 15]]))
    torch.testing.assert_close(out.conditions[:, 5:], patches.projector(kept))


def test_siglip_patches_are_pooled_one_token_at_a_time():
    """Each SigLIP patch token becomes what the attention-pooling head outputs on it alone (z's space)."""
    torch.manual_seed(0)
    config = SiglipVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=16,
        patch_size=4,
    )
    tower = SiglipVisionModel(config).eval()
    official, patches = _pair(tower, ratio=0.25)
    x = torch.rand(2, 3, 16, 16)
    out = patches(x)
    torch.testing.assert_close(out.conditions[:, :5], official(x).conditions)
    hidden = tower(pixel_values=x).last_hidden_state  # post-LN, 16 patch tokens, no [CLS]
    head = tower.head
    pooled = torch.stack([head(hidden[:, [p]]) for p in (0, 5, 10, 15)], dim=1)  # the head on one token
    torch.testing.assert_close(out.conditions[:, 5:], patches.projector(pooled))
    assert not torch.allclose(pooled, hidden[:, [0, 5, 10, 15]], atol=1e-2)  # not the raw hidden states


@pytest.mark.parametrize("mode", ["official", "cls_patches"])
def test_empty_prompt_buffer_in_both_modes(mode):
    model = DCRModel.from_clip(
        tiny_clip(image_size=16), condition_dim=16, num_condition_tokens=5, condition_mode=mode
    )
    assert model.null_text_embeds.shape == (1, 5, 16)
