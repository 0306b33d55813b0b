"""`hf_vrl.hub.publish`: exactly what goes to the Hub for each model a run exports, in one commit, and every
refusal before anything is sent."""

from __future__ import annotations

import json
import shutil

import pytest
from huggingface_hub import ModelCard

from hf_vrl.errors import UserError
from hf_vrl.hub import publish

PROCESSOR = {"preprocessor_config.json"}
TOKENIZER = {"tokenizer.json", "tokenizer_config.json"}
EXPECTED = {
    ("diffclip", "final"): {
        "README.md", "config.json", "model.safetensors", "configuration_diffclip.py", "modeling_diffclip.py",
        "figures/attention.png", *PROCESSOR, *TOKENIZER,
    },
    ("dcr", "final"): {"README.md", "config.json", "model.safetensors", *PROCESSOR, *TOKENIZER},
    ("dcr", "vision-tower"): {"README.md", "config.json", "model.safetensors", *PROCESSOR},
    ("dcr", "dcr-model"): {
        "README.md", "config.json", "model.safetensors", "configuration_dcr.py", "modeling_dcr.py",
        *PROCESSOR,
    },
}  # fmt: skip
REMOTE_CODE = {("diffclip", "final"), ("dcr", "dcr-model")}
PIPELINES = {
    ("diffclip", "final"): "zero-shot-image-classification",
    ("dcr", "final"): "zero-shot-image-classification",
    ("dcr", "vision-tower"): "image-feature-extraction",
    ("dcr", "dcr-model"): "image-feature-extraction",
}


@pytest.fixture
def runs(diffclip_run, dcr_run):
    return {"diffclip": diffclip_run, "dcr": dcr_run}


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
    assert hub.calls == ["file_exists", "create_repo", "upload_folder"]  # one commit, nothing else
    assert hub.api.create_repo.call_args.kwargs == {"private": True, "exist_ok": True, "repo_type": "model"}
    assert hub.files(repo) == EXPECTED[method, what] == set(publication.files)
    for name in EXPECTED[method, what] - {"README.md"}:
        assert (hub.repo(repo) / name).read_bytes() == _source(run, what, name).read_bytes(), name
    card = ModelCard.load(hub.repo(repo) / "README.md")
    assert card.data.pipeline_tag == PIPELINES[method, what] and card.data.library_name == "transformers"
    remote = "auto_map" in json.loads((hub.repo(repo) / "config.json").read_text())
    assert ("custom_code" in card.data.tags) == remote == ((method, what) in REMOTE_CODE)
    assert publication.url == "https://huggingface.co/me/" + f"{method}-{what}/commit/0123abcd"


def test_the_processor_of_an_export_without_one_is_the_runs(dcr_run, hub):
    assert not (dcr_run / "exports/dcr-model/preprocessor_config.json").exists()
    publish(dcr_run, "me/dcr-model", what="dcr-model", api=hub.api)
    uploaded = json.loads((hub.repo("me/dcr-model") / "preprocessor_config.json").read_text())
    assert uploaded == json.loads((dcr_run / "final/preprocessor_config.json").read_text())


def test_dry_run_makes_no_hub_call(diffclip_run, hub):
    publication = publish(diffclip_run, "me/x", api=hub.api, dry_run=True)
    assert hub.calls == [] and publication.commit is None
    assert set(publication.files) == EXPECTED["diffclip", "final"]
    assert publication.files["model.safetensors"] == (diffclip_run / "final/model.safetensors").stat().st_size


def test_an_existing_card_is_kept_unless_overwrite_card(diffclip_run, make_hub):
    hub = make_hub(existing_card=True)
    with pytest.raises(UserError, match="already has a model card.*--overwrite-card"):
        publish(diffclip_run, "me/x", api=hub.api)
    assert hub.calls == ["file_exists"]  # nothing created, nothing uploaded
    publish(diffclip_run, "me/x", api=hub.api, overwrite_card=True)
    assert hub.calls == ["file_exists", "create_repo", "upload_folder"] and "README.md" in hub.files("me/x")


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
        (lambda run: (run / "final/modeling_diffclip.py").unlink(), "auto_map names modeling_diffclip.py"),
        (lambda run: shutil.rmtree(run / "final"), "has no 'final' model; it has: none"),
        (lambda run: (run / "config.json").unlink(), "not a run folder"),
        (lambda run: (run / "report.json").unlink(), "has no report.json"),
    ],
    ids=["no-weights", "pickle-only", "no-config", "no-remote-code", "no-final", "not-a-run", "no-report"],
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
