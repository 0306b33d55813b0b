"""Table 4's metrics in DiVE's evaluation and run report: macro F1 (iWildCam), worst-region accuracy (FMoW),
equal to `hf_vrl.metrics`' functions on the same predictions; reproduce_dive.py reads them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoConfig, CLIPModel

from hf_vrl.data.toy import shapes_dataset
from hf_vrl.evaluation import encode_images
from hf_vrl.methods.diffclip.build import load_processors
from hf_vrl.methods.dive.evaluate import ClassifySettings, evaluate_dive, text_classifier
from hf_vrl.methods.dive.method import DiVERunConfig, run_report_section
from hf_vrl.methods.dive.shifts import shift_dataset
from hf_vrl.metrics import macro_f1, worst_group_accuracy
from hf_vrl.presets import preset_path
from hf_vrl.run.parser import parse_run_args

TEMPLATES = ["a photo of a {}.", "a drawing of a {}."]
REGIONS = ("Asia", "Europe", "Africa", "Other")


def with_regions(data):
    return data.add_column("region", [REGIONS[i % len(REGIONS)] for i in range(len(data))])


def plain_predictions(clip, image_processor, tokenizer, data) -> np.ndarray:
    """argmax of normalize(image) @ the zero-shot classifier, written out."""
    image = F.normalize(encode_images(clip, image_processor, data["image"]), dim=-1)
    weights = text_classifier(clip, tokenizer, data.features["label"].names, TEMPLATES)
    return (image @ weights).argmax(dim=1).numpy()


def test_the_report_holds_macro_f1_and_worst_region_accuracy():
    image_processor, tokenizer = load_processors("tiny-clip", "tiny-clip")
    torch.manual_seed(0)
    clip = CLIPModel(AutoConfig.from_pretrained(preset_path("tiny-clip"))).eval()
    data = with_regions(shapes_dataset(40, seed=3, image_size=32))
    ood = {"inverted": shift_dataset(data, "inverted"), "no regions": data.remove_columns("region")}
    report = evaluate_dive(
        clip, image_processor, tokenizer, id_dataset=data, ood_datasets=ood, templates=TEMPLATES,
        settings=ClassifySettings(macro_f1=True),
    )  # fmt: skip
    expected = {}
    for name, dataset in {"id": data, **ood}.items():
        labels = np.asarray(dataset["label"])
        predicted = plain_predictions(clip, image_processor, tokenizer, dataset)
        expected[name] = {"zero_shot.top1": float(np.mean(predicted == labels))}
        expected[name]["zero_shot.macro_f1"] = macro_f1(labels, predicted)
        if "region" in dataset.column_names:
            worst = worst_group_accuracy(labels, predicted, dataset["region"], exclude=("Other",))
            expected[name]["zero_shot.worst_group"] = worst["worst"]
    measured = {"id": report["id"], **report["ood"]}
    for name, metrics in expected.items():
        assert {key: measured[name][key] for key in metrics} == pytest.approx(metrics), name
    assert "zero_shot.worst_group" not in report["ood"]["no regions"]

    section = run_report_section(report)
    assert section["zero_shot"] == {
        "top1": expected["id"]["zero_shot.top1"],
        "macro_f1": expected["id"]["zero_shot.macro_f1"],
        "worst_group": expected["id"]["zero_shot.worst_group"],
    }
    f1 = [expected[name]["zero_shot.macro_f1"] for name in ood]
    assert section["ood"]["macro_f1"] == pytest.approx(np.mean(f1))
    assert (
        section["ood"]["worst_group"] == expected["inverted"]["zero_shot.worst_group"]
    )  # the one with regions
    assert section["ood"]["inverted.worst_group"] == expected["inverted"]["zero_shot.worst_group"]

    plain = evaluate_dive(clip, image_processor, tokenizer, id_dataset=data.remove_columns("region"))
    assert set(plain["id"]) == {"zero_shot.top1", "zero_shot.top5", "zero_shot.mean_per_class_recall"}


def example():
    path = Path(__file__).parents[2] / "examples" / "reproduce_dive.py"
    spec = importlib.util.spec_from_file_location("reproduce_dive", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_table_4_reads_the_papers_metrics(tmp_path):
    (_, iwildcam, iwildcam_cells), (_, fmow, fmow_cells) = example().targets(4, tmp_path)
    assert iwildcam_cells["iWildCam ID"] == ("zero_shot", "macro_f1")
    assert iwildcam_cells["iWildCam OOD"] == ("ood", "macro_f1")
    assert fmow_cells["FMoW ID"] == ("zero_shot", "top1") and fmow_cells["FMoW OOD"] == ("ood", "worst_group")
    assert parse_run_args(DiVERunConfig, [*iwildcam, "--objective", "dive"]).config.dive.macro_f1
    fmow_config = parse_run_args(DiVERunConfig, [*fmow, "--objective", "dive"]).config.dive
    assert fmow_config.group_column == "region" and fmow_config.group_exclude == ["Other"]
    (_, toy, toy_cells), *_ = example().targets(4, example().EMBEDDED)
    assert toy_cells["iWildCam ID"] == ("zero_shot", "macro_f1")
    assert parse_run_args(DiVERunConfig, [*toy, "--objective", "flyp"]).config.dive.macro_f1
