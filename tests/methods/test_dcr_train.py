"""`hf-vrl train dcr` end to end at tiny sizes: both stages, resume, export, before/after report."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer, CLIPImageProcessor, CLIPVisionModel

from hf_vrl.methods.dcr.diffusion import tiny_diffusion
from hf_vrl.methods.dcr.toy import tiny_clip
from hf_vrl.methods.dcr.train import load_config, main, parse_args
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


def _argv(inputs, out, *extra):
    clip, sd = inputs
    return [
        "--clip", str(clip), "--clip_pretrain_steps", "0", "--diffusion", str(sd),
        "--batch_size", "3", "--max_train_samples", "12", "--eval_samples", "30",
        "--stage1_steps", "2", "--stage2_steps", "2", "--save_steps", "1", "--logging_steps", "1",
        "--lora_r", "4", "--output-dir", str(out), *extra,
    ]  # fmt: skip


def test_two_stages_resume_and_export(inputs, tmp_path):
    out = tmp_path / "run"
    assert main(_argv(inputs, out)) == 0
    report = json.loads((out / "report.json").read_text())
    for name in ("before", "after"):
        assert set(report[name]["clustering"]) == {"nmi", "acc", "ari"}
        assert report[name]["mmvp"]["n_pairs"] == 50 and "text tower" in report[name]["mmvp"]["protocol"]
    assert (out / "stage1" / "final" / "model.safetensors").exists()
    assert (out / "stage2" / "final" / "adapter_model.safetensors").exists()
    assert not list((out / "stage1" / "final").glob("*unet*"))

    tower, info = CLIPVisionModel.from_pretrained(out / "vision-tower", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert (out / "vision-tower" / "preprocessor_config.json").exists()
    merged = DCRModel.from_pretrained(out / "dcr-model")
    assert merged.config.condition_dim == 16 and merged.null_text_embeds.shape == (1, 8, 16)

    # resume stage 2 from its last checkpoint and train one more step
    assert main(_argv(inputs, out, "--stage", "2", "--resume", "--stage2_steps", "3", "--no-eval")) == 0
    state = json.loads((out / "stage2" / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["global_step"] == 3 and [e["step"] for e in state["log_history"] if "loss" in e] == [1, 2, 3]


def test_stage2_needs_stage1(inputs, tmp_path):
    with pytest.raises(FileNotFoundError, match="run --stage 1"):
        main(_argv(inputs, tmp_path / "empty", "--stage", "2", "--no-eval"))


def test_presets_parse_and_override(tmp_path):
    for name in (
        "dcr-tiny",
        "dcr-openai-l14-224",
        "dcr-openai-l14-336",
        "dcr-metaclip-l14",
        "dcr-metaclip-h14",
    ):
        assert load_config(name)
    for name in ("dcr-siglip-so400m-224", "dcr-siglip-so400m-384"):
        assert load_config(name)["clip"].startswith("google/siglip-so400m")
    config, options = parse_args(
        ["--config", "dcr-openai-l14-224", "--target", "v_prediction", "--stage", "1"]
    )
    assert config.clip == "openai/clip-vit-large-patch14" and config.target == "v_prediction"
    assert config.stage1_learning_rate == 1e-4 and config.stage2_learning_rate == 1e-5
    assert config.batch_size == 16 and config.stage2_steps == 4600 and config.weight_decay == 0.01
    assert config.lora_r == 16 and config.lora_alpha == 16 and config.lora_dropout == 0.1
    assert options.stage == "1"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"clip": "x", "learning_rate": 1.0}))
    with pytest.raises(ValueError, match="unknown settings"):
        load_config(str(bad))


def test_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "--stage" in text and "--unet_chunk_size" in text and "Manojb/stable-diffusion-2-1-base" in text


@pytest.mark.slow
def test_no_argument_example_run(tmp_path, monkeypatch):
    """The documented default: the dcr-tiny preset on the toy world (pretraining included), several
    minutes."""
    monkeypatch.chdir(tmp_path)
    assert main([]) == 0
    report = json.loads((tmp_path / "runs" / "dcr" / "report.json").read_text())
    assert report["after"]["mmvp"]["n_pairs"] == 50
