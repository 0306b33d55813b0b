"""Reproduce DiffCLIP's evaluations with given models: Table 1 (linear probe and few-shot on nine sets),
Table 2 (zero-shot retrieval R@5 and zero-shot ImageNet), Table 3 (POPE of a LLaVA with each encoder),
Figure 3 (zero-shot ImageNet and four OOD variants) and MMVP-VLM (Figure 4), printed "paper / measured"
beside the paper's rows (`hf_vrl.methods.diffclip.paper`).

    hf-vrl convert diffclip --official CC12M/checkpoint_best.pt --output-dir models/diffclip-cc12m
    python examples/reproduce_diffclip.py --table 2 --data-root /data \\
        --model "DiffCLIP (CC12M)=models/diffclip-cc12m" --model "CLIP (CC12M)=models/clip-cc12m"

    python examples/reproduce_diffclip.py --table miniature --seeds 0 1 2   # trains 2 runs a seed (CPU)

    python examples/reproduce_diffclip.py --table 3 \\
        --model "CLIP (CC12M)=runs/llava-clip" --model "DiffCLIP (CC12M)=runs/llava-diffclip"

`--table 3` scores LLaVA folders (`hf-vrl export-llava` / `llava-align`) with lmms-eval (`hf-vrl
llava-eval`, `pip install "hf-vrl[llava-eval]"`) on pope_random / pope_pop / pope_adv (pope_accuracy,
pope_precision, pope_recall), the outputs in --eval-dir (default runs/diffclip-table3/<label>/). The paper's
rows are TinyLLaVA with Qwen-2.5-0.5B; `--task "Random Accuracy=my_task:exact_match"` scores a column with
another task (one of your own in --include-path), `--sets "Random Accuracy"` picks columns, --limit takes the
first N samples of each task.

`--table miniature` trains instead of evaluating given models: CLIP and DiffCLIP (`hf-vrl demo`'s recipe,
diffclip-tiny sizes, same data, seed and batches) on the cluttered shapes world
(`hf_vrl.methods.diffclip.clutter`: textured backgrounds, faded distractor shapes, captions that name only
the target), once per seed, and prints zero-shot and clustering as mean ± population std over seeds with
the paired difference: the setting where attention noise matters.

A model labelled with a paper row's name ("CLIP (CC3M)", "DiffCLIP (CC3M)", "CLIP (CC12M)", "DiffCLIP
(CC12M)") fills that row; others get rows of their own. Models: any DiffCLIP or CLIP folder or Hub id, or a
released `checkpoint_best.pt` (converted on the fly with SLIP's preprocessing and --tokenizer).

--data-root holds one folder per benchmark, named by its key (or pass --source KEY=NAME[@SPLIT], e.g. --source
cifar10=hf:uoft-cs/cifar10), in one of the layouts its publisher ships (listed at the end of --help):
caltech101/ dtd/ pets/ flowers/ sun397/ aircraft/ cifar10/ cifar100/ food101/ (Table 1: train and test;
FGVC-Aircraft probed on its 100 variants, as LGSSL and the paper), flickr30k/ flickr8k/ mscoco/ (Table 2:
Karpathy's test splits), imagenet/ imagenet-v2/ imagenet-a/ imagenet-r/ imagenet-sketch/ (Table 2, Figure 3;
ImageNet's test is its validation set), mmvp_vlm/. Without --data-root or --source a set is read from its
Hub mirror (hf:clip-benchmark/wds_<name>, hf:MMVP/MMVP_VLM: the mirror's own class names, templates and
counts, noted beside the table). Every set is counted against the official numbers before a model is loaded;
a partial copy is refused, or scored with --allow-partial and its cells marked. Protocols:
Table 1 as LGSSL (El Banani et al. 2023), which the paper follows: logistic regression on frozen image
features with the L2 strength chosen on a held-out fifth of train (`hf_vrl.metrics.linear_probe`; LGSSL refits
on train + validation too, and scores some sets by mean per-class accuracy, which this does not) and 5-way
5-shot nearest-prototype episodes (6 queries a class from test, centred and L2-normalised features;
`hf_vrl.paper_eval.few_shot_episodes`), over --seeds: one seed is comparable with Table 1 (one run), several
give mean ± population std, the protocol of Appendix B's Tables 4-5 (not stored), and are then printed on rows
of their own; Table 2 with LAION's clip_benchmark (OpenAI templates and class names, R@5 per image and per
caption); Figure 3 zero-shot with ImageNet-R / -A scored on their 200 classes; MMVP-VLM with the official
scoring (`hf_vrl.metrics.mmvp`). Each cell is kept in --output-dir/cells/ as it is measured: a stopped run
resumes at the first missing cell.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hf_vrl.errors import UserError
from hf_vrl.methods.diffclip.paper import (
    CLASSIFICATION_SETS,
    FIG3_COLUMNS,
    FIG3_STATED_OOD_GAIN,
    PAPER_TABLES,
    TABLE3_LMMS,
)
from hf_vrl.paper_eval import (
    MMVP_SHORT_NAMES,
    CellCache,
    LazyModels,
    TableCells,
    TableData,
    add_llava_arguments,
    add_model_and_data_arguments,
    data_help,
    few_shot_episodes,
    llava_table_command,
    load_model,
    main_with_user_errors,
    mmvp_row,
    paper_comparison,
    parse_labelled,
    percent,
    ran_header,
    write_measured,
)

CLASSIFICATION_KEYS = dict(
    zip(
        CLASSIFICATION_SETS,
        ("caltech101", "dtd", "pets", "flowers", "sun397", "aircraft", "cifar10", "cifar100", "food101"),
    )
)
RETRIEVAL_KEYS = {"Flickr30k": "flickr30k", "Flickr8k": "flickr8k", "MSCOCO": "mscoco"}
FIG3_KEYS = dict(
    zip(FIG3_COLUMNS, ("imagenet", "imagenet-v2", "imagenet-a", "imagenet-r", "imagenet-sketch"))
)
TABLE_SETS = {
    "1": list(CLASSIFICATION_KEYS.values()),
    "2": [*RETRIEVAL_KEYS.values(), "imagenet"],
    "fig3": list(FIG3_KEYS.values()),
    "mmvp": ["mmvp_vlm"],
}
TABLE_COLUMNS = {  # the columns of each printed table that each set fills (None: all; averages follow)
    "1-linear": {key: [name, "Avg."] for name, key in CLASSIFICATION_KEYS.items()},
    "1-fewshot": {key: [name, "Avg."] for name, key in CLASSIFICATION_KEYS.items()},
    "2": {
        key: [f"image R@5 {n}", f"text R@5 {n}", "image R@5 Avg.", "text R@5 Avg."]
        for n, key in RETRIEVAL_KEYS.items()
    }
    | {"imagenet": ["zero-shot ImageNet"]},
    "fig3": {key: [column, "OOD avg."] for column, key in FIG3_KEYS.items()},
    "mmvp": {"mmvp_vlm": None},
}

Row = dict[str, Any]


def _mean_std(values: list[float]) -> tuple[float, float] | float:
    return (statistics.mean(values), statistics.pstdev(values)) if len(values) > 1 else values[0]


def _average(row: Row, columns: list[str]) -> float | None:
    """The mean of `row`'s cells in `columns` (means of (mean, std) pairs), None unless all are there."""
    values = [row[c][0] if isinstance(row.get(c), tuple) else row.get(c) for c in columns]
    return statistics.mean(values) if values and None not in values else None


def _probes(loaded: tuple, table: TableCells, args: argparse.Namespace, key: str) -> dict[str, list[float]]:
    """Linear-probe and few-shot top-1 (%) per seed on set `key` (LGSSL's protocol)."""
    from hf_vrl import metrics
    from hf_vrl.evaluation import encode_images

    model, image_processor, _ = loaded
    train = table.data.load(key, "train", limit=args.train_limit)
    test = table.data.load(key, "test")
    x_train, x_test = (
        encode_images(model, image_processor, d["image"], batch_size=args.batch_size) for d in (train, test)
    )
    y_train, y_test = train["label"], test["label"]
    return {
        "linear": [
            100 * metrics.linear_probe(x_train, y_train, x_test, y_test, seed=s)["accuracy"]
            for s in args.seeds
        ],
        "fewshot": [
            100
            * few_shot_episodes(x_train, y_train, x_test, y_test, episodes=args.episodes, seed=s)[
                "accuracy_mean"
            ]
            for s in args.seeds
        ],
    }


def table1(table: TableCells, args: argparse.Namespace) -> dict[str, dict[str, Row]]:
    """{"1-linear", "1-fewshot"}: per model and set, top-1 (%) over seeds, and the average over the sets."""
    linear: dict[str, Row] = {label: {} for label in table.models}
    fewshot: dict[str, Row] = {label: {} for label in table.models}
    for column, key in CLASSIFICATION_KEYS.items():
        if key in args.sets:
            for label in table.models:
                probes = table.cell(label, key, _probes, table, args, key)
                linear[label][column] = _mean_std(probes["linear"])
                fewshot[label][column] = _mean_std(probes["fewshot"])
    for rows in (linear, fewshot):
        for row in rows.values():
            row["Avg."] = _average(row, list(CLASSIFICATION_KEYS))
    return {"1-linear": linear, "1-fewshot": fewshot}


def _scores(
    loaded: tuple, table: TableCells, args: argparse.Namespace, label: str, key: str, task: str
) -> dict:
    """`evaluate_clip`'s `task` section on set `key` (clip_benchmark protocol)."""
    from hf_vrl.evaluation import evaluate_clip

    model, image_processor, tokenizer = loaded
    report = evaluate_clip(
        model,
        image_processor,
        tokenizer,
        table.data.load(key),
        tasks=[task],
        protocol="clip_benchmark",
        dataset_name=key,
        mirror=table.data.mirror(key),
        batch_size=args.batch_size,
        seed=args.seed,
    )
    if task not in report:
        raise UserError(f"{label} on {key}: {report['skipped'][task]}")
    return report[task]


def _evaluate(table: TableCells, args: argparse.Namespace, key: str, task: str) -> dict[str, dict[str, Any]]:
    """{label: evaluate_clip's `task` section} on benchmark `key`, cell by cell."""
    return {label: table.cell(label, key, _scores, table, args, label, key, task) for label in table.models}


def table2(table: TableCells, args: argparse.Namespace) -> dict[str, dict[str, Row]]:
    """Image and text R@5 on the three retrieval sets with their averages, zero-shot ImageNet top-1 (%)."""
    rows: dict[str, Row] = {label: {} for label in table.models}
    for name, key in RETRIEVAL_KEYS.items():
        if key in args.sets:
            for label, scores in _evaluate(table, args, key, "retrieval").items():
                rows[label][f"image R@5 {name}"] = percent(scores, "t2i_R@5")
                rows[label][f"text R@5 {name}"] = percent(scores, "i2t_R@5")
    if "imagenet" in args.sets:
        for label, scores in _evaluate(table, args, "imagenet", "zero_shot").items():
            rows[label]["zero-shot ImageNet"] = 100 * scores["top1"]
    for row in rows.values():
        for side in ("image", "text"):
            row[f"{side} R@5 Avg."] = _average(row, [f"{side} R@5 {name}" for name in RETRIEVAL_KEYS])
    return {"2": rows}


def fig3(table: TableCells, args: argparse.Namespace) -> dict[str, dict[str, Row]]:
    """Zero-shot top-1 (%) on ImageNet and its four OOD variants, and the OOD average."""
    rows: dict[str, Row] = {label: {} for label in table.models}
    for column, key in FIG3_KEYS.items():
        if key in args.sets:
            for label, scores in _evaluate(table, args, key, "zero_shot").items():
                rows[label][column] = 100 * scores["top1"]
    for row in rows.values():
        row["OOD avg."] = _average(row, FIG3_COLUMNS[1:-1])
    return {"fig3": rows}


def _mmvp(loaded: tuple, table: TableCells, args: argparse.Namespace) -> dict[str, float]:
    from hf_vrl.evaluation import evaluate_mmvp

    model, image_processor, tokenizer = loaded
    pairs = table.data.mmvp()
    return mmvp_row(evaluate_mmvp(model, image_processor, tokenizer, pairs, batch_size=args.batch_size))


def mmvp(table: TableCells, args: argparse.Namespace) -> dict[str, dict[str, Row]]:
    """MMVP-VLM accuracy per visual pattern and their mean (%)."""
    return {"mmvp": {label: table.cell(label, "mmvp_vlm", _mmvp, table, args) for label in table.models}}


TABLES = {"1": table1, "2": table2, "fig3": fig3, "mmvp": mmvp}


def marked_columns(name: str, data: TableData, columns: Sequence[str]) -> list[str]:
    """The columns of printed table `name` measured on a partial set (or a subset)."""
    marked: list[str] = []
    for key, filled in TABLE_COLUMNS[name].items():
        if data.partial(key):
            marked += list(columns) if filled is None else filled
    return marked


def load_any(path: str, tokenizer: str, device: str | None) -> tuple[Any, Any, Any]:
    """A model folder or Hub id (`hf-vrl eval`'s loading), or a released checkpoint file converted here."""
    if not Path(path).is_file():
        return load_model(path, device=device)
    from transformers import AutoTokenizer

    from hf_vrl.methods.diffclip import from_official_checkpoint
    from hf_vrl.methods.diffclip.processors import slip_image_processor

    model = from_official_checkpoint(path)
    if device:
        model.to(device)
    return model.eval(), slip_image_processor(), AutoTokenizer.from_pretrained(tokenizer)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python examples/reproduce_diffclip.py",
        description=__doc__,
        epilog=data_help([key for sets in TABLE_SETS.values() for key in sets]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--table",
        choices=[*TABLES, "3", "miniature"],
        required=True,
        help="1, 2, 3 (POPE of LLaVAs, lmms-eval), fig3 (Figure 3), mmvp, or miniature (train CLIP and "
        "DiffCLIP on the cluttered world)",
    )
    add_model_and_data_arguments(
        parser, model_required=False, model_example='"DiffCLIP (CC12M)=models/diffclip"'
    )
    parser.add_argument(
        "--sets", nargs="+", help="only these benchmarks (Table 3: columns; default: all the table's)"
    )
    parser.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        default=[0, 1, 2],
        help="Table 1's probe and episode seeds; miniature runs",
    )
    parser.add_argument("--episodes", type=int, default=5000, help="few-shot episodes per seed (LGSSL: 5000)")
    parser.add_argument(
        "--limit",
        type=int,
        help="evaluate a seeded subset of this many test images per set (Table 3: each task's first N)",
    )
    parser.add_argument(
        "--train-limit", type=int, help="Table 1: a seeded subset of this many training images"
    )
    parser.add_argument(
        "--tokenizer",
        default="openai/clip-vit-base-patch16",
        help="the OpenAI BPE tokenizer for released checkpoint files",
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--device", help="e.g. cuda (default: the CPU)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the --limit subsets")
    parser.add_argument("--output", help="also write the measured numbers to this JSON file")
    add_llava_arguments(parser)
    miniature = parser.add_argument_group(
        "--table miniature (--output-dir: data and a run per arch and seed)"
    )
    miniature.add_argument("--steps", type=int, default=300, help="optimisation steps per run (the demo's)")
    miniature.add_argument("--train-size", type=int, default=2000, help="cluttered training images")
    miniature.add_argument("--test-size", type=int, default=500, help="cluttered test images")
    miniature.add_argument("--distractors", type=int, default=2, help="faded distractor scenes per image")
    return parser


def miniature(args: argparse.Namespace) -> int:
    """Train CLIP and DiffCLIP on the cluttered world per seed (`hf_vrl.demo.dual_encoder`, resumable) and
    print the after-training metrics as mean ± std over seeds, with DiffCLIP − CLIP paired by seed."""
    from hf_vrl import demo
    from hf_vrl.evaluation import text_table
    from hf_vrl.methods.diffclip.clutter import cluttered_splits

    out = Path(args.output_dir or "runs/diffclip-clutter")
    data = out / "data"
    if not (data / "dataset_dict.json").is_file():
        splits = cluttered_splits(args.train_size, args.test_size, distractors=args.distractors)
        splits.save_to_disk(str(data))
    after: dict[str, dict[str, list[float]]] = {"CLIP": {}, "DiffCLIP": {}}
    for seed in args.seeds:
        for arch, name in (("clip", "CLIP"), ("diffclip", "DiffCLIP")):
            options = ["--dataset", str(data), "--steps", str(args.steps), "--seed", str(seed)]
            options += ["--eval-limit", str(args.test_size), "--workers", "0"]
            run_args = demo._build_parser().parse_args(options)  # the demo's recipe, defaults included
            report = demo.dual_encoder(arch)(run_args, out / f"{arch}-seed{seed}")[arch]
            for metric in demo.DUAL_ENCODER_METRICS:
                task, key = metric.split(".")
                after[name].setdefault(metric, []).append(100 * report["after"][task][key])
    rows = [["", "CLIP", "DiffCLIP", "DiffCLIP − CLIP"]]
    for metric in demo.DUAL_ENCODER_METRICS:
        clip, diffclip = after["CLIP"][metric], after["DiffCLIP"][metric]
        differences = [d - c for c, d in zip(clip, diffclip)]
        rows.append([metric, *(_spread(values) for values in (clip, diffclip, differences))])
    print(f"\nCluttered shapes world, after training, percent, mean ± std over seeds {args.seeds}:")
    print(text_table(rows, left_columns=1))
    print(f"runs: {out}/<arch>-seed<N>/ (report.json, final/)")
    return write_measured(args.output, {"table": "miniature", "seeds": args.seeds, "after": after})


def _spread(values: list[float]) -> str:
    mean, std = (statistics.mean(values), statistics.pstdev(values)) if len(values) > 1 else (values[0], 0.0)
    return f"{mean:.1f} ± {std:.1f}"


def run(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.table == "miniature":
        return miniature(args)
    if args.table == "3":
        title = f"DiffCLIP Table 3: {PAPER_TABLES['3'].title}, TinyLLaVA (Qwen-2.5-0.5B) in the paper"
        rows = PAPER_TABLES["3"].rows
        measured = llava_table_command(
            args, TABLE3_LMMS, rows, title, default_dir="runs/diffclip-table3", digits=2
        )
        return write_measured(args.output, {"table": args.table, "measured": {"3": measured}})
    if not args.model:
        raise UserError(f"--table {args.table} evaluates models: pass --model [LABEL=]PATH (repeatable)")
    args.sets = args.sets or TABLE_SETS[args.table]
    unknown = sorted(set(args.sets) - set(TABLE_SETS[args.table]))
    if unknown:
        raise UserError(f"--sets {unknown}: --table {args.table} uses {TABLE_SETS[args.table]}")
    paths = parse_labelled(args.model, "--model")
    check_models(paths.values())
    data = TableData(
        args.data_root, parse_labelled(args.source, "--source"), args.allow_partial, args.limit, args.seed
    )
    for key in args.sets:  # every set loaded and counted before the first model
        if key == "mmvp_vlm":
            data.mmvp()
        else:
            if args.table == "1":
                data.load(key, "train", limit=args.train_limit)
            data.load(key)
    settings = {"limit": args.limit, "seed": args.seed}
    if args.table == "1":
        settings |= {"seeds": args.seeds, "episodes": args.episodes, "train_limit": args.train_limit}
    table = TableCells(
        LazyModels(paths, lambda path: load_any(path, args.tokenizer, args.device)),
        data,
        CellCache(args.output_dir or f"runs/diffclip-table{args.table}", f"table{args.table}"),
        settings,
        # the tokenizer of released checkpoint files (a folder has its own)
        also={"tokenizer": args.tokenizer} if any(Path(p).is_file() for p in paths.values()) else {},
    )
    measured = TABLES[args.table](table, args)
    header = {
        "models": paths,
        "data": {name: record["described"] for name, record in data.counts.items()},
        "seeds": args.seeds if args.table == "1" else None,
        "limit": args.limit,
        "cells": str(table.cache.folder),
    }
    for name, rows in measured.items():
        paper = PAPER_TABLES[name]
        what = "Figure 3" if name == "fig3" else "Figure 4" if name == "mmvp" else f"Table {paper.number}"
        print(ran_header(f"\nDiffCLIP {what}: {paper.title}; paper / measured", header))
        columns, paper_rows = paper.columns, dict(paper.rows)
        if name == "mmvp":  # the paper gives the averages only
            columns = (*MMVP_SHORT_NAMES.values(), *paper.columns)
            paper_rows = {row: (None,) * len(MMVP_SHORT_NAMES) + values for row, values in paper.rows.items()}
        differs = None
        if (
            name.startswith("1-") and len(args.seeds) > 1
        ):  # Table 1 is one run; Appendix B's 3 seeds: not stored
            differs = f"mean ± std over {len(args.seeds)} seeds; the paper's Table 1 is one run"
        marked = marked_columns(name, data, columns)
        print(paper_comparison(columns, paper_rows, rows, marked=marked, differs=differs))
    for note in data.notes():
        print(note)
    for key, note in table.notes.items():
        print(f"{key}: {note}")
    if args.table == "fig3":
        print(
            "(the paper gives Figure 3 as bars; its text: DiffCLIP "
            f"+{FIG3_STATED_OOD_GAIN} on the OOD average over CLIP)"
        )
    return write_measured(args.output, {"table": args.table, "measured": measured}, data)


def check_models(paths: Sequence[str]) -> None:
    """Each model (a folder, Hub id or released checkpoint file) can be loaded: a one-line UserError
    otherwise, before any data is scored."""
    from hf_vrl.run.preflight import check_source

    for path in paths:
        if not Path(path).is_file():
            check_source(path, "--model")


def main(argv: list[str] | None = None) -> int:
    return main_with_user_errors(run, argv)


if __name__ == "__main__":
    sys.exit(main())
