"""One batch rule for every method (`hf_vrl.run.batch`): the global batch is the paper's on any process count
that divides it; the micro-batch is memory; the run states what each loss term sees."""

from __future__ import annotations

import pytest
import torch

from hf_vrl.errors import UserError
from hf_vrl.presets import list_presets, load_preset
from hf_vrl.run.batch import plan_batches
from hf_vrl.run.data import SeededDataset
from hf_vrl.trainer import VRLTrainer, VRLTrainingArguments


@pytest.mark.parametrize(
    ("processes", "micro", "steps"),
    [(1, 256, 16), (2, 256, 8), (8, 256, 2), (16, 256, 1), (32, 128, 1), (64, 64, 1)],
)
def test_a_global_batch_is_the_same_on_every_process_count_that_divides_it(processes, micro, steps):
    plan = plan_batches(256, processes, global_batch_size=4096)
    assert (plan.micro_batch, plan.accumulation_steps, plan.global_batch) == (micro, steps, 4096)
    assert plan.loss_batch == 4096  # whole_batch: the loss sees the global batch


def test_whole_batch_splits_a_share_batch_size_does_not_divide():
    plan = plan_batches(256, 2, global_batch_size=768)  # 384 per process: micro-batches of 192
    assert (plan.micro_batch, plan.accumulation_steps, plan.global_batch) == (192, 2, 768)


def test_micro_batch_accumulation_keeps_the_micro_batch_exact():
    plan = plan_batches(16, 8, global_batch_size=256, accumulation="micro_batch")  # DCR's official run
    assert (plan.micro_batch, plan.accumulation_steps, plan.loss_batch, plan.local_loss_batch) == (
        16,
        2,
        128,
        16,
    )
    with pytest.raises(UserError, match="not a multiple of batch_size 16"):
        plan_batches(16, 3, global_batch_size=72, accumulation="micro_batch")  # 24 per process


def test_a_process_count_that_does_not_divide_the_global_batch_is_refused_in_one_line():
    with pytest.raises(UserError, match="cannot be shared by 3 processes") as error:
        plan_batches(256, 3, global_batch_size=4096)
    assert "\n" not in str(error.value)


def test_without_a_global_batch_accumulation_steps_multiply_the_micro_batch():
    plan = plan_batches(8, 2, gradient_accumulation_steps=3)
    assert (plan.per_process, plan.global_batch, plan.loss_batch) == (24, 48, 48)
    assert plan_batches(8, 2, gradient_accumulation_steps=3, accumulation="micro_batch").loss_batch == 16


def run_print_config(capsys, monkeypatch, argv, processes: int):
    from hf_vrl.run import main

    monkeypatch.setenv("WORLD_SIZE", str(processes))
    assert main(argv[0], ["--print-config", *argv[1:]]) == 0
    return capsys.readouterr()


def test_print_config_states_the_batch_and_what_each_loss_term_sees(capsys, monkeypatch):
    out = run_print_config(
        capsys, monkeypatch, ["diffclip", "--config", "diffclip-tiny", "--global-batch-size", "64"], 2
    )
    assert "64 per process and micro-batch" not in out.err
    assert "x 2 process(es) = 64 per optimiser step" in out.err
    assert "CLIP loss: 64 pairs (63 negatives each)" in out.err
    out = run_print_config(
        capsys,
        monkeypatch,
        ["diffclip", "--config", "diffclip-tiny", "--global-batch-size", "64", "--batch-size", "16"],
        1,
    )
    assert "16 per process and micro-batch x 4 micro-batches (whole_batch accumulation)" in out.err
    assert "CLIP loss: 64 pairs" in out.err
    out = run_print_config(
        capsys,
        monkeypatch,
        ["diffclip", "--config", "diffclip-tiny", "--global-batch-size", "64", "--batch-size", "16",
         "--accumulation", "micro_batch"],
        1,
    )  # fmt: skip
    assert "CLIP loss: 16 pairs (15 negatives each): every process's samples of one micro-step" in out.err


def test_dive_reference_batch_is_global_and_stated(capsys, monkeypatch):
    argv = ["dive", "--config", "dive-b16", "--dataset", "digits", "--reference-dataset", "digits"]
    out = run_print_config(capsys, monkeypatch, argv, 8)
    assert "64 per process and micro-batch x 1 micro-batches (whole_batch accumulation) x 8" in out.err
    assert "AVL, PVL: 512 reference pairs per evaluation (B' = 512 per optimiser step)" in out.err
    assert "m (Eq. 6): updated once per optimiser step" in out.err


def test_dcr_refuses_whole_batch_accumulation(capsys, monkeypatch):
    from hf_vrl.run import main

    with pytest.raises(UserError, match="DCR's loss is per micro-batch"):
        main("dcr", ["--print-config", "--accumulation", "whole_batch"])
    out = run_print_config(capsys, monkeypatch, ["dcr", "--global-batch-size", "64"], 1)
    assert "grid of one process's micro-batch" in out.err and "not gathered across processes" in out.err


def test_the_run_log_states_the_batch(tmp_path, caplog):
    import logging

    import hf_vrl

    with caplog.at_level(logging.INFO, logger="hf_vrl.run"):
        hf_vrl.train(
            "diffclip", max_steps=1, train_limit=32, batch_size=8, global_batch_size=16, eval_before=False,
            eval_after=False, figures=False, output_dir=str(tmp_path / "run"),
        )  # fmt: skip
    assert "8 per process and micro-batch x 2 micro-batches (whole_batch accumulation)" in caplog.text
    assert "CLIP loss: 16 pairs (15 negatives each)" in caplog.text


class RowTrainer(VRLTrainer):
    """A split loss over the rows of `x` (whole-batch accumulation needs the split); records the rows of every
    forward pass."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.forward_rows: list[int] = []

    def embed(self, model, inputs):
        self.forward_rows.append(len(inputs["x"]))
        return {"y": model(inputs["x"])}

    def objective(self, embedded, targets, inputs):
        return {"loss": embedded["y"].logsumexp(0).sum()}


@pytest.mark.parametrize("accumulation", ["micro_batch", "whole_batch"])
def test_an_epoch_ends_at_its_last_whole_optimiser_step(tmp_path, accumulation):
    """120 rows, global batch 32 (micro-batches of 8, 4 per step), 2 epochs: 3 whole steps per epoch, 6 in
    all, and the schedule is 6 steps long (before: a partial 4th step per epoch, 8 steps)."""
    rows = [{"x": torch.full((2,), float(i))} for i in range(120)]
    args = VRLTrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=8, gradient_accumulation_steps=4,
        accumulation=accumulation, num_train_epochs=2, lr_scheduler_type="linear", learning_rate=0.1,
        dataloader_drop_last=True, use_cpu=True, report_to="none", save_strategy="no", disable_tqdm=True,
        remove_unused_columns=False,
    )  # fmt: skip
    trainer = RowTrainer(
        model=torch.nn.Linear(2, 1),
        args=args,
        train_dataset=SeededDataset(rows, seed=0),
        data_collator=lambda batch: {"x": torch.stack([row["x"] for row in batch])},
    )
    trainer.train()
    assert (trainer.state.global_step, trainer.state.max_steps) == (6, 6)
    assert trainer.lr_scheduler.get_last_lr()[0] == 0.0  # the schedule ended with the last step run
    passes = 2 if accumulation == "whole_batch" else 1  # whole_batch embeds each micro-batch twice
    assert trainer.forward_rows == [8] * 24 * passes


PAPER_PRESETS = [(name, method) for name, method, _ in list_presets() if not name.endswith("-tiny")]


@pytest.mark.parametrize("processes", [1, 2, 8])
@pytest.mark.parametrize(("preset", "method"), PAPER_PRESETS)
def test_every_paper_preset_gives_its_global_batch_on_any_process_count(
    capsys, monkeypatch, preset, method, processes
):
    global_batch = load_preset(preset)["optim"]["global_batch_size"]  # stated by every paper preset
    out = run_print_config(capsys, monkeypatch, [method, "--config", preset], processes)
    assert f"x {processes} process(es) = {global_batch} per optimiser step" in out.err


def test_dcr_paper_presets_step_16_images_and_say_what_the_grid_holds(capsys, monkeypatch):
    """DCR §5.1: batch 16; on 2 processes each holds 8 (an 8 x 8 grid), as --print-config says."""
    one = run_print_config(capsys, monkeypatch, ["dcr", "--config", "dcr-openai-l14-224"], 1).err
    assert "= 16 per optimiser step" in one and "16 x 16 grid" in one and "batch_size is 16" not in one
    two = run_print_config(capsys, monkeypatch, ["dcr", "--config", "dcr-openai-l14-224"], 2).err
    assert "8 per process and micro-batch x 1 micro-batches (micro_batch accumulation) x 2" in two
    assert "8 x 8 grid" in two and "--global-batch-size 32 keeps 16-image grids" in two


def test_clue_states_what_batchnorm_sees_and_the_layout_that_gives_it_the_step(capsys, monkeypatch):
    """clue-r50 (the paper: 512 = 4 GPUs x 128, SyncBatchNorm): one process normalises each micro-batch of
    128, and --print-config names the layout that gives BatchNorm the step's 512."""
    one = run_print_config(capsys, monkeypatch, ["clue", "--config", "clue-r50"], 1).err
    assert (
        "BatchNorm statistics: 128 samples (one micro-batch of one process); not the step's 512: "
        "--batch-size 512 (one micro-batch per process) gives it all" in one
    )
    remedy = run_print_config(capsys, monkeypatch, ["clue", "--config", "clue-r50", "--batch-size", "512"], 1)
    assert "BatchNorm statistics: 512 samples (one micro-batch of one process)\n" in remedy.err
    four = run_print_config(capsys, monkeypatch, ["clue", "--config", "clue-r50"], 4).err
    assert (
        "BatchNorm statistics: 512 samples on GPUs (a micro-batch of 128 x 4 processes, SyncBatchNorm)"
        in four
    )
    assert "not the step's" not in four
