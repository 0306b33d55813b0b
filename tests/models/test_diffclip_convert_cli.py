"""`hf-vrl convert diffclip`: a released checkpoint or a transformers CLIP becomes a DiffCLIP model folder
that transformers loads (remote code, processors, the zero-shot auto class)."""

from __future__ import annotations

import json

import pytest
import torch
from test_diffclip_convert import official_state_dict, slip_checkpoint
from transformers import AutoModel, AutoProcessor, AutoTokenizer, CLIPImageProcessorPil

from hf_vrl.cli import main as cli_main
from hf_vrl.errors import UserError
from hf_vrl.methods import diffclip
from hf_vrl.methods.dcr.toy import tiny_clip
from hf_vrl.models.diffclip import DiffCLIPModel
from hf_vrl.presets import preset_path


def _check_folder(out) -> DiffCLIPModel:
    model = AutoModel.from_pretrained(out)
    assert isinstance(model, DiffCLIPModel)
    auto_map = json.loads((out / "config.json").read_text())["auto_map"]
    assert auto_map["AutoModelForZeroShotImageClassification"] == "modeling_diffclip.DiffCLIPModel"
    assert (out / "modeling_diffclip.py").is_file() and (out / "differential_attention.py").is_file()
    assert (out / "preprocessor_config.json").is_file()
    return model


def test_convert_a_clip(tmp_path, capsys):
    tokenizer = AutoTokenizer.from_pretrained(preset_path("tiny-clip"))
    clip_dir = tmp_path / "clip"
    tiny_clip(image_size=16, vocab_size=len(tokenizer)).save_pretrained(clip_dir)
    tokenizer.save_pretrained(clip_dir)
    CLIPImageProcessorPil(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16}).save_pretrained(
        clip_dir
    )
    out = tmp_path / "diffclip"
    argv = [
        "convert",
        "diffclip",
        "--clip",
        str(clip_dir),
        "--output",
        str(out),
        "--calibration",
        "synthetic",
    ]
    assert cli_main(argv) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    model = _check_folder(out)
    assert type(AutoProcessor.from_pretrained(out)).__name__ == "CLIPProcessor"
    assert model.config.text_config.vocab_size == len(tokenizer)


def test_convert_an_official_checkpoint_and_refuse_a_full_folder(tmp_path):
    path = tmp_path / "checkpoint_best.pt"
    torch.save(slip_checkpoint(official_state_dict()), path)
    out = tmp_path / "diffclip"
    assert cli_main(["convert", "diffclip", "--official", str(path), "--output", str(out)]) == 0
    expected = diffclip.from_official_checkpoint(path)
    model = _check_folder(out)
    for name, tensor in expected.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], tensor, rtol=0, atol=0)
    with pytest.raises(UserError, match="not empty"):
        from hf_vrl.methods.diffclip.convert_cli import main

        main(["diffclip", "--official", str(path), "--output", str(out)])
