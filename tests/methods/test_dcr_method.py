"""`hf-vrl train dcr` on the shared run design at tiny sizes: both stages, the exports, the before/after
report, stage plans."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer, CLIPImageProcessor, CLIPModel, CLIPVisionModel

import hf_vrl
from hf_vrl.errors import UserError
from hf_vrl.methods.dcr.diffusion import tiny_diffusion
from hf_vrl.methods.dcr.toy import tiny_clip
from hf_vrl.models.dcr import DCRModel
from hf_vrl.presets import preset_path


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A 16-px CLIP checkpoint (weights, processor, the toy tokenizer) and a tiny SD pipeline folder."""
    root = tmp_path_factory.mktemp("inputs")
    tokenizer = AutoTokenizer.from_pretrained(preset_path("tiny-clip"))
    clip = tiny_clip(image_size=16, vocab_size=len(tokenizer))
    clip.save_pretrained(root / "clip")
    tokenizer.save_pretrained(root / "clip")
    CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16}).save_pretrained(
        root / "clip"
    )
    return root / "clip", tiny_diffusion(root / "sd", image_size=16, text_context_length=8)


def run(inputs, out, **settings):
    clip, sd = inputs
    tiny = dict(
        clip=str(clip), clip_pretrain_steps=0, diffusion=str(sd), batch_size=3, train_limit=12, eval_limit=30,
        stage1_steps=2, max_steps=2, save_steps=1, logging_steps=1, lora_r=4,
    )  # fmt: skip
    return hf_vrl.train("dcr", output_dir=str(out), **(tiny | settings))


@pytest.fixture(scope="module")
def both(inputs, tmp_path_factory):
    out = tmp_path_factory.mktemp("dcr") / "run"
    return out, run(inputs, out)


def test_two_stages_write_the_common_layout(both):
    out, report = both
    assert report["method"] == "dcr" and report["train"]["stages"]["stage1"]["steps"] == 2
    assert report["train"]["stages"]["stage2"]["steps"] == 2 and report["train"]["steps"] == 4
    for name in ("before", "after"):
        assert set(report[name]["clustering"]) == {"nmi", "acc", "ari", "data"}
        assert report[name]["mmvp"]["n_pairs"] == 50 and "text tower" in report[name]["mmvp"]["protocol"]
    # what each was measured on: the evaluation rows, and the toy MMVP-style pairs
    shapes = {
        "dataset": "shapes",
        "split": "test",
        "n_samples": 30,
        "limit": 30,
        "seed": 0,
        "drawn": "generated",
        "texts": "generated",
    }
    assert report["after"]["clustering"]["data"] == shapes
    assert report["after"]["clustering_fine"]["data"] == {**shapes, "labels": "fine_label"}
    assert (
        report["after"]["mmvp"]["data"]
        == report["after"]["pairs"]["data"]
        == {"dataset": "toy", "n_samples": 50, "drawn": "generated", "seed": 0}  # generated from the seed
    )
    assert (out / "checkpoints/stage1/done/model.safetensors").exists()
    assert (out / "checkpoints/stage2/checkpoint-2/adapter_model.safetensors").exists()
    assert not list((out / "checkpoints/stage1/done").glob("*unet*"))  # the diffusion model is never saved


def test_final_is_the_base_clip_with_the_enhanced_tower(both, inputs):
    out, _ = both
    final, info = CLIPModel.from_pretrained(out / "final", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    base = CLIPModel.from_pretrained(inputs[0])
    merged = DCRModel.from_pretrained(out / "exports/dcr-model")
    x = torch.rand(2, 3, 16, 16)
    with torch.no_grad():  # the image side is the enhanced one, the text side the original
        torch.testing.assert_close(
            final.get_image_features(pixel_values=x).pooler_output, merged.get_image_features(x).pooler_output
        )
        ids = torch.tensor([[0, 5, 1]])
        torch.testing.assert_close(
            final.get_text_features(input_ids=ids).pooler_output,
            base.get_text_features(input_ids=ids).pooler_output,
        )
        assert not torch.allclose(
            final.get_image_features(pixel_values=x).pooler_output,
            base.get_image_features(pixel_values=x).pooler_output,
        )
    assert (out / "final/preprocessor_config.json").exists() and (out / "final/tokenizer.json").exists()


def test_vision_tower_export_loads_as_plain_transformers(both):
    out, _ = both
    tower, info = CLIPVisionModel.from_pretrained(out / "exports/vision-tower", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert (out / "exports/vision-tower/preprocessor_config.json").exists()
    merged = DCRModel.from_pretrained(out / "exports/dcr-model")
    assert merged.config.condition_dim == 16 and merged.null_text_embeds.shape == (1, 8, 16)


def test_a_projector_only_run_keeps_the_dcr_model(inputs, tmp_path):
    report = run(inputs, tmp_path / "s1", stage="1", eval_before=False, eval_after=False)
    assert list(report["train"]["stages"]) == ["stage1"]
    assert DCRModel.from_pretrained(tmp_path / "s1" / "final").config.condition_mode == "official"
    report = run(inputs, tmp_path / "e2e", stage="end_to_end", eval_before=False, eval_after=False)
    assert list(report["train"]["stages"]) == ["end_to_end"]


@pytest.mark.parametrize("lean, autocast", [(True, False), (False, True)])
def test_unet_memory_settings_reach_the_frozen_diffusion(inputs, tmp_path, monkeypatch, lean, autocast):
    """--lean-activations / --unet-autocast reach the run's FrozenDiffusion (the real one, recorded)."""
    from hf_vrl.methods.dcr import diffusion as diffusion_module
    from hf_vrl.methods.dcr.lean_unet import LeanConv2d

    built, load = [], diffusion_module.load_diffusion

    def recorded(*args, **kwargs):
        built.append(load(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(diffusion_module, "load_diffusion", recorded)
    settings = dict(stage="1", stage1_steps=1, eval_before=False, eval_after=False)
    run(inputs, tmp_path / "run", lean_activations=lean, unet_autocast=autocast, **settings)
    (diffusion,) = built
    assert diffusion.unet_autocast is autocast
    assert any(isinstance(m, LeanConv2d) for m in diffusion.unet.modules()) is lean


def test_stage2_needs_a_finished_stage1(inputs, tmp_path):
    with pytest.raises(UserError, match="whose stage 1 is finished"):
        run(inputs, tmp_path / "empty", stage="2", eval_before=False)


def test_report_json_is_the_report(both):
    out, report = both
    assert json.loads((out / "report.json").read_text()) == report


@pytest.mark.slow
def test_no_argument_run(tmp_path, monkeypatch):
    """The documented default: the dcr-tiny preset on the toy world (toy inputs included), several minutes."""
    from hf_vrl.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["train", "dcr"]) == 0
    report = json.loads((tmp_path / "runs" / "dcr-tiny" / "report.json").read_text())
    assert report["after"]["mmvp"]["n_pairs"] == 50


def test_encoder_gradient_checkpointing_recomputes_the_tower_in_the_stage_that_trains_it(
    inputs, tmp_path, monkeypatch
):
    """--encoder-gradient-checkpointing turns on the tower's checkpointing in stage 2 (LoRA on the tower),
    not in stage 1 (the tower frozen); the tower's layers then run again in backward."""
    from transformers.models.clip.modeling_clip import CLIPEncoderLayer

    enabled, calls = [], []
    enable = DCRModel.activation_checkpointing_enable

    def recorded(self, *args, **kwargs):
        enabled.append(type(self).__name__)
        return enable(self, *args, **kwargs)

    monkeypatch.setattr(DCRModel, "activation_checkpointing_enable", recorded)
    forward = CLIPEncoderLayer.forward
    monkeypatch.setattr(
        CLIPEncoderLayer, "forward", lambda self, *a, **k: calls.append(1) or forward(self, *a, **k)
    )
    settings = dict(stage1_steps=1, max_steps=1, eval_before=False, eval_after=False)
    report = run(inputs, tmp_path / "run", encoder_gradient_checkpointing=True, **settings)
    assert enabled == ["DCRModel"] and list(report["train"]["stages"]) == ["stage1", "stage2"]
    layers = DCRModel.from_pretrained(tmp_path / "run" / "exports" / "dcr-model").config.vision_config
    # stage 1 and stage 2's forward: one call per layer each; stage 2's backward recomputes layers again
    assert len(calls) > 2 * layers.num_hidden_layers
