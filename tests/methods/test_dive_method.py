"""`hf-vrl train dive` on the shared run design: a tiny run end to end (layout, report, final/ and exports
reload as plain transformers models, the frozen model and m in the checkpoint), WiSE-FT, configuration
errors."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel, CLIPVisionModel

import hf_vrl
from hf_vrl.errors import UserError
from hf_vrl.methods.dive.method import DiVERunConfig, run_report_section
from hf_vrl.presets import load_preset
from hf_vrl.run.config import resolve

# dive-tiny shrunk: a few pre-training steps on small sets, 4 fine-tuning steps of batch 8
TINY = dict(
    pretrain_steps=3,
    pretrain_data={"fashion_mnist": 32, "digits": 32, "shapes": 32},
    pretrain_batch_size=16,
    train_limit=120,
    batch_size=8,
    max_steps=4,
    warmup_steps=1,
    save_steps=2,
    logging_steps=1,
    eval_limit=40,
    reference_limit=24,
    val_size=8,
    rsa_limit=12,
    zero_shot_datasets=["shapes"],
    rsa_dataset="shapes",
    reference_dataset=["digits", "shapes"],
)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("dive") / "run"
    report = hf_vrl.train("dive", output_dir=str(out), wise_ft=True, **TINY)
    return out, report


def test_the_common_layout_and_report(run):
    out, report = run
    assert json.loads((out / "report.json").read_text()) == report
    assert report["method"] == "dive" and report["train"]["steps"] == 4
    for stage in ("before", "after"):
        section = report[stage]
        assert set(section) == {"zero_shot", "ood", "transfer", "rsa"}
        assert set(section["ood"]) == {"top1", "inverted", "blurred", "recoloured", "data"}
        assert set(section["transfer"]) == {"top1", "held-out classes", "shapes", "data"}
        assert 0.0 <= section["zero_shot"]["top1"] <= 1.0
    # each number's data: the ID classes of the evaluation rows, the shifts of those, the held-out classes,
    # the named sets, RSA's own set and limit
    after, fashion = report["after"], {"dataset": "fashion_mnist", "split": "test", "limit": 40, "seed": 0}
    fashion |= {"drawn": "seeded subset", "texts": "templates"}  # a seeded subset; captions hf_vrl wrote
    classes = ["t-shirt/top", "pullover", "dress", "coat", "shirt"]
    assert after["zero_shot"]["data"] == {**fashion, "classes": classes, "n_samples": 20}
    for shift in ("inverted", "blurred", "recoloured"):
        assert after["ood"]["data"][shift] == {**after["zero_shot"]["data"], "transform": shift}
    held_out = after["transfer"]["data"]["held-out classes"]
    assert held_out["classes"] == ["trouser", "sandal", "sneaker", "bag", "ankle boot"]
    shapes = {"dataset": "shapes", "split": "test", "seed": 0, "drawn": "generated", "texts": "generated"}
    assert after["transfer"]["data"]["shapes"] == {**shapes, "limit": 40, "n_samples": 40}
    assert after["rsa"]["data"] == {**shapes, "limit": 12, "n_samples": 12}
    rsa = {key: report["before"]["rsa"][key] for key in ("image", "text")}
    assert rsa == pytest.approx({"image": 1.0, "text": 1.0})  # the model against itself
    assert report["after"]["rsa"]["image"] < 1.0  # training moved it
    assert set(report["outputs"]) == {"final", "vision_tower", "wise_ft"}


def test_final_and_exports_load_as_plain_transformers_models(run, device):
    out, _ = run
    model = CLIPModel.from_pretrained(out / "final")
    AutoImageProcessor.from_pretrained(out / "final"), AutoTokenizer.from_pretrained(out / "final")
    tower = CLIPVisionModel.from_pretrained(out / "exports/vision-tower").to(device)
    pixels = torch.rand(2, 3, 16, 16, device=device)
    expected = model.to(device).vision_model(pixel_values=pixels).pooler_output
    torch.testing.assert_close(tower(pixel_values=pixels).pooler_output, expected)
    wise = json.loads((out / "exports/wise-ft/wise_ft.json").read_text())
    assert wise["alpha"] in wise["validation_top1"] or str(wise["alpha"]) in wise["validation_top1"]
    assert set(wise["evaluation"]) == {"zero_shot", "ood", "transfer", "rsa"}
    CLIPModel.from_pretrained(out / "exports/wise-ft")


def test_the_checkpoint_holds_m_the_reference_position_and_the_frozen_fingerprint(run):
    out, _ = run
    state = load_file(out / "checkpoints/train/checkpoint-4/extra_state.safetensors")
    assert int(state["reference_batches"]) == 4
    assert state["avg_vector"].shape == (64,) and state["avg_vector"].norm() > 0
    assert "pretrained_fingerprint" in state


def test_the_frozen_model_is_the_pretrained_one_never_saved(run):
    out, _ = run
    pretrained = load_file(out / "inputs/pretrained/model.safetensors")
    final = load_file(out / "final/model.safetensors")
    assert final.keys() == pretrained.keys()  # no second (frozen) copy in the saved model
    assert any(not torch.equal(final[key], pretrained[key]) for key in final)


def test_report_section_names():
    report = {
        "id": {"zero_shot.top1": 0.5},
        "ood": {"a": {"zero_shot.top1": 0.2}, "b": {"zero_shot.top1": 0.4}},
        "transfer": {},
        "rsa": {"rsa.image": 0.9, "rsa.text": 0.8},
        "summary": {"id.top1": 0.5, "ood.top1": 0.3, "transfer.top1": None},
    }
    assert run_report_section(report) == {
        "zero_shot": {"top1": 0.5},
        "ood": {"top1": 0.3, "a": 0.2, "b": 0.4},
        "rsa": {"image": 0.9, "text": 0.8},
    }


def preset(**dive):
    values = load_preset("dive-tiny")
    values["dive"] = values["dive"] | dive
    return values


@pytest.mark.parametrize(
    ("dive", "message"),
    [
        ({"objective": "lwf"}, "dive.objective: expected one of"),
        ({"alpha": 1.5}, r"dive.alpha: must lie in \[0, 1\]"),
        ({"reference_dataset": None}, "needs a reference image-caption set"),
        ({"wise_ft": True, "val_size": 0}, "set dive.val_size"),
        ({"held_out_classes": [0, 1]}, "overlap"),
        ({"ood_shifts": ["rotated"]}, "unknown shift"),
        ({"templates": ["a photo"]}, "exactly one"),
    ],
)
def test_configuration_mistakes_are_user_errors(dive, message):
    with pytest.raises(UserError, match=message):
        resolve(DiVERunConfig, preset(**dive))


def test_every_problem_is_reported_at_once():
    values = preset(alpha=2.0, objective="x")
    values["optim"] = values["optim"] | {"batch_size": 0}
    with pytest.raises(UserError, match="3 problem") as error:
        resolve(DiVERunConfig, values)
    assert "dive.alpha" in str(error.value) and "optim.batch_size" in str(error.value)


def test_a_validation_set_larger_than_the_data_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="lower --val-size"):
        hf_vrl.train("dive", output_dir=str(tmp_path), **(TINY | {"val_size": 200, "eval_before": False}))


def test_flyp_needs_no_reference_set():
    config = resolve(DiVERunConfig, preset(objective="flyp", reference_dataset=None))
    assert not config.dive.uses_reference


def test_the_vision_tower_export_is_in_the_layout_every_supported_transformers_reads(run):
    """Keys under `vision_model.`, as transformers 4.x and 5.0 read a CLIPVisionModel (5.17 and later save it
    without: loaded there, the tower would be random); tests/hub/test_load_back.py loads it on each
    release."""
    from safetensors import safe_open
    from transformers import CLIPVisionModel

    out, _ = run
    folder = out / "exports" / "vision-tower"
    with safe_open(folder / "model.safetensors", "pt") as weights:
        assert all(key.startswith("vision_model.") for key in weights.keys())
    _, info = CLIPVisionModel.from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
