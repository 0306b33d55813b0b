"""Several processes, the same way for every method: `torchrun` and `accelerate launch` (2 CPU processes on
gloo). A 2-process run equals the 1-process run over the same global batch where the method defines one
(DiffCLIP: the features are all-gathered); each process reads its own share of streamed shards."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from data_fixtures import write_mixed_shard, write_plain_shard
from safetensors.torch import load_file

TESTS = Path(__file__).parents[1]
WORKER = TESTS / "_run_worker.py"
SRC = TESTS.parent / "src"
EXAMPLES = TESTS.parent / "examples" / "accelerate"
QUIET = ["--no-eval-before", "--no-eval-after", "--no-figures"]
DIFFCLIP = ["train", "diffclip", "--train-limit", "32", "--max-steps", "3", "--save-steps", "3", *QUIET]


def env() -> dict:
    """The processes share the CPU (gloo), also where there is a GPU: one GPU cannot give each its own."""
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(SRC),
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
    }


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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def nodes(launch_for_rank, argv, count=2):
    """Run one launcher per "machine" (all on localhost), as a user starts one on each node; one
    CompletedProcess per node."""
    procs = [
        subprocess.Popen([*launch_for_rank(rank), *argv], env=env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for rank in range(count)
    ]  # fmt: skip
    done = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            raise
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


def torchrun_nodes(argv):
    """`torchrun --nnodes 2 --nproc-per-node 1 --node-rank i --master-addr ... --master-port ...`."""
    port = free_port()

    def launch(rank):
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", str(port),
                str(WORKER)]  # fmt: skip

    return nodes(launch, argv)


def accelerate_nodes(argv, folder):
    """`accelerate launch --config_file examples/accelerate/multi_node.yaml --machine_rank i`: the shipped
    file pointed at localhost, one process per machine."""
    config = yaml.safe_load((EXAMPLES / "multi_node.yaml").read_text())
    config.update(num_processes=2, main_process_ip="127.0.0.1", main_process_port=free_port())
    path = folder / "multi_node.yaml"
    path.write_text(yaml.safe_dump(config))

    def launch(rank):
        return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(path),
                "--machine_rank", str(rank), str(WORKER)]  # fmt: skip

    return nodes(launch, argv)


def ok(proc):
    if isinstance(proc, list):
        for node in proc:
            ok(node)
        return
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


def test_two_nodes_train_diffclip_as_one_over_the_global_batch(tmp_path):
    """Two machines (two torchrun launchers on localhost, static rendezvous) of one process each."""
    ok(single([*DIFFCLIP, "--batch-size", "8", "--output-dir", str(tmp_path / "one")]))
    ok(torchrun_nodes([*DIFFCLIP, "--batch-size", "4", "--output-dir", str(tmp_path / "two")]))
    one, two = (load_file(tmp_path / name / "final" / "model.safetensors") for name in ("one", "two"))
    assert one.keys() == two.keys()
    compared = [key for key in one if not key.endswith("k_proj.bias")]  # see the test above
    assert len(compared) > 0.9 * len(one)
    for key in compared:
        torch.testing.assert_close(two[key], one[key], rtol=1e-4, atol=1e-5, msg=key)
    report = json.loads((tmp_path / "two" / "report.json").read_text())
    assert report["train"]["steps"] == 3


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


# Every method, tiny and short, on two machines of one process each under both launchers. DCR above already
# runs under both single-machine launchers.
METHODS = {
    "diffclip": (DIFFCLIP, 3),
    "dcr": (["train", "dcr", "--train-limit", "24", "--batch-size", "3", "--stage1-steps", "2",
             "--max-steps", "2", "--save-steps", "2", "--clip-pretrain-steps", "2",
             "--diffusion-pretrain-steps", "2", *QUIET], 4),
    "dive": (["train", "dive", "--train-limit", "64", "--batch-size", "4", "--max-steps", "2",
              "--save-steps", "2", "--pretrain-steps", "2", "--pretrain-data", '{"digits": 32, "shapes": 32}',
              "--pretrain-batch-size", "16", "--reference-limit", "12", "--set",
              'dive.reference_dataset=["digits", "shapes"]', "--rsa-dataset", "shapes", "--val-size", "0",
              *QUIET], 2),
    "clue": (["train", "clue", "--train-limit", "32", "--batch-size", "4", "--max-steps", "2",
              "--save-steps", "2", "--backbone-pretrain-steps", "2", "--text-encoder-pretrain-steps", "2",
              *QUIET], 2),
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["torchrun", "accelerate"])
@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_runs_on_two_nodes(tmp_path, method, launcher):
    argv, steps = METHODS[method]
    if method == "diffclip":
        argv = [*argv, "--batch-size", "4"]
    argv = [*argv, "--output-dir", str(tmp_path / "run")]
    ok(torchrun_nodes(argv) if launcher == "torchrun" else accelerate_nodes(argv, tmp_path))
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["train"]["steps"] == steps
