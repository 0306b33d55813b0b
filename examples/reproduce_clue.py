"""Reproduce CLUE's Table 2 (the ablation of Eq. 8's terms) or Table 3 (the number of parts K): train every
row with `hf-vrl train clue` from the same start (`hf_vrl.methods.clue.miniature.run_ladder`) and print the
paper's numbers (`hf_vrl.methods.clue.paper`) beside the measured ones, "paper / measured" (linear-probe
top-1, image retrieval Rank-1 / Rank-5, %; mean over the seeds).

    python examples/reproduce_clue.py --data-root data --table 2 \\
        --descriptions data/cub200_descriptions.json                      # clue-r50 on CUB-200 (4 GPUs)
    python examples/reproduce_clue.py --table 2 --descriptions cub.json   # CUB-200 from its Hub copy
    python examples/reproduce_clue.py --data-root data --dataset Cars --table 3 --descriptions cars.json
    python examples/reproduce_clue.py --data-root embedded --table 2 --max-steps 30   # the pipeline on the
                                                    # embedded toy data (clue-tiny): not the paper's numbers

--data-root holds one folder per dataset named by its benchmark key, as the other reproduce scripts read it:
cub/ (the extracted CUB_200_2011.tgz), cars/ (the devkit's .mat files beside cars_train/ and cars_test/, or
{train,test}/<class name>/) and aircraft/ (the archive), each in its publisher's layout (listed at the end of
--help); the publishers' own folder names (CUB_200_2011/, stanford_cars/, fgvc-aircraft-2013b/) are read
where the key's folder is absent. Aircraft and Cars keep their label
hierarchies (`hf_vrl.data.fine_grained`: label the family / make, fine_label the 100 variants / 196 models the
probe and retrieval score), so the granularity metrics are measured there too. Both splits are counted against
the official numbers before the first run; a partial copy is refused, or trained on with --allow-partial and
marked. Without --data-root, CUB-200 is read from its Hub copy (efekankavalci/CUB_200_2011: both official
splits, the 200 species the probe and retrieval score; online from the Hub, offline from the local Hub cache).
Cars and Aircraft need --data-root: their Hub mirrors (clip_benchmark's) hold the test split alone, without a
training split to train and probe on. Descriptions come from `python -m hf_vrl.methods.clue.describe` (a .json
keyed by the dataset's `key` column); the datasets' captions are class-name templates, i.e. the label, and are
never used. Table 3 trains #4's objective (global and part terms) with K = 2, 3, 4, 8. Other options
(`--max-steps 2`, `--batch-size 8`, `--backbone ...`, ...) go to every run and are printed in the header. Each
rung is a run that resumes, and a finished one is read back. On the embedded toy data no paper number is
printed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from hf_vrl.errors import UserError
from hf_vrl.evaluation import text_table
from hf_vrl.methods.clue.miniature import run_ladder
from hf_vrl.methods.clue.paper import DATASETS, PAPER_TABLES, TABLE_ROWS
from hf_vrl.paper_eval import (
    PARTIAL,
    data_help,
    hub_mirror,
    main_with_user_errors,
    mirror_notes,
    ran_header,
)

PREFIXES = {"CUB200": "cub", "Cars": "cars", "Aircraft": "aircraft"}  # the registry's hierarchy names
# the publishers' folder names, read where <data-root>/<key>/ is absent
FOLDERS = {"CUB200": "CUB_200_2011", "Cars": "stanford_cars", "Aircraft": "fgvc-aircraft-2013b"}
MEASURED = {
    "top1": ("linear_probe", "top1"),
    "R@1": ("retrieval", "i2i_R@1"),
    "R@5": ("retrieval", "i2i_R@5"),
}


def data_spec(root: str | None, dataset: str) -> str:
    """The registry name of `dataset` under `root` ("shapes" for the embedded data): `<root>/<key>/`, else the
    publisher's folder name under `root`; `root` None: its Hub mirror holding both splits, where it has one
    (`hf_vrl.paper_eval.hub_mirror`)."""
    if root == "embedded":
        return "shapes"
    key = PREFIXES[dataset]
    if root is None:
        return _hub_spec(dataset, key)
    folder = next(
        (f for f in (Path(root).expanduser() / n for n in (key, FOLDERS[dataset])) if f.is_dir()),
        None,
    )
    if folder is None:
        raise UserError(
            f"{Path(root) / key} is missing: put {dataset} there (or in {root}/{FOLDERS[dataset]}/)"
        )
    return f"{key}:{folder}"


def _hub_spec(dataset: str, key: str) -> str:
    mirrors = {split: hub_mirror(key, split) for split in ("train", "test")}
    if mirrors["train"] is None or mirrors["train"] != mirrors["test"]:
        held = "it has no Hub mirror"
        if mirrors["test"]:
            held = f"its Hub mirror {mirrors['test'].removeprefix('hf:')} holds the test split alone"
        raise UserError(
            f"CLUE's {dataset} column trains and probes on {dataset}'s train split and {held}: pass "
            f"--data-root DIR (with {key}/ in it)"
        )
    return f"{key}:{mirrors['train']}"


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
            raise UserError(f"unexpected argument {argv[i]!r}: options are --name value")
        name = argv[i][2:].replace("-", "_")
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            options[name], i = _value(argv[i + 1]), i + 2
        else:
            options[name.removeprefix("no_")], i = not name.startswith("no_"), i + 1
    return options


def comparison(
    table: int, dataset: str, ladder: dict[str, Any], *, paper: bool = True, mark: str = ""
) -> str:
    """One line per row of the paper's table: its id, the rung, then "paper / measured" per metric (the
    measured value alone, "- / measured", without `paper`; `mark` after measured values of partial data)."""
    rows = [["row", "rung", *(f"{dataset} {metric}" for metric in MEASURED)]]
    for row, rung in TABLE_ROWS[table].items():
        seeds = ladder["rungs"][rung]["seeds"]
        cells = []
        for metric, (task, key) in MEASURED.items():
            values = [100 * report[task][key] for report in seeds if task in report]
            measured = f"{sum(values) / len(values):.2f}{mark}" if values else "-"
            printed = f"{PAPER_TABLES[table][row][dataset][metric]:.2f}" if paper else "-"
            cells.append(f"{printed} / {measured}")
        rows.append([row, rung, *cells])
    return text_table(rows, left_columns=2)


def check_data(spec: str, allow_partial: bool) -> dict[str, dict[str, Any]]:
    """Both splits of `spec` counted against the official numbers before any run (one-line UserError for a
    partial copy unless `allow_partial`): {split: counts record}."""
    from hf_vrl.eval_inputs import load_counted_dataset

    return {
        split: load_counted_dataset(spec, split=split, allow_partial=allow_partial)[1]
        for split in ("train", "test")
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python examples/reproduce_clue.py",
        description=__doc__,
        epilog=data_help(
            ["cub", "cars", "aircraft"],
            "--data-root DIR holds cub/, cars/ and aircraft/ (or CUB_200_2011/, stanford_cars/,"
            " fgvc-aircraft-2013b/), each as published (without it CUB is read from its Hub copy; cars and"
            " aircraft need --data-root, their Hub mirrors hold no train split):",
            only=("cub", "cars-devkit", "cars-folders", "fgvc-aircraft"),
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--data-root",
        help="folder of the datasets, or 'embedded'; default: CUB's Hub copy (Cars and Aircraft need it)",
    )
    parser.add_argument("--table", type=int, choices=sorted(PAPER_TABLES), required=True)
    parser.add_argument("--dataset", choices=DATASETS, default="CUB200", help="the paper's column")
    parser.add_argument("--descriptions", help="descriptions .json (describe.py); needed on real data")
    parser.add_argument("--config", help="preset (default: clue-r50; clue-tiny on the embedded data)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--output-dir", default="runs/clue-reproduce")
    parser.add_argument(
        "--allow-partial",
        action="store_true",
        help=f"train and score on a copy that lacks images or classes; its cells are marked {PARTIAL}",
    )
    return parser


def run(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    embedded = args.data_root == "embedded"
    if not embedded and not args.descriptions:
        raise UserError("--descriptions is needed on real data (the captions name the class: the label)")
    if args.descriptions and not Path(args.descriptions).is_file():
        raise UserError(
            f"--descriptions {args.descriptions}: no such file (write it with hf_vrl.methods.clue.describe)"
        )
    overrides = train_options(rest)
    spec = data_spec(args.data_root, args.dataset)
    counts = {} if embedded else check_data(spec, args.allow_partial)
    settings: dict[str, Any] = {} if embedded else {"dataset": spec, "eval_dataset": spec}
    if args.descriptions:
        settings["text_source"] = args.descriptions
    settings |= overrides
    config = args.config or ("clue-tiny" if embedded else "clue-r50")
    out = Path(args.output_dir) / f"table{args.table}-{args.dataset}"
    rungs = list(TABLE_ROWS[args.table].values())
    ladder = run_ladder(tuple(args.seeds), out, rungs, config=config, **settings)
    partial = [f"{split}: {r['described']}" for split, r in counts.items() if not r["complete"]]
    header = {
        "preset": config,
        "overrides": ", ".join(f"{k}={v}" for k, v in overrides.items()) or "none",
        "data": "the embedded toy data: not the paper's protocol, no paper numbers" if embedded else spec,
        "counts": {split: record["described"] for split, record in counts.items()},
        "seeds": args.seeds,
    }
    what = "measured" if embedded else "paper / measured"
    print(ran_header(f"\nCLUE Table {args.table}, {what} (%, mean over the seeds):", header))
    print(comparison(args.table, args.dataset, ladder, paper=not embedded, mark=PARTIAL if partial else ""))
    for line in partial:
        print(f"{PARTIAL} {args.dataset} {line} (not the paper's set)")
    for note in mirror_notes({f"{args.dataset}/{split}": record for split, record in counts.items()}):
        print(note)
    return 0


def main(argv: list[str] | None = None) -> int:
    return main_with_user_errors(run, argv)


if __name__ == "__main__":
    sys.exit(main())
