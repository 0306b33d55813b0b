"""examples/reproduce_clue.py and the paper's numbers it ships (hf_vrl.methods.clue.paper): the rows of Tables
2 and 3 run as rungs from one start and print "paper / measured"."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

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


def test_options_and_the_comparison_table():
    example = _example()
    assert example.train_options(["--max-steps", "2", "--no-figures", "--probe-cs", "[1.0]", "--eval"]) == {
        "max_steps": 2, "figures": False, "probe_cs": [1.0], "eval": True,
    }  # fmt: skip
    assert example.data_spec("/d", "CUB200") == "cub:/d/CUB_200_2011"
    assert example.data_spec("/d", "Aircraft") == "aircraft:/d/fgvc-aircraft-2013b"
    assert example.data_spec("/d", "Cars") == "cars:/d/stanford_cars"
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
    for row, values in PAPER_TABLES[table].items():
        line = next(line for line in out.splitlines() if line.startswith(row))
        assert f"{values['CUB200']['top1']:.2f} / " in line and f"{values['CUB200']['R@5']:.2f} / " in line
    if table == 3:
        parts = [ladder["rungs"][f"K = {k}"]["seeds"][0] for k in (2, 8)]
        assert parts[0] != parts[1]
        config = json.loads((tmp_path / "table3-CUB200" / "seed0" / "K8" / "config.json").read_text())
        assert config["clue"]["num_parts"] == 8
