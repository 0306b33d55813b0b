"""CLUETrainer: the momentum schedules and update, Eq. 8 in training, exact resume, two processes."""

from __future__ import annotations

import math
import shutil

import pytest
import torch
import torch.multiprocessing as mp
from clue_helpers import (
    DIST_BATCH,
    DIST_WORLD,
    clue_trainer,
    dist_trainer_worker,
    seeded_rows,
    tiny_model,
    tiny_settings,
    toy_data,
)
from safetensors.torch import load_file

from hf_vrl.errors import UserError
from hf_vrl.losses import clue_objective
from hf_vrl.methods.clue.trainer import CLUETrainer, momentum_at


def test_momentum_schedules():
    assert momentum_at(0, 100, 0.999) == momentum_at(100, 100, 0.999) == 0.999
    assert momentum_at(0, 100, 0.996, "cosine") == pytest.approx(0.996)
    assert momentum_at(50, 100, 0.996, "cosine") == pytest.approx(0.998)  # half-way: halfway to 1
    assert momentum_at(100, 100, 0.996, "cosine") == pytest.approx(1.0)
    step = 30
    expected = 1 - (1 - 0.996) * (math.cos(math.pi * step / 100) + 1) / 2  # DINO / ReSA cosine_scheduler
    assert momentum_at(step, 100, 0.996, "cosine") == pytest.approx(expected)
    with pytest.raises(ValueError, match="schedule"):
        momentum_at(1, 10, 0.9, "linear")


class Recorder(CLUETrainer):
    calls: list

    def update_momentum(self, step, total_steps):
        type(self).calls.append((step, total_steps))
        super().update_momentum(step, total_steps)


def test_one_momentum_update_per_optimiser_step(tmp_path):
    Recorder.calls = []
    data = toy_data(12)
    trainer = clue_trainer(tmp_path, data, steps=3, batch=2, gradient_accumulation_steps=2)
    trainer = Recorder(
        model=trainer.model,
        args=trainer.args,
        train_dataset=data,
        settings=tiny_settings(momentum=0.9, momentum_schedule="cosine"),
        text_bank=trainer.data_collator.text_bank,
    )
    initial = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.train()
    assert Recorder.calls == [(1, 3), (2, 3), (3, 3)]
    assert trainer.current_momentum == pytest.approx(1.0)  # the cosine schedule's end
    momentum = {n: p for n, p in trainer.model.named_parameters() if n.startswith("momentum_")}
    assert any(not torch.equal(p, initial[n]) for n, p in momentum.items())  # the branch moved
    assert not any(p.requires_grad for p in momentum.values())
    logs = trainer.state.log_history[0]
    assert {"loss_global", "loss_local", "loss_text", "target_self_weight", "momentum"} <= set(logs)


@pytest.mark.parametrize("momentum", [1.0, 0.0])
def test_momentum_extremes(tmp_path, momentum):
    """m = 1: the momentum branch keeps its initial weights; m = 0: it copies the online branch each step."""
    trainer = clue_trainer(tmp_path, toy_data(8), steps=2, batch=4, settings=tiny_settings(momentum=momentum))
    model = trainer.model
    before = [[p.clone() for p in target.parameters()] for _, target in model.momentum_pairs()]
    trainer.train()
    for (online, target), initial in zip(model.momentum_pairs(), before):
        now = list(target.parameters())
        if momentum == 1.0:
            assert all(torch.equal(p, q) for p, q in zip(now, initial))
            assert not all(torch.equal(p, q) for p, q in zip(online.parameters(), initial))  # online moved
        else:
            assert all(torch.equal(p, q) for p, q in zip(now, online.parameters()))


def test_weight_decay_on_every_parameter_and_sgd_momentum(tmp_path):
    trainer = clue_trainer(tmp_path, toy_data(4), steps=1, batch=4, weight_decay=1e-5)
    names = trainer.get_decay_parameter_names(trainer.model)
    assert "projector.layers.0.bias" in names and "part_extractor.centroids" in names
    assert not any(name.startswith("momentum_") for name in names)
    assert "momentum=0.9" in trainer.args.optim_args
    trainer.create_optimizer()
    assert trainer.optimizer.param_groups[0]["momentum"] == 0.9


def test_resume_is_exact(tmp_path):
    """With the run layer's `sample_seed` column (views drawn per row, not from an RNG the prefetching data
    loader advances), a run resumed from step 2 ends bit-identical to the uninterrupted one."""
    data = seeded_rows(16)
    save = dict(save_strategy="steps", save_steps=2)
    full = clue_trainer(tmp_path / "full", data, steps=4, batch=4, **save)
    full.train()
    shutil.copytree(tmp_path / "full" / "checkpoint-2", tmp_path / "resumed" / "checkpoint-2")
    resumed = clue_trainer(tmp_path / "resumed", data, steps=4, batch=4, **save)
    resumed.train(resume_from_checkpoint=str(tmp_path / "resumed" / "checkpoint-2"))
    expected = full.model.state_dict()
    for key, value in resumed.model.state_dict().items():  # online, momentum and BatchNorm statistics
        torch.testing.assert_close(value, expected[key], rtol=0, atol=0, msg=key)
    assert any(
        k.startswith("momentum_") for k in load_file(tmp_path / "full" / "checkpoint-2" / "model.safetensors")
    )


def test_clear_errors(tmp_path):
    data = toy_data(4)
    trainer = clue_trainer(tmp_path, data)
    args, bank, settings = trainer.args, trainer.data_collator.text_bank, tiny_settings()

    def build(model, **kwargs):
        return CLUETrainer(model=model, args=args, train_dataset=kwargs.pop("data", data), **kwargs)

    with pytest.raises(UserError, match="text_bank"):
        build(tiny_model(text_embed_dim=64), settings=settings)
    with pytest.raises(UserError, match="text head"):
        build(tiny_model(), settings=settings, text_bank=bank)
    with pytest.raises(UserError, match="text_embed_dim=64"):
        build(tiny_model(text_embed_dim=5), settings=settings, text_bank=bank)
    with pytest.raises(UserError, match="part extractor"):
        build(tiny_model(num_parts=0), settings=tiny_settings(gamma=0.0))
    with pytest.raises(UserError, match="no 'caption' column"):
        build(
            tiny_model(text_embed_dim=64),
            settings=settings,
            text_bank=bank,
            data=data.remove_columns("caption"),
        )
    with pytest.raises(KeyError, match="weak and strong"):
        trainer.compute_loss(trainer.model, {"pixel_values": torch.zeros(2, 3, 16, 16)})


@pytest.mark.slow  # two spawned processes train; the objective's gather is tested in the default suite
def test_two_processes_match_one_process(tmp_path):
    """DDP over 2 gloo processes (3 rows each): the first logged loss equals Eq. 8 computed in one process on
    the concatenated outputs of the two halves (BatchNorm sees each process's half), and both processes end
    with the same online and momentum parameters."""
    from _dist_worker import free_port

    data = seeded_rows(DIST_BATCH * DIST_WORLD)
    single = clue_trainer(tmp_path / "single", data, steps=1, batch=DIST_BATCH)
    model, collate, s = single.model.train(), single.data_collator, single.settings
    halves = [
        collate([data[i] for i in range(r * DIST_BATCH, (r + 1) * DIST_BATCH)]) for r in range(DIST_WORLD)
    ]
    online = [model(pixel_values=h["pixel_values"]) for h in halves]
    with torch.no_grad():
        momentum = [model(pixel_values=h["pixel_values"], momentum=True) for h in halves]

    def joined(outputs):
        return {
            key: torch.cat([getattr(o, key) for o in outputs])
            for key in ("features", "embeddings", "part_descriptors", "text_embeds")
            if getattr(outputs[0], key) is not None
        }

    expected = clue_objective(
        joined(online),
        joined(momentum),
        text_embeds=torch.cat([h["text_embeds"] for h in halves]),
        temperature=s.temperature,
        part_temperature=s.part_temperature,
        text_temperature=s.text_temperature,
        world_size=1,
        rank=0,
    )
    mp.spawn(dist_trainer_worker, args=(str(tmp_path), free_port()), nprocs=DIST_WORLD, join=True)
    log = load_file(str(tmp_path / "log.safetensors"))
    for name in ("loss", "loss_global", "loss_local", "loss_text"):
        assert log[name].item() == pytest.approx(expected[name].item(), rel=1e-5), name
    weights = [load_file(str(tmp_path / f"weights{r}.safetensors")) for r in range(DIST_WORLD)]
    parameters = {name for name, _ in model.named_parameters()}  # BatchNorm statistics stay per process
    assert any(name.startswith("momentum_") for name in parameters)
    for key in parameters:
        torch.testing.assert_close(weights[1][key], weights[0][key], rtol=0, atol=0, msg=key)
