"""DCRConfig / DCRModel: tower copied exactly from CLIP/SigLIP, projector and condition modes, save/load,
remote code."""

from __future__ import annotations

import json

import pytest
import torch
from remote_code import remote_load
from transformers import SiglipVisionConfig, SiglipVisionModel

from hf_vrl.methods.dcr.toy import tiny_clip
from hf_vrl.models.dcr import DCRConfig, DCRModel


@pytest.fixture(scope="module")
def clip():
    return tiny_clip().eval()


def _embeds(output):
    return getattr(output, "pooler_output", output)


def test_from_clip_copies_tower_and_projection(clip):
    model = DCRModel.from_clip(clip, condition_dim=16, num_condition_tokens=5).eval()
    x = torch.rand(3, 3, 16, 16)
    torch.testing.assert_close(
        model.get_image_features(x).pooler_output, _embeds(clip.get_image_features(pixel_values=x))
    )
    assert model.config.image_embed_dim == 24  # CLIP feeds the projector its projected embedding
    assert model.projector.linear_1.in_features == 24 and model.projector.linear_2.out_features == 16
    assert model.config.projector_hidden_dim == 16  # official clip_dim = condition width


def test_from_clip_checkpoint_paths(clip, tmp_path):
    clip.save_pretrained(tmp_path / "clip")
    from_dir = DCRModel.from_clip(str(tmp_path / "clip"), condition_dim=16, num_condition_tokens=5).eval()
    x = torch.rand(2, 3, 16, 16)
    torch.testing.assert_close(
        from_dir.get_image_features(x).pooler_output, _embeds(clip.get_image_features(pixel_values=x))
    )
    from_dir.vision_model.save_pretrained(tmp_path / "vision-only")  # a bare tower has no projection to copy
    with pytest.raises(ValueError, match="does not hold a complete CLIPVisionModelWithProjection"):
        DCRModel.from_clip(str(tmp_path / "vision-only"))


def test_condition_modes(clip):
    x = torch.rand(2, 3, 16, 16)
    official = DCRModel.from_clip(clip, condition_dim=16, num_condition_tokens=5).eval()
    null = torch.randn(1, 5, 16)
    official.set_null_text_embeds(null)
    out = official(x)
    # official: empty-prompt embedding + projected image embedding broadcast over all tokens
    expected = null + official.projector(out.image_embeds).unsqueeze(1)
    torch.testing.assert_close(out.conditions, expected)

    cls = DCRModel.from_clip(clip, condition_dim=16, condition_mode="cls").eval()
    out = cls(x)
    assert out.conditions.shape == (2, 1, 16)
    torch.testing.assert_close(out.conditions[:, 0], cls.projector(out.image_embeds))
    assert cls.null_text_embeds is None

    patches = DCRModel.from_clip(
        clip, condition_dim=16, num_condition_tokens=5, condition_mode="cls_patches", patch_token_ratio=0.25
    )
    patches.eval()
    assert patches(x).conditions.shape == (2, 5 + 4, 16)  # 16 patches at 16 px / patch 4, keep 25%
    patches.train()
    assert patches(x).conditions.shape == (2, 9, 16)
    patches.config.patch_token_ratio = 0.0
    assert patches(x).conditions.shape == (2, 5, 16)  # Table 7's 0% row: the official condition


def test_set_null_text_embeds_checks_shape(clip):
    model = DCRModel.from_clip(clip, condition_dim=16, num_condition_tokens=5)
    with pytest.raises(ValueError, match="num_condition_tokens"):
        model.set_null_text_embeds(torch.zeros(1, 77, 16))
    with pytest.raises(ValueError, match="uses no text embedding"):
        DCRModel.from_clip(clip, condition_dim=16, condition_mode="cls").set_null_text_embeds(
            torch.zeros(1, 5, 16)
        )


def test_siglip_tower_uses_pooled_output():
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
    model = DCRModel.from_clip(tower, condition_dim=16, condition_mode="cls").eval()
    assert model.visual_projection is None and model.config.image_embed_dim == 32
    x = torch.rand(2, 3, 16, 16)
    torch.testing.assert_close(model.get_image_features(x).pooler_output, tower(pixel_values=x).pooler_output)


def test_config_validation():
    with pytest.raises(Exception, match="condition_mode"):
        DCRConfig(condition_mode="tokens")
    with pytest.raises(Exception, match="clip_vision_model"):
        DCRConfig(vision_config={"model_type": "bert"})
    with pytest.raises(Exception, match="patch_token_ratio"):
        DCRConfig(patch_token_ratio=1.5)
    with pytest.raises(TypeError, match="CLIPModel"):
        DCRModel.from_clip(torch.nn.Linear(2, 2))


def test_save_load_round_trip(clip, tmp_path):
    model = DCRModel.from_clip(clip, condition_dim=16, num_condition_tokens=5).eval()
    model.set_null_text_embeds(torch.randn(1, 5, 16))
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "dcr" and config["vision_config"]["model_type"] == "clip_vision_model"
    loaded = DCRModel.from_pretrained(tmp_path).eval()
    x = torch.rand(2, 3, 16, 16)
    assert torch.equal(loaded(x).conditions, model(x).conditions)  # null embedding saved as a buffer
    # a fresh projector is initialised by _init_weights, not left as garbage
    fresh = DCRModel(DCRConfig(vision_config=model.config.vision_config.to_dict(), condition_dim=16))
    assert torch.isfinite(fresh.projector.linear_1.weight).all()
    assert fresh.projector.layer_norm.weight.eq(1).all() and fresh.null_text_embeds.eq(0).all()


def test_remote_code_loads_without_hf_vrl(clip, tmp_path):
    """The modeling files are self-contained: a fresh interpreter without hf_vrl loads them via
    trust_remote_code and gives the same outputs (same torch thread settings on both sides)."""
    model = DCRModel.from_clip(clip, condition_dim=16, num_condition_tokens=5).eval()
    model.set_null_text_embeds(torch.randn(1, 5, 16))
    model.save_pretrained(tmp_path / "m")
    assert (tmp_path / "m" / "modeling_dcr.py").exists() and (
        tmp_path / "m" / "configuration_dcr.py"
    ).exists()
    auto_map = json.loads((tmp_path / "m" / "config.json").read_text())["auto_map"]
    assert auto_map == {"AutoConfig": "configuration_dcr.DCRConfig", "AutoModel": "modeling_dcr.DCRModel"}
    x = torch.rand(2, 3, 16, 16)
    with torch.no_grad():
        expected = model(x)
    loaded = remote_load(tmp_path / "m", {"pixel_values": x}, tmp_path / "child")
    assert loaded["cls"] == "DCRModel"
    for name in ("image_embeds", "conditions", "last_hidden_state"):
        torch.testing.assert_close(loaded["outputs"][name], expected[name], rtol=0, atol=0, msg=name)
