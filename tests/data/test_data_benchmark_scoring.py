"""Benchmarks scored as published: ObjectNet on all 113 mapped classes, counts checked before `hf-vrl eval`
loads a model (refused in one line, or scored with --allow-partial and recorded), class names from the
registry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from hf_vrl import eval_command
from hf_vrl.data.imagenet_classes import OBJECTNET_FOLDER_TO_IMAGENET
from hf_vrl.eval_inputs import load_counted_dataset, load_eval_dataset
from hf_vrl.evaluation import evaluate_clip


def _image(path: Path, colour=(90, 120, 30)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (10, 10), colour).save(path)


@pytest.fixture(scope="module")
def objectnet(tmp_path_factory) -> Path:
    """objectnet-1.0/images/<folder>/: one image in each of the 113 mapped folders, one in an unmapped one."""
    root = tmp_path_factory.mktemp("objectnet")
    for i, folder in enumerate(sorted(OBJECTNET_FOLDER_TO_IMAGENET)):
        _image(root / "objectnet-1.0" / "images" / folder / f"{i:04x}.png", (i, 2 * i, 255 - i))
    _image(root / "objectnet-1.0" / "images" / "squeegee" / "ffff.png")
    return root


def _zero_shot(tiny_clip: Path, dataset, name: str) -> dict:
    from hf_vrl.eval_inputs import load_model_and_processors

    model, processor, tokenizer = load_model_and_processors(str(tiny_clip))
    report = evaluate_clip(
        model,
        processor,
        tokenizer,
        dataset,
        tasks=["zero_shot"],
        templates=["a photo of a {}."],
        dataset_name=name,
    )
    return report["zero_shot"]


def test_objectnet_scores_all_113_mapped_classes(tiny_clip, objectnet):
    """As published (the registry) and as a plain image folder, whose loader turns "alarm_clock" into "alarm
    clock": every mapped folder is scored (51 of them used to drop out with label -1)."""
    dataset, counts = load_counted_dataset(f"objectnet:{objectnet}", split="test", allow_partial=True)
    assert (counts["images"], counts["classes"], counts["official_classes"]) == (113, 113, 113)
    report = _zero_shot(tiny_clip, dataset, f"objectnet:{objectnet}")
    assert report["class_names"] == "openai:objectnet" and "n_scored" not in report  # all 113 images
    folder = f"imagefolder:{objectnet / 'objectnet-1.0' / 'images'}"
    plain = load_eval_dataset(folder, split="train")
    assert "alarm clock" in plain.features["label"].names and len(plain) == 114
    report = _zero_shot(tiny_clip, plain, "objectnet")
    assert report["n_scored"] == 113  # only the unmapped folder's image is left out


def _imagenet_r(root: Path) -> Path:
    from hf_vrl.data.imagenet_classes import IMAGENET_R_WNIDS

    for wnid in IMAGENET_R_WNIDS[:5]:
        _image(root / "imagenet-r" / wnid / "art_0.jpg")
    return root


def test_eval_refuses_a_partial_copy_in_one_line_before_loading_the_model(tiny_clip, tmp_path, capsys):
    from hf_vrl import cli

    root = _imagenet_r(tmp_path / "data")
    argv = ["eval", "--model", str(tiny_clip), "--dataset", f"imagenet-r:{root}", "--tasks", "zero_shot"]
    assert cli.main([*argv, "--output-dir", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err.splitlines()
    assert error[0].startswith("hf-vrl: error: ImageNet-R test at imagenet-r:")
    assert (
        "5 of 30,000 images, 5 of 200 classes (missing n01518878, " in error[0]
        and "--allow-partial" in error[0]
    )
    assert not (tmp_path / "out").exists()


def test_eval_scores_a_partial_copy_over_every_class_with_its_counts(tiny_clip, tmp_path, capsys):
    root = _imagenet_r(tmp_path / "data")
    out = tmp_path / "out"
    argv = ["--model", str(tiny_clip), "--dataset", f"imagenet-r:{root}", "--tasks", "zero_shot"]
    argv += ["--templates", "caltech101", "--allow-partial", "--output-dir", str(out), "--no-figures"]
    assert eval_command.main(argv) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["partial"] is True
    assert report["counts"]["test"]["described"] == "5 of 30,000 images, 5 of 200 classes"
    assert (
        report["counts"]["test"]["complete"] is False
        and len(report["counts"]["test"]["missing_classes"]) == 195
    )
    assert report["zero_shot"]["class_names"] == "openai:imagenet-r"
    assert report["n_classes"] == 5  # the images' classes; the classifier holds all 200 (below)
    assert "PARTIAL test: 5 of 30,000 images, 5 of 200 classes" in capsys.readouterr().out
    dataset, _ = load_counted_dataset(f"imagenet-r:{root}", split="test", allow_partial=True)
    assert dataset.features["label"].num_classes == 200


def test_transfer_sets_are_prompted_with_openais_names(tiny_clip, tmp_path):
    for folder in ("AnnualCrop", "SeaLake"):
        _image(tmp_path / "eurosat" / "test" / folder / "1.jpg")
    dataset, counts = load_counted_dataset(
        f"eurosat:{tmp_path / 'eurosat'}", split="test", allow_partial=True
    )
    assert counts["images"] == 2 and counts["official_images"] == 27_000  # clip_benchmark's: the whole set
    report = _zero_shot(tiny_clip, dataset, f"eurosat:{tmp_path / 'eurosat'}")
    assert report["class_names"] == "openai:eurosat"
    # the same folder without the key is a user's own data, though its path is named eurosat (issue 34)
    user, record = load_counted_dataset(f"imagefolder:{tmp_path / 'eurosat'}", split="test")
    assert user.features["label"].names == ["annualcrop", "sealake"] and record is None  # folder names
    assert _zero_shot(tiny_clip, user, f"imagefolder:{tmp_path / 'eurosat'}")["class_names"] == "dataset"


def test_iwildcam_is_prompted_as_flyp_does(tiny_clip, tmp_path):
    """Labelled by WILDS' scientific names (FLYP's English ones repeat), prompted with FLYP's English names
    and templates."""
    from hf_vrl.data.benchmarks import openai_class_names

    root = tmp_path / "iwildcam_v2.0"
    root.mkdir()
    (root / "metadata.csv").write_text(
        "split,filename,y,location_remapped\nid_test,a.jpg,2,4\nid_test,b.jpg,1,4\n"
    )
    for name in ("a.jpg", "b.jpg"):
        _image(root / "train" / name)
    dataset, counts = load_counted_dataset(f"iwildcam:{tmp_path}", split="id_test", allow_partial=True)
    assert counts["described"] == "2 of 8,154 images"
    names = dataset.features["label"].names
    assert openai_class_names(f"iwildcam:{tmp_path}", names)[1:3] == [
        "white-lipped peccary",
        "central american agouti",
    ]
    report = _zero_shot(tiny_clip, dataset, f"iwildcam:{tmp_path}")
    assert report["class_names"] == "flyp:iwildcam"
