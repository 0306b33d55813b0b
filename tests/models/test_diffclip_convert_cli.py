"""`hf-vrl convert diffclip`: a released checkpoint or a transformers CLIP becomes a DiffCLIP model folder
that transformers loads (remote code, processors, the zero-shot auto class)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_diffclip_convert import official_state_dict, slip_checkpoint
from transformers import AutoModel, AutoProcessor, AutoTokenizer, CLIPImageProcessorPil

import hf_vrl
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


@pytest.mark.parametrize("damage", ["empty", "truncated", "not a pickle"])
def test_a_damaged_checkpoint_is_one_line_and_writes_nothing(tmp_path, capsys, damage):
    """issue 37: an empty, truncated or garbled .pt was a traceback."""
    path = tmp_path / "checkpoint_best.pt"
    torch.save(slip_checkpoint(official_state_dict()), path)
    data = path.read_bytes()
    path.write_bytes(
        {"empty": b"", "truncated": data[: len(data) // 2], "not a pickle": b"\x00garbage" * 9}[damage]
    )
    out = tmp_path / "diffclip"
    assert cli_main(["convert", "diffclip", "--official", str(path), "--output", str(out)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("hf-vrl")]
    assert len(err) == 1 and "is not a readable PyTorch checkpoint" in err[0], err
    assert not out.exists()


def test_files_follow_the_umask(tmp_path):
    """issue 37: model.safetensors was written 0600 whatever the umask."""
    clip = tmp_path / "clip"
    tokenizer = AutoTokenizer.from_pretrained(preset_path("tiny-clip"))
    tiny_clip(image_size=16, vocab_size=len(tokenizer)).save_pretrained(clip)
    tokenizer.save_pretrained(clip)
    CLIPImageProcessorPil(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16}).save_pretrained(
        clip
    )
    mask = os.umask(0o022)
    try:
        argv = ["convert", "diffclip", "--clip", str(clip), "--calibration", "synthetic"]
        assert cli_main([*argv, "--output", str(tmp_path / "out")]) == 0
    finally:
        os.umask(mask)
    modes = {
        p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "out").iterdir() if not p.name.startswith(".")
    }
    assert modes["model.safetensors"] == 0o644 and set(modes.values()) <= {0o644, 0o755}, modes


def _namespaces() -> bool:
    probe = shutil.which("unshare") and subprocess.run(["unshare", "-Urm", "true"], capture_output=True)
    return bool(probe) and probe.returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not _namespaces(), reason="needs unprivileged mount namespaces (unshare -Urm)")
def test_a_full_disk_is_one_line_and_the_rerun_writes_the_folder(tmp_path):
    """issue 37: a full disk left a half-written folder that the re-run refused as not empty. The output
    lies on a small tmpfs (a private mount namespace); once it is larger, the same command completes."""
    clip, disk = tmp_path / "clip", tmp_path / "disk"
    tokenizer = AutoTokenizer.from_pretrained(preset_path("tiny-clip"))
    tiny_clip(image_size=16, vocab_size=len(tokenizer)).save_pretrained(clip)
    tokenizer.save_pretrained(clip)
    CLIPImageProcessorPil(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16}).save_pretrained(
        clip
    )
    disk.mkdir()
    out = disk / "out"
    convert = [sys.executable, "-m", "hf_vrl.cli", "convert", "diffclip", "--clip", str(clip)]
    convert += ["--calibration", "synthetic", "--output", str(out)]
    full, rerun = tmp_path / "after-full.txt", tmp_path / "after-rerun.txt"
    script = (
        f"mount -t tmpfs -o size=64k tmpfs {disk} && {{ {shlex.join(convert)}; echo $? > {full}; "
        f"ls -A {out} >> {full}; mount -o remount,size=20m {disk} && {shlex.join(convert)} && "
        f"ls -A {out} > {rerun}; }}"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(Path(hf_vrl.__file__).parents[1])}
    proc = subprocess.run(["unshare", "-Urm", "sh", "-c", script], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    code, *left = full.read_text().split()
    assert code == "2" and "no space left on the disk" in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.count("Traceback") == 0
    assert not {"model.safetensors", "conversion.json"} & set(left)  # the failed run left no model files
    assert {"model.safetensors", "conversion.json", "modeling_diffclip.py"} <= set(rerun.read_text().split())
