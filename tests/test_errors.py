"""Mistakes users make print one or two lines that say what to change (the traceback only with --debug)."""

from __future__ import annotations

import pytest
from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

from hf_vrl.cli import main
from hf_vrl.errors import UserError, explain
from hf_vrl.run.layout import RUN_MARKER


def run(argv, capsys):
    capsys.readouterr()  # what the test itself printed before
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    return code, err


def test_a_missing_model_folder_is_one_line(tmp_path, capsys):
    code, err = run(
        ["train", "dcr", "--clip", str(tmp_path / "no-such-clip"), "--output-dir", str(tmp_path / "o")],
        capsys,
    )
    assert code == 2 and len(err) == 2
    assert (
        "no-such-clip" in err[0] and "neither a local folder nor reachable on the Hugging Face Hub" in err[0]
    )
    assert err[1] == "(run with --debug for the traceback)"


def test_a_damaged_weight_file_is_named(tmp_path, capsys):
    config = CLIPConfig(
        text_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2),
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           image_size=16, patch_size=8),
    )  # fmt: skip
    CLIPModel(config).save_pretrained(tmp_path / "clip")
    CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16}).save_pretrained(
        tmp_path / "clip"
    )
    weights = tmp_path / "clip" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])  # a truncated download
    argv = ["train", "dcr", "--clip", str(tmp_path / "clip"), "--clip-pretrain-steps", "0"]
    code, err = run([*argv, "--output-dir", str(tmp_path / "o")], capsys)
    assert code == 2 and len(err) == 2
    assert str(weights) in err[0] and "truncated or damaged" in err[0]


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(UserError, match="already holds a run"):
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / RUN_MARKER).write_text('{"hf_vrl": "0", "command": "train"}')  # hf_vrl's folder
        (tmp_path / "run" / "config.json").write_text('{"method": "diffclip", "optim": {}}')
        (tmp_path / "run" / "final").mkdir()  # a run that saved its work
        main(["train", "diffclip", "--output-dir", str(tmp_path / "run"), "--debug"])


def test_bugs_keep_their_traceback():
    assert explain(ZeroDivisionError("division by zero")) is None
    assert explain(UserError("change x")) == "change x"


def test_a_write_that_found_the_disk_full_is_not_called_a_damaged_file():
    """safetensors reports a full disk as a SafetensorError, which said 'cannot be read ... re-download'."""
    from safetensors import SafetensorError

    message = explain(
        SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    )
    assert message.startswith("no space left on the disk (SafetensorError") and "re-download" not in message
