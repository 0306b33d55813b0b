"""CLUE's ablation ladder in miniature: every rung a `clue-tiny` run through `hf_vrl.train`, the toy
stand-in for ImageNet weights, the table."""

from __future__ import annotations

import json

import pytest

from hf_vrl import metrics
from hf_vrl.methods.clue.miniature import LADDER, format_ladder, pretrain_backbone, run_ladder
from hf_vrl.presets import load_preset

SMALL = dict(
    max_steps=2, save_steps=2, batch_size=8, train_limit=32, eval_limit=30, backbone_pretrain_steps=2
)


def test_rungs_are_runs_from_the_same_start(tmp_path):
    report = run_ladder((0,), tmp_path, rungs=("InfoNCE", "+ text"), **SMALL)
    assert list(report["rungs"]) == ["InfoNCE", "+ text"]
    for name, folder in (("InfoNCE", "InfoNCE"), ("+ text", "text")):
        run = json.loads((tmp_path / "seed0" / folder / "report.json").read_text())
        assert run["after"] == report["rungs"][name]["seeds"][0]
        assert run["before"] == report["start"]["seeds"][0]  # the same start, evaluated by the last rung
        assert run["config"]["clue"]["targets"] == LADDER[name]["targets"]
    assert report["rungs"]["InfoNCE"]["mean"] != report["rungs"]["+ text"]["mean"]
    assert json.loads((tmp_path / "clue_ladder.json").read_text())["seeds"] == [0]
    table = format_ladder(report)
    assert "InfoNCE" in table and "+ text" in table and "start" in table


def test_pretraining_learns_the_coarse_label():
    """The stand-in for ImageNet weights: a few SGD steps on shape labels of separate images beat chance."""
    import torch

    from hf_vrl.data.toy import SHAPES, shapes_dataset
    from hf_vrl.methods.clue.augment import image_to_tensor
    from hf_vrl.methods.clue.trainer import IMAGENET_MEAN, IMAGENET_STD

    config = load_preset("clue-tiny")["model"]["backbone_config"]
    backbone = pretrain_backbone(config, 60, size=200, batch_size=32, seed=0)
    data = shapes_dataset(200, seed=0, split="pretrain")  # the images it trained on
    mean, std = torch.tensor(IMAGENET_MEAN).view(3, 1, 1), torch.tensor(IMAGENET_STD).view(3, 1, 1)
    images = torch.stack([(image_to_tensor(image) - mean) / std for image in data["image"]])
    with torch.no_grad():
        features = backbone(pixel_values=images).pooler_output.flatten(1)
    probe = metrics.linear_probe(
        features[:150], data["label"][:150], features[150:], data["label"][150:], Cs=(1.0,)
    )
    assert probe["accuracy"] > 2 / len(SHAPES)


@pytest.mark.slow
def test_ladder_over_three_seeds(tmp_path):
    """The several-seed table (as reported): clue-tiny, every rung, seeds 0, 1, 2; mean and spread."""
    report = run_ladder((0, 1, 2), tmp_path)
    print(format_ladder(report))
    for entry in report["rungs"].values():
        assert len(entry["seeds"]) == 3 and any(std > 0 for std in entry["std"].values())
