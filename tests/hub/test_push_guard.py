"""`hf-vrl push` uploads only what hf_vrl wrote (issue 37): the files a model folder needs, never a secret
left in the folder nor a file reached through a link that leaves the run; a linked hub-staging/ is refused
(replacing it deleted outside the run); non-finite weights and a damaged report are refused in one line; a
finished run given `--resume auto --push-to-hub` is pushed."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from hf_vrl import cli
from hf_vrl.errors import UserError
from hf_vrl.hub import publish

SECRET = "hf_NotARealTokenButTreatItAsOne123"


@pytest.fixture
def run(diffclip_run, tmp_path):
    return shutil.copytree(diffclip_run, tmp_path / "run", symlinks=True)


def test_secrets_and_links_out_of_the_run_stay_behind(run, hub, tmp_path):
    outside = tmp_path / "home"
    outside.mkdir()
    (outside / "token").write_text(SECRET)
    (run / "final" / "token.txt").write_text(SECRET)
    (run / "final" / "credentials.json").write_text(json.dumps({"token": SECRET}))
    (run / "final" / "special_tokens_map.json").symlink_to(outside / "token")  # a name the model may have
    shutil.copy(run / "figures" / "attention.png", outside / "figure.png")
    (run / "figures" / "leak.png").symlink_to(outside / "figure.png")
    publication = publish(run, "me/x", api=hub.api)
    uploaded = hub.files("me/x")
    assert not {"token.txt", "credentials.json", "special_tokens_map.json", "figures/leak.png"} & uploaded
    assert {"token.txt", "credentials.json", "special_tokens_map.json"} <= set(publication.left_out)
    for name in uploaded:
        assert SECRET.encode() not in (hub.repo("me/x") / name).read_bytes(), name


def test_a_linked_hub_staging_is_refused_and_nothing_outside_is_deleted(run, tmp_path, capsys):
    outside = tmp_path / "elsewhere" / "me--x"
    outside.mkdir(parents=True)
    (outside / "keep.txt").write_text("not the run's")
    (run / "hub-staging").symlink_to(tmp_path / "elsewhere")
    assert cli.main(["push", str(run), "me/x", "--dry-run"]) == 2
    assert "hub-staging is a link" in capsys.readouterr().err
    assert (outside / "keep.txt").read_text() == "not the run's"


def test_non_finite_weights_are_refused(run, hub):
    weights = load_file(run / "final" / "model.safetensors")
    name = next(key for key, value in weights.items() if value.is_floating_point())
    weights[name] = torch.full_like(weights[name], float("nan"))
    save_file(weights, run / "final" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UserError, match=f"non-finite weights \\({name}: NaN or inf\\)"):
        publish(run, "me/x", api=hub.api)
    assert hub.calls == []


@pytest.mark.parametrize("content", ["{", "", "[]"])
def test_a_damaged_report_is_one_line(run, hub, content, capsys):
    (run / "report.json").write_text(content)
    assert cli.main(["push", str(run), "me/x", "--dry-run"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("hf-vrl")]
    assert len(err) == 1 and "report" in err[0], err


def test_resume_auto_push_to_hub_pushes_a_finished_run(hub, hub_client, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_TOKEN", SECRET)
    out = tmp_path / "run"
    argv = ["train", "diffclip", "--output-dir", str(out), "--max-steps", "1", "--train-limit", "16"]
    argv += ["--batch-size", "8", "--eval-limit", "8", "--no-figures"]
    assert cli.main(argv) == 0
    assert cli.main([*argv, "--resume", "auto", "--push-to-hub", "--hub-model-id", "me/later"]) == 0
    assert hub.calls.count("upload_folder") == 1 and "model.safetensors" in hub.files("me/later")
