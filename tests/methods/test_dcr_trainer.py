"""DCRTrainer and the two stages: what gets gradients (projector / LoRA / both), frozen diffusion, metrics."""

from __future__ import annotations

import pytest
import torch
from dcr_helpers import fixed_model, toy_data
from transformers import TrainingArguments

from hf_vrl.methods.dcr.diffusion import load_diffusion, tiny_diffusion
from hf_vrl.methods.dcr.task import DCRCollator, DCRTask, DCRTaskConfig
from hf_vrl.methods.dcr.trainer import DCRTrainer, LoraSettings, lora_target_modules, prepare_stage


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    return tiny_diffusion(tmp_path_factory.mktemp("sd"), text_context_length=8)


@pytest.fixture(scope="module")
def data():
    return toy_data()


def _grads_after_one_step(pipeline, stage, lora=None):
    model = fixed_model()
    task = DCRTask(model, load_diffusion(pipeline, dtype="float32"), DCRTaskConfig())
    trainable = prepare_stage(model, stage, lora)
    task.train()
    torch.manual_seed(0)
    task(torch.rand(3, 3, 16, 16), encoder=trainable)["loss"].backward()
    return trainable, task


def _with_grad(module) -> set[str]:
    return {name for name, p in module.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}


def test_stage1_trains_only_the_projector(pipeline):
    trainable, task = _grads_after_one_step(pipeline, "projector")
    grads = _with_grad(trainable)
    assert grads and all(name.startswith("projector.") for name in grads)
    assert {n for n, p in trainable.named_parameters() if p.requires_grad} == grads
    assert not _with_grad(task.diffusion)


def test_stage2_trains_only_lora(pipeline):
    trainable, task = _grads_after_one_step(pipeline, "encoder", LoraSettings(r=4, alpha=4))
    grads = _with_grad(trainable)
    assert grads and all(".lora_A." in n or ".lora_B." in n for n in grads)
    assert any("visual_projection" in n for n in grads)  # the projection is adapted too
    for name, p in trainable.named_parameters():  # projector frozen, tower base weights frozen
        if "lora_" not in name:
            assert p.grad is None, name
    assert not _with_grad(task.diffusion)


def test_stage2_official_bias_and_end_to_end(pipeline):
    trainable, _ = _grads_after_one_step(pipeline, "encoder", LoraSettings(r=4, bias="lora_only"))
    adapted = {f"base_model.model.{name}.base_layer.bias" for name in lora_target_modules(fixed_model())}
    extra = {n for n in _with_grad(trainable) if "lora_" not in n}
    assert extra and extra <= adapted  # only biases of adapted layers (official bias="lora_only")
    trainable, _ = _grads_after_one_step(pipeline, "end_to_end", LoraSettings(r=4))
    names = _with_grad(trainable)
    assert any("projector" in n for n in names) and any("lora_" in n for n in names)
    assert not any("embeddings" in n or "layer_norm1" in n for n in names)


def test_lora_targets_vision_linears_not_projector():
    targets = lora_target_modules(fixed_model())
    assert "visual_projection" in targets
    assert all(t.startswith("vision_model.") or t == "visual_projection" for t in targets)
    assert any(t.endswith("self_attn.q_proj") for t in targets) and any(
        t.endswith("mlp.fc2") for t in targets
    )
    with pytest.raises(ValueError, match="stage"):
        prepare_stage(fixed_model(), "stage3")


def _trainer(pipeline, data, out_dir, stage, steps=3, save_steps=2, model=None):
    model = model if model is not None else fixed_model()
    task = DCRTask(model, load_diffusion(pipeline, dtype="float32"), DCRTaskConfig())
    trainable = prepare_stage(model, stage, LoraSettings(r=4))
    args = TrainingArguments(
        output_dir=str(out_dir),
        max_steps=steps,
        per_device_train_batch_size=3,
        learning_rate=1e-2,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=1,
        save_steps=save_steps,
        logging_steps=1,
        seed=0,
        dataloader_drop_last=True,
        remove_unused_columns=False,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = DCRTrainer(
        model=trainable, args=args, train_dataset=data, data_collator=DCRCollator(16), task=task
    )
    return trainer, task


def test_frozen_diffusion_untouched_and_metrics_logged(pipeline, data, tmp_path):
    trainer, task = _trainer(pipeline, data, tmp_path, "projector", steps=2, save_steps=100)
    before = {k: v.clone() for k, v in task.diffusion.state_dict().items()}
    projector = trainer.model.projector.linear_1.weight.detach().clone()
    tower = trainer.model.vision_model.embeddings.patch_embedding.weight.detach().clone()
    trainer.train()
    after = task.diffusion.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # bit-identical UNet/VAE
    assert not torch.equal(projector, trainer.model.projector.linear_1.weight)
    assert torch.equal(tower, trainer.model.vision_model.embeddings.patch_embedding.weight)
    logged = trainer.state.log_history[0]
    assert {"loss", "sim_positive", "sim_target", "sim_negative", "contrastive_acc", "recon_mse"} <= set(
        logged
    )


def test_each_micro_batch_draws_by_its_place_in_the_step(pipeline, data, tmp_path):
    """A micro-batch's timesteps, noise, VAE samples and augmentations come from a seed of (run seed, step,
    its place among the step's micro-batches), apart from the run's random stream, so they are the same on
    any process count (tests/run/test_run_process_count.py trains on 1 and 2); the loss is DCRTask's Eq. 12
    as before, on those draws."""
    from hf_vrl.accumulation import own_draws, reseed
    from hf_vrl.run.data import sample_seed

    trainer, task = _trainer(pipeline, data, tmp_path, "projector")
    trainer.state.global_step, trainer.current_gradient_accumulation_steps = 5, 2
    batch = trainer.data_collator([data[i] for i in range(3)])
    stream = torch.get_rng_state()
    halves = [
        trainer.training_step(trainer.model, dict(batch)) for _ in range(2)
    ]  # one step, 2 micro-batches
    assert torch.equal(torch.get_rng_state(), stream)
    cpu = torch.device("cpu")
    for place, half in enumerate(halves):
        with own_draws(cpu), torch.no_grad():
            reseed(sample_seed(0, "step 5", f"micro-batch {place}"), cpu)
            loss = task(batch["pixel_values"], encoder=trainer.model)["loss"]
        assert torch.equal(half * 2, loss)
    assert not torch.equal(halves[0], halves[1])  # the same images, other draws
