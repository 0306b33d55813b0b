"""Best-epoch selection on the ID validation set (the paper's early stopping) with a save policy that keeps
the selected weights apart from the rotating checkpoints."""

from __future__ import annotations

import json

import pytest
import torch
from dive_helpers import trainer
from safetensors.torch import load_file

import hf_vrl
from hf_vrl.errors import UserError
from hf_vrl.methods.dive.selection import BestEpoch
from hf_vrl.methods.dive.settings import DiVESettings


def test_the_best_epoch_is_kept_and_restored(tmp_path):
    scores, snapshots = iter([0.2, 0.5, 0.3]), []

    def score(model):
        snapshots.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        return next(scores)

    t = trainer(tmp_path / "run", DiVESettings(objective="flyp"), steps=12, batch=4, save_total_limit=1)
    best = BestEpoch(score, tmp_path / "best", unwrap=t.accelerator.unwrap_model)
    t.add_callback(best)
    t.train()
    record = json.loads((tmp_path / "best" / "best_epoch.json").read_text())
    assert record["best"]["epoch"] == 2 and record["best"]["score"] == 0.5
    assert record["scores"] == {"1": 0.2, "2": 0.5, "3": 0.3}
    saved = load_file(str(tmp_path / "best" / "model.safetensors"))
    assert all(torch.equal(saved[k], snapshots[1][k]) for k in saved)
    best.restore(t.model)
    assert all(torch.equal(t.model.state_dict()[k], snapshots[1][k]) for k in snapshots[1])
    # a resumed run reads the record back and compares with it
    again = BestEpoch(lambda m: 0.4, tmp_path / "best")
    assert again.best == 0.5


def test_selection_needs_a_validation_set():
    with pytest.raises(UserError, match="set val_size > 0"):
        DiVESettings(objective="flyp", select_best_epoch=True)


def test_a_run_finishes_with_the_selected_epoch(tmp_path):
    tiny = dict(
        pretrain_steps=2,
        pretrain_data={"fashion_mnist": 32, "shapes": 32},
        pretrain_batch_size=16,
        train_limit=40,
        batch_size=8,
        num_train_epochs=2,
        max_steps=None,
        warmup_steps=1,
        save_steps=100,
        eval_limit=20,
        val_size=8,
        objective="flyp",
        eval_after=False,
        eval_before=False,
    )
    out = tmp_path / "run"
    hf_vrl.train("dive", output_dir=str(out), select_best_epoch=True, **tiny)
    record = json.loads((out / "checkpoints" / "train" / "best-epoch" / "best_epoch.json").read_text())
    assert set(record["scores"]) == {"1", "2"}
    selected = load_file(str(out / "checkpoints" / "train" / "best-epoch" / "model.safetensors"))
    final = load_file(str(out / "final" / "model.safetensors"))
    shared = [k for k in selected if k in final]
    assert shared and all(torch.equal(selected[k], final[k]) for k in shared)
