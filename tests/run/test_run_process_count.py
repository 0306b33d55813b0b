"""A run resumes on another process count exactly, or is refused in one line before anything is written
(issues 27, 29): a user whose 8-GPU job was pre-empted resumes on the 4 GPUs they get.

What a step's result depends on in its layout (`RunConfig.layout_identity`): the samples of the step
(`SeededSampler` deals the same samples to any process count with the same global batch), the samples one
loss evaluation sees where that is less than the step, the micro-batch where a forward pass computes over it
alone (BatchNorm, dropout), the process count where a process's part depends on it (streamed shards,
BatchNorm's running statistics, SyncBatchNorm); every random draw of a step is a function of (seed, step,
the micro-batch's place in it).

Resumed runs are compared with the uninterrupted one to float32 rounding: on another process count the
gradient is the same sum taken in another order (each process's part, then the all-reduce), a few units in
the last place per step. With plain SGD that stays near 1e-6 over six steps (measured on a 2-core CPU: 6e-8
resuming 1 -> 2 processes, 8e-7 for 2 -> 1; the tolerance, 5e-6, leaves room for another CPU's summation
order), while a resume that changes a step's samples moves the weights by 1e-2 (3e-2, measured before this
rule, which resumed on 2 processes a run whose global batch doubled with them). AdamW would turn the
rounding noise of gradients that are zero in exact arithmetic (DiffCLIP's key biases) into updates of +-lr
(tests/run/test_run_distributed.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_run_distributed import WORKER, env
from test_run_refusals import listing

from hf_vrl.errors import UserError
from hf_vrl.methods.clue.method import CLUERunConfig
from hf_vrl.methods.dcr.method import DCRRunConfig
from hf_vrl.methods.diffclip.method import DiffCLIPRunConfig
from hf_vrl.presets import load_preset
from hf_vrl.run.config import resolve
from hf_vrl.run.layout import Launch, RunDir

ONE, TWO = Launch(1), Launch(2)


def config(cls=DiffCLIPRunConfig, preset="diffclip-tiny", **overrides):
    return resolve(cls, load_preset(preset), overrides)


def recorded(root: Path, cfg, launch: Launch) -> RunDir:
    """A folder whose run `cfg` saved a step on `launch`."""
    run = RunDir(root)
    run.record_config(cfg, launch)
    (run.checkpoints("train") / "checkpoint-2").mkdir(parents=True)
    (run.checkpoints("train") / "checkpoint-2" / "trainer_state.json").write_text("{}")
    run.mark()
    return run


def refusal(run: RunDir, cfg, launch: Launch) -> str:
    with pytest.raises(UserError) as error:
        run.open(cfg, resume="auto", launch=launch)
    return str(error.value)


# -- the rule, in this process ------------------------------------------------------------------------------


def test_a_step_that_grows_with_the_process_count_is_refused_a_fixed_global_batch_resumes(tmp_path):
    """8 per process on 1 process is a step of 8; on 2 it would be 16. With the global batch fixed the
    same command resumes on either count."""
    run = recorded(tmp_path / "run", config(**{"optim.batch_size": 8}), ONE)
    message = refusal(run, config(**{"optim.batch_size": 8}), TWO)
    assert "ran on 1 process, this launch is 2 processes" in message
    assert "samples per optimiser step: 8 there, 16 now" in message
    assert "resume it on 1 process (or give --global-batch-size 8" in message and "\n" not in message
    fixed = {"optim.global_batch_size": 8, "optim.batch_size": 4}
    assert run.open(config(**fixed), resume="auto", launch=TWO)
    two = recorded(tmp_path / "two", config(**fixed), TWO)
    assert two.open(config(**{"optim.global_batch_size": 8}), resume="auto", launch=ONE)


def test_what_a_micro_batch_computes_alone_ties_the_run_to_its_micro_batch(tmp_path):
    """Under whole_batch accumulation the micro-batch is memory only, unless a forward pass draws dropout
    masks for its micro-batch (DiffCLIP with attention dropout) or normalises it (CLUE's BatchNorm, whose
    running statistics DDP takes from process 0, which saw only its micro-batches: CLUE keeps its count)."""
    dropout = {
        "optim.global_batch_size": 8,
        "optim.batch_size": 4,
        "model.architecture.vision_config.attention_dropout": 0.1,
    }
    run = recorded(tmp_path / "dropout", config(**dropout), ONE)
    message = refusal(run, config(**{**dropout, "optim.batch_size": 2}), ONE)
    assert "samples per micro-batch (vision_config.attention_dropout 0.1): 4 there, 2 now" in message
    assert run.open(config(**dropout), resume="auto", launch=TWO)  # 4 a micro-batch there and here
    clue = {"optim.global_batch_size": 16, "optim.batch_size": 8}
    run = recorded(tmp_path / "clue", config(CLUERunConfig, "clue-tiny", **clue), ONE)
    message = refusal(run, config(CLUERunConfig, "clue-tiny", **{**clue, "optim.batch_size": 4}), ONE)
    assert "samples per micro-batch (BatchNorm normalises each micro-batch" in message
    message = refusal(run, config(CLUERunConfig, "clue-tiny", **clue), TWO)
    running = "BatchNorm's running statistics are process 0's under DDP"
    assert (
        f"processes ({running}; SyncBatchNorm joins the processes' micro-batches on GPUs): 1 there, 2 now"
        in (message)
    )
    apart = {**clue, "clue.sync_batchnorm": False}
    run = recorded(tmp_path / "apart", config(CLUERunConfig, "clue-tiny", **apart), ONE)
    message = refusal(run, config(CLUERunConfig, "clue-tiny", **apart), TWO)
    assert f"processes ({running}): 1 there, 2 now" in message
    assert run.open(config(CLUERunConfig, "clue-tiny", **apart), resume="auto", launch=ONE)


def test_dive_reads_the_dropout_of_its_pretrained_model(tmp_path):
    """tiny-clip has none, so its micro-batch is memory only; a pre-trained model with attention dropout ties
    the run to its micro-batch (on any process count that keeps it)."""
    from transformers import CLIPConfig

    from hf_vrl.methods.dive.method import DiVERunConfig

    dive = {"optim.global_batch_size": 8, "optim.batch_size": 4}
    run = recorded(tmp_path / "tiny", config(DiVERunConfig, "dive-tiny", **dive), ONE)
    assert run.open(config(DiVERunConfig, "dive-tiny", **{**dive, "optim.batch_size": 2}), "auto", TWO)
    CLIPConfig(vision_config={"attention_dropout": 0.1}).save_pretrained(tmp_path / "clip")
    dropped = {**dive, "model.pretrained": str(tmp_path / "clip")}
    run = recorded(tmp_path / "dropped", config(DiVERunConfig, "dive-tiny", **dropped), ONE)
    message = refusal(run, config(DiVERunConfig, "dive-tiny", **{**dropped, "optim.batch_size": 2}), ONE)
    assert "samples per micro-batch (vision_config.attention_dropout 0.1): 4 there, 2 now" in message
    assert run.open(config(DiVERunConfig, "dive-tiny", **dropped), "auto", TWO)


def test_dcr_keeps_its_grid_on_any_process_count_that_keeps_the_micro_batch(tmp_path):
    """Eq. 12's B^2 grid is one process's micro-batch: 16 on 1 process, 8 on 2 (the global 16 shared)."""
    grid = {"optim.global_batch_size": 6, "optim.batch_size": 3}
    run = recorded(tmp_path / "three", config(DCRRunConfig, "dcr-tiny", **grid), ONE)
    assert run.open(config(DCRRunConfig, "dcr-tiny", **grid), resume="auto", launch=TWO)
    paper = {"optim.global_batch_size": 16, "optim.batch_size": 16}
    run = recorded(tmp_path / "sixteen", config(DCRRunConfig, "dcr-tiny", **paper), ONE)
    message = refusal(run, config(DCRRunConfig, "dcr-tiny", **paper), TWO)
    assert "samples per loss evaluation (a micro-batch of one process): 16 there, 8 now" in message


def test_dropouts_reads_every_sub_configuration():
    """Any dropout or stochastic depth above 0, at any depth; other keys (id2label's integers) pass by."""
    from transformers import CLIPConfig

    from hf_vrl.run.config import dropouts

    config = CLIPConfig(vision_config={"attention_dropout": 0.1}, text_config={"id2label": {0: "a", 1: "b"}})
    assert dropouts(config) == ["vision_config.attention_dropout 0.1"]
    assert dropouts({"drop_path_rate": 0.2, "hidden_dropout": 0.0, "layers": 2}) == ["drop_path_rate 0.2"]


def test_streamed_data_and_fsdp_checkpoints_are_tied_to_their_launch(tmp_path):
    """Each process reads its own shards of a stream; FSDP's checkpoints hold shards that only FSDP loads
    (torch.distributed.checkpoint reshards them onto another process count)."""
    shards = {"data.dataset": "webdataset:/data/cc3m/{00000..00003}.tar", "optim.max_steps": 10}
    streamed = {**shards, "optim.global_batch_size": 8}
    run = recorded(tmp_path / "streamed", config(**streamed), ONE)
    message = refusal(run, config(**streamed), TWO)
    assert (
        "processes (streamed data: each process reads its own shards of --dataset): 1 there, 2 now" in message
    )
    fixed = {"optim.global_batch_size": 8}
    run = recorded(tmp_path / "fsdp", config(**fixed), Launch(2, fsdp=True))
    message = refusal(run, config(**fixed), TWO)
    assert "ran on 2 processes with FSDP, this launch is 2 processes" in message
    assert "checkpoints sharded by FSDP: True there, False now" in message
    assert run.open(config(**fixed), resume="auto", launch=Launch(4, fsdp=True))


def test_a_run_of_an_earlier_release_tells_its_process_count_by_its_random_states(tmp_path):
    """No launch in its config.json: each process saved its own rng_state_<rank>.pth."""
    run = recorded(tmp_path / "run", config(**{"optim.batch_size": 4}), TWO)
    recorded_config = run.recorded_config()
    del recorded_config["launch"]
    run.config_file.write_text(json.dumps(recorded_config))
    for rank in (0, 1):
        (run.checkpoints("train") / "checkpoint-2" / f"rng_state_{rank}.pth").write_bytes(b"")
    assert run.recorded_launch(recorded_config) == TWO
    assert "samples per optimiser step: 8 there, 4 now" in refusal(
        run, config(**{"optim.batch_size": 4}), ONE
    )


def test_config_json_with_its_launch_is_a_preset(tmp_path):
    """`--config <run>/config.json` repeats a run: the launch it records is no setting."""
    run = recorded(tmp_path / "run", config(seed=3), TWO)
    assert run.recorded_config()["launch"] == {"processes": 2, "fsdp": False}
    assert resolve(DiffCLIPRunConfig, run.recorded_config()).seed == 3


# -- real runs: 1 and 2 processes (gloo) --------------------------------------------------------------------

QUIET = ["--no-eval-before", "--no-eval-after", "--no-figures", "--deterministic"]
SGD = ["--optimizer", "sgd", "--learning-rate", "0.05"]  # see the module docstring
DIFFCLIP = ["train", "diffclip", "--train-limit", "48", "--max-steps", "6", "--save-steps", "2", *SGD, *QUIET]


def launch(argv: list[str], processes: int = 1, kill: str | None = None) -> subprocess.CompletedProcess:
    """`hf-vrl argv` on 1 process, or under torchrun on 2 (tests/_run_worker.py; `kill` as it says)."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    command = [*torchrun, str(WORKER)] if processes == 2 else [sys.executable, str(WORKER)]
    variables = {**env(), **({"HF_VRL_TEST_KILL": kill} if kill else {})}
    return subprocess.run([*command, *argv], env=variables, capture_output=True, text=True, timeout=900)


def ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stderr[-3000:]


def killed_at_step_3(argv: list[str], out: Path, processes: int) -> None:
    proc = launch([*argv, "--output-dir", str(out)], processes, kill="step:train:3")
    assert proc.returncode != 0 and not (out / "final").exists(), proc.stderr[-3000:]
    assert sorted(p.name for p in (out / "checkpoints/train").glob("checkpoint-*")) == ["checkpoint-2"]


def contents(out: Path) -> list[str]:
    """`ls -R -a` of the folder but the lock's owner file, which a killed run leaves behind and the next
    process to take the lock (before the folder is read) clears."""
    return [entry for entry in listing(out) if not entry.startswith(".lock.owner:")]


def refused(argv: list[str], out: Path, processes: int) -> str:
    """A resume refused before anything is written, in at most three lines (each process prints the
    same ones; torchrun then reports the failed processes)."""
    before = contents(out)
    proc = launch([*argv, "--output-dir", str(out), "--resume"], processes)
    lines = {line for line in proc.stderr.splitlines() if line.startswith(("hf-vrl", "(run with"))}
    assert proc.returncode != 0 and 1 <= len(lines) <= 3, proc.stderr[-3000:]
    assert contents(out) == before
    return proc.stderr


def assert_close_to(run: Path, full: Path) -> None:
    first, second = (load_file(folder / "final/model.safetensors") for folder in (full, run))
    assert first.keys() == second.keys()
    for key in first:  # float32 rounding of another summation order (module docstring)
        torch.testing.assert_close(second[key], first[key], rtol=0, atol=5e-6, msg=key)


@pytest.fixture(scope="module")
def diffclip_full(tmp_path_factory) -> Path:
    """The uninterrupted run on 1 process, 8 samples a step."""
    out = tmp_path_factory.mktemp("diffclip") / "full"
    ok(launch([*DIFFCLIP, "--batch-size", "8", "--output-dir", str(out)]))
    return out


def test_diffclip_resumed_on_two_processes_equals_the_uninterrupted_run(diffclip_full, tmp_path):
    """Killed on 1 process; the same command on 2 is refused (its step would be 16), the one that keeps
    the global batch resumes to the uninterrupted run's weights."""
    out = tmp_path / "run"
    killed_at_step_3([*DIFFCLIP, "--batch-size", "8"], out, processes=1)
    stderr = refused([*DIFFCLIP, "--batch-size", "8"], out, processes=2)
    assert "samples per optimiser step: 8 there, 16 now" in stderr and "resume it on 1 process" in stderr
    resumed = launch([*DIFFCLIP, "--global-batch-size", "8", "--output-dir", str(out), "--resume"], 2)
    ok(resumed)
    assert "4 per process and micro-batch x 1 micro-batches (whole_batch accumulation) x 2" in resumed.stderr
    assert_close_to(out, diffclip_full)


@pytest.mark.slow
def test_diffclip_resumed_on_one_process_equals_the_uninterrupted_run(diffclip_full, tmp_path):
    """Killed on 2 processes of 4 samples each; resumed on 1 with 4 (a step of 4) it is refused in one
    process's lines, with 8 it continues to the uninterrupted run's weights."""
    out = tmp_path / "run"
    killed_at_step_3([*DIFFCLIP, "--batch-size", "4"], out, processes=2)
    stderr = refused([*DIFFCLIP, "--batch-size", "4"], out, processes=1)
    assert "ran on 2 processes, this launch is 1 process" in stderr
    ok(launch([*DIFFCLIP, "--batch-size", "8", "--output-dir", str(out), "--resume"]))
    assert_close_to(out, diffclip_full)


# DCR-tiny shrunk, 3 + 4 steps, a step of 6 images in grids of 3 (1 process: 2 micro-batches; 2: one each):
# stage 2 draws timesteps, noise, VAE samples, augmentations and LoRA dropout every micro-batch
DCR = ["train", "dcr", "--train-limit", "24", "--batch-size", "3", "--global-batch-size", "6",
       "--stage1-steps", "3", "--max-steps", "4", "--save-steps", "2", "--clip-pretrain-steps", "2",
       "--diffusion-pretrain-steps", "2", "--learning-rate", "0.001", *QUIET]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(("before", "after"), [(1, 2), (2, 1)])
def test_dcr_resumed_on_another_process_count_equals_the_uninterrupted_run(tmp_path, before, after):
    """Every draw of a micro-batch is a function of (seed, step, its place in the step): a run killed in
    stage 2 and resumed on the other process count gives the uninterrupted run's weights (here bit for bit:
    2 processes average their two gradients, 1 process adds the two halved: the same floats)."""
    full, out = tmp_path / "full", tmp_path / "run"
    ok(launch([*DCR, "--output-dir", str(full)]))
    proc = launch([*DCR, "--output-dir", str(out)], before, kill="step:stage2:3")
    assert proc.returncode != 0 and (out / "checkpoints/stage2/checkpoint-2").is_dir(), proc.stderr[-3000:]
    ok(launch([*DCR, "--output-dir", str(out), "--resume"], after))
    for part in ("final", "exports/dcr-model"):
        first, second = (load_file(run / part / "model.safetensors") for run in (full, out))
        assert first.keys() == second.keys()
        for key in first:
            torch.testing.assert_close(second[key], first[key], rtol=0, atol=1e-6, msg=f"{part}: {key}")
