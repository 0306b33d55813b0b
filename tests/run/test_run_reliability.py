"""A run folder cannot be corrupted: one writer per folder (two real processes), SIGTERM / SIGINT save and
stop, every check before the first write, a folder whose run never saved a step is taken over, files follow
the umask. Every run is a fresh process (tests/_run_worker.py), as in test_run_resume."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from test_run_resume import (
    DIFFCLIP,
    SRC,
    WORKER,
    assert_identical,
    hf_vrl,
    ok,
    steps,
)

from hf_vrl.cli import main


@pytest.fixture(scope="module")
def diffclip_full(tmp_path_factory):
    out = tmp_path_factory.mktemp("diffclip") / "full"
    ok(hf_vrl([*DIFFCLIP, "--output-dir", str(out)]))
    return out


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith(("hf-vrl:", "(run with"))]


def test_a_second_process_is_refused_and_a_killed_runs_lock_is_taken_over(diffclip_full, tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(SRC), "HF_VRL_TEST_KILL": "sleep:train:2"}
    first = subprocess.Popen(
        [sys.executable, str(WORKER), *DIFFCLIP, "--output-dir", str(out)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 300
        while not (out / "checkpoints/train/checkpoint-2/trainer_state.json").is_file():
            assert first.poll() is None and time.monotonic() < deadline, "the first run never got to step 2"
            time.sleep(0.5)
        second = hf_vrl([*DIFFCLIP, "--output-dir", str(out), "--resume", "auto"])
        assert second.returncode == 2, second.stderr[-3000:]
        message = error_lines(second)[0]
        assert "in use by process" in message and f"{first.pid} on {socket.gethostname()}" in message
        assert "Traceback" not in second.stderr
        assert first.poll() is None  # the first run is untouched, still holding its folder
    finally:
        first.kill()
        first.wait()
    assert (out / ".lock").exists() and steps(out / "checkpoints/train") == [2]
    ok(hf_vrl([*DIFFCLIP, "--output-dir", str(out), "--resume", "auto"]))  # the stale lock is taken over
    assert_identical(out / "final", diffclip_full / "final")


@pytest.mark.parametrize(("point", "code"), [("term", 143), ("int", 130)])
def test_sigterm_and_sigint_save_the_current_step_and_resume_exactly(diffclip_full, tmp_path, point, code):
    out = tmp_path / "run"
    proc = hf_vrl([*DIFFCLIP, "--output-dir", str(out)], kill=f"{point}:train:2")
    assert proc.returncode == code, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "KeyboardInterrupt" not in proc.stderr
    name = signal.Signals(code - 128).name
    assert error_lines(proc) == [
        f"hf-vrl: stopped: {name} (saved a checkpoint at the current step); continue with the same command "
        "and --resume auto"
    ]
    assert steps(out / "checkpoints/train") == [2, 3] and not (out / "final").exists()  # step 3: the signal's
    state = json.loads((out / "checkpoints/train/checkpoint-3/trainer_state.json").read_text())
    first_part = state["stateful_callbacks"]["TrainingClock"]["attributes"]["runtime_s"]
    ok(hf_vrl([*DIFFCLIP, "--output-dir", str(out), "--resume", "auto"]))
    assert_identical(out / "final", diffclip_full / "final")
    runtime = json.loads((out / "report.json").read_text())["train"]["runtime_s"]
    assert 0 < first_part < runtime  # the report counts the time before the resume too
    assert not (out / "checkpoints/train/.staging").exists()


def run_cli(argv: list[str], capsys) -> tuple[int, list[str]]:
    capsys.readouterr()
    code = main(argv)
    lines = capsys.readouterr().err.strip().splitlines()
    return code, [line for line in lines if not line.startswith("[transformers]")]  # a library's notice


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["diffclip", "--lr-scheduler", "cosinus"], "did you mean 'cosine'"),
        (["diffclip", "--dataset", "imagefolder:/no/such/folder"], "--dataset imagefolder:/no/such/folder"),
        (["diffclip", "--eval-dataset", "/no/such/data"], "--eval-dataset /no/such/data"),
        (["diffclip", "--tokenizer", "/no/such/tokenizer"], "--tokenizer /no/such/tokenizer"),
        (["dive", "--pretrained", "/no/such/clip"], "--pretrained /no/such/clip"),
        (
            ["dive", "--reference-dataset", "webdataset:/no/cc3m/{0..3}.tar"],
            "--reference-dataset webdataset:",
        ),
        (["dive", "--set", 'model.pretrain_data={"/no/pets": 8}'], "--pretrain-data /no/pets"),
        (["dcr", "--diffusion", "/nonexistent"], "--diffusion /nonexistent"),
        (["dcr", "--diffusion", "nobody/not-in-the-cache"], "not in the local cache"),
    ],
)
def test_what_can_be_known_before_training_is_checked_before_the_first_write(
    tmp_path, capsys, monkeypatch, argv, named
):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    out = tmp_path / "run"
    code, err = run_cli(["train", *argv, "--output-dir", str(out)], capsys)
    assert code == 2 and named in "\n".join(err) and len(err) <= 3, err
    assert not out.exists()


def test_a_folder_whose_run_never_saved_a_step_is_taken_over(diffclip_full, tmp_path):
    """A run refused (or killed) before its first checkpoint leaves config.json, a report and skip logs:
    the corrected command starts there, with nothing of the old attempt. Files follow the umask."""
    out = tmp_path / "run"
    out.mkdir()
    (out / ".hf-vrl-run").write_text('{"command": "train"}')  # the run's first write: its marker
    (out / "config.json").write_text(json.dumps({"method": "diffclip", "optim": {"lr_scheduler": "cosinus"}}))
    (out / "report.json").write_text(json.dumps({"before": {"stale": 1}}))
    (out / "logs/skips").mkdir(parents=True)
    (out / "logs/skips/1.tsv").write_text("corrupt_image\told-sample\n")
    (out / "checkpoints/train/.staging/checkpoint-2").mkdir(parents=True)
    (out / "inputs/.tiny-sd.tmp-abc").mkdir(parents=True)
    old = os.umask(0o022)
    try:
        ok(hf_vrl([*DIFFCLIP, "--output-dir", str(out)]))
    finally:
        os.umask(old)
    report = json.loads((out / "report.json").read_text())
    assert "before" not in report and report["train"]["skipped"] == {}
    assert_identical(out / "final", diffclip_full / "final")
    assert (
        not (out / "inputs/.tiny-sd.tmp-abc").exists() and not (out / "checkpoints/train/.staging").exists()
    )
    for path in (out / "final", out / "final/model.safetensors", out / "config.json", out / "report.json"):
        assert path.stat().st_mode & 0o777 == (0o755 if path.is_dir() else 0o644), path


def test_a_mistyped_flag_gets_the_nearest_flag(tmp_path, capsys):
    code, err = run_cli(["train", "diffclip", "--learnin-rate", "0.1", "--output-dir", str(tmp_path)], capsys)
    assert code == 2 and "did you mean --learning-rate?" in err[0] and len(err) == 2


def test_eval_of_a_missing_model_folder_names_the_path(tmp_path, capsys):
    argv = ["eval", "--model", "/no/such/path", "--dataset", "shapes", "--output-dir", str(tmp_path / "o")]
    code, err = run_cli(argv, capsys)
    assert code == 2 and len(err) == 2 and "/no/such/path" in err[0] and "no such path" in err[0]
    assert "Repo id" not in err[0]


def test_no_figures_still_writes_the_exports():
    """`--figures false` controls the figures only: `Method.finish` (the exports) still runs."""
    from types import SimpleNamespace

    from hf_vrl.run.runner import _finish

    class Exporting:
        config = SimpleNamespace(eval=SimpleNamespace(figures=False))

        def finish(self, model):
            return {"vision_tower": "exports/vision-tower"}

    assert _finish(Exporting(), None) == {"vision_tower": "exports/vision-tower"}


def test_push_without_the_hub_is_one_line(tmp_path, capsys, monkeypatch):
    from hf_vrl.errors import explain

    class ConnectError(Exception):  # httpx's, as huggingface_hub raises it without a network
        pass

    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    code, err = run_cli(["push", str(tmp_path), "someone/model"], capsys)
    assert code == 2 and len(err) == 2 and "HF_HUB_OFFLINE=1 is set" in err[0]
    try:  # no network: the connection error is usually wrapped by huggingface_hub
        try:
            raise ConnectError("[Errno -3] Temporary failure in name resolution")
        except ConnectError as error:
            raise RuntimeError("upload failed") from error
    except RuntimeError as wrapped:
        message = explain(wrapped)
    assert message is not None and "cannot be reached (ConnectError" in message


def test_under_torchrun_the_main_process_locks_and_no_process_goes_on_when_it_is_refused(tmp_path):
    from test_run_distributed import DIFFCLIP as SHORT
    from test_run_distributed import torchrun

    from hf_vrl.run.layout import RunLock

    out = tmp_path / "run"
    with RunLock(out):  # this test process holds the folder
        proc = torchrun([*SHORT, "--batch-size", "4", "--output-dir", str(out)])
    assert proc.returncode != 0 and f"in use by process {os.getpid()} on" in proc.stderr
    assert not (out / "config.json").exists() and not (out / "checkpoints").exists()
    ok(
        torchrun([*SHORT, "--batch-size", "4", "--output-dir", str(out)])
    )  # free again: both processes train (and agree per step)
    assert (out / "final/model.safetensors").is_file()
