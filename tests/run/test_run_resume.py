"""A run killed at any point (SIGKILL, as `kill -9` or a pre-empted node) resumes to exactly what the
uninterrupted run gives, bit for bit (on CUDA with `--deterministic`), with random augmentation on; a
finished stage or run is never trained again. Every run is a fresh process with one torch thread
(tests/_run_worker.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

WORKER = Path(__file__).parents[1] / "_run_worker.py"
SRC = Path(__file__).parents[2] / "src"
QUIET = ["--no-eval-before", "--no-eval-after", "--no-figures", "--deterministic"]
# DiffCLIP-tiny with its random crops, a loader worker prefetching, checkpoints every 2 steps
DIFFCLIP = [
    "train",
    "diffclip",
    "--train-limit",
    "48",
    "--batch-size",
    "8",
    "--max-steps",
    "6",
    "--save-steps",
    "2",
    "--num-workers",
    "1",
    *QUIET,
]
# DCR-tiny shrunk: toy inputs of a few steps, 3 + 4 steps of the two stages
DCR = [
    "train",
    "dcr",
    "--train-limit",
    "24",
    "--batch-size",
    "3",
    "--stage1-steps",
    "3",
    "--max-steps",
    "4",
    "--save-steps",
    "2",
    "--clip-pretrain-steps",
    "2",
    "--diffusion-pretrain-steps",
    "2",
    *QUIET,
]

# DiVE-tiny shrunk: a toy CLIP of 2 pre-training steps, 6 DiVE steps; 24 reference pairs in batches of 8, so
# the reference stream wraps (and the frozen-embedding cache is hit) after the resume point
DIVE = [
    "train",
    "dive",
    "--train-limit",
    "120",
    "--batch-size",
    "8",
    "--max-steps",
    "6",
    "--save-steps",
    "2",
    "--pretrain-steps",
    "2",
    "--pretrain-data",
    '{"digits": 32, "shapes": 32}',
    "--pretrain-batch-size",
    "16",
    "--reference-limit",
    "12",
    "--set",
    'dive.reference_dataset=["digits", "shapes"]',
    "--rsa-dataset",
    "shapes",
    "--val-size",
    "0",
    *QUIET,
]

# CLUE-tiny shrunk: 2 toy pretraining steps, then 6 steps with both random views, the momentum branch and a
# loader worker, checkpoints every 2 steps
CLUE = [
    "train",
    "clue",
    "--text-encoder-pretrain-steps",
    "2",
    "--train-limit",
    "48",
    "--batch-size",
    "8",
    "--max-steps",
    "6",
    "--save-steps",
    "2",
    "--num-workers",
    "1",
    "--backbone-pretrain-steps",
    "2",
    *QUIET,
]


def hf_vrl(argv: list[str], kill: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(SRC)}
    env.pop("HF_VRL_TEST_KILL", None)
    if kill:
        env["HF_VRL_TEST_KILL"] = kill
    return subprocess.run(
        [sys.executable, str(WORKER), *argv], env=env, capture_output=True, text=True, timeout=900
    )


def ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stderr[-3000:]


def killed(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]


def weights(folder: Path) -> dict:
    return load_file(folder / "model.safetensors")


def assert_identical(a: Path, b: Path) -> None:
    first, second = weights(a), weights(b)
    assert first.keys() == second.keys()
    different = [key for key in first if not (first[key] == second[key]).all()]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"


def steps(folder: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in folder.glob("checkpoint-*"))


def kill_then_resume(argv: list[str], out: Path, kill: str) -> None:
    """Kill the run at `kill` (only checkpoint-2 complete, no final/), then resume it to the end."""
    killed(hf_vrl([*argv, "--output-dir", str(out)], kill=kill))
    assert steps(out / "checkpoints/train") == [2] and not (out / "final").exists()
    ok(hf_vrl([*argv, "--output-dir", str(out), "--resume"]))


@pytest.fixture(scope="module")
def diffclip_full(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("diffclip") / "full"
    ok(hf_vrl([*DIFFCLIP, "--output-dir", str(out)]))
    return out


def test_diffclip_killed_during_training_resumes_exactly(diffclip_full, tmp_path):
    out = tmp_path / "run"
    kill_then_resume(DIFFCLIP, out, "step:train:3")
    assert_identical(out / "final", diffclip_full / "final")


def test_diffclip_killed_while_writing_a_checkpoint_resumes_from_the_previous_one(diffclip_full, tmp_path):
    out = tmp_path / "run"
    killed(hf_vrl([*DIFFCLIP, "--output-dir", str(out)], kill="save:train:4"))
    checkpoints = out / "checkpoints/train"
    assert steps(checkpoints) == [2]  # the half-written checkpoint-4 never took its name
    assert (checkpoints / ".staging/checkpoint-4").is_dir()
    ok(hf_vrl([*DIFFCLIP, "--output-dir", str(out), "--resume"]))
    assert_identical(out / "final", diffclip_full / "final")
    assert steps(checkpoints) == [4, 6]


def test_a_finished_run_is_never_trained_again(diffclip_full, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(diffclip_full, out)
    before = (out / "final/model.safetensors").stat().st_mtime_ns
    ok(hf_vrl([*DIFFCLIP, "--output-dir", str(out), "--resume"]))
    assert steps(out / "checkpoints/train") == [4, 6]
    assert (out / "final/model.safetensors").stat().st_mtime_ns == before


def test_a_run_killed_after_its_last_checkpoint_finishes_without_training(diffclip_full, tmp_path):
    """Killed between the last checkpoint and final/: the resumed run loads checkpoint-6 and trains no step
    7 (the Trainer alone would)."""
    out = tmp_path / "run"
    shutil.copytree(diffclip_full, out)
    shutil.rmtree(out / "final")
    (out / "report.json").unlink()
    ok(hf_vrl([*DIFFCLIP, "--output-dir", str(out), "--resume"]))
    assert steps(out / "checkpoints/train") == [4, 6]
    assert_identical(out / "final", diffclip_full / "final")


def test_a_new_run_in_an_old_runs_folder_is_refused(diffclip_full, tmp_path):
    proc = hf_vrl([*DIFFCLIP, "--output-dir", str(diffclip_full)])
    assert proc.returncode == 2 and "already holds a run" in proc.stderr
    proc = hf_vrl([*DIFFCLIP, "--output-dir", str(diffclip_full), "--resume", "--seed", "1"])
    assert proc.returncode == 2 and "seed: 0 there, 1 now" in proc.stderr


@pytest.fixture(scope="module")
def dcr_full(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dcr") / "full"
    ok(hf_vrl([*DCR, "--output-dir", str(out)]))
    return out


def test_dcr_killed_in_stage_two_resumes_exactly_and_never_retrains_stage_one(dcr_full, tmp_path):
    out = tmp_path / "run"
    killed(hf_vrl([*DCR, "--output-dir", str(out)], kill="step:stage2:3"))
    stage1_done = out / "checkpoints/stage1/done/model.safetensors"
    stamp = stage1_done.stat().st_mtime_ns
    assert steps(out / "checkpoints/stage2") == [2]
    ok(hf_vrl([*DCR, "--output-dir", str(out), "--resume"]))
    assert stage1_done.stat().st_mtime_ns == stamp and steps(out / "checkpoints/stage1") == [2, 3]
    assert_identical(out / "final", dcr_full / "final")
    assert_identical(out / "exports/dcr-model", dcr_full / "exports/dcr-model")
    report = json.loads((out / "report.json").read_text())
    assert (
        report["train"]["stages"]["stage1"]["steps"] == 3
        and report["train"]["stages"]["stage2"]["steps"] == 4
    )


def test_dcr_toy_inputs_of_another_seed_are_not_reused(dcr_full):
    proc = hf_vrl([*DCR, "--output-dir", str(dcr_full), "--resume", "--seed", "1"])
    assert proc.returncode == 2 and "seed: 0 there, 1 now" in proc.stderr


@pytest.fixture(scope="module")
def dive_full(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dive") / "full"
    ok(hf_vrl([*DIVE, "--output-dir", str(out)]))
    return out


@pytest.mark.parametrize("kill", ["step:train:3", "save:train:4"])
def test_dive_killed_resumes_exactly_with_its_average_vector_and_reference_position(
    dive_full, tmp_path, kill
):
    out = tmp_path / "run"
    kill_then_resume(DIVE, out, kill)
    assert_identical(out / "final", dive_full / "final")
    state, full = (
        load_file(run / "checkpoints/train/checkpoint-6/extra_state.safetensors") for run in (out, dive_full)
    )
    assert int(state["reference_batches"]) == 6 and torch.equal(state["avg_vector"], full["avg_vector"])


@pytest.fixture(scope="module")
def clue_full(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("clue") / "full"
    ok(hf_vrl([*CLUE, "--output-dir", str(out)]))
    return out


def test_clue_killed_during_training_resumes_exactly_with_its_momentum_branch(clue_full, tmp_path):
    """The momentum branch (momentum_* weights, updated after every step) continues exactly too."""
    out = tmp_path / "run"
    kill_then_resume(CLUE, out, "step:train:3")
    assert_identical(out / "final", clue_full / "final")
    assert any(key.startswith("momentum_backbone.") for key in weights(out / "final"))


def test_clue_killed_while_writing_a_checkpoint_resumes_from_the_previous_one(clue_full, tmp_path):
    out = tmp_path / "run"
    kill_then_resume(CLUE, out, "save:train:4")
    assert_identical(out / "final", clue_full / "final")
    assert steps(out / "checkpoints/train") == [6]  # clue-tiny keeps the newest checkpoint only


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        ("optimizer.pt", "optimizer.pt is missing"),
        pytest.param("model.safetensors", "model.safetensors cannot be read", marks=pytest.mark.slow),
    ],  # every kind of damage in-process: tests/test_trainer_checkpoints.py
)
def test_a_damaged_last_checkpoint_falls_back_to_the_one_before(diffclip_full, tmp_path, damage, reason):
    """A checkpoint is complete or it is not used (issue 29): the last one lost its optimizer state, or its
    weights were cut short; the resume takes checkpoint-4, says which it skipped and why, and ends where the
    uninterrupted run did."""
    out = tmp_path / "run"
    shutil.copytree(diffclip_full, out)
    shutil.rmtree(out / "final")
    (out / "report.json").unlink()
    damaged = out / "checkpoints/train/checkpoint-6" / damage
    if damage == "optimizer.pt":
        damaged.unlink()
    else:
        damaged.write_bytes(damaged.read_bytes()[:-1000])
    proc = hf_vrl([*DIFFCLIP, "--output-dir", str(out), "--resume"])
    ok(proc)
    assert f"checkpoint-6 is incomplete ({reason}" in proc.stderr and "resuming from" in proc.stderr
    assert "checkpoint-4" in proc.stderr.split("resuming from")[1].splitlines()[0]
    assert_identical(out / "final", diffclip_full / "final")


@pytest.mark.slow
def test_a_resume_with_half_the_micro_batch_equals_the_uninterrupted_run(tmp_path):
    """An out-of-memory error is fixed by resuming with a smaller micro-batch (issue 27): under whole_batch
    accumulation the loss sees the same 8 samples per step, only its gradient is summed over two micro-batches
    of 4 instead of one of 8. Not bit-identical: that sum is taken in another order, so the weights agree to
    float32 rounding (measured: max |difference| 6e-8 after three steps); plain SGD, because Adam turns the
    rounding noise of gradients that are zero in exact arithmetic into updates of +-lr."""
    argv = [*DIFFCLIP, "--global-batch-size", "8", "--optimizer", "sgd", "--learning-rate", "0.05"]
    ok(hf_vrl([*argv, "--output-dir", str(tmp_path / "full")]))
    out = tmp_path / "run"
    killed(hf_vrl([*argv, "--output-dir", str(out)], kill="step:train:3"))
    proc = hf_vrl([*argv, "--batch-size", "4", "--output-dir", str(out), "--resume"])
    ok(proc)
    assert "4 per process and micro-batch x 2 micro-batches" in proc.stderr
    full, resumed = weights(tmp_path / "full/final"), weights(out / "final")
    assert max((full[key] - resumed[key]).abs().max().item() for key in full) < 1e-6


@pytest.mark.slow
def test_a_takeover_with_other_settings_rebuilds_what_the_folder_holds_in_inputs(tmp_path):
    """A DiVE run that failed after building inputs/pretrained (1 toy pre-training step) is taken over by the
    corrected command (2 steps): its inputs are rebuilt, as a fresh run builds them (issue 29: the 5-step
    model was reused under a config.json saying 30)."""
    out, fresh = tmp_path / "run", tmp_path / "fresh"
    one_step = [*DIVE, "--pretrain-steps", "1"]  # the last --pretrain-steps counts
    killed(hf_vrl([*one_step, "--output-dir", str(out)], kill="step:train:0"))
    assert (out / "inputs/pretrained").is_dir() and not steps(out / "checkpoints/train")
    killed(hf_vrl([*DIVE, "--output-dir", str(out)], kill="step:train:0"))
    killed(hf_vrl([*DIVE, "--output-dir", str(fresh)], kill="step:train:0"))
    assert_identical(out / "inputs/pretrained", fresh / "inputs/pretrained")
