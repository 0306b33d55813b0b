"""Reproduce a table of DiVE's paper (Tables 2, 3, 4, 8): train the rows hf_vrl has (vanilla FT, LP-FT, FLYP,
FLYP + replay, SnD, DiVE; not ARF; the pre-trained row is the first run's evaluation before training) and
print the paper's numbers (`hf_vrl.methods.dive.paper`) beside the measured ones, "paper / measured", mean ±
std over seeds, and with several seeds DiVE's paired t-test against each row (the paper's Table 13).

    python examples/reproduce_dive.py --table 2                        # the Hub mirrors, nothing on disk
    python examples/reproduce_dive.py --data-root /data --table 2 --seeds 0 1 2
    python examples/reproduce_dive.py --data-root embedded --table 8 --max-steps 30   # the pipeline on the
                                                    # embedded toy data (dive-tiny): no paper numbers

--data-root holds one folder per benchmark, named by its key, in one of the layouts its publisher ships
(listed at the end of --help): imagenet/ (ILSVRC-2012: train/ and the validation set, the paper's ID test),
imagenet-v2/ imagenet-r/ imagenet-a/ imagenet-sketch/ objectnet/ (the OOD sets), caltech101/ flowers/
food101/ sun397/ dtd/ aircraft/ cars/ pets/ eurosat/ ucf101/ (the ten zero-shot sets, scored on their test
split with OpenAI's class names and templates; FGVC-Aircraft's 100 variants, Stanford Cars' 196 models),
iwildcam/ and fmow/ (Table 4: WILDS' folders; train, ID test id_test, OOD test test; FMoW's regions from
WILDS' country-code mapping) and cc3m/ (img2dataset's output folder: the reference set). Every evaluation set
is counted against its official numbers before the first run starts; a partial copy is refused, or scored
with --allow-partial and its cells marked.

Without --data-root every set is read from its Hub mirror (`hf_vrl.data.benchmarks.MIRRORS`; online from the
Hub, offline from the local Hub cache): ImageNet's training set from timm/imagenet-1k-wds, its evaluation sets
(-V2, -R, -A, -Sketch, ObjectNet) and the transfer sets from clip_benchmark's mirrors (clip-benchmark/wds_*,
each with its own class names and templates; noted beside the table with where it differs), CC3M from
pixparse/cc3m-wds (streamed). Sets without a Hub mirror need --data-root: UCF-101 (without it, its column
stays empty and ZS avg. is over the other nine, marked), and WILDS' iWildCam and FMoW (Table 4).

Presets: dive-b16 (Tables 2, 3), dive-l14 (Table 8), dive-iwildcam-b16 / dive-fmow-b16 (Table 4). Measured
cells are top-1 accuracies of hf_vrl's evaluation, except Table 4's as the paper: iWildCam's macro F1 (ID and
OOD; the preset sets dive.macro_f1) and FMoW's worst-region OOD accuracy ("Other" left out, as WILDS). On the
embedded data Table 4's iWildCam cells are the macro F1 of the toy run (its FMoW cells stay empty: no
regions), and no paper number is printed: the toy world is not the paper's protocol. Other options go to
every run; each run is a cell's source and is kept: a stopped table resumes, a finished run is read back.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from hf_vrl.errors import UserError
from hf_vrl.methods.dive.paper import (
    PAPER_TABLES,
    ROW_OBJECTIVES,
    ZERO_SHOT_SETS,
    comparison_table,
    paired_tests,
)
from hf_vrl.paper_eval import (
    PARTIAL,
    data_help,
    hub_mirror,
    main_with_user_errors,
    mirror_notes,
    ran_header,
)

OOD_KEYS = {
    "ImageNet-V2": "imagenet-v2",
    "ImageNet-R": "imagenet-r",
    "ImageNet-A": "imagenet-a",
    "ImageNet-Sketch": "imagenet-sketch",
    "ObjectNet": "objectnet",
}
# the ten zero-shot sets by registry prefix (FGVC-Aircraft and Stanford Cars at their fine level)
ZERO_SHOT_KEYS = dict(
    zip(
        ZERO_SHOT_SETS,
        (
            "caltech101",
            "flowers",
            "food101",
            "sun397",
            "dtd",
            "fgvc_aircraft",
            "stanford_cars",
            "pets",
            "eurosat",
            "ucf101",
        ),
    )
)
FOLDERS = {"fgvc_aircraft": "aircraft", "stanford_cars": "cars"}  # the data-root folder of a prefix
WILDS_SPLITS = {"train": "train", "id": "id_test", "ood": "test"}  # WILDS' splits of Table 4's columns
DATA_KEYS = ["imagenet", *OOD_KEYS.values(), *(FOLDERS.get(k, k) for k in ZERO_SHOT_KEYS.values())]
DATA_KEYS += ["iwildcam", "fmow", "cc3m"]
EMBEDDED = "embedded"  # --data-root embedded: the toy data dive-tiny trains on


def name(root: Path | None, prefix: str, split: str = "test") -> str | None:
    """The registry name of benchmark `prefix` under `root`; `root` None: its Hub mirror holding `split`
    (`hf_vrl.paper_eval.hub_mirror`), None when it has none (the set needs --data-root)."""
    key = FOLDERS.get(prefix, prefix)
    if root is not None:
        return f"{prefix}:{root / key}"
    mirror = hub_mirror(key, split)
    return None if mirror is None else f"{prefix}:{mirror}"


def without_mirror(table: int, root: Path | None) -> list[str]:
    """The paper columns (and keys) of `table`'s zero-shot sets that have no Hub mirror, where its ZS avg.
    averages them (none under a --data-root)."""
    if root is not None or "ZS avg." not in PAPER_TABLES[table].columns:
        return []
    return [f"{column} ({key})" for column, key in ZERO_SHOT_KEYS.items() if name(root, key) is None]


def _wilds_need_a_data_root(root: Path | None) -> None:
    if root is None:
        raise UserError(
            "Table 4 trains on WILDS' iWildCam and FMoW, which have no Hub mirror: pass --data-root DIR "
            "(with iwildcam/ and fmow/ in it, WILDS' folders as published)"
        )


def targets(table: int, root: Path | str | None) -> list[tuple[str, list[str], dict[str, tuple[str, str]]]]:
    """(name, run options, {paper column: (report group, key)}) per fine-tuning target of `table`; `root`
    EMBEDDED: the embedded toy data (dive-tiny, the table's ID and average columns only); None: the Hub
    mirrors (a set without one is left out, `without_mirror`)."""
    columns = PAPER_TABLES[table].columns
    if root == EMBEDDED:
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
    ood = {column: name(root, key) for column, key in OOD_KEYS.items()}
    zero_shot = {column: name(root, key) for column, key in ZERO_SHOT_KEYS.items()}
    zero_shot = {column: set_name for column, set_name in zero_shot.items() if set_name is not None}
    common = ["--reference-dataset", name(root, "cc3m", "train")]
    common += ["--set", f"dive.zero_shot_datasets={json.dumps(list(zero_shot.values()))}"]
    if table in (2, 3, 8):
        preset = "dive-l14" if table == 8 else "dive-b16"
        imagenet, train = name(root, "imagenet"), name(root, "imagenet", "train")
        run = ["--config", preset, "--dataset", train, "--eval-dataset", imagenet, "--eval-split", "test"]
        run += [*common, "--set", f"dive.ood_datasets={json.dumps(list(ood.values()))}"]
        cells = {columns[0]: ("zero_shot", "top1")}
        cells |= {column: ("ood", set_name) for column, set_name in ood.items()}
        cells |= {column: ("transfer", set_name) for column, set_name in zero_shot.items()}
        cells |= {"OOD avg.": ("ood", "top1"), "ZS avg.": ("transfer", "top1")}
        return [("imagenet", run, {c: cells[c] for c in columns if c in cells})]
    _wilds_need_a_data_root(root)
    out = []
    for key in ("iwildcam", "fmow"):
        data = name(root, key)
        run = ["--config", f"dive-{key}-b16", "--dataset", data, "--eval-dataset", data, *common]
        run += ["--eval-split", WILDS_SPLITS["id"], "--set", f"dive.ood_datasets={json.dumps([data])}"]
        run += ["--set", f"dive.ood_splits={json.dumps({data: WILDS_SPLITS['ood']})}"]
        title = "iWildCam" if key == "iwildcam" else "FMoW"
        id_metric, ood_metric = ("macro_f1", "macro_f1") if key == "iwildcam" else ("top1", "worst_group")
        cells = {f"{title} ID": ("zero_shot", id_metric), f"{title} OOD": ("ood", ood_metric)}
        out.append((key, run, cells | {f"{title} ZS": ("transfer", "top1")}))
    return out


def evaluation_sets(table: int, root: Path | None) -> dict[str, tuple[str, str, list[str]]]:
    """{set name: (registry name, split, the columns it fills)} of every set `table`'s runs evaluate (`root`
    None: the Hub mirrors; a set without one is left out)."""
    columns = PAPER_TABLES[table].columns
    zs = "ZS avg." if table != 4 else None
    sets = {}
    for column, key in ZERO_SHOT_KEYS.items():
        zs_columns = [c for c in columns if c in (column, zs) or c.endswith(" ZS")]
        if (set_name := name(root, key)) is not None:
            sets[key] = (set_name, "test", zs_columns)
    if table == 4:
        _wilds_need_a_data_root(root)
        for key, title in (("iwildcam", "iWildCam"), ("fmow", "FMoW")):
            sets[f"{key} ID"] = (name(root, key), WILDS_SPLITS["id"], [f"{title} ID"])
            sets[f"{key} OOD"] = (name(root, key), WILDS_SPLITS["ood"], [f"{title} OOD"])
        return sets
    sets["imagenet"] = (name(root, "imagenet"), "test", [columns[0]])
    for column, key in OOD_KEYS.items():
        sets[key] = (name(root, key), "test", [c for c in columns if c in (column, "OOD avg.")])
    return sets


def check_data(table: int, root: Path | None, allow_partial: bool) -> tuple[dict[str, Any], list[str]]:
    """Before any run: the training and reference data are there, and every evaluation set is counted
    against its official numbers (a one-line UserError for a partial one unless `allow_partial`). Returns
    ({set: counts record}, the columns measured on partial sets)."""
    from hf_vrl.data.registry import check_dataset_name
    from hf_vrl.eval_inputs import load_counted_dataset

    if table == 4:
        _wilds_need_a_data_root(root)
    check_dataset_name(name(root, "cc3m", "train"), "the reference set (cc3m/)")
    for key in ("iwildcam", "fmow") if table == 4 else ("imagenet",):
        check_dataset_name(name(root, key, "train"), f"the training set ({key}/)")
    counts, marked = {}, []
    if without_mirror(table, root):  # the average over fewer sets than the paper's
        marked.append("ZS avg.")
    for label, (set_name, split, columns) in evaluation_sets(table, root).items():
        _, record = load_counted_dataset(set_name, split=split, allow_partial=allow_partial)
        counts[f"{label}/{split}"] = record
        if record is not None and not record["complete"]:
            marked += columns
    return counts, marked


def percent(section: dict, where: tuple[str, str]) -> float | None:
    value = section.get(where[0], {}).get(where[1])
    return None if value is None else 100 * value


def finished(run_dir: Path) -> dict[str, Any] | None:
    """A run's report when it has finished (its evaluation after training is in), else None."""
    from hf_vrl.run.report import load_report

    return load_report(run_dir) if (run_dir / "report.json").is_file() else None


def run_cells(
    args: argparse.Namespace, train_args: list[str], root: Path | None, objectives: list[str]
) -> dict:
    """Every run of the table (each resumed, or read back when finished) -> {row: {column: [per seed]}}."""
    from hf_vrl.run import main

    table = PAPER_TABLES[args.table]
    out = Path(args.output_dir or f"runs/dive-table{args.table}")
    rows: dict[str, dict[str, list]] = {row: {} for row in table.rows}
    for target, options, cells in targets(args.table, root):
        first = out / target / f"seed{args.seeds[0]}" / objectives[0]
        for seed in args.seeds:
            for objective in objectives:
                run_dir = out / target / f"seed{seed}" / objective
                report = finished(run_dir)
                if report is None or "after" not in report:
                    command = [*options, *train_args, "--resume", "auto", "--seed", str(seed)]
                    command += ["--objective", objective, "--output-dir", str(run_dir)]
                    command += ["--eval-before", str(run_dir == first).lower()]
                    if root == EMBEDDED and run_dir != first:  # the toy world: the first run pre-trains, once
                        command += [
                            "--pretrained",
                            str(first / "inputs" / "pretrained"),
                            "--pretrain-steps",
                            "0",
                        ]
                    if main("dive", command):
                        raise UserError(f"the {objective} run of seed {seed} failed: see {run_dir}")
                    report = finished(run_dir)
                sections = {objective: report["after"]} | (
                    {"pretrained": report["before"]} if run_dir == first else {}
                )
                for row, objective_of_row in ROW_OBJECTIVES.items():
                    if row in rows and objective_of_row in sections:
                        for column, where in cells.items():
                            rows[row].setdefault(column, []).append(
                                percent(sections[objective_of_row], where)
                            )
    return {
        row: {c: [v for v in vs if v is not None] for c, vs in cols.items()} for row, cols in rows.items()
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python examples/reproduce_dive.py",
        description=__doc__,
        epilog=data_help(
            DATA_KEYS,
            "--data-root DIR holds one folder per benchmark, named by its key, in one of its layouts "
            "(without it, each set's Hub mirror is read; ucf101, iwildcam and fmow have none and need "
            "--data-root):",
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--data-root",
        help="the data folder (layouts below), or 'embedded'; default: the Hub mirrors (UCF-101, iWildCam "
        "and FMoW have none: they need --data-root)",
    )
    parser.add_argument("--table", type=int, choices=sorted(PAPER_TABLES), required=True)
    parser.add_argument("--output-dir", default=None, help="default: runs/dive-table<N>")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--objectives", nargs="+", default=None, help="default: every row hf_vrl trains")
    parser.add_argument(
        "--allow-partial",
        action="store_true",
        help=f"score evaluation sets that lack images or classes; their cells are marked {PARTIAL}",
    )
    parser.add_argument(
        "--output", help="also write the measured numbers (and the sets' counts) to this JSON"
    )
    return parser


def run(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, train_args = parser.parse_known_args(argv)
    table = PAPER_TABLES[args.table]
    trainable = [o for row in table.rows if (o := ROW_OBJECTIVES[row]) not in (None, "pretrained")]
    objectives = args.objectives or trainable
    unknown = sorted(set(objectives) - set(trainable))
    if unknown:
        parser.error(f"Table {args.table} has no row for {unknown}; its rows: {trainable}")
    root = EMBEDDED if args.data_root == EMBEDDED else args.data_root and Path(args.data_root)
    counts, marked = check_data(args.table, root, args.allow_partial) if root != EMBEDDED else ({}, [])
    measured = run_cells(args, train_args, root, objectives)
    presets = sorted({options[options.index("--config") + 1] for _, options, _ in targets(args.table, root)})
    data = {EMBEDDED: "the embedded toy data (dive-tiny): not the paper's protocol", None: "the Hub mirrors"}
    header = {
        "preset": ", ".join(presets),
        "overrides": " ".join(train_args) or "none",
        "data": data.get(root, str(root)),
        "seeds": args.seeds,
        "sets": {s: r["described"] for s, r in counts.items() if r is not None},
    }
    if root != EMBEDDED and without_mirror(args.table, root):
        missing = ", ".join(without_mirror(args.table, root))
        header["needs --data-root"] = f"{missing} (no Hub mirror): not scored; ZS avg. is over the other sets"
    if root == EMBEDDED:  # no paper number beside the toy world's
        print(ran_header(f"\nDiVE Table {table.number}'s rows on the toy data; measured, percent:", header))
        print(comparison_table(table, measured, paper=False))
    else:
        title = f"\nTable {table.number} ({table.title}); paper / measured (mean ± std), percent:"
        print(ran_header(title, header))
        print(comparison_table(table, measured, marked=marked))
        for set_name, record in counts.items():
            if record is not None and not record["complete"]:
                print(f"{PARTIAL} {set_name}: {record['described']} (not the paper's set)")
        for note in mirror_notes(counts):
            print(note)
    if len(args.seeds) > 1 and measured.get("DiVE"):
        print("\nDiVE against each row: mean difference over seeds, points (paired t-test p, Table 13):")
        print(paired_tests(table, measured))
    if args.output:
        Path(args.output).write_text(
            json.dumps({"table": args.table, "measured": measured, "counts": counts})
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    return main_with_user_errors(run, argv)


if __name__ == "__main__":
    sys.exit(main())
