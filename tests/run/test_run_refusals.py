"""Every mistake issue 29 lists is refused in at most three lines before anything is written (the folder
is as it was, hidden files included), and remote code runs only on request. In-process `hf-vrl` calls."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from data_fixtures import write_plain_shard
from PIL import Image

from hf_vrl.cli import main


def listing(root: Path) -> list[str]:
    """`ls -R -a` of `root`: every file and folder with its size."""
    return sorted(
        f"{Path(parent, name).relative_to(root)}:{os.path.getsize(Path(parent, name))}"
        for parent, dirs, files in os.walk(root)
        for name in dirs + files
    )


def refused(argv: list[str], root: Path, capsys) -> str:
    """Run `hf-vrl argv` in `root`; assert it failed in at most three lines and wrote nothing."""
    before = listing(root)
    capsys.readouterr()
    cwd = os.getcwd()
    os.chdir(root)
    try:
        code = main(argv)
    finally:
        os.chdir(cwd)
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith(("hf-vrl", "(run with"))]
    assert code == 2 and 1 <= len(err) <= 3, err
    assert listing(root) == before
    return err[0]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """A tiny CLUE model, a broken YAML preset, a file, a folder of someone else's, a shard."""
    from hf_vrl.models.clue import CLUEConfig, CLUEModel

    root = tmp_path_factory.mktemp("workspace")
    backbone = {"model_type": "resnet", "embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 1]}
    config = CLUEConfig(
        backbone_config=backbone, projection_hidden_dim=16, projection_dim=8, predictor_hidden_dim=16
    )
    CLUEModel(config).save_pretrained(root / "clue-model")
    (root / "broken.yaml").write_text("optim:\n  batch_size: [1, 2\n")
    (root / "a-file").write_text("x")
    for name in ("figures", "logs", "exports"):
        (root / "mine" / name).mkdir(parents=True)
        (root / "mine" / name / "keep.txt").write_text("not hf_vrl's")
    (root / "mine" / "config.json").write_text('{"model_type": "bert"}')
    write_plain_shard(root / "eval-0.tar", 0, 4)
    (root / "latin1/train").mkdir(parents=True)  # an image folder whose metadata.csv is Latin-1
    for i in range(4):
        Image.new("RGB", (32, 32), (60 * i, 0, 0)).save(root / f"latin1/train/{i}.png")
    metadata = "file_name,caption\n" + "".join(f"{i}.png,caf\u00e9 {i}\n" for i in range(4))
    (root / "latin1/train/metadata.csv").write_bytes(metadata.encode("latin-1"))
    return root


SHORT = ["--max-steps", "1", "--train-limit", "64"]
CASES = {
    "yaml": (["train", "diffclip", "--config", "broken.yaml"], "broken.yaml is not valid YAML: expected ','"),
    "output file": (["train", "diffclip", "--output-dir", "a-file"], "--output-dir a-file is a file"),
    "foreign folder": (["train", "diffclip", "--output-dir", "mine"], "is not a folder hf_vrl wrote"),
    "split": (["train", "diffclip", "--split", "validation", *SHORT], "--dataset shapes (split validation)"),
    "eval split": (
        ["train", "diffclip", "--eval-split", "validation", *SHORT],
        "--eval-dataset shapes (split",
    ),
    "tasks": (["train", "diffclip", "--tasks", "bogus_task", *SHORT], "--tasks bogus_task: unknown task"),
    "one batch": (["train", "diffclip", "--train-limit", "10"], "10 training samples, fewer than one"),
    "streamed eval": (
        ["train", "diffclip", "--eval-dataset", "webdataset:eval-0.tar", "--eval-limit", "none", *SHORT],
        "the evaluation data is streamed: give --eval-limit",
    ),
    "latin-1 metadata": (
        ["train", "diffclip", "--dataset", "imagefolder:latin1", "--batch-size", "4", "--max-steps", "1"],
        "--dataset imagefolder:latin1 (split train): a text file in it (metadata.csv, ...) is not UTF-8",
    ),
    "compare with": (
        ["train", "diffclip", "--compare-with", "/nonexistent", *SHORT],
        "--compare-with /nonexistent",
    ),
    "dive classes": (
        ["train", "dive", "--dataset", "shapes", "--classes", "0", "99", "--pretrain-steps", "1"],
        "--classes 99: shapes has classes 0..",
    ),
    "dive val size": (
        [
            "train",
            "dive",
            "--dataset",
            "shapes",
            "--set",
            "dive.classes=null",
            "--set",
            "dive.held_out_classes=null",
        ]
        + ["--val-size", "60"]
        + ["--train-limit", "64", "--pretrain-steps", "1"],
        "dive.val_size 60 leaves fewer than one batch",
    ),
    "dive pretrained": (
        ["train", "dive", "--pretrained", "clue-model"],
        "--pretrained clue-model is a 'clue' model",
    ),
    "dcr clip": (
        ["train", "dcr", "--clip", "clue-model", "--clip-pretrain-steps", "0"],
        "--clip clue-model is a 'clue' model",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_a_mistake_is_one_line_before_anything_is_written(workspace, capsys, case):
    argv, expected = CASES[case]
    output = [] if "--output-dir" in argv else ["--output-dir", f"run-{case.replace(' ', '-')}"]
    assert expected in refused([*argv, *output], workspace, capsys)


PLANTED = """
from pathlib import Path

from transformers import PretrainedConfig

Path({sentinel!r}).write_text("the folder's code ran")


class PlantedConfig(PretrainedConfig):
    model_type = "planted"
"""


def planted_folder(root: Path) -> tuple[Path, Path]:
    """A model folder whose config names its own Python (auto_map); importing it writes a file."""
    import json

    folder, sentinel = root / "planted", root / "code-ran.txt"
    folder.mkdir()
    (folder / "configuration_planted.py").write_text(PLANTED.format(sentinel=str(sentinel)))
    auto_map = {
        "AutoConfig": "configuration_planted.PlantedConfig",
        "AutoModel": "modeling_planted.PlantedModel",
    }
    (folder / "config.json").write_text(json.dumps({"model_type": "planted", "auto_map": auto_map}))
    return folder, sentinel


def test_a_folders_code_runs_only_with_trust_remote_code(tmp_path, capsys):
    """`--compare-with DIR` loaded DIR with trust_remote_code=True hard-coded (issue 29): DIR's Python ran
    with no opt-in. Now the run refuses it before anything is written, and only --trust-remote-code lets
    transformers import it."""
    from transformers import AutoModel

    from hf_vrl.weights import load_pretrained

    folder, sentinel = planted_folder(tmp_path)
    message = refused(
        ["train", "diffclip", "--compare-with", str(folder), "--output-dir", "run"], tmp_path, capsys
    )
    assert "carries its own Python code" in message and "--trust-remote-code" in message
    with pytest.raises(ValueError, match="trust_remote_code"):
        load_pretrained(AutoModel, folder, trust_remote_code=False)
    assert not sentinel.exists()
    with pytest.raises(Exception):  # noqa: B017  (the planted folder has no model: its config module ran)
        load_pretrained(AutoModel, folder, trust_remote_code=True)
    assert sentinel.read_text() == "the folder's code ran"
