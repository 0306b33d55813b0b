"""`hf-vrl push` over `hf_vrl.hub.publish`: the token is found the usual way and never shown."""

from __future__ import annotations

import huggingface_hub
import pytest
from huggingface_hub import constants

from hf_vrl import cli

SECRET = "hf_NotARealTokenButTreatItAsOne123"


@pytest.fixture
def hub_client(monkeypatch, hub):
    """`HfApi()` as `hf-vrl push` builds it: the autospec'd fake, the constructor's arguments recorded."""
    made = []

    def factory(*args, **kwargs):
        made.append((args, kwargs))
        return hub.api

    monkeypatch.setattr(huggingface_hub, "HfApi", factory)
    return made


def test_dry_run_lists_the_upload_without_a_client(diffclip_run, hub_client, capsys):
    assert cli.main(["push", str(diffclip_run), "--repo-id", "me/diffclip-tiny", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would upload to me/diffclip-tiny (dry run, nothing sent)" in out
    for name in ("README.md", "model.safetensors", "modeling_diffclip.py", "figures/attention.png"):
        assert f"  {name} " in out
    assert "9 files" in out and hub_client == []


def test_push_reads_the_token_from_the_environment_and_never_shows_it(
    dcr_run, hub, hub_client, monkeypatch, capsys
):
    monkeypatch.setenv("HF_TOKEN", SECRET)
    argv = ["push", str(dcr_run), "--repo-id", "me/dcr-tower", "--what", "vision-tower", "--private"]
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert hub_client == [((), {})]  # HfApi() finds the token itself; hf_vrl never handles it
    assert hub.api.create_repo.call_args.kwargs["private"] is True
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
    assert cli.main(["push", str(diffclip_run), "--repo-id", "me/x"]) == 2
    assert (
        "not logged in to the Hugging Face Hub: run `hf auth login` or set HF_TOKEN"
        in capsys.readouterr().err
    )
    assert hub_client == [] and hub.calls == []


def test_an_existing_card_needs_overwrite_card(diffclip_run, make_hub, monkeypatch, capsys):
    hub = make_hub(existing_card=True)
    monkeypatch.setattr(huggingface_hub, "HfApi", lambda: hub.api)
    monkeypatch.setenv("HF_TOKEN", SECRET)
    assert cli.main(["push", str(diffclip_run), "--repo-id", "me/x"]) == 2
    assert "already has a model card (README.md): pass --overwrite-card" in capsys.readouterr().err
    assert cli.main(["push", str(diffclip_run), "--repo-id", "me/x", "--overwrite-card"]) == 0
    assert hub.calls.count("upload_folder") == 1


def test_help(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["push", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for option in ("--repo-id", "--what", "--private", "--overwrite-card", "--dry-run", "hf auth login"):
        assert option in out
    cli.main(["--help"])
    assert "push" in capsys.readouterr().out
