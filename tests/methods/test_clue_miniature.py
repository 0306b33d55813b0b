"""CLUE's ablation ladder in miniature: every rung a `clue-tiny` run through `hf_vrl.train`, the toy
stand-in for ImageNet weights, the table."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hf_vrl import metrics
from hf_vrl.methods.clue.miniature import (
    COLUMNS,
    LADDER,
    RUNGS,
    SHUFFLED,
    _slug,
    format_ladder,
    pretrain_backbone,
    run_ladder,
)
from hf_vrl.presets import load_preset

SMALL = dict(
    max_steps=2, save_steps=2, batch_size=8, train_limit=32, eval_limit=30, backbone_pretrain_steps=2,
    text_encoder_pretrain_steps=2, logging_steps=1,
)  # fmt: skip


def _log(folder) -> dict:
    """The last training log line of a rung (the per-step metrics CLUETrainer stores)."""
    state = next(folder.glob("checkpoints/train/checkpoint-*/trainer_state.json"))
    return [entry for entry in json.loads(state.read_text())["log_history"] if "loss" in entry][-1]


def test_rungs_are_runs_from_the_same_start(tmp_path):
    """Each rung trains exactly its terms of Eq. 8 from one start: the same pretrained backbone and text
    encoder (built by the first rung needing each, then passed on), the same evaluation before training;
    the control rung sees the same descriptions as "+ text", moved to other images."""
    rungs = ("InfoNCE", "text only", "+ text", "+ shuffled text")
    report = run_ladder((0,), tmp_path, rungs=rungs, **SMALL)
    assert list(report["rungs"]) == list(rungs)
    seed = tmp_path / "seed0"
    folders = {
        "InfoNCE": "InfoNCE",
        "text only": "text_only",
        "+ text": "text",
        "+ shuffled text": "shuffled_text",
    }
    runs = {name: json.loads((seed / folder / "report.json").read_text()) for name, folder in folders.items()}
    backbone, encoder = (
        seed / "InfoNCE" / "inputs" / "backbone",
        seed / "text_only" / "inputs" / "text_encoder",
    )
    for name, run in runs.items():
        assert run["after"] == report["rungs"][name]["seeds"][0]
        assert run["before"] == report["start"]["seeds"][0]  # the same start, evaluated by each rung
        for key, value in RUNGS[name].items():
            section = "model" if key == "text_source" else "clue"
            assert run["config"][section][key] == value, (name, key)
        if name != "InfoNCE":
            assert run["config"]["model"]["backbone"] == str(backbone)
    assert backbone.is_dir() and encoder.is_dir()
    for name in ("+ text", "+ shuffled text"):
        assert runs[name]["config"]["model"]["text_encoder"] == str(encoder)
    logs = {name: _log(seed / folder) for name, folder in folders.items()}
    assert logs["InfoNCE"]["target_self_weight"] == 1.0 and "loss_text" not in logs["InfoNCE"]
    assert (
        set(logs["text only"]) & {"loss_global", "loss_local"} == set() and "loss_text" in logs["text only"]
    )
    assert {"loss_global", "loss_local", "loss_text"} <= set(logs["+ text"])
    # the same images, heads and descriptions in the two text rungs: only the pairing differs
    assert logs["+ text"]["loss_global"] == logs["+ shuffled text"]["loss_global"]
    assert logs["+ text"]["loss_text"] != logs["+ shuffled text"]["loss_text"]
    banks = [sorted((seed / f / "inputs").glob("text_bank-*.safetensors")) for f in ("text", "shuffled_text")]
    assert [p.name for p in banks[0]] == [p.name for p in banks[1]]  # the same set of texts
    assert json.loads((tmp_path / "clue_ladder.json").read_text())["seeds"] == [0]
    table = format_ladder(report)
    assert all(name in table for name in ("start", *rungs))


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
    """The several-seed table (as reported): clue-tiny, every rung and the control, seeds 0, 1, 2. Each seed
    is its own run (its own pretrained start), the summary is the mean and spread of the per-seed reports,
    and every training term reaches below its value at the start of training."""
    report = run_ladder((0, 1, 2), tmp_path)
    print(format_ladder(report))
    assert list(report["rungs"]) == [*LADDER, *SHUFFLED]
    starts = report["start"]["seeds"]
    assert starts[0] != starts[1] != starts[2]  # seeded pretraining: three different starts
    for name, entry in report["rungs"].items():
        assert len(entry["seeds"]) == 3
        for path, title in COLUMNS:
            values = [seed[path[0]][path[1]] for seed in entry["seeds"]]
            assert entry["mean"][title] == pytest.approx(np.mean(values))
            assert entry["std"][title] == pytest.approx(np.std(values))
        for seed in (0, 1, 2):
            run = json.loads((tmp_path / f"seed{seed}" / _slug(name) / "report.json").read_text())
            assert run["config"]["seed"] == seed and run["after"] == entry["seeds"][seed]
