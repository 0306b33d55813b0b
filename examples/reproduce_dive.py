"""Reproduce a table of DiVE's paper (Tables 2, 3, 4, 8): train the rows hf_vrl has (vanilla FT, LP-FT, FLYP,
FLYP + replay, SnD, DiVE; not ARF; the pre-trained row is the first run's evaluation before training) and
print the paper's numbers (`hf_vrl.methods.dive.paper`) beside the measured ones, "paper / measured", mean ±
std over seeds, and with several seeds DiVE's paired t-test against each row (the paper's Table 13).

    python examples/reproduce_dive.py --data-root /data --table 2 --seeds 0 1 2
    python examples/reproduce_dive.py --data-root embedded --table 8 --max-steps 30   # the pipeline on the
                                                    # embedded toy data (dive-tiny): not the paper's numbers

--data-root holds image folders (one folder per class inside each split folder) and CC3M shards:

    imagenet/{train,test}/               ILSVRC-2012 train and validation (the paper's ID test)
    imagenet-v2/test/ imagenet-r/test/ imagenet-a/test/ imagenet-sketch/test/ objectnet/test/
    caltech101/test/ flowers102/test/ food101/test/ sun397/test/ dtd/test/ fgvc_aircraft/test/
    stanford_cars/test/ oxford_pets/test/ eurosat/test/ ucf101/test/          (the ten zero-shot sets)
    iwildcam/{train,test}/ iwildcam-ood/test/ fmow/{train,test}/ fmow-ood/test/   (Table 4: ID, OOD tests)
    cc3m/{00000..00331}.tar             (the reference set, img2dataset shards)

Presets: dive-b16 (Tables 2, 3), dive-l14 (Table 8), dive-iwildcam-b16 / dive-fmow-b16 (Table 4). Measured
cells are top-1 accuracies of hf_vrl's evaluation, except Table 4's as the paper: iWildCam's macro F1 (ID and
OOD; the preset sets dive.macro_f1) and FMoW's worst-region OOD accuracy (the OOD set needs a `region`
column: an image folder with a metadata.csv / metadata.jsonl naming each file's region). On the embedded
data Table 4's iWildCam cells are the macro F1 of the toy run (its FMoW cells stay empty: no regions). Other
options go to every run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hf_vrl.methods.dive.paper import (
    PAPER_TABLES,
    ROW_OBJECTIVES,
    ZERO_SHOT_SETS,
    comparison_table,
    paired_tests,
)
from hf_vrl.run import main
from hf_vrl.run.report import load_report

OOD_FOLDERS = {
    "ImageNet-V2": "imagenet-v2",
    "ImageNet-R": "imagenet-r",
    "ImageNet-A": "imagenet-a",
    "ImageNet-Sketch": "imagenet-sketch",
    "ObjectNet": "objectnet",
}
ZERO_SHOT_FOLDERS = dict(
    zip(
        ZERO_SHOT_SETS,
        (
            "caltech101",
            "flowers102",
            "food101",
            "sun397",
            "dtd",
            "fgvc_aircraft",
            "stanford_cars",
            "oxford_pets",
            "eurosat",
            "ucf101",
        ),
    )
)


def folder(root: Path, name: str) -> str:
    return f"imagefolder:{root / name}"


def targets(table: int, root: Path | None) -> list[tuple[str, list[str], dict[str, tuple[str, str]]]]:
    """(name, run options, {paper column: (report group, key)}) per fine-tuning target of `table`; `root`
    None: the embedded toy data (dive-tiny, the table's ID and average columns only)."""
    columns = PAPER_TABLES[table].columns
    if root is None:
        id_column, *_ = columns
        cells = {id_column: ("zero_shot", "top1")}
        cells |= {c: ("ood", "top1") for c in columns if c.startswith("OOD")}
        cells |= {c: ("transfer", "top1") for c in columns if c.startswith("ZS")}
        options = ["--config", "dive-tiny"]
        if table == 4:
            cells = {"iWildCam ID": ("zero_shot", "macro_f1"), "iWildCam OOD": ("ood", "macro_f1")}
            cells["iWildCam ZS"] = ("transfer", "top1")
            options += ["--set", "dive.macro_f1=true"]
        return [("embedded", options, cells)]
    ood = {column: folder(root, name) for column, name in OOD_FOLDERS.items()}
    zero_shot = {column: folder(root, name) for column, name in ZERO_SHOT_FOLDERS.items()}
    common = [
        "--reference-dataset",
        f"webdataset:{root / 'cc3m'}/{{00000..00331}}.tar",
        "--eval-split",
        "test",
        "--set",
        f"dive.zero_shot_datasets={json.dumps(list(zero_shot.values()))}",
    ]
    if table in (2, 3, 8):
        preset = "dive-l14" if table == 8 else "dive-b16"
        run = [
            "--config",
            preset,
            "--dataset",
            folder(root, "imagenet"),
            "--eval-dataset",
            folder(root, "imagenet"),
        ]
        run += [*common, "--set", f"dive.ood_datasets={json.dumps(list(ood.values()))}"]
        cells = {columns[0]: ("zero_shot", "top1")}
        cells |= {column: ("ood", name) for column, name in ood.items()}
        cells |= {column: ("transfer", name) for column, name in zero_shot.items()}
        cells |= {"OOD avg.": ("ood", "top1"), "ZS avg.": ("transfer", "top1")}
        return [("imagenet", run, {c: cells[c] for c in columns})]
    out = []
    for name in ("iwildcam", "fmow"):
        run = [
            "--config",
            f"dive-{name}-b16",
            "--dataset",
            folder(root, name),
            "--eval-dataset",
            folder(root, name),
        ]
        run += [*common, "--set", f"dive.ood_datasets={json.dumps([folder(root, name + '-ood')])}"]
        title = "iWildCam" if name == "iwildcam" else "FMoW"
        id_metric, ood_metric = ("macro_f1", "macro_f1") if name == "iwildcam" else ("top1", "worst_group")
        cells = {f"{title} ID": ("zero_shot", id_metric), f"{title} OOD": ("ood", ood_metric)}
        out.append((name, run, cells | {f"{title} ZS": ("transfer", "top1")}))
    return out


def percent(section: dict, where: tuple[str, str]) -> float | None:
    value = section.get(where[0], {}).get(where[1])
    return None if value is None else 100 * value


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data-root", required=True, help="the data folder (layout above), or 'embedded'")
    parser.add_argument("--table", type=int, choices=sorted(PAPER_TABLES), required=True)
    parser.add_argument("--output-dir", default=None, help="default: runs/dive-table<N>")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--objectives", nargs="+", default=None, help="default: every row hf_vrl trains")
    args, train_args = parser.parse_known_args(argv)
    table = PAPER_TABLES[args.table]
    trainable = [o for row in table.rows if (o := ROW_OBJECTIVES[row]) not in (None, "pretrained")]
    objectives = args.objectives or trainable
    unknown = sorted(set(objectives) - set(trainable))
    if unknown:
        parser.error(f"Table {args.table} has no row for {unknown}; its rows: {trainable}")
    root = None if args.data_root == "embedded" else Path(args.data_root)
    out = Path(args.output_dir or f"runs/dive-table{args.table}")
    rows = {row: {} for row in table.rows}  # row -> column -> [value per seed]
    for name, options, cells in targets(args.table, root):
        first = out / name / f"seed{args.seeds[0]}" / objectives[0]
        for seed in args.seeds:
            for objective in objectives:
                run_dir = out / name / f"seed{seed}" / objective
                command = [*options, *train_args, "--resume", "auto", "--seed", str(seed)]
                command += ["--objective", objective, "--output-dir", str(run_dir)]
                command += ["--eval-before", str(run_dir == first).lower()]
                if root is None and run_dir != first:  # the toy world: the first run pre-trains, once
                    command += ["--pretrained", str(first / "inputs" / "pretrained"), "--pretrain-steps", "0"]
                if main("dive", command):
                    return 1
                report = load_report(run_dir)
                sections = {objective: report["after"]} | (
                    {"pretrained": report["before"]} if run_dir == first else {}
                )
                for row, objective_of_row in ROW_OBJECTIVES.items():
                    if row in rows and objective_of_row in sections:
                        for column, where in cells.items():
                            rows[row].setdefault(column, []).append(
                                percent(sections[objective_of_row], where)
                            )
    measured = {
        row: {c: [v for v in vs if v is not None] for c, vs in cols.items()} for row, cols in rows.items()
    }
    print(
        f"\nTable {table.number} ({table.title}); seeds {args.seeds}; paper / measured (mean ± std), percent:"
    )
    print(comparison_table(table, measured))
    if len(args.seeds) > 1 and measured.get("DiVE"):
        print("\nDiVE against each row: mean difference over seeds, points (paired t-test p, Table 13):")
        print(paired_tests(table, measured))
    return 0


if __name__ == "__main__":
    sys.exit(run())
