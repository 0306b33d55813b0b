"""Several processes, the same way for every method: `torchrun` and `accelerate launch` (2 CPU processes on
gloo). A 2-process run equals the 1-process run over the same global batch where the method defines one
(DiffCLIP: the features are all-gathered); each process reads its own share of streamed shards."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from data_fixtures import write_mixed_shard, write_plain_shard
from safetensors.torch import load_file

TESTS = Path(__file__).parents[1]
WORKER = TESTS / "_run_worker.py"
SRC = TESTS.parent / "src"
QUIET = ["--no-eval-before", "--no-eval-after", "--no-figures"]
DIFFCLIP = ["train", "diffclip", "--train-limit", "32", "--max-steps", "3", "--save-steps", "3", *QUIET]


def env() -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}


def single(argv):
    return subprocess.run(
        [sys.executable, str(WORKER), *argv], env=env(), capture_output=True, text=True, timeout=900
    )


def torchrun(argv):
    launch = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(WORKER),
    ]
    return subprocess.run([*launch, *argv], env=env(), capture_output=True, text=True, timeout=900)


def accelerate_launch(argv, port):
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    launch += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    launch += ["--main_process_port", str(port), str(WORKER)]
    return subprocess.run([*launch, *argv], env=env(), capture_output=True, text=True, timeout=900)


def ok(proc):
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_two_processes_train_diffclip_as_one_over_the_global_batch(tmp_path):
    ok(single([*DIFFCLIP, "--batch-size", "8", "--output-dir", str(tmp_path / "one")]))
    ok(torchrun([*DIFFCLIP, "--batch-size", "4", "--output-dir", str(tmp_path / "two")]))
    one, two = (load_file(tmp_path / name / "final" / "model.safetensors") for name in ("one", "two"))
    assert one.keys() == two.keys()
    moved = load_file(tmp_path / "one" / "checkpoints" / "train" / "checkpoint-3" / "model.safetensors")
    # A key bias shifts every logit of a query by the same q.b, which softmax ignores: its gradient is zero in
    # exact arithmetic and rounding noise in floats, which Adam normalises into full steps of random sign.
    compared = [key for key in one if not key.endswith("k_proj.bias")]
    assert len(compared) > 0.9 * len(one)
    for key in compared:
        # same samples, crops, order and gradient; only the reduction order differs
        torch.testing.assert_close(two[key], one[key], rtol=1e-4, atol=1e-5, msg=key)
        torch.testing.assert_close(moved[key], one[key], rtol=0, atol=0)


def test_each_process_reads_its_own_shards(tmp_path):
    """Two shards with different bad samples: each process's skip log holds only its own shard's."""
    shards = [
        write_mixed_shard(tmp_path / "0.tar"),
        write_plain_shard(tmp_path / "1.tar", 100, 12, size=(32, 32)),
    ]
    # the second shard gets a bad sample of its own kind: a missing caption
    import tarfile

    from data_fixtures import add_member, encode, noise

    with tarfile.open(shards[1], "a") as tar:
        add_member(tar, "999999.jpg", encode(noise((32, 32), seed=1), "JPEG"))
    data = f"webdataset:{tmp_path}/{{0..1}}.tar"
    out = tmp_path / "run"
    argv = ["train", "diffclip", "--dataset", data, "--shuffle-buffer", "0", "--batch-size", "2"]
    ok(torchrun([*argv, "--max-steps", "2", "--save-steps", "2", "--output-dir", str(out), *QUIET]))
    logs = sorted((out / "logs" / "skips").glob("*.tsv"))
    keys = [{line.split("\t")[1] for line in path.read_text().splitlines()} for path in logs]
    assert len(logs) == 2  # one file per process
    mixed = {k for k in set().union(*keys) if len(k) == 9}  # the mixed shard's keys are 9 digits long
    assert sorted(keys, key=len) == [{"999999"}, mixed] and len(mixed) == 7


@pytest.mark.parametrize("launcher", ["accelerate", "torchrun"])
def test_dcr_runs_under_both_launchers(tmp_path, launcher):
    argv = ["train", "dcr", "--train-limit", "24", "--batch-size", "3", "--stage1-steps", "2",
            "--max-steps", "2", "--save-steps", "2", "--clip-pretrain-steps", "2",
            "--diffusion-pretrain-steps", "2", *QUIET,
            "--output-dir", str(tmp_path / "run")]  # fmt: skip
    ok(accelerate_launch(argv, 29400 + os.getpid() % 500) if launcher == "accelerate" else torchrun(argv))
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()
    assert (tmp_path / "run" / "exports" / "vision-tower" / "model.safetensors").is_file()
