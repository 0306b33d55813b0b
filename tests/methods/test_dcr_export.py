"""The DCR exports load in plain transformers with no missing or unexpected keys and compute what the trained
(LoRA-wrapped) model computes."""

from __future__ import annotations

import torch
from dcr_helpers import fixed_model
from safetensors.torch import load_file
from transformers import CLIPVisionModel, CLIPVisionModelWithProjection

from hf_vrl.methods.dcr.export import export_vision_tower, merge_lora
from hf_vrl.methods.dcr.trainer import LoraSettings, prepare_stage
from hf_vrl.models.dcr import DCRModel


def trained_lora(device):
    """A stage-2 model whose adapters moved away from their zero start, as after training."""
    model = prepare_stage(fixed_model(), "encoder", LoraSettings(r=4))
    with torch.no_grad():
        generator = torch.Generator().manual_seed(0)
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(0.1 * torch.randn(param.shape, generator=generator))
    return model.to(device)


def test_export_loads_as_plain_transformers(tmp_path, device):
    trained = trained_lora(device)
    merged = merge_lora(trained).eval()
    assert isinstance(merged, DCRModel) and not any("lora_" in n for n, _ in merged.named_parameters())
    assert any("lora_A" in n for n, _ in trained.named_parameters())  # the trained model is left untouched
    x = torch.rand(2, 3, 16, 16, device=device)

    out = export_vision_tower(trained, tmp_path / "tower")
    keys = set(load_file(out / "model.safetensors"))
    expected = {f"vision_model.{k}" for k in CLIPVisionModel(merged.config.vision_config).state_dict()}
    assert keys == expected  # the 4.x / 5.x cross-version layout (hf-conventions 2.5)
    tower, info = CLIPVisionModel.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    tower = tower.to(device).eval()
    with torch.no_grad():
        exported = tower(pixel_values=x).pooler_output
        torch.testing.assert_close(exported, merged.vision_model(pixel_values=x).pooler_output)
        with_lora = trained.eval()(pixel_values=x).image_embeds
        torch.testing.assert_close(
            merged.get_image_features(x).pooler_output, with_lora, atol=1e-5, rtol=1e-5
        )

    out = export_vision_tower(trained, tmp_path / "with-proj", with_projection=True)
    proj, info = CLIPVisionModelWithProjection.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    with torch.no_grad():
        torch.testing.assert_close(
            proj.to(device).eval()(pixel_values=x).image_embeds, merged.get_image_features(x).pooler_output
        )
