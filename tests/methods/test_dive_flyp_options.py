"""FLYP's recipe as options of a DiVE run: the training crop RandomResizedCrop(scale 0.9-1.0) and the logit
scale learned, uncapped and weight-decayed (both the dive-b16 preset's defaults)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from dive_helpers import trainer
from PIL import Image

from hf_vrl.errors import UserError
from hf_vrl.methods.dive.data import FLYPCollator, flyp_crop
from hf_vrl.methods.dive.settings import DiVESettings
from hf_vrl.presets import load_preset
from hf_vrl.trainer import LogitScaleCap


class _Processor:
    """Records the images it is given; outputs 8-px tensors of their mean."""

    crop_size = {"height": 8, "width": 8}

    def __init__(self):
        self.seen = []

    def __call__(self, images, return_tensors):
        self.seen.append([np.asarray(im).copy() for im in images])
        return {"pixel_values": torch.zeros(len(images), 3, 8, 8)}


def _tokenizer(captions, **kwargs):
    ids = torch.ones(len(captions), 3, dtype=torch.long)
    return {"input_ids": ids, "attention_mask": ids}


def _rows(n=4):
    rng = np.random.default_rng(0)
    return [
        {
            "image": Image.fromarray(rng.integers(0, 255, (20, 30, 3), dtype=np.uint8)),
            "label": i % 2,
            "sample_seed": 100 + i,
        }
        for i in range(n)
    ]


def test_flyp_crop_is_seeded_per_sample_and_sized_by_the_processor():
    processor = _Processor()
    collator = FLYPCollator(processor, _tokenizer, ["cat", "dog"], ["a {}."], crop_scale=[0.9, 1.0])
    rows = _rows()
    torch.manual_seed(0)
    collator(rows)
    torch.manual_seed(1)  # the rows' seeds decide, not the global RNG
    collator(rows)
    first, second = processor.seen
    assert all(a.shape == (8, 8, 3) for a in first)
    assert all(np.array_equal(a, b) for a, b in zip(first, second))
    assert not np.array_equal(first[0], first[1])  # other images
    image = Image.fromarray(np.random.default_rng(1).integers(0, 255, (30, 30, 3), dtype=np.uint8))
    crops = {flyp_crop(image, 8, (0.9, 1.0), torch.Generator().manual_seed(s)).tobytes() for s in range(5)}
    assert len(crops) > 1  # the box moves
    plain = _Processor()
    FLYPCollator(plain, _tokenizer, ["cat", "dog"], ["a {}."])(rows)
    assert plain.seen[0][0].shape == (20, 30, 3)  # no crop: the processor gets the image as it is


@pytest.mark.parametrize("scale", [[0.0, 1.0], [0.9], [1.0, 0.9], [0.5, 1.5]])
def test_crop_scale_is_checked(scale):
    with pytest.raises(UserError, match="crop_scale"):
        DiVESettings(objective="flyp", crop_scale=scale)


def test_flyp_logit_scale_is_uncapped_and_decayed(tmp_path):
    settings = DiVESettings(objective="flyp", logit_scale="flyp")
    capped = trainer(tmp_path / "a", DiVESettings(objective="flyp"), steps=1, weight_decay=0.1)
    flyp = trainer(tmp_path / "b", settings, steps=1, weight_decay=0.1)
    assert any(isinstance(c, LogitScaleCap) for c in capped.callback_handler.callbacks)
    assert not any(isinstance(c, LogitScaleCap) for c in flyp.callback_handler.callbacks)
    assert flyp.max_logit_scale == math.inf
    assert "logit_scale" not in capped.get_decay_parameter_names(capped.model)
    assert "logit_scale" in flyp.get_decay_parameter_names(flyp.model)
    for t in (capped, flyp):
        with torch.no_grad():
            t.model.logit_scale.fill_(math.log(150.0))
        t.train()
    assert capped.model.logit_scale.item() <= math.log(100.0) + 1e-6
    assert flyp.model.logit_scale.item() > math.log(120.0)  # one step of lr 5e-3 moves it by ~ 5e-3
    decayed = [g for g in flyp.optimizer.param_groups if g["weight_decay"] > 0]
    assert any(p is flyp.model.logit_scale for g in decayed for p in g["params"])


def test_the_b16_preset_uses_flyps_recipe():
    dive = load_preset("dive-b16")["dive"]
    assert dive["crop_scale"] == [0.9, 1.0] and dive["logit_scale"] == "flyp"
    assert DiVESettings(**{**dive, "reference_dataset": "shapes"}).logit_scale == "flyp"


def test_a_run_with_flyps_recipe(tmp_path, monkeypatch):
    """Both options through hf_vrl.train: the crop reaches the collator, the trainer drops the cap."""
    import hf_vrl
    from hf_vrl.methods.dive import data
    from hf_vrl.methods.dive.trainer import DiVETrainer

    crops, trainers = [], []
    original_crop, original_train = data.flyp_crop, DiVETrainer.train
    monkeypatch.setattr(data, "flyp_crop", lambda *a, **k: crops.append(a[2]) or original_crop(*a, **k))
    monkeypatch.setattr(
        DiVETrainer, "train", lambda t, *a, **k: trainers.append(t) or original_train(t, *a, **k)
    )
    hf_vrl.train(
        "dive",
        output_dir=str(tmp_path / "run"),
        pretrain_steps=2,
        pretrain_data={"fashion_mnist": 32, "shapes": 32},
        pretrain_batch_size=16,
        train_limit=40,
        batch_size=8,
        max_steps=2,
        warmup_steps=1,
        val_size=8,
        objective="flyp",
        eval_after=False,
        eval_before=False,
        crop_scale=[0.9, 1.0],
        logit_scale="flyp",
    )
    assert crops and all(tuple(scale) == (0.9, 1.0) for scale in crops)
    assert len(trainers) == 1 and trainers[0].max_logit_scale == math.inf
