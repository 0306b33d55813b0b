"""VRLTrainer's run-safety mechanisms: atomic checkpoints that list their files and follow the umask, damaged
ones skipped for the newest complete one, a method's extra state across resume, equal batches from streams."""

from __future__ import annotations

import json
import os
import zipfile

import pytest
import torch
from datasets import IterableDataset
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import TrainingArguments

from hf_vrl.errors import UserError
from hf_vrl.run.layout import CHECKPOINT_MANIFEST, checkpoint_problem, last_complete_checkpoint
from hf_vrl.trainer import EXTRA_STATE_NAME, STAGING_DIR, VRLTrainer


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 1)

    def forward(self, x, y):
        return {"loss": nn.functional.mse_loss(self.linear(x).squeeze(-1), y)}


class MeanTracker(VRLTrainer):
    """Keeps a running sum of the targets it trained on: state that lives outside model and optimizer."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = torch.zeros(())

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        self.seen = self.seen + inputs["y"].sum().detach().cpu()
        return model(**inputs)["loss"]

    def extra_state(self):
        return {"seen": self.seen}

    def load_extra_state(self, state):
        self.seen = state["seen"].cpu()


def _rows(n: int = 24) -> list[dict]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=generator)
    return [{"x": x[i], "y": x[i].sum()} for i in range(n)]


def _collate(rows):
    return {"x": torch.stack([r["x"] for r in rows]), "y": torch.stack([r["y"] for r in rows])}


def _args(out, steps, **kwargs):
    settings = dict(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=4,
        learning_rate=0.1,
        save_strategy="steps",
        save_steps=2,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        seed=0,
        remove_unused_columns=False,
    )
    return TrainingArguments(**(settings | kwargs))


def _trainer(out, steps, cls=MeanTracker, **kwargs):
    torch.manual_seed(0)
    return cls(
        model=Regressor(), args=_args(out, steps, **kwargs), train_dataset=_rows(), data_collator=_collate
    )


def test_extra_state_is_checkpointed_and_resumed_exactly(tmp_path):
    full = _trainer(tmp_path / "full", 6)
    full.train()
    assert (tmp_path / "full" / "checkpoint-4" / EXTRA_STATE_NAME).is_file()
    resumed = _trainer(tmp_path / "full", 6)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-4"))
    assert resumed.seen == full.seen  # a fresh trainer starts at 0: only a restored sum ends equal
    for a, b in zip(full.model.parameters(), resumed.model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_resume_refuses_a_checkpoint_without_the_extra_state(tmp_path):
    _trainer(tmp_path / "run", 2, cls=_Plain).train()
    with pytest.raises(FileNotFoundError, match=EXTRA_STATE_NAME):
        _trainer(tmp_path / "run", 4).train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-2"))


class _Plain(VRLTrainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        return model(**inputs)["loss"]


class _DiesWhileSaving(_Plain):
    """Raises in the middle of writing the checkpoint of step 4 (after the weights, before the RNG state)."""

    def _save_rng_state(self, output_dir):
        if self.state.global_step == 4:
            raise KeyboardInterrupt("killed while writing a checkpoint")
        super()._save_rng_state(output_dir)


def test_a_checkpoint_interrupted_while_written_never_appears(tmp_path):
    trainer = _trainer(tmp_path, 6, cls=_DiesWhileSaving)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-2"]
    assert (tmp_path / "checkpoint-2" / "trainer_state.json").is_file()
    partial = tmp_path / STAGING_DIR / "checkpoint-4"
    assert partial.is_dir() and not (partial / "trainer_state.json").exists()
    # a later save of the same step starts from a clean staging folder and completes
    _trainer(tmp_path, 6, cls=_Plain).train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert {p.name for p in tmp_path.glob("checkpoint-*")} >= {"checkpoint-4", "checkpoint-6"}
    assert not os.listdir(tmp_path / STAGING_DIR)


def test_rotation_keeps_the_newest_checkpoints(tmp_path):
    _trainer(tmp_path, 8, cls=_Plain, save_total_limit=2).train()
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-6", "checkpoint-8"]


def test_streams_give_full_batches_only(tmp_path):
    """13 rows in batches of 4, twice over: every training batch holds 4 rows (transformers' own stream
    dataloader would hand out a batch of 1 at the end of each pass)."""
    sizes = []

    class Recorder(_Plain):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            sizes.append(len(inputs["y"]))
            return super().compute_loss(model, inputs)

    rows = _rows(13)
    stream = IterableDataset.from_generator(lambda: iter(rows))
    torch.manual_seed(0)
    args = _args(tmp_path, 6, dataloader_drop_last=True, save_strategy="no")
    Recorder(model=Regressor(), args=args, train_dataset=stream, data_collator=_collate).train()
    assert sizes == [4] * 6


@pytest.mark.parametrize(("mask", "mode"), [(0o022, 0o644), (0o002, 0o664)])
def test_a_checkpoint_lists_its_files_and_they_follow_the_umask(tmp_path, mask, mode):
    """Every file is listed in checkpoint.json (what a complete checkpoint holds), and none is left 0600 by
    the private temporary files safetensors and torch write through (the extra state included)."""
    old = os.umask(mask)
    try:
        _trainer(tmp_path, 2).train()
    finally:
        os.umask(old)
    checkpoint = tmp_path / "checkpoint-2"
    listed = json.loads((checkpoint / CHECKPOINT_MANIFEST).read_text())["files"]
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", EXTRA_STATE_NAME} <= set(
        listed
    )
    assert sorted(listed) == sorted(p.name for p in checkpoint.iterdir() if p.name != CHECKPOINT_MANIFEST)
    assert {name: (checkpoint / name).stat().st_mode & 0o777 for name in listed} == dict.fromkeys(
        listed, mode
    )


def _cut(path):
    path.write_bytes(path.read_bytes()[:-100])


DAMAGES = {
    "optimizer.pt is missing": lambda c: (c / "optimizer.pt").unlink(),
    "scheduler.pt is missing": lambda c: (c / "scheduler.pt").unlink(),
    "model.safetensors is missing": lambda c: (c / "model.safetensors").unlink(),
    "model.safetensors cannot be read": lambda c: _cut(c / "model.safetensors"),
    "rng_state.pth cannot be read": lambda c: (c / "rng_state.pth").write_bytes(b"garbage"),
    "trainer_state.json cannot be read": lambda c: (c / "trainer_state.json").write_text("{'step"),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_checkpoint_gives_way_to_the_newest_complete_one(tmp_path, damage, caplog):
    _trainer(tmp_path, 4).train()
    DAMAGES[damage](tmp_path / "checkpoint-4")
    with caplog.at_level("WARNING", logger="hf_vrl.run"):
        assert last_complete_checkpoint(tmp_path, report=True) == tmp_path / "checkpoint-2"
    assert f"checkpoint-4 is incomplete ({damage}" in caplog.text and "skipped" in caplog.text


def _earlier_release(checkpoint, lost):
    """A checkpoint as an earlier release wrote it (no checkpoint.json) that lost `lost`."""
    (checkpoint / CHECKPOINT_MANIFEST).unlink()
    (checkpoint / lost).unlink()


MALFORMED = {
    "a list": ["model.safetensors"],
    "no list of names": {"files": 5},
    "a name outside": {"files": ["model.safetensors", "../outside.txt"]},
}


@pytest.mark.parametrize("lost", ["optimizer.pt", "scheduler.pt"])
def test_an_earlier_releases_checkpoint_without_its_optimiser_is_incomplete(tmp_path, lost, caplog):
    """Issue 37: a checkpoint without checkpoint.json missing optimizer.pt or scheduler.pt was resumed with a
    fresh optimiser, silently; it is skipped as a listed incomplete one is."""
    _trainer(tmp_path, 4).train()
    _earlier_release(tmp_path / "checkpoint-4", lost)
    with caplog.at_level("WARNING", logger="hf_vrl.run"):
        assert last_complete_checkpoint(tmp_path, report=True) == tmp_path / "checkpoint-2"
    assert f"checkpoint-4 is incomplete ({lost} is missing)" in caplog.text
    (tmp_path / "checkpoint-2" / CHECKPOINT_MANIFEST).unlink()  # complete, of an earlier release: resumed
    assert checkpoint_problem(tmp_path / "checkpoint-2") is None


@pytest.mark.parametrize("manifest", MALFORMED)
def test_a_malformed_checkpoint_list_makes_the_checkpoint_incomplete(tmp_path, manifest, caplog):
    """Issue 37: a checkpoint.json that is a list, lists no names or names a file outside its folder was a
    traceback; the checkpoint is skipped with the reason."""
    _trainer(tmp_path, 4).train()
    (tmp_path / "outside.txt").write_text("not the checkpoint's")
    (tmp_path / "checkpoint-4" / CHECKPOINT_MANIFEST).write_text(json.dumps(MALFORMED[manifest]))
    with caplog.at_level("WARNING", logger="hf_vrl.run"):
        assert last_complete_checkpoint(tmp_path, report=True) == tmp_path / "checkpoint-2"
    reason = "names a file outside" if manifest == "a name outside" else "does not list the checkpoint's"
    assert f"checkpoint-4 is incomplete ({CHECKPOINT_MANIFEST} {reason}" in caplog.text


def test_damage_the_completeness_check_cannot_see_is_one_line_at_load(tmp_path):
    """An RNG state that is a well-formed archive but no torch file: resuming stops with one line."""
    _trainer(tmp_path, 2).train()
    with zipfile.ZipFile(tmp_path / "checkpoint-2" / "rng_state.pth", "w") as archive:
        archive.writestr("other", "not a torch file")
    assert checkpoint_problem(tmp_path / "checkpoint-2") is None
    with pytest.raises(UserError) as error:
        _trainer(tmp_path, 4).train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    message = str(error.value)
    assert "checkpoint-2 cannot be resumed (RuntimeError" in message and len(message.splitlines()) == 1


class _ViTRegressor(_Plain):
    """A tiny transformers ViT trained to a regression target: a model whose checkpoint keys transformers 5
    renames on load (`encoder.layer.0.attention.attention.query` -> `layers.0.attention.q_proj`)."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        features = model(pixel_values=inputs["x"]).last_hidden_state[:, 0]
        return nn.functional.mse_loss(features.sum(-1), inputs["y"])


def _vit_trainer(out, steps):
    from transformers import ViTConfig, ViTModel

    torch.manual_seed(0)
    vit = ViTModel(ViTConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
                             image_size=8, patch_size=4), add_pooling_layer=False)  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    rows = [
        {"x": torch.randn(3, 8, 8, generator=gen), "y": torch.randn((), generator=gen)} for _ in range(16)
    ]
    return _ViTRegressor(model=vit, args=_args(out, steps), train_dataset=rows, data_collator=_collate)


def test_a_vit_checkpoint_resumes_under_the_new_names_and_a_renamed_tensor_is_refused(tmp_path):
    """Issue 30: the Trainer's own load matched none of the renamed keys and went on with the untrained
    encoder (a warning only). The trained weights come back exactly; a tensor the model does not have is one
    line, before anything is loaded."""
    full = _vit_trainer(tmp_path / "full", 4)
    full.train()
    resumed = _vit_trainer(tmp_path / "full", 4)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-2"))
    for a, b in zip(full.model.state_dict().values(), resumed.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    weights = tmp_path / "full" / "checkpoint-2" / "model.safetensors"
    tensors = load_file(weights)
    assert "encoder.layer.0.attention.attention.query.weight" in tensors  # the names on disk are the old ones
    tensors["encoder.layer.0.attention.attention.queries.weight"] = tensors.pop(
        "encoder.layer.0.attention.attention.query.weight"
    )
    save_file(tensors, weights, metadata={"format": "pt"})
    with pytest.raises(UserError) as error:
        _vit_trainer(tmp_path / "full", 4).train(resume_from_checkpoint=str(weights.parent))
    message = str(error.value)
    assert "does not fit ViTModel: 1 missing (e.g. layers.0.attention.q_proj.weight)" in message
    assert "1 unexpected" in message and len(message.splitlines()) == 1


def test_weights_that_turn_non_finite_are_never_checkpointed(tmp_path):
    """Plain SGD at 1e38: the first update overflows the weights while its loss was finite (issue 37). No
    checkpoint of them is written (a NaN one used to be, rotating the finite ones away), and training stops
    with one line saying so."""
    from hf_vrl.divergence import Diverged

    settings = dict(optim="sgd", learning_rate=1e38, max_grad_norm=0.0, save_steps=1)
    with pytest.raises(Diverged) as error:
        _trainer(tmp_path, 4, **settings).train()
    message = str(error.value)
    assert message.startswith("the weights turned non-finite at step 1: training stopped there and no ")
    assert len(message.splitlines()) == 1 and not list(tmp_path.glob("checkpoint-*"))
