"""A push that fails says so in the exit status; a run that stopped before final/, or a training checkpoint,
is refused in one line that says what to do, and nothing is staged inside it (issue 29)."""

from __future__ import annotations

import json
import shutil

from hf_vrl import cli

SECRET = "hf_NotARealTokenButTreatItAsOne123"


def error_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith(("hf-vrl", "(run with"))]


def test_a_failed_push_to_hub_is_a_failed_command(hub, hub_client, monkeypatch, tmp_path, capsys):
    """The run is trained and saved; the upload fails; the exit status is 2 and the one line says how to
    retry (scripts and schedulers read the status)."""
    monkeypatch.setenv("HF_TOKEN", SECRET)
    hub.api.upload_folder.side_effect = OSError("503 Service Unavailable")
    out = tmp_path / "run"
    argv = ["train", "diffclip", "--output-dir", str(out), "--max-steps", "1", "--train-limit", "16"]
    argv += [
        "--batch-size",
        "8",
        "--eval-limit",
        "8",
        "--no-figures",
        "--push-to-hub",
        "--hub-model-id",
        "me/x",
    ]
    capsys.readouterr()
    assert cli.main(argv) == 2
    message, hint = error_lines(capsys)
    assert (
        f"the run is saved in {out}, but the push to me/x failed (OSError: 503 Service Unavailable)"
        in message
    )
    assert f"retry with `hf-vrl push {out} me/x`" in message and "--debug" in hint
    assert (out / "final/model.safetensors").is_file() and "after" in json.loads(
        (out / "report.json").read_text()
    )


def test_a_run_that_stopped_before_final_says_resume(diffclip_run, tmp_path, capsys):
    stopped = tmp_path / "stopped"
    shutil.copytree(diffclip_run, stopped)
    shutil.rmtree(stopped / "final")
    evaluation = [
        "eval",
        "--model",
        str(stopped / "final"),
        "--dataset",
        "shapes",
        "--output-dir",
        str(tmp_path / "eval"),
    ]
    for command in (["push", str(stopped), "me/x", "--dry-run"], evaluation):
        code = cli.main(command)
        message = error_lines(capsys)[0]
        assert code == 2 and "stopped before final/" in message and "--resume auto" in message, message
    assert not (stopped / "hub-staging").exists()


def test_a_training_checkpoint_is_not_pushed(diffclip_run, tmp_path, capsys):
    """A checkpoint holds weights without processors; staging it wrote hub-staging/ inside it."""
    run = tmp_path / "run"
    shutil.copytree(diffclip_run, run)
    checkpoint = next((run / "checkpoints/train").glob("checkpoint-*"))
    before = sorted(p.name for p in checkpoint.iterdir())
    assert cli.main(["push", str(checkpoint), "me/x", "--dry-run"]) == 2
    assert "is a training checkpoint" in error_lines(capsys)[0]
    assert sorted(p.name for p in checkpoint.iterdir()) == before
