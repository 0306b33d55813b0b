"""Reproduce CLUE's Table 2 (the ablation of Eq. 8's terms) or Table 3 (the number of parts K): train every
row with `hf-vrl train clue` from the same start (`hf_vrl.methods.clue.miniature.run_ladder`) and print the
paper's numbers (`hf_vrl.methods.clue.paper`) beside the measured ones, "paper / measured" (linear-probe
top-1, image retrieval Rank-1 / Rank-5, %; mean over the seeds).

    python examples/reproduce_clue.py --data-root data --table 2 \\
        --descriptions data/cub200_descriptions.json                      # clue-r50 on CUB-200 (4 GPUs)
    python examples/reproduce_clue.py --data-root data --dataset Cars --table 3 --descriptions cars.json
    python examples/reproduce_clue.py --data-root embedded --table 2 --max-steps 30   # the pipeline on the
                                                    # embedded toy data (clue-tiny): not the paper's numbers

--data-root holds CUB_200_2011/ and fgvc-aircraft-2013b/ (the official archives, extracted) and
stanford_cars/ (an image folder: {train,test}/<class name>/...); Aircraft and Cars keep their label
hierarchies (`hf_vrl.data.fine_grained`), so the granularity metrics are measured there too. Descriptions
come from `python -m hf_vrl.methods.clue.describe` (a .json keyed by the dataset's `key` column); the
datasets' captions are class-name templates, i.e. the label, and are never used. Table 3 trains #4's
objective (global and part terms) with K = 2, 3, 4, 8. Other options (`--max-steps 2`, `--batch-size 8`,
...) go to every run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from hf_vrl.evaluation import text_table
from hf_vrl.methods.clue.miniature import run_ladder
from hf_vrl.methods.clue.paper import DATASETS, PAPER_TABLES, TABLE_ROWS

FOLDERS = {"CUB200": "CUB_200_2011", "Cars": "stanford_cars", "Aircraft": "fgvc-aircraft-2013b"}
MEASURED = {
    "top1": ("linear_probe", "top1"),
    "R@1": ("retrieval", "i2i_R@1"),
    "R@5": ("retrieval", "i2i_R@5"),
}


def data_spec(root: str, dataset: str) -> str:
    """The registry name of `dataset` under `root` ("shapes" for the embedded data)."""
    if root == "embedded":
        return "shapes"
    prefix = {"CUB200": "cub", "Cars": "cars", "Aircraft": "aircraft"}[dataset]
    return f"{prefix}:{Path(root).expanduser() / FOLDERS[dataset]}"


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def train_options(argv: list[str]) -> dict[str, Any]:
    """`--flag value` / `--flag` / `--no-flag` pairs as `hf_vrl.train` settings (dashes to underscores)."""
    options: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        if not argv[i].startswith("--"):
            raise SystemExit(f"unexpected argument {argv[i]!r}: options are --name value")
        name = argv[i][2:].replace("-", "_")
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            options[name], i = _value(argv[i + 1]), i + 2
        else:
            options[name.removeprefix("no_")], i = not name.startswith("no_"), i + 1
    return options


def comparison(table: int, dataset: str, ladder: dict[str, Any]) -> str:
    """One line per row of the paper's table: its id, the rung, then "paper / measured" per metric."""
    rows = [["row", "rung", *(f"{dataset} {metric}" for metric in MEASURED)]]
    for row, rung in TABLE_ROWS[table].items():
        seeds = ladder["rungs"][rung]["seeds"]
        cells = []
        for metric, (task, key) in MEASURED.items():
            values = [100 * report[task][key] for report in seeds if task in report]
            measured = f"{sum(values) / len(values):.2f}" if values else "-"
            cells.append(f"{PAPER_TABLES[table][row][dataset][metric]:.2f} / {measured}")
        rows.append([row, rung, *cells])
    return text_table(rows, left_columns=2)


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data-root", required=True, help="folder of the datasets, or 'embedded'")
    parser.add_argument("--table", type=int, choices=sorted(PAPER_TABLES), required=True)
    parser.add_argument("--dataset", choices=DATASETS, default="CUB200", help="the paper's column")
    parser.add_argument("--descriptions", help="descriptions .json (describe.py); needed on real data")
    parser.add_argument("--config", help="preset (default: clue-r50; clue-tiny on the embedded data)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--output-dir", default="runs/clue-reproduce")
    args, rest = parser.parse_known_args(argv)
    embedded = args.data_root == "embedded"
    if not embedded and not args.descriptions:
        parser.error("--descriptions is needed on real data (the captions name the class: the label)")
    spec = data_spec(args.data_root, args.dataset)
    settings: dict[str, Any] = {} if embedded else {"dataset": spec, "eval_dataset": spec}
    if args.descriptions:
        settings["text_source"] = args.descriptions
    settings |= train_options(rest)
    config = args.config or ("clue-tiny" if embedded else "clue-r50")
    out = Path(args.output_dir) / f"table{args.table}-{args.dataset}"
    rungs = list(TABLE_ROWS[args.table].values())
    ladder = run_ladder(tuple(args.seeds), out, rungs, config=config, **settings)
    note = "the embedded toy data: not comparable with the paper" if embedded else spec
    print(f"\nCLUE Table {args.table}, paper / measured (%, {config}, {note}, seeds {args.seeds}):")
    print(comparison(args.table, args.dataset, ladder))
    return 0


if __name__ == "__main__":
    sys.exit(run())
