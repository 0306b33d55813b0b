"""Remote code only with --trust-remote-code, wherever it comes from (issue 37): a stock `clip` folder whose
config.json carries an `auto_map` naming its own Python (which writes a sentinel file when imported) runs no
code in `train`, the dry run's load-back, `eval`, `convert` and `push`, and nothing they write carries that
auto_map."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_push_model_folder import _clip_folder

from hf_vrl import cli
from hf_vrl.run import load_back
from hf_vrl.run.trust import AUTO_MAP_FILES

PLANTED = """
from pathlib import Path

Path({sentinel!r}).write_text("the folder's code ran")
from transformers import CLIPConfig, CLIPModel


class PlantedConfig(CLIPConfig):
    pass


class PlantedModel(CLIPModel):
    config_class = PlantedConfig
"""


def planted(root: Path) -> tuple[Path, Path]:
    """A tiny stock CLIP folder with an auto_map naming its own module, which writes `sentinel` on import."""
    folder, sentinel = _clip_folder(root / "planted"), root / "code-ran.txt"
    (folder / "modeling_planted.py").write_text(PLANTED.format(sentinel=str(sentinel)))
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {
        "AutoConfig": "modeling_planted.PlantedConfig",
        "AutoModel": "modeling_planted.PlantedModel",
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder, sentinel


def auto_maps(root: Path) -> list[str]:
    """The files under `root` (any depth) that carry an auto_map, and the code they name."""
    found = []
    for name in AUTO_MAP_FILES:
        for file in root.rglob(name):
            data = json.loads(file.read_text())
            if isinstance(data, dict) and data.get("auto_map"):
                found.append(f"{file.relative_to(root)}: {data['auto_map']}")
    return found


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return planted(tmp_path_factory.mktemp("remote"))


@pytest.fixture(scope="module")
def dive_run(folder):
    """`hf-vrl train dive --pretrained <planted> --pretrain-steps 0`, tiny."""
    planted_folder, _ = folder
    out = planted_folder.parent / "dive"
    tiny = ["--pretrain-steps", "0", "--train-limit", "48", "--batch-size", "8", "--max-steps", "2"]
    tiny += ["--save-steps", "2", "--eval-limit", "24", "--reference-limit", "16", "--val-size", "0"]
    tiny += ["--rsa-limit", "12", "--zero-shot-datasets", "shapes", "--rsa-dataset", "shapes"]
    tiny += ["--reference-dataset", "shapes", "--image-size", "16"]
    argv = ["train", "dive", "--pretrained", str(planted_folder), *tiny, "--output-dir", str(out)]
    assert cli.main(argv) == 0
    return out


def test_train_runs_no_code_and_writes_no_auto_map(folder, dive_run):
    _, sentinel = folder
    assert not sentinel.exists()
    assert auto_maps(dive_run) == []


def test_the_load_back_runs_no_code_of_a_stock_model_type(folder, tmp_path):
    """The dry run's load-back (a fresh interpreter) loads a stock type without trust_remote_code."""
    planted_folder, sentinel = folder
    out = tmp_path / "found.json"
    subprocess.run([sys.executable, load_back.__file__, str(out), str(planted_folder)], check=True)
    assert json.loads(out.read_text())[str(planted_folder)]["class"] == "CLIPModel"
    assert not sentinel.exists()


def test_eval_and_convert_run_no_code_and_write_no_auto_map_of_it(folder, tmp_path):
    planted_folder, sentinel = folder
    argv = [
        "eval",
        "--model",
        str(planted_folder),
        "--dataset",
        "shapes",
        "--limit",
        "8",
        "--image-size",
        "16",
    ]
    assert (
        cli.main([*argv, "--tasks", "clustering", "--no-figures", "--output-dir", str(tmp_path / "e")]) == 0
    )
    argv = ["convert", "diffclip", "--clip", str(planted_folder), "--calibration", "synthetic"]
    assert cli.main([*argv, "--output-dir", str(tmp_path / "c")]) == 0
    assert not sentinel.exists()
    assert auto_maps(tmp_path / "e") == []
    converted = json.loads((tmp_path / "c" / "config.json").read_text())["auto_map"]  # DiffCLIP's own code
    assert {ref.split(".")[0] for ref in converted.values()} <= {
        "configuration_diffclip",
        "modeling_diffclip",
    }


def test_push_stages_no_foreign_auto_map(folder, dive_run, tmp_path):
    """Even a run whose final/ carries one (an earlier release copied it there) is published without it."""
    _, sentinel = folder
    config_file = dive_run / "final" / "config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, "auto_map": {"AutoModel": "someone/else--modeling_x.X"}}))
    try:
        argv = ["push", str(dive_run), "me/x", "--dry-run", "--staging-dir", str(tmp_path / "staged")]
        assert cli.main(argv) == 0
    finally:
        config_file.write_text(json.dumps(config))
    assert auto_maps(tmp_path / "staged") == [] and not sentinel.exists()
    assert "trust_remote_code=True" not in (tmp_path / "staged" / "README.md").read_text()


@pytest.mark.slow
def test_the_dry_run_runs_no_code_and_writes_no_auto_map(folder, tmp_path):
    """`hf-vrl train dive --pretrained <planted> --pretrain-steps 0 --dry-run` (40 s on a CPU): its load-back
    ran the planted code before (issue 37)."""
    planted_folder, sentinel = folder
    argv = ["train", "dive", "--pretrained", str(planted_folder), "--pretrain-steps", "0", "--val-size", "0"]
    assert cli.main([*argv, "--dry-run", "--output-dir", str(tmp_path / "dry")]) == 0
    assert not sentinel.exists() and auto_maps(tmp_path / "dry") == []
    loaded = json.loads((tmp_path / "dry" / "dry_run.json").read_text())["load_back"]
    assert {found.get("class") for found in loaded.values()} == {"CLIPModel", "CLIPVisionModel"}, loaded
