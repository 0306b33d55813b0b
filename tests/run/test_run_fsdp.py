"""FSDP (FSDP2 through `accelerate launch` with examples/accelerate/fsdp.yaml) on two CPU processes (gloo).

accelerate 1.15 only enables FSDP on GPU process groups (tests/_run_worker.py `_allow_fsdp_on_cpu` says
where); the worker lifts that gate, so these runs shard, gather and checkpoint exactly as on GPUs. A sharded
run trains as the 1-process run over the same global batch, `final/` is a plain `save_pretrained` folder with
the full weights, and a run killed with SIGKILL resumes from its sharded checkpoint to the same final weights.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from torch import nn

from hf_vrl.errors import UserError
from hf_vrl.run import fsdp

TESTS = Path(__file__).parents[1]
WORKER = TESTS / "_run_worker.py"
SRC = TESTS.parent / "src"
EXAMPLE = TESTS.parent / "examples" / "accelerate" / "fsdp.yaml"
QUIET = ["--no-eval-before", "--no-eval-after", "--no-figures"]
DIFFCLIP = ["train", "diffclip", "--train-limit", "48", "--max-steps", "4", "--save-steps", "2", *QUIET]
SHARDS = "pytorch_model_fsdp_0"  # what only an FSDP checkpoint holds: each process's shard of the model


def env(**extra: str) -> dict:
    base = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    base.pop("HF_VRL_TEST_KILL", None)
    return {**base, "CUDA_VISIBLE_DEVICES": "", "HF_VRL_TEST_FSDP_ON_CPU": "1", **extra}


def fsdp_launch(
    argv, folder: Path, kill: str | None = None, processes: int = 2
) -> subprocess.CompletedProcess:
    """The shipped FSDP config on 2 CPU processes of this machine (or `processes`)."""
    config = yaml.safe_load(EXAMPLE.read_text())
    config.update(num_processes=processes, main_process_port=29400 + os.getpid() % 500)
    path = folder / f"fsdp{processes}.yaml"
    path.write_text(yaml.safe_dump(config))
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(path), str(WORKER)]
    extra = {"HF_VRL_TEST_KILL": kill} if kill else {}
    return subprocess.run([*launch, *argv], env=env(**extra), capture_output=True, text=True, timeout=900)


def single(argv) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(WORKER), *argv], env=env(), capture_output=True, text=True, timeout=900
    )


def ok(proc):
    assert proc.returncode == 0, proc.stderr[-4000:]


def weights(run: Path) -> dict:
    return load_file(run / "final" / "model.safetensors")


def test_fsdp_trains_diffclip_as_one_process_and_saves_a_plain_final(tmp_path):
    ok(single([*DIFFCLIP, "--batch-size", "8", "--output-dir", str(tmp_path / "one")]))
    ok(fsdp_launch([*DIFFCLIP, "--batch-size", "4", "--output-dir", str(tmp_path / "fsdp")], tmp_path))
    checkpoint = tmp_path / "fsdp" / "checkpoints" / "train" / "checkpoint-4"
    assert (checkpoint / SHARDS).is_dir()  # the model really was sharded
    assert {p.name for p in (checkpoint / SHARDS).glob("*.distcp")} == {"__0_0.distcp", "__1_0.distcp"}
    assert not (tmp_path / "fsdp" / "checkpoints" / "train" / ".staging" / "checkpoint-4").exists()
    one, sharded = weights(tmp_path / "one"), weights(tmp_path / "fsdp")
    assert one.keys() == sharded.keys()
    assert sharded["logit_scale"].shape == one["logit_scale"].shape == torch.Size([])
    # a key bias gets no gradient in exact arithmetic (test_run_distributed): rounding noise, not compared
    compared = [key for key in one if not key.endswith("k_proj.bias")]
    for key in compared:
        torch.testing.assert_close(sharded[key], one[key], rtol=1e-4, atol=1e-5, msg=key)
    earlier = load_file(tmp_path / "one" / "checkpoints" / "train" / "checkpoint-2" / "model.safetensors")
    assert sum(not torch.equal(earlier[key], one[key]) for key in compared) > 0.9 * len(compared)  # it trains
    from hf_vrl.models.diffclip import DiffCLIPModel

    final = DiffCLIPModel.from_pretrained(tmp_path / "fsdp" / "final")  # a plain save_pretrained folder
    assert torch.equal(final.logit_scale.detach(), sharded["logit_scale"])


def test_fsdp_run_killed_resumes_from_its_sharded_checkpoint_exactly(tmp_path):
    argv = [*DIFFCLIP, "--batch-size", "4", "--num-workers", "1", "--deterministic"]
    full, run = tmp_path / "full", tmp_path / "run"
    ok(fsdp_launch([*argv, "--output-dir", str(full)], tmp_path))
    killed = fsdp_launch([*argv, "--output-dir", str(run)], tmp_path, kill="step:train:3")
    assert killed.returncode != 0, killed.stderr[-3000:]
    assert f"exitcode  : -{int(signal.SIGKILL)} " in killed.stderr, killed.stderr[
        -3000:
    ]  # killed, not failed
    checkpoints = run / "checkpoints" / "train"
    assert sorted(p.name for p in checkpoints.glob("checkpoint-*")) == ["checkpoint-2"]
    assert (checkpoints / "checkpoint-2" / SHARDS).is_dir() and not (run / "final").exists()
    resumed = fsdp_launch([*argv, "--output-dir", str(run), "--resume", "auto"], tmp_path)
    ok(resumed)
    assert f"resuming from {run}/checkpoints/train/checkpoint-2" in resumed.stderr + resumed.stdout
    first, second = weights(full), weights(run)
    assert first.keys() == second.keys()
    different = [key for key in first if not torch.equal(first[key], second[key])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"
    assert json.loads((run / "report.json").read_text())["train"]["steps"] == 4


@pytest.mark.slow
def test_fsdp_run_resumes_on_another_process_count_by_resharding(tmp_path):
    """Killed on 2 processes, resumed on 4: torch.distributed.checkpoint reshards the model and optimizer
    shards on load, so the run ends where the uninterrupted 1-process run does, to the float32 rounding of
    another summation order (plain SGD: tests/run/test_run_process_count.py says why; measured 6e-7)."""
    argv = [*DIFFCLIP, "--global-batch-size", "8", "--optimizer", "sgd", "--learning-rate", "0.05"]
    argv += ["--deterministic"]
    full, run = tmp_path / "full", tmp_path / "run"
    ok(single([*argv, "--output-dir", str(full)]))
    killed = fsdp_launch([*argv, "--output-dir", str(run)], tmp_path, kill="step:train:3")
    assert killed.returncode != 0 and (run / "checkpoints/train/checkpoint-2" / SHARDS).is_dir()
    ok(fsdp_launch([*argv, "--output-dir", str(run), "--resume", "auto"], tmp_path, processes=4))
    first, second = weights(full), weights(run)
    for key in first:
        torch.testing.assert_close(second[key], first[key], rtol=0, atol=1e-6, msg=key)


# the other methods, tiny and short (DCR: stage 1 on the projector, stage 2 with LoRA through peft)
METHODS = {
    "dcr": (["train", "dcr", "--train-limit", "24", "--batch-size", "3", "--stage1-steps", "2",
             "--max-steps", "2", "--save-steps", "2", "--clip-pretrain-steps", "2",
             "--diffusion-pretrain-steps", "2"], "stage2",
            ["final", "exports/dcr-model", "exports/vision-tower"]),
    "dive": (["train", "dive", "--train-limit", "64", "--batch-size", "4", "--max-steps", "2",
              "--save-steps", "2", "--pretrain-steps", "2", "--pretrain-data", '{"digits": 32, "shapes": 32}',
              "--pretrain-batch-size", "16", "--reference-limit", "12", "--set",
              'dive.reference_dataset=["digits", "shapes"]', "--rsa-dataset", "shapes", "--val-size", "0"],
             "train", ["final"]),
    "clue": (["train", "clue", "--train-limit", "32", "--batch-size", "4", "--max-steps", "2",
              "--save-steps", "2", "--backbone-pretrain-steps", "2", "--text-encoder-pretrain-steps", "2"],
             "train", ["final"]),
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(METHODS))
def test_fsdp_trains_every_method_as_data_parallel(tmp_path, method):
    """Sharded (FSDP2) and replicated (DDP, torchrun) runs of 2 processes give the same weights."""
    argv, stage, parts = METHODS[method]
    argv = [*argv, *QUIET]
    ok(fsdp_launch([*argv, "--output-dir", str(tmp_path / "fsdp")], tmp_path))
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    ddp = subprocess.run(
        [*torchrun, str(WORKER), *argv, "--output-dir", str(tmp_path / "ddp")],
        env={**env(), "HF_VRL_TEST_FSDP_ON_CPU": "0"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    ok(ddp)
    assert (tmp_path / "fsdp" / "checkpoints" / stage / "checkpoint-2" / SHARDS).is_dir()
    assert not (tmp_path / "ddp" / "checkpoints" / stage / "checkpoint-2" / SHARDS).exists()
    for part in parts:
        a, b = (load_file(tmp_path / run / part / "model.safetensors") for run in ("ddp", "fsdp"))
        assert a.keys() == b.keys()
        for key in a:
            torch.testing.assert_close(b[key], a[key], rtol=1e-4, atol=1e-5, msg=f"{part}: {key}")


# -- the pieces, in this process -----------------------------------------------------------------------------


class Tiny(nn.Module):
    _no_split_modules = [
        "Linear",
        "CLIPTextEmbeddings",
    ]  # as a vision tower's merged list names its text side

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 2)
        self.logit_scale = nn.Parameter(torch.tensor(2.5))

    def get_input_embeddings(self):
        raise NotImplementedError


def test_prepare_trains_scalars_as_vectors_and_gather_restores_them():
    model = Tiny()
    fsdp.prepare(model)
    assert model.logit_scale.shape == (1,) and model.get_input_embeddings() is None
    assert (model.logit_scale * torch.ones(2, 2)).shape == (2, 2)  # broadcasting is unchanged
    assert model._no_split_modules == ["Linear"]  # what accelerate's wrapping policy can find
    fsdp.gather(model)  # nothing was sharded: only prepare's changes are undone
    assert model.logit_scale.shape == () and model.logit_scale.item() == 2.5
    assert model.logit_scale.requires_grad
    with pytest.raises(NotImplementedError):
        model.get_input_embeddings()
    assert set(model.state_dict()) == {"linear.weight", "linear.bias", "logit_scale"}
    assert "_no_split_modules" not in model.__dict__ and model._no_split_modules == Tiny._no_split_modules


def test_fsdp1_is_refused_and_no_fsdp_is_no_fsdp(monkeypatch):
    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    assert not fsdp.fsdp_requested()
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "1")
    with pytest.raises(UserError, match="fsdp_version: 2"):
        fsdp.fsdp_requested()
    monkeypatch.setenv("FSDP_VERSION", "2")
    assert fsdp.fsdp_requested()
