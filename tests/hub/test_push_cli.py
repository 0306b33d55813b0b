"""`hf-vrl push` over `hf_vrl.hub.publish`: the token is found the usual way and never shown."""

from __future__ import annotations

import pytest
from huggingface_hub import constants

from hf_vrl import cli
from hf_vrl.errors import UserError

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


def _whoami(role: str, orgs: dict[str, str] | None = None, scoped: list | None = None) -> dict:
    """The Hub's whoami-v2 answer for user "me" with a token of `role` ("read", "write", "fineGrained")."""
    token: dict = {"role": role}
    if scoped is not None:
        token["fineGrained"] = {"scoped": scoped, "global": []}
    memberships = [{"name": name, "roleInOrg": org_role} for name, org_role in (orgs or {}).items()]
    return {"name": "me", "orgs": memberships, "auth": {"accessToken": token}}


def _write(entity: str) -> dict:
    return {"entity": {"type": "org", "name": entity}, "permissions": ["repo.content.read", "repo.write"]}


@pytest.mark.parametrize(
    ("identity", "repo_id", "refusal"),
    [
        (_whoami("write"), "me/new", None),
        (_whoami("write", {"lab": "contributor"}), "lab/new", None),
        (_whoami("fineGrained", {"lab": "write"}, [_write("lab")]), "lab/new", None),
        (_whoami("read"), "me/new", "me's token cannot create me/new in 'me'"),
        (_whoami("write", {"lab": "read"}), "lab/new", "cannot create lab/new in 'lab'"),
        (_whoami("write"), "other/new", "cannot create other/new in 'other'"),
        (_whoami("fineGrained", {"lab": "admin"}, [_write("me")]), "lab/new", "a write token of 'lab'"),
    ],
)
def test_push_to_hub_checks_the_token_can_write_before_training(
    hub, hub_client, monkeypatch, tmp_path, capsys, identity, repo_id, refusal
):
    """Before the run writes anything (the Trainer would create the repo at the start; hf_vrl publishes at
    the end): a token that cannot create the repo in its namespace is refused with one line."""
    monkeypatch.setenv("HF_TOKEN", SECRET)
    hub.api.whoami.return_value = identity
    out = tmp_path / "run"
    argv = ["train", "diffclip", "--output-dir", str(out), "--max-steps", "1", "--train-limit", "16"]
    argv += ["--batch-size", "8", "--eval-limit", "8", "--no-figures", "--no-eval-before", "--no-eval-after"]
    argv += ["--push-to-hub", "--hub-model-id", repo_id]
    if refusal is None:
        from hf_vrl.run.preflight import check_push

        check_push(True, repo_id)  # the run's check passes; the run itself is test_push_to_hub_publishes...
        assert hub.calls == ["whoami", "auth_check"]
        return
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "--push-to-hub: me's token cannot" in err and refusal in err and SECRET not in err
    assert not out.exists() and "upload_folder" not in hub.calls and "create_repo" not in hub.calls


def test_push_to_hub_refuses_an_invalid_token_and_an_existing_repo_it_cannot_write(
    hub, hub_client, monkeypatch
):
    import httpx2
    from huggingface_hub.errors import HfHubHTTPError

    from hf_vrl.run.preflight import check_push

    def answer(status: int) -> httpx2.Response:
        return httpx2.Response(status, request=httpx2.Request("GET", "https://huggingface.co/api/x"))

    monkeypatch.setenv("HF_TOKEN", SECRET)
    hub.repo("me/theirs").mkdir(parents=True)  # exists: the Hub's own write check answers
    hub.api.auth_check.side_effect = HfHubHTTPError("403", response=answer(403))
    with pytest.raises(UserError, match="--push-to-hub: me's token cannot write to me/theirs"):
        check_push(True, "me/theirs")
    hub.api.whoami.side_effect = HfHubHTTPError("401", response=answer(401))
    with pytest.raises(UserError, match=r"--push-to-hub: the Hub refused the token \(401\): log in again"):
        check_push(True, "me/theirs")
