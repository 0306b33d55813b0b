"""DCR checkpoints through `train.run_stage`: resuming reaches the uninterrupted weights exactly; the merged
export loads in plain transformers with zero missing/unexpected keys."""

from __future__ import annotations

import shutil

import pytest
import torch
from dcr_helpers import fixed_model, toy_data
from safetensors.torch import load_file
from transformers import CLIPVisionModel, CLIPVisionModelWithProjection

from hf_vrl.methods.dcr.diffusion import load_diffusion, tiny_diffusion
from hf_vrl.methods.dcr.export import export_vision_tower, merge_lora
from hf_vrl.methods.dcr.task import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
from hf_vrl.methods.dcr.train import DCRRunConfig, run_stage
from hf_vrl.models.dcr import DCRModel

CONFIG = DCRRunConfig(
    batch_size=3,
    stage1_steps=3,
    stage2_steps=3,
    stage1_learning_rate=1e-2,
    stage2_learning_rate=1e-2,
    warmup_steps=1,
    save_steps=2,
    logging_steps=1,
    lora_r=4,
)


@pytest.fixture(scope="module")
def diffusion(tmp_path_factory):
    return load_diffusion(
        tiny_diffusion(tmp_path_factory.mktemp("sd"), text_context_length=8), dtype="float32"
    )


@pytest.fixture(scope="module")
def data():
    return toy_data()


def _run(stage, diffusion, data, out_dir, resume=False):
    return run_stage(
        fixed_model(), stage, diffusion, data, CONFIG, out_dir, resume, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
    )


@pytest.fixture(scope="module")
def encoder_run(diffusion, data, tmp_path_factory):
    """An uninterrupted 3-step stage-2 run (checkpoints at step 2), shared by the resume and export tests."""
    out = tmp_path_factory.mktemp("stage2") / "full"
    return _run("encoder", diffusion, data, out), out


def _check_resume(full, full_dir, stage, diffusion, data, tmp_path):
    shutil.copytree(full_dir / "checkpoint-2", tmp_path / "resumed" / "checkpoint-2")
    resumed = _run(stage, diffusion, data, tmp_path / "resumed", resume=True)
    trained = {n: p for n, p in full.named_parameters() if p.requires_grad}
    again = dict(resumed.named_parameters())
    assert trained and set(trained) == {n for n, p in resumed.named_parameters() if p.requires_grad}
    for name, param in trained.items():
        torch.testing.assert_close(again[name], param, rtol=0, atol=0, msg=name)
    # checkpoints hold what trains (stage 2: the adapter only), never the frozen diffusion model
    weights = "adapter_model.safetensors" if stage == "encoder" else "model.safetensors"
    saved = load_file(full_dir / "checkpoint-2" / weights)
    assert saved and not any("unet" in k or "vae" in k for k in saved)
    return saved


def test_resume_stage1_reaches_the_same_weights(diffusion, data, tmp_path):
    full = _run("projector", diffusion, data, tmp_path / "full")
    _check_resume(full, tmp_path / "full", "projector", diffusion, data, tmp_path)


def test_resume_stage2_reaches_the_same_weights(encoder_run, diffusion, data, tmp_path):
    saved = _check_resume(*encoder_run, "encoder", diffusion, data, tmp_path)
    assert all("lora_" in k for k in saved)


def test_export_loads_as_plain_transformers(encoder_run, tmp_path):
    trained = encoder_run[0]
    merged = merge_lora(trained).eval()
    assert isinstance(merged, DCRModel) and not any("lora_" in n for n, _ in merged.named_parameters())
    assert any("lora_A" in n for n, _ in trained.named_parameters())  # the trained model is left untouched
    x = torch.rand(2, 3, 16, 16)

    out = export_vision_tower(trained, tmp_path / "tower")
    keys = set(load_file(out / "model.safetensors"))
    expected = {f"vision_model.{k}" for k in CLIPVisionModel(merged.config.vision_config).state_dict()}
    assert keys == expected  # the 4.x / 5.x cross-version layout (hf-conventions 2.5)
    tower, info = CLIPVisionModel.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    with torch.no_grad():
        exported = tower.eval()(pixel_values=x).pooler_output
        torch.testing.assert_close(exported, merged.vision_model(pixel_values=x).pooler_output)
        with_lora = trained.eval()(pixel_values=x).image_embeds
        torch.testing.assert_close(merged.get_image_features(x), with_lora, atol=1e-5, rtol=1e-5)

    out = export_vision_tower(trained, tmp_path / "with-proj", with_projection=True)
    proj, info = CLIPVisionModelWithProjection.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    with torch.no_grad():
        torch.testing.assert_close(proj.eval()(pixel_values=x).image_embeds, merged.get_image_features(x))
