"""`hf-vrl push` over `hf_vrl.hub.publish`: the token is found the usual way and never shown."""

from __future__ import annotations

import pytest
from huggingface_hub import constants

from hf_vrl import cli

SECRET = "hf_NotARealTokenButTreatItAsOne123"


def test_dry_run_stages_and_lists_the_upload_without_a_client(diffclip_run, hub_client, tmp_path, capsys):
    stage = tmp_path / "stage"
    argv = ["push", str(diffclip_run), "me/diffclip-tiny", "--dry-run", "--staging-dir", str(stage)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "would upload to me/diffclip-tiny (dry run, nothing sent)" in out
    names = (
        "README.md",
        "model.safetensors",
        "modeling_diffclip.py",
        "differential_attention.py",
        "figures/attention.png",
        "processor_config.json",
        "run/report.json",
    )
    for name in names:
        assert f"  {name} " in out and (stage / name).is_file()
    assert "13 files" in out and f"staged in {stage}" in out and hub_client == []


def test_staging_dir_needs_dry_run(diffclip_run, hub_client, tmp_path, capsys):
    assert cli.main(["push", str(diffclip_run), "me/x", "--staging-dir", str(tmp_path)]) == 2
    assert "a staging folder is for dry runs" in capsys.readouterr().err and hub_client == []


def test_push_reads_the_token_from_the_environment_and_never_shows_it(
    dcr_run, hub, hub_client, monkeypatch, capsys
):
    monkeypatch.setenv("HF_TOKEN", SECRET)
    argv = ["push", str(dcr_run), "me/dcr-tower", "--what", "vision-tower", "--private", "--revision", "v2"]
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert hub_client == [((), {"token": None})]  # HfApi finds the token itself; hf_vrl never handles it
    assert hub.api.create_repo.call_args.kwargs["private"] is True
    assert hub.api.upload_folder.call_args.kwargs["revision"] == "v2"
    assert "https://huggingface.co/me/dcr-tower/commit/0123abcd" in out
    assert SECRET not in out + err
    assert not any(
        SECRET in p.read_text(errors="ignore") for p in hub.repo("me/dcr-tower").rglob("*") if p.is_file()
    )


def test_without_a_token_push_stops_before_the_hub(
    diffclip_run, hub, hub_client, monkeypatch, tmp_path, capsys
):
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    assert cli.main(["push", str(diffclip_run), "me/x"]) == 2
    assert "not logged in to the Hugging Face Hub: run `hf auth login`" in capsys.readouterr().err
    assert hub_client == [] and hub.calls == []


def test_user_errors_are_one_line(dcr_run, hub_client, capsys):
    assert cli.main(["push", str(dcr_run), "dcr-tower"]) == 2
    err = capsys.readouterr().err.strip()
    message, hint = err.splitlines()  # the message in one line, then the CLI's --debug hint
    assert message.startswith("hf-vrl: error: give the full repo id, owner/name") and "--debug" in hint
    assert cli.main(["push", str(dcr_run / "final"), "me/x"]) == 2
    assert (
        "is not a run folder written by `hf-vrl train` (it is a model folder: give the run folder around it)"
        in (capsys.readouterr().err)
    )
    assert hub_client == []


def test_help(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["push", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for option in ("REPO_ID", "--what", "--export", "--private", "--revision", "--dry-run", "hf auth login"):
        assert option in out
    cli.main(["--help"])
    assert "push" in capsys.readouterr().out


def test_push_to_hub_publishes_the_finished_run(hub, hub_client, monkeypatch, tmp_path):
    """`--push-to-hub --hub-model-id` (TrainingArguments' names): the run, when it ends, goes up as `hf-vrl
    push` sends it (model, card, record), replacing the card as the Trainer's push does."""
    monkeypatch.setenv("HF_TOKEN", SECRET)
    (hub.repo("me/pushed") / "README.md").parent.mkdir(parents=True)
    (hub.repo("me/pushed") / "README.md").write_text("an older card")
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
        "me/pushed",
    ]
    assert cli.main(argv) == 0
    assert {"README.md", "model.safetensors", "run/report.json"} <= hub.files("me/pushed")
    assert (hub.repo("me/pushed") / "README.md").read_text() != "an older card"
    assert hub.calls.count("upload_folder") == 1


def test_push_to_hub_is_checked_before_the_run_writes(monkeypatch, tmp_path, capsys):
    out = tmp_path / "run"
    base = ["train", "diffclip", "--output-dir", str(out), "--max-steps", "1", "--push-to-hub"]
    assert cli.main(base) == 2
    assert (
        "output.push_to_hub needs output.hub_model_id: give --hub-model-id owner/name"
        in capsys.readouterr().err
    )
    assert cli.main([*base, "--hub-model-id", "pushed"]) == 2
    expected = "--hub-model-id: give the full repo id, owner/name (e.g. your-name/pushed)"
    assert expected in capsys.readouterr().err
    assert cli.main([*base, "--hub-model-id", "me/pushed"]) == 2  # HF_HUB_OFFLINE=1 in the tests
    assert "--push-to-hub needs the Hub, but HF_HUB_OFFLINE=1 is set" in capsys.readouterr().err
    assert not out.exists()
