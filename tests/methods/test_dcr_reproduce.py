"""examples/reproduce_dcr.py end to end on synthetic data in the layouts it reads, and the paper's numbers it
ships (hf_vrl.methods.dcr.paper)."""

from __future__ import annotations

import json
import re

import pytest
from reproduce_helpers import example, image_folder, mmvp_folder, retrieval_parquet, tiny_clip_folder

from hf_vrl.methods.dcr.paper import BACKBONE_PRESETS, PAPER_TABLES
from hf_vrl.paper_eval import paper_comparison
from hf_vrl.presets import preset_path


def test_the_paper_numbers_are_consistent():
    assert sorted(PAPER_TABLES) == [1, 2, 6]
    for table in PAPER_TABLES[1].values():  # Avg: the mean of the nine patterns (15 pairs each)
        for row, values in table.rows.items():
            assert abs(sum(values[:-1]) / 9 - values[-1]) <= 0.051, row
    assert PAPER_TABLES[1]["OpenAI ViT-L-14 224"].rows["Ours"][-1] == 33.3
    assert PAPER_TABLES[2]["SigLIP ViT-SO-14 224"].rows["Ours"][-3:] == (0.83, 0.76, 0.65)
    assert PAPER_TABLES[6]["unstated"].rows["Original"] == (
        76.4,
        95.6,
        60.1,
        86.6,
        55.4,
        75.5,
        87.2,
        61.1,
        97.4,
        79.2,
    )
    assert set(PAPER_TABLES[2]) <= set(PAPER_TABLES[1]) == set(BACKBONE_PRESETS)
    for preset in BACKBONE_PRESETS.values():
        assert preset_path(preset).is_file()


def test_paper_comparison_puts_models_beside_the_paper_rows():
    text = paper_comparison(
        ("a", "b"), {"Original": (1.0, 2.0), "Ours": (3.0, None)}, {"Ours": {"a": 2.5}, "x": {"b": 7}}
    )
    lines = [re.split(r"\s{2,}", line.strip()) for line in text.splitlines()]
    assert lines == [
        ["a", "b"],
        ["Original", "1.0 / -", "2.0 / -"],
        ["Ours", "3.0 / 2.5", "- / -"],
        ["x", "- / -", "- / 7.0"],
    ]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Every benchmark of the three tables as tiny synthetic sets; a tiny CLIP and a DCR export of it."""
    from hf_vrl.models.dcr import DCRModel

    root = tmp_path_factory.mktemp("data")
    for key in ("mnist", "cifar10", "eurosat", "caltech101", "dtd", "imagenet"):
        image_folder(root / key, splits=("test",))
    for key in ("flickr30k", "mscoco"):
        retrieval_parquet(root / key)
    mmvp_folder(root / "mmvp_vlm")
    models = tmp_path_factory.mktemp("models")
    clip = tiny_clip_folder(models / "clip")
    from transformers import AutoImageProcessor

    DCRModel.from_clip(str(clip), condition_dim=16, num_condition_tokens=4).save_pretrained(models / "dcr")
    AutoImageProcessor.from_pretrained(clip).save_pretrained(models / "dcr")
    return root, clip, models / "dcr"


def _rows(out: str) -> dict[str, list[str]]:
    lines = [re.split(r"\s{2,}", line.strip()) for line in out.split("paper / measured\n")[-1].splitlines()]
    return {line[0]: line[1:] for line in lines[1:] if len(line) > 2}


@pytest.mark.parametrize("table", [1, 2, 6])
def test_each_table_runs_end_to_end(setup, table, tmp_path, capsys):
    root, clip, dcr = setup
    argv = ["--table", str(table), "--data-root", str(root), "--model", f"Original={clip}"]
    argv += ["--model", f"Ours={dcr}", "--text-model", str(clip), "--output", str(tmp_path / "m.json")]
    assert example("reproduce_dcr").main(argv) == 0
    rows = _rows(capsys.readouterr().out)
    measured = json.loads((tmp_path / "m.json").read_text())["measured"]
    columns = PAPER_TABLES[table]["OpenAI ViT-L-14 224" if table != 6 else "unstated"].columns
    assert set(measured["Ours"]) == set(columns) == set(measured["Original"])
    for label in ("Original", "Ours"):
        assert len(rows[label]) == len(columns)
        assert all(re.fullmatch(r"\d+\.\d+ / \d+\.\d+", cell) for cell in rows[label]), rows[label]
    if table == 2:  # the DCR export is the same tower: the same clustering
        assert measured["Ours"] == measured["Original"]


def test_missing_data_is_one_line(setup, tmp_path, capsys):
    _, clip, _ = setup
    argv = ["--table", "2", "--data-root", str(tmp_path), "--model", str(clip)]
    assert example("reproduce_dcr").main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "mnist is missing" in err and len(err.splitlines()) == 1


def test_an_unknown_backbone_is_refused(setup, capsys):
    root, clip, _ = setup
    argv = ["--table", "1", "--data-root", str(root), "--model", str(clip), "--backbone", "ViT-Z"]
    assert example("reproduce_dcr").main(argv) == 2
    assert "--backbone 'ViT-Z': Table 1 has OpenAI ViT-L-14 224" in capsys.readouterr().err


def test_sources_name_a_benchmark_with_its_split(setup, tmp_path):
    """--source KEY=NAME[@SPLIT]: any name the registry loads (a save_to_disk folder here), split after @."""
    from datasets import DatasetDict

    from hf_vrl.paper_eval import load_benchmark

    root, _, _ = setup
    saved = tmp_path / "saved"
    mnist = load_benchmark("mnist", root, {})
    mnist.reset_format()  # the contract's decoding transform is not saved
    DatasetDict({"train": mnist}).save_to_disk(str(saved))
    dataset = load_benchmark("cifar10", None, {"cifar10": f"{saved}@train"}, limit=5)
    assert len(dataset) == 5 and dataset.features["label"].names == ["blue", "green", "red"]
