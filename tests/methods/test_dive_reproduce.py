"""examples/reproduce_dive.py and the paper's numbers it ships (hf_vrl.methods.dive.paper)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from hf_vrl.methods.dive.method import DiVERunConfig
from hf_vrl.methods.dive.paper import PAPER_TABLES, ROW_OBJECTIVES, comparison_table, paired_tests
from hf_vrl.run.parser import parse_run_args

EXAMPLE = Path(__file__).parents[2] / "examples" / "reproduce_dive.py"


def example():
    spec = importlib.util.spec_from_file_location("reproduce_dive", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_paper_numbers_are_consistent():
    assert sorted(PAPER_TABLES) == [2, 3, 4, 8]
    for number, first in ((2, 1), (3, 0)):  # the printed averages are the means of the printed cells
        for row, values in PAPER_TABLES[number].rows.items():
            cells = values[first:-1]
            assert abs(sum(cells) / len(cells) - values[-1]) <= 0.051, (number, row)
    assert PAPER_TABLES[2].rows["DiVE"][0] == 82.5 and PAPER_TABLES[8].rows["Pre-trained"][0] == 75.2
    assert PAPER_TABLES[4].rows["DiVE"] == (53.1, 37.2, 65.3, 69.9, 42.3, 65.1)
    assert all(row in ROW_OBJECTIVES for table in PAPER_TABLES.values() for row in table.rows)


def test_comparison_table_puts_measured_beside_the_paper():
    text = comparison_table(PAPER_TABLES[8], {"DiVE": {"ID": 80.04, "OOD avg.": None}})
    lines = [re.split(r"\s{2,}", line.strip()) for line in text.splitlines()]
    assert lines[0] == ["ID", "OOD avg.", "ZS avg."]
    assert ["DiVE", "86.1 / 80.0", "74.5 / -", "70.1 / -"] in lines
    assert ["FLYP", "86.0 / -", "71.5 / -", "55.4 / -"] in lines


def test_seeds_show_as_mean_and_std_and_dive_is_tested_against_each_row():
    measured = {"DiVE": {"ID": [80.0, 82.0, 84.0]}, "FLYP": {"ID": [79.0, 80.0, 83.0]}, "SnD": {"ID": [80.0]}}
    lines = [
        re.split(r"\s{2,}", line.strip()) for line in comparison_table(PAPER_TABLES[8], measured).splitlines()
    ]
    assert ["DiVE", "86.1 / 82.0 ± 2.0", "74.5 / -", "70.1 / -"] in lines  # sample std over seeds
    assert ["SnD", "86.0 / 80.0", "73.2 / -", "61.2 / -"] in lines  # one seed: the value alone
    tests = [
        re.split(r"\s{2,}", line.strip()) for line in paired_tests(PAPER_TABLES[8], measured).splitlines()
    ]
    # differences 1, 2, 1: mean 1.333, sd 0.577, t = 4.0 on 2 degrees of freedom, two-sided p = 0.0572
    assert tests[1] == ["FLYP", "+1.3 (p 0.057)", "-", "-"]
    assert tests[2] == ["SnD", "-", "-", "-"]  # one seed against three: nothing to pair


def test_table_2_runs_resolve_to_the_paper_setting(tmp_path):
    (name, options, cells), *_ = example().targets(2, tmp_path)
    config = parse_run_args(DiVERunConfig, [*options, "--objective", "flyp"]).config
    assert config.data.dataset == f"imagefolder:{tmp_path / 'imagenet'}"
    assert config.eval.eval_dataset == config.data.dataset and config.eval.eval_split == "test"
    assert config.dive.ood_datasets == [f"imagefolder:{tmp_path / n}" for n in example().OOD_FOLDERS.values()]
    assert len(config.dive.zero_shot_datasets) == 10 and config.optim.global_batch_size == 512
    assert cells["ImageNet-R"] == ("ood", f"imagefolder:{tmp_path / 'imagenet-r'}")
    assert set(cells) == set(PAPER_TABLES[2].columns)
    iwildcam, fmow = example().targets(4, tmp_path)
    assert parse_run_args(DiVERunConfig, [*fmow[1], "--objective", "dive"]).config.optim.learning_rate == 3e-5


# dive-tiny shrunk, as in test_dive_example
TINY = [
    "--pretrain-steps", "2", "--pretrain-data", '{"fashion_mnist": 32, "shapes": 32}',
    "--pretrain-batch-size", "16", "--train-limit", "80", "--batch-size", "8", "--max-steps", "2",
    "--warmup-steps", "1", "--save-steps", "2", "--eval-limit", "30", "--reference-dataset", "shapes",
    "--reference-limit", "16", "--val-size", "8", "--rsa-limit", "8", "--zero-shot-datasets", "shapes",
    "--rsa-dataset", "shapes",
]  # fmt: skip


@pytest.mark.slow
def test_reproduce_end_to_end_on_the_embedded_data(tmp_path, capsys):
    argv = [
        "--data-root",
        "embedded",
        "--table",
        "8",
        "--output-dir",
        str(tmp_path),
        "--objectives",
        "flyp",
        "dive",
    ]
    assert example().run([*argv, *TINY]) == 0
    out = capsys.readouterr().out.split("paper / measured, percent:\n")[-1]
    lines = {
        parts[0]: parts[1:] for parts in (re.split(r"\s{2,}", line.strip()) for line in out.splitlines()[1:])
    }
    for row in ("Pre-trained", "FLYP", "DiVE"):
        assert all(re.fullmatch(r"\d+\.\d / \d+\.\d", cell) for cell in lines[row]), lines[row]
    assert all(cell.endswith("/ -") for cell in lines["SnD"])
    assert lines["DiVE"][0].startswith("86.1 / ")


def test_the_cross_entropy_rows_are_trained():
    assert ROW_OBJECTIVES["Vanilla FT"] == "ft" and ROW_OBJECTIVES["LP-FT"] == "lp_ft"
    with pytest.raises(SystemExit):  # ARF is the one row without an objective
        example().run(["--data-root", "embedded", "--table", "2", "--objectives", "arf"])


@pytest.mark.slow
def test_reproduce_table_4_with_the_cross_entropy_baselines(tmp_path, capsys):
    argv = [
        "--data-root",
        "embedded",
        "--table",
        "4",
        "--output-dir",
        str(tmp_path),
        "--objectives",
        "ft",
        "lp_ft",
    ]
    assert example().run([*argv, *TINY]) == 0
    out = capsys.readouterr().out.split("paper / measured, percent:\n")[-1]
    lines = {
        parts[0]: parts[1:] for parts in (re.split(r"\s{2,}", line.strip()) for line in out.splitlines()[1:])
    }
    for row in ("Pre-trained", "Vanilla FT", "LP-FT"):
        iwildcam, fmow = lines[row][:3], lines[row][3:]
        assert all(re.fullmatch(r"\d+\.\d / \d+\.\d", cell) for cell in iwildcam), lines[row]
        assert all(cell.endswith("/ -") for cell in fmow), lines[row]  # no regions in the toy world
    assert all(cell.endswith("/ -") for cell in lines["DiVE"])
    report = json.loads((tmp_path / "embedded/seed0/lp_ft/report.json").read_text())
    assert set(report["train"]["stages"]) == {"linear_probe", "train"}
    assert {"top1", "macro_f1"} <= set(report["after"]["zero_shot"])
