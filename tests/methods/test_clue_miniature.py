"""The ablation ladder on the shapes world: every rung trains from the same start, is evaluated; the table."""

from __future__ import annotations

import json
import math

import pytest

from hf_vrl import metrics
from hf_vrl.data.offline import FASHION_MNIST_DIR
from hf_vrl.methods.clue.miniature import (
    COARSE_GROUPS,
    LADDER,
    LadderConfig,
    format_ladder,
    ladder_data,
    main,
    pretrain_backbone,
    run_ladder,
)

TINY = LadderConfig(steps=2, pretrain_steps=2, pretrain_size=16, batch_size=8, train_size=48, test_size=40)
TINY.probe_cs, TINY.num_workers = (1.0,), 0


def test_every_rung_trains_and_is_evaluated(tmp_path):
    report = run_ladder((0,), TINY, tmp_path)
    assert list(report["rungs"]) == [name for name, _ in LADDER]
    entries = [report["init"], *report["rungs"].values()]
    for entry in entries:
        assert len(entry["seeds"]) == 1 and entry["seeds"][0]["label_column"] == "fine_label"
        assert all(math.isfinite(v) for v in entry["mean"].values()) and set(entry["std"]) == set(
            entry["mean"]
        )
    # the rungs differ in their objective only, so their trained features differ
    means = [tuple(entry["mean"].values()) for entry in report["rungs"].values()]
    assert len(set(means)) > 1
    assert json.loads((tmp_path / "clue_ladder.json").read_text())["config"]["steps"] == 2
    table = format_ladder(report)
    assert all(name in table for name, _ in LADDER) and "start (pretrained)" in table


def test_command_line(tmp_path, capsys):
    argv = ["--seeds", "0", "--steps", "1", "--batch-size", "8", "--train-size", "40", "--test-size", "30"]
    argv += ["--pretrain-steps", "0", "--workers", "0", "--rungs", "+ text", "--output-dir", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "+ text" in out and "InfoNCE" not in out and "start (untrained)" in out


def test_pretraining_learns_the_coarse_label():
    """The stand-in for ImageNet weights: a few SGD steps on shape labels of separate images beat chance."""
    import torch

    from hf_vrl.data.toy import SHAPES, shapes_dataset
    from hf_vrl.methods.clue.augment import image_to_tensor

    backbone = pretrain_backbone(LadderConfig(pretrain_steps=60, pretrain_size=200, batch_size=32), seed=0)
    data = shapes_dataset(200, seed=0, split="pretrain")  # the images it trained on
    mean, std = (
        torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1),
        torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1),
    )
    images = torch.stack([(image_to_tensor(image) - mean) / std for image in data["image"]])
    with torch.no_grad():
        features = backbone(pixel_values=images).pooler_output.flatten(1)
    probe = metrics.linear_probe(
        features[:150], data["label"][:150], features[150:], data["label"][150:], Cs=(1.0,)
    )
    assert probe["accuracy"] > 2 / len(SHAPES)


@pytest.mark.slow
def test_ladder_over_three_seeds(tmp_path):
    """The several-seed table (as reported): the demo's size, seeds 0, 1, 2; mean and spread per rung."""
    report = run_ladder((0, 1, 2), LadderConfig(threads=1), tmp_path)
    print(format_ladder(report))
    for entry in report["rungs"].values():
        assert len(entry["seeds"]) == 3 and any(std > 0 for std in entry["std"].values())


@pytest.mark.skipif(not FASHION_MNIST_DIR.is_dir(), reason="apt-get install dataset-fashion-mnist")
def test_offline_sets_get_a_coarse_level():
    data = ladder_data("fashion_mnist", "test", 60, seed=0)
    fine, coarse = data.features["fine_label"].names, data.features["label"].names
    assert coarse == list(COARSE_GROUPS["fashion_mnist"])
    for row in data:
        assert fine[row["fine_label"]] in COARSE_GROUPS["fashion_mnist"][coarse[row["label"]]]
    with pytest.raises(ValueError, match="coarse grouping"):
        ladder_data("digits", "test", 10, seed=0)
