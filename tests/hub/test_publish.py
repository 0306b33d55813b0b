"""`hf_vrl.hub.publish`: exactly what goes to the Hub for each model a run exports, in one commit, and every
refusal before anything is sent. The Hub is an autospec'd `HfApi` (wrong call signatures fail)."""

from __future__ import annotations

import json
import shutil

import pytest
from huggingface_hub import ModelCard

from hf_vrl.errors import UserError
from hf_vrl.hub import publish
from hf_vrl.hub.publish import MACHINE_STATE_FILES, _clean, portable_json

PROCESSOR = {"preprocessor_config.json"}
TOKENIZER = {"tokenizer.json", "tokenizer_config.json"}
RECORD = {"README.md", "run/config.json", "run/report.json"}
CLUE_FIGURES = ("figures/part_maps.png", "figures/gradcam.png")  # Fig. 6 and Fig. 9
EXPECTED = {
    ("diffclip", "final"): {
        "config.json", "model.safetensors", "configuration_diffclip.py", "modeling_diffclip.py",
        "differential_attention.py", "figures/attention.png", "processor_config.json", *PROCESSOR, *TOKENIZER,
        *RECORD,
    },
    ("dcr", "final"): {"config.json", "model.safetensors", *PROCESSOR, *TOKENIZER, *RECORD},
    ("dcr", "vision-tower"): {"config.json", "model.safetensors", *PROCESSOR, *RECORD},
    ("dcr", "dcr-model"): {
        "config.json", "model.safetensors", "configuration_dcr.py", "modeling_dcr.py", *PROCESSOR, *RECORD,
    },
    ("dive", "final"): {"config.json", "model.safetensors", *PROCESSOR, *TOKENIZER, *RECORD},
    ("dive", "vision-tower"): {"config.json", "model.safetensors", *PROCESSOR, *RECORD},
    ("clue", "final"): {
        "config.json", "model.safetensors", "configuration_clue.py", "modeling_clue.py",
        *CLUE_FIGURES, *PROCESSOR, *RECORD,
    },
    ("clue", "backbone"): {"config.json", "model.safetensors", *CLUE_FIGURES, *PROCESSOR, *RECORD},
}  # fmt: skip
REMOTE_CODE = {("diffclip", "final"), ("dcr", "dcr-model"), ("clue", "final")}
PIPELINES = {
    ("diffclip", "final"): "zero-shot-image-classification",
    ("dcr", "final"): "zero-shot-image-classification",
    ("dcr", "vision-tower"): "image-feature-extraction",
    ("dcr", "dcr-model"): "image-feature-extraction",
    ("dive", "final"): "zero-shot-image-classification",
    ("dive", "vision-tower"): "image-feature-extraction",
    ("clue", "final"): "image-feature-extraction",
    ("clue", "backbone"): "image-feature-extraction",
}


@pytest.fixture
def runs(diffclip_run, dcr_run, dive_run, clue_run):
    return {"diffclip": diffclip_run, "dcr": dcr_run, "dive": dive_run, "clue": clue_run}


def _source(run, what, name):
    """Where a published file comes from: the model folder, its figures, or the run's image processor."""
    folder = run / "final" if what == "final" else run / "exports" / what
    if name.startswith("figures/"):
        return run / name
    return folder / name if (folder / name).is_file() else run / "final" / name


@pytest.mark.parametrize(("method", "what"), list(EXPECTED))
def test_uploads_exactly_the_model_its_processors_code_and_card_in_one_commit(runs, hub, method, what):
    run, repo = runs[method], f"me/{method}-{what}"
    publication = publish(run, repo, what=what, api=hub.api, private=True)
    assert hub.calls == ["create_repo", "file_exists", "upload_folder"]  # one commit, nothing else
    assert hub.api.create_repo.call_args.args == (repo,)
    assert hub.api.create_repo.call_args.kwargs == {
        "token": None, "private": True, "exist_ok": True, "repo_type": "model",
    }  # fmt: skip
    upload = hub.api.upload_folder.call_args.kwargs
    assert (upload["repo_id"], upload["repo_type"], upload["revision"]) == (repo, "model", None)
    assert upload["commit_message"] == f"Upload {method} model ({what}) with hf_vrl"
    assert hub.files(repo) == EXPECTED[method, what] == set(publication.files)
    assert not any(name.endswith((".bin", ".pt", ".pth", ".pkl")) for name in hub.files(repo))
    for name in EXPECTED[method, what] - RECORD:
        uploaded, source = hub.repo(repo) / name, _source(run, what, name)
        if name in MACHINE_STATE_FILES:  # the run's file without the saving machine's state
            assert json.loads(uploaded.read_text()) == _clean(json.loads(source.read_text())), name
        else:
            assert uploaded.read_bytes() == source.read_bytes(), name
    card = ModelCard.load(hub.repo(repo) / "README.md")
    assert card.data.pipeline_tag == PIPELINES[method, what] and card.data.library_name == "transformers"
    remote = "auto_map" in json.loads((hub.repo(repo) / "config.json").read_text())
    assert ("custom_code" in card.data.tags) == remote == ((method, what) in REMOTE_CODE)
    assert publication.url == "https://huggingface.co/me/" + f"{method}-{what}/commit/0123abcd"


def test_the_processor_of_an_export_without_one_is_the_runs(dcr_run, hub, tmp_path):
    """An export written without its processor (by an hf_vrl before every export carried one)."""
    run = _copy(dcr_run, tmp_path)
    (run / "exports/dcr-model/preprocessor_config.json").unlink()
    publish(run, "me/dcr-model", what="dcr-model", api=hub.api)
    uploaded = json.loads((hub.repo("me/dcr-model") / "preprocessor_config.json").read_text())
    assert uploaded == json.loads((run / "final/preprocessor_config.json").read_text())


def test_the_run_record_goes_up_without_local_paths(dcr_run, hub):
    publish(dcr_run, "me/dcr", api=hub.api)
    record = {
        name: (hub.repo("me/dcr") / "run" / name).read_text() for name in ("config.json", "report.json")
    }
    assert str(dcr_run.parent) not in "".join(record.values())
    config = json.loads(record["config.json"])
    assert config["model"]["clip"] == "…/clip" and config["dcr"]["diffusion"] == "…/sd"
    original = json.loads((dcr_run / "report.json").read_text())
    assert json.loads(record["report.json"])["after"] == original["after"]


def test_chosen_exports_go_into_subfolders_of_the_same_commit(dcr_run, hub):
    publication = publish(dcr_run, "me/dcr", api=hub.api, exports=["vision-tower", "dcr-model"])
    assert hub.calls == ["create_repo", "file_exists", "upload_folder"]
    for name in ("vision-tower", "dcr-model"):
        expected = {f"exports/{name}/{f}" for f in EXPECTED["dcr", name] - RECORD}
        assert {f for f in hub.files("me/dcr") if f.startswith(f"exports/{name}/")} == expected
    assert set(publication.files) >= EXPECTED["dcr", "final"]
    text = ModelCard.load(hub.repo("me/dcr") / "README.md").text
    assert 'CLIPVisionModel.from_pretrained("me/dcr", subfolder="exports/vision-tower")' in text
    assert (
        'AutoModel.from_pretrained("me/dcr", subfolder="exports/dcr-model", trust_remote_code=True)' in text
    )


def test_revision_and_token_reach_the_hub_calls(diffclip_run, hub):
    publish(diffclip_run, "me/x", api=hub.api, revision="v1", token="hf_x", commit_message="first")
    assert hub.calls == ["create_repo", "create_branch", "file_exists", "upload_folder"]
    assert hub.api.create_branch.call_args.kwargs == {
        "branch": "v1", "token": "hf_x", "repo_type": "model", "exist_ok": True,
    }  # fmt: skip
    upload = hub.api.upload_folder.call_args.kwargs
    assert (upload["revision"], upload["token"], upload["commit_message"]) == ("v1", "hf_x", "first")


def test_dry_run_stages_the_folder_and_makes_no_hub_call(diffclip_run, hub, tmp_path):
    publication = publish(diffclip_run, "me/x", api=hub.api, dry_run=True, staging_dir=tmp_path / "stage")
    assert hub.calls == [] and publication.commit is None and publication.staging_dir == tmp_path / "stage"
    staged = {p.relative_to(tmp_path / "stage").as_posix() for p in (tmp_path / "stage").rglob("*")}
    staged = {s for s in staged if "." in s and not s.startswith(".")}  # its marker and lock aside
    assert set(publication.files) == EXPECTED["diffclip", "final"] == staged
    assert publication.files["model.safetensors"] == (diffclip_run / "final/model.safetensors").stat().st_size
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="is not empty and is not a folder hf_vrl wrote"):
        publish(diffclip_run, "me/x", dry_run=True, staging_dir=tmp_path / "mine")
    again = publish(diffclip_run, "me/x", dry_run=True, staging_dir=tmp_path / "stage")  # its own: replaced
    assert set(again.files) == set(publication.files)
    with pytest.raises(UserError, match="staging folder is for dry runs"):
        publish(diffclip_run, "me/x", api=hub.api, staging_dir=tmp_path / "other")


def test_dry_run_default_staging_is_in_the_run_and_replaced(diffclip_run, tmp_path):
    run = _copy(diffclip_run, tmp_path)
    first = publish(run, "me/x", dry_run=True).staging_dir
    assert first == run / "hub-staging" / "me--x" and (first / "README.md").is_file()
    (first / "stale.txt").write_text("old")
    assert not (publish(run, "me/x", dry_run=True).staging_dir / "stale.txt").exists()


def test_an_hf_vrl_model_saved_without_its_code_gets_it(diffclip_run, tmp_path, hub):
    run = _copy(diffclip_run, tmp_path)
    config_file = run / "final/config.json"
    config = json.loads(config_file.read_text())
    del config["auto_map"]
    config_file.write_text(json.dumps(config))
    for name in ("configuration_diffclip.py", "modeling_diffclip.py", "differential_attention.py"):
        (run / "final" / name).unlink()
    publish(run, "me/x", api=hub.api)
    assert hub.files("me/x") == EXPECTED["diffclip", "final"]
    uploaded = json.loads((hub.repo("me/x") / "config.json").read_text())
    assert uploaded.pop("auto_map") == {
        "AutoConfig": "configuration_diffclip.DiffCLIPConfig", "AutoModel": "modeling_diffclip.DiffCLIPModel",
        "AutoModelForZeroShotImageClassification": "modeling_diffclip.DiffCLIPModel",
    }  # fmt: skip
    assert uploaded == config and json.loads(config_file.read_text()) == config  # the run is untouched
    assert "custom_code" in ModelCard.load(hub.repo("me/x") / "README.md").data.tags


def test_a_model_folder_without_a_file_its_code_imports_gets_the_code(diffclip_run, tmp_path, hub):
    """modeling_diffclip.py imports .differential_attention: a folder without that file cannot load remote."""
    run = _copy(diffclip_run, tmp_path)
    (run / "final/differential_attention.py").unlink()
    publish(run, "me/x", api=hub.api)
    assert hub.files("me/x") == EXPECTED["diffclip", "final"]
    assert not (run / "final/differential_attention.py").exists()  # the run is untouched


def test_card_metadata_overrides(dcr_run, hub):
    publish(
        dcr_run, "me/x", api=hub.api, license="mit", base_model="openai/clip-vit-base-patch16",
        datasets=["pixparse/cc3m-wds"],
    )  # fmt: skip
    data = ModelCard.load(hub.repo("me/x") / "README.md").data
    assert (data.license, data.base_model, data.datasets) == (
        "mit",
        "openai/clip-vit-base-patch16",
        ["pixparse/cc3m-wds"],
    )


def _copy(run, tmp_path):
    return shutil.copytree(run, tmp_path / "copy", ignore=shutil.ignore_patterns("checkpoints", "inputs"))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda run: (run / "final/model.safetensors").unlink(), "has no weights"),
        (
            lambda run: (run / "final/model.safetensors").rename(run / "final/pytorch_model.bin"),
            "pickled PyTorch weights only",
        ),
        (lambda run: (run / "final/config.json").unlink(), "has no config.json"),
        (lambda run: shutil.rmtree(run / "final"), "has no 'final' model; it has: none"),
        (lambda run: (run / "config.json").unlink(), "neither a run folder"),
        (lambda run: (run / "report.json").unlink(), "has no report.json"),
    ],
    ids=["no-weights", "pickle-only", "no-config", "no-final", "not-a-run", "no-report"],
)
def test_a_folder_that_cannot_be_published_is_refused_before_any_hub_call(
    diffclip_run, tmp_path, hub, damage, message
):
    run = _copy(diffclip_run, tmp_path)
    damage(run)
    with pytest.raises(UserError, match=message):
        publish(run, "me/x", api=hub.api)
    assert hub.calls == []


def test_a_shard_its_index_lists_must_be_there(diffclip_run, tmp_path, hub):
    run = _copy(diffclip_run, tmp_path)
    index = {
        "metadata": {},
        "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model.safetensors"},
    }
    (run / "final/model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(UserError, match="lacks weight shards its index lists: model-00001-of-00002"):
        publish(run, "me/x", api=hub.api)
    assert hub.calls == []


def test_files_outside_the_model_stay_behind(diffclip_run, tmp_path, hub):
    run = _copy(diffclip_run, tmp_path)
    (run / "final/training_args.bin").write_bytes(b"pickle")
    (run / "final/.hidden.json").write_text("{}")
    publication = publish(run, "me/x", api=hub.api)
    assert publication.left_out == [".hidden.json", "training_args.bin"]
    assert hub.files("me/x") == EXPECTED["diffclip", "final"]


@pytest.mark.parametrize(
    ("repo_id", "message"),
    [
        ("diffclip", "full repo id, owner/name"),
        ("me/bad id", "not a valid Hub repo id"),
        ("a/b/c", "not a valid"),
    ],
)
def test_a_bad_repo_id_is_refused(diffclip_run, hub, repo_id, message):
    with pytest.raises(UserError, match=message):
        publish(diffclip_run, repo_id, api=hub.api)
    assert hub.calls == []


def test_an_unknown_export_names_those_that_exist(dcr_run, hub):
    with pytest.raises(UserError, match="no 'llava' model; it has: final, dcr-model, vision-tower"):
        publish(dcr_run, "me/x", what="llava", api=hub.api)
    with pytest.raises(UserError, match="no 'tower' model"):
        publish(dcr_run, "me/x", exports=["tower"], api=hub.api)
    assert hub.calls == []


def test_a_foreign_auto_map_must_name_files_that_are_there(dcr_run, tmp_path, hub):
    run = _copy(dcr_run, tmp_path)
    config_file = run / "exports/vision-tower/config.json"
    config_file.write_text(
        json.dumps({**json.loads(config_file.read_text()), "auto_map": {"AutoModel": "x.Y"}})
    )
    with pytest.raises(UserError, match="auto_map names modules that are not in the folder"):
        publish(run, "me/x", what="vision-tower", api=hub.api)


def test_an_existing_card_is_replaced_only_when_asked(diffclip_run, hub):
    publish(diffclip_run, "me/x", api=hub.api)
    with pytest.raises(UserError, match="already has a model card.*--overwrite-card"):
        publish(diffclip_run, "me/x", api=hub.api)
    assert hub.calls.count("upload_folder") == 1
    publish(diffclip_run, "me/x", api=hub.api, overwrite_card=True)
    assert hub.calls.count("upload_folder") == 2


def test_staged_json_files_lose_machine_state_and_local_source_paths(tmp_path):
    source = tmp_path / "run" / "config.json"
    source.parent.mkdir()
    saved = {
        "backbone_config": {"_name_or_path": "runs/clue/inputs/backbone", "model_type": "resnet"},
        "text_config": {"_name_or_path": "openai/clip-vit-base-patch32"},
        "local_files_only": True,
    }
    source.write_text(json.dumps(saved))
    staged = tmp_path / "staged" / "config.json"
    staged.parent.mkdir()
    staged.symlink_to(source)
    portable_json(staged)
    assert not staged.is_symlink() and json.loads(source.read_text()) == saved  # the run is left alone
    assert json.loads(staged.read_text()) == {
        "backbone_config": {"_name_or_path": "", "model_type": "resnet"},
        "text_config": {"_name_or_path": "openai/clip-vit-base-patch32"},
    }
