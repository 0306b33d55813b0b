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
    assert config.data.dataset == f"imagenet:{tmp_path / 'imagenet'}"  # the registry's names, no path pattern
    assert config.eval.eval_dataset == config.data.dataset and config.eval.eval_split == "test"
    assert config.dive.ood_datasets == [f"{key}:{tmp_path / key}" for key in example().OOD_KEYS.values()]
    assert config.dive.reference_dataset == [f"cc3m:{tmp_path / 'cc3m'}"]
    zero_shot = config.dive.zero_shot_datasets
    assert len(zero_shot) == 10 and f"fgvc_aircraft:{tmp_path / 'aircraft'}" in zero_shot
    assert config.optim.global_batch_size == 512
    assert cells["ImageNet-R"] == ("ood", f"imagenet-r:{tmp_path / 'imagenet-r'}")
    assert set(cells) == set(PAPER_TABLES[2].columns)
    iwildcam, fmow = example().targets(4, tmp_path)
    config = parse_run_args(DiVERunConfig, [*fmow[1], "--objective", "dive"]).config
    assert config.optim.learning_rate == 3e-5 and config.eval.eval_split == "id_test"
    assert config.dive.ood_splits == {f"fmow:{tmp_path / 'fmow'}": "test"}


@pytest.fixture
def table2_data(tmp_path):
    """Every set Table 2's runs read, as a tiny copy of its official layout (each partial)."""
    from reproduce_helpers import (
        aircraft_archive,
        cc3m_shards,
        class_folders,
        imagenet_shift,
        imagenet_val,
        objectnet,
    )

    root = tmp_path / "data"
    imagenet_val(root / "imagenet")
    for key in ("imagenet-v2", "imagenet-a", "imagenet-r", "imagenet-sketch"):
        imagenet_shift(root / key, key)
    objectnet(root / "objectnet")
    for key in ("caltech101", "flowers", "food101", "sun397", "dtd", "pets", "eurosat", "ucf101", "cars"):
        class_folders(root / key, key)
    aircraft_archive(root / "aircraft")
    cc3m_shards(root / "cc3m")
    return root


def test_every_evaluation_set_is_counted_before_any_run(table2_data, capsys):
    """Without --allow-partial the first partial set stops the table in one line, before training; with it
    the sets' counts are recorded and their columns marked."""
    module = example()
    assert module.main(["--data-root", str(table2_data), "--table", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: Caltech-101 test at caltech101:")
    assert "--allow-partial" in err
    counts, marked = module.check_data(2, table2_data, allow_partial=True)
    assert counts["imagenet/test"]["described"] == "12 of 50,000 images, 3 of 1,000 classes"
    assert counts["objectnet/test"]["described"] == "6 of 18,574 images, 3 of 113 classes"
    assert counts["fgvc_aircraft/test"]["described"] == "18 of 3,333 images, 3 of 100 classes"
    assert set(marked) == set(PAPER_TABLES[2].columns)
    assert not (table2_data.parent / "runs").exists()


def test_a_missing_set_is_one_line_naming_the_expected_layout(tmp_path, capsys):
    assert example().main(["--data-root", str(tmp_path), "--table", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "the reference set (cc3m/) cc3m:" in err


def test_help_lists_the_layouts(capsys):
    with pytest.raises(SystemExit):
        example().main(["--help"])
    text = capsys.readouterr().out
    assert "fmow: WILDS' fmow_v1.1/" in text and "objectnet: objectnet-1.0/images/" in text
    assert "cc3m: img2dataset's output folder" in text


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
    out = capsys.readouterr().out
    assert "Table 8 (CLIP ViT-L/14" not in out  # no paper title, no paper number beside the toy world's
    assert "preset: dive-tiny" in out and "overrides: --pretrain-steps 2" in out
    lines = {
        parts[0]: parts[1:]
        for parts in (
            re.split(r"\s{2,}", line.strip()) for line in out.split("measured, percent:\n")[-1].splitlines()
        )
    }
    for row in ("Pre-trained", "FLYP", "DiVE"):
        assert all(re.fullmatch(r"- / \d+\.\d", cell) for cell in lines[row]), lines[row]
    assert "SnD" not in lines
    assert example().run([*argv, *TINY]) == 0  # the finished runs are read back, not trained again
    assert "no step" not in capsys.readouterr().err


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
    out = capsys.readouterr().out.split("measured, percent:\n")[-1]
    lines = {
        parts[0]: parts[1:] for parts in (re.split(r"\s{2,}", line.strip()) for line in out.splitlines()[1:])
    }
    for row in ("Pre-trained", "Vanilla FT", "LP-FT"):
        iwildcam, fmow = lines[row][:3], lines[row][3:]
        assert all(re.fullmatch(r"- / \d+\.\d", cell) for cell in iwildcam), lines[row]
        assert all(cell == "- / -" for cell in fmow), lines[row]  # no regions in the toy world
    assert "DiVE" not in lines
    report = json.loads((tmp_path / "embedded/seed0/lp_ft/report.json").read_text())
    assert set(report["train"]["stages"]) == {"linear_probe", "train"}
    assert {"top1", "macro_f1"} <= set(report["after"]["zero_shot"])


def test_without_a_data_root_each_set_is_read_from_its_hub_mirror(tmp_path, monkeypatch, capsys):
    """Nothing on disk: ImageNet trains from timm's shards, its evaluation sets and the transfer sets come
    from clip_benchmark's mirrors, CC3M from pixparse's; UCF-101 (no mirror) is left out and named; Table 4
    (WILDS) needs --data-root in one line. The cache's repos are read in order before any run."""
    from reproduce_helpers import hub_fixtures

    module = example()
    (name, options, cells), *_ = module.targets(3, None)
    config = parse_run_args(DiVERunConfig, [*options, "--objective", "dive"]).config
    assert config.data.dataset == "imagenet:hf:timm/imagenet-1k-wds"
    assert config.eval.eval_dataset == "imagenet:hf:clip-benchmark/wds_imagenet1k"
    assert config.dive.reference_dataset == ["cc3m:hf:pixparse/cc3m-wds"]
    assert "imagenet-r:hf:clip-benchmark/wds_imagenet-r" in config.dive.ood_datasets
    zero_shot = config.dive.zero_shot_datasets
    assert len(zero_shot) == 9 and "stanford_cars:hf:clip-benchmark/wds_cars" in zero_shot
    assert "UCF" not in cells and module.without_mirror(3, None) == ["UCF (ucf101)"]
    assert module.without_mirror(3, tmp_path) == [] and module.without_mirror(2, None) == []
    hub = hub_fixtures()
    cache = hub.offline_hub_cache(tmp_path, monkeypatch)
    monkeypatch.chdir(tmp_path)
    for repo, files in (
        ("pixparse/cc3m-wds", hub.cc3m_wds_files([4], [2])),
        ("timm/imagenet-1k-wds", hub.imagenet_wds_files([4], [2])),
        ("clip-benchmark/wds_vtab-caltech101", None),  # the first evaluation set: not in the cache
    ):
        assert module.main(["--table", "3"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"{repo} is not in the local Hub cache" in err, err
        if files is not None:
            hub.hub_cache_repo(cache, repo, files)
    assert module.main(["--table", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no Hub mirror: pass --data-root DIR" in err
    assert not (tmp_path / "runs").exists()
    with pytest.raises(SystemExit):
        module.main(["--help"])
    assert "ucf101, iwildcam and fmow have none and need --data-root" in capsys.readouterr().out
