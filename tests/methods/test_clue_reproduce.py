"""examples/reproduce_clue.py and the paper's numbers it ships (hf_vrl.methods.clue.paper): the rows of Tables
2 and 3 run as rungs from one start and print "paper / measured"."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from hf_vrl.errors import UserError
from hf_vrl.methods.clue.miniature import RUNGS
from hf_vrl.methods.clue.paper import PAPER_TABLES, TABLE_ROWS

EXAMPLE = Path(__file__).parents[2] / "examples" / "reproduce_clue.py"
FEW_STEPS = ["--max-steps", "2", "--save-steps", "2", "--batch-size", "8", "--train-limit", "24"]
FEW_STEPS += ["--eval-limit", "20", "--probe-cs", "[1.0]", "--no-figures"]


def _example():
    spec = importlib.util.spec_from_file_location("reproduce_clue", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_paper_row_has_a_rung_and_table_2_reads_as_printed():
    for table, rows in TABLE_ROWS.items():
        assert list(rows) == list(PAPER_TABLES[table]) and all(rung in RUNGS for rung in rows.values())
    assert PAPER_TABLES[2]["#5"]["Cars"] == {"top1": 72.66, "R@1": 43.45, "R@5": 69.49}
    assert PAPER_TABLES[2]["#1"]["Aircraft"] == {"top1": 51.13, "R@1": 31.74, "R@5": 52.07}
    assert PAPER_TABLES[3]["K = 4"]["CUB200"] == {"top1": 66.10, "R@1": 43.48, "R@5": 71.52}
    assert RUNGS["K = 8"]["num_parts"] == 8 and RUNGS["K = 8"]["beta"] > 0 and RUNGS["K = 8"]["gamma"] == 0


def test_data_root_holds_a_folder_per_benchmark_key_as_the_other_scripts(tmp_path, capsys):
    """<data-root>/cars/ as reproduce_dcr / reproduce_diffclip read it; the publisher's stanford_cars/ where
    cars/ is absent; neither: one line naming both."""
    example = _example()
    for name in ("cub", "aircraft", "stanford_cars"):
        (tmp_path / name).mkdir()
    assert example.data_spec(str(tmp_path), "CUB200") == f"cub:{tmp_path / 'cub'}"
    assert example.data_spec(str(tmp_path), "Aircraft") == f"aircraft:{tmp_path / 'aircraft'}"
    assert example.data_spec(str(tmp_path), "Cars") == f"cars:{tmp_path / 'stanford_cars'}"
    (tmp_path / "cars").mkdir()
    assert example.data_spec(str(tmp_path), "Cars") == f"cars:{tmp_path / 'cars'}"
    argv = ["--data-root", str(tmp_path / "none"), "--table", "2", "--descriptions", __file__]
    assert example.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{tmp_path / 'none' / 'cub'} is missing" in err
    with pytest.raises(SystemExit):
        example.main(["--help"])
    assert "--data-root DIR holds cub/, cars/ and aircraft/" in capsys.readouterr().out


def test_options_and_the_comparison_table():
    example = _example()
    assert example.train_options(["--max-steps", "2", "--no-figures", "--probe-cs", "[1.0]", "--eval"]) == {
        "max_steps": 2, "figures": False, "probe_cs": [1.0], "eval": True,
    }  # fmt: skip
    reports = [{"linear_probe": {"top1": 0.5}, "retrieval": {"i2i_R@1": 0.25, "i2i_R@5": 0.75}}]
    ladder = {"rungs": {rung: {"seeds": reports * 2} for rung in TABLE_ROWS[3].values()}}
    lines = example.comparison(3, "Aircraft", ladder).splitlines()
    assert lines[-1].split() == ["K", "=", "8", "K", "=", "8", "57.03", "/", "50.00", "36.42", "/", "25.00",
                                 "59.54", "/", "75.00"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("table", [2, 3])
def test_reproduce_runs_every_row_on_the_embedded_data(tmp_path, capsys, table):
    example = _example()
    argv = ["--data-root", "embedded", "--table", str(table), "--output-dir", str(tmp_path), *FEW_STEPS]
    argv += ["--backbone-pretrain-steps", "2", "--text-encoder-pretrain-steps", "2"]
    assert example.run(argv) == 0
    out = capsys.readouterr().out
    ladder = json.loads((tmp_path / f"table{table}-CUB200" / "clue_ladder.json").read_text())
    assert list(ladder["rungs"]) == list(TABLE_ROWS[table].values())
    assert "preset: clue-tiny" in out and "backbone_pretrain_steps=2" in out  # what ran, overrides included
    for row in PAPER_TABLES[table]:  # the toy world: no paper number beside it
        line = next(line for line in out.splitlines() if line.startswith(row))
        assert re.findall(r"(\S+) / \d+\.\d\d", line) == ["-", "-", "-"], line
    if table == 3:
        parts = [ladder["rungs"][f"K = {k}"]["seeds"][0] for k in (2, 8)]
        assert parts[0] != parts[1]
        config = json.loads((tmp_path / "table3-CUB200" / "seed0" / "K8" / "config.json").read_text())
        assert config["clue"]["num_parts"] == 8


def test_the_ladder_summary_takes_an_undefined_cdnv():
    """CDNV_A is None when every coarse class holds one fine class: a NaN cell, not float(None)."""
    import math

    from hf_vrl.methods.clue.miniature import _summary, format_ladder

    report = {"linear_probe": {"top1": 0.5}, "granularity": {"ncc_fine": 0.4, "cdnv_coarse_mean": None}}
    summary = _summary([report, report])
    assert math.isnan(summary["mean"]["CDNV_A"]) and summary["mean"]["NCC fine"] == 0.4
    ladder = {"seeds": [0, 1], "start": {"seeds": [report] * 2, **summary}, "rungs": {}}
    assert "nan" in format_ladder(ladder)


@pytest.fixture
def cars_devkit(tmp_path):
    """Stanford Cars as published: the devkit .mat files beside cars_train/ and cars_test/."""
    import numpy as np
    from PIL import Image
    from scipy.io import savemat

    root = tmp_path / "data" / "stanford_cars"
    (root / "devkit").mkdir(parents=True)
    names = np.array(["AM General Hummer SUV 2000", "Acura RL Sedan 2012"], dtype=object).reshape(1, -1)
    savemat(root / "devkit" / "cars_meta.mat", {"class_names": names})
    fields = [("class", "O"), ("fname", "O")]
    for split, path in (
        ("train", root / "devkit" / "cars_train_annos.mat"),
        ("test", root / "cars_test_annos_withlabels.mat"),
    ):
        rows = np.array([(1, "00001.jpg"), (2, "00002.jpg")], dtype=fields).reshape(1, -1)
        savemat(path, {"annotations": rows})
        for name in ("00001.jpg", "00002.jpg"):
            (root / f"cars_{split}").mkdir(exist_ok=True)
            Image.new("RGB", (16, 16), (10, 20, 30)).save(root / f"cars_{split}" / name)
    (tmp_path / "descriptions.json").write_text("{}")
    return tmp_path


def test_real_data_is_counted_before_any_run(cars_devkit, capsys):
    """The devkit copy holds 2 of Stanford Cars' 8,144 training images: refused in one line, nothing run."""
    example = _example()
    argv = ["--data-root", str(cars_devkit / "data"), "--table", "2", "--dataset", "Cars"]
    argv += [
        "--descriptions",
        str(cars_devkit / "descriptions.json"),
        "--output-dir",
        str(cars_devkit / "runs"),
    ]
    assert example.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith("error: Stanford Cars train at cars:") and "2 of 8,144 images, 2 of 196 classes" in err
    )
    assert len(err.splitlines()) == 1 and not (cars_devkit / "runs").exists()
    counts = example.check_data(example.data_spec(str(cars_devkit / "data"), "Cars"), allow_partial=True)
    assert counts["test"]["described"] == "2 of 8,041 images, 2 of 196 classes"
    assert example.main([*argv[:-2], "--descriptions", str(cars_devkit / "none.json")]) == 2
    assert "--descriptions" in capsys.readouterr().err


def test_help_lists_the_layouts(capsys):
    with pytest.raises(SystemExit):
        _example().main(["--help"])
    text = capsys.readouterr().out
    assert "cars: Stanford Cars as published: cars_train/, cars_test/, devkit/cars_meta.mat" in text
    assert "aircraft: the FGVC-Aircraft archive" in text and "cub: CUB_200_2011/" in text


def test_without_a_data_root_cub_is_read_from_its_hub_copy(tmp_path, monkeypatch, capsys):
    """CUB-200 from efekankavalci/CUB_200_2011 (both splits, the 200 species), counted before any run; Cars
    and Aircraft, whose mirrors hold no train split, need --data-root in one line."""
    from reproduce_helpers import hub_fixtures

    example = _example()
    assert example.data_spec(None, "CUB200") == "cub:hf:efekankavalci/CUB_200_2011"
    for dataset, mirror in (("Cars", "wds_cars"), ("Aircraft", "wds_fgvc_aircraft")):
        with pytest.raises(UserError) as raised:
            example.data_spec(None, dataset)
        message = str(raised.value)
        assert "\n" not in message and f"clip-benchmark/{mirror} holds the test split alone" in message
        assert "pass --data-root DIR" in message
    hub = hub_fixtures()
    cache = hub.offline_hub_cache(tmp_path, monkeypatch)
    hub.hub_cache_repo(cache, "efekankavalci/CUB_200_2011", hub.cub_copy_files([0, 1, 1], [1, 0]))
    monkeypatch.chdir(tmp_path)
    assert example.main(["--table", "2", "--descriptions", __file__]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cub:hf:efekankavalci/CUB_200_2011" in err, err
    assert "3 of 5,994 images" in err and "--allow-partial" in err
    counts = example.check_data("cub:hf:efekankavalci/CUB_200_2011", allow_partial=True)
    assert counts["test"]["described"] == "2 of 5,794 images, 2 of 200 classes"
    assert not (tmp_path / "runs").exists()
