"""Reproduce DCR's evaluation tables with given models: Table 1 (MMVP-VLM per visual pattern, P-ability),
Table 2 (zero-shot clustering on six benchmarks, D-ability), Table 3 (LLaVA-1.5 on MLLM benchmarks, through
lmms-eval) and Table 6 (zero-shot classification and retrieval), printed "paper / measured" beside the
paper's rows (`hf_vrl.methods.dcr.paper`).

    python examples/reproduce_dcr.py --table 1 --data-root /data \\
        --model Original=openai/clip-vit-large-patch14 --model Ours=runs/dcr-openai-l14-224/final

    python examples/reproduce_dcr.py --table 3 --model Original=runs/llava-clip --model Ours=runs/llava-dcr

`--table 3` scores LLaVA folders (`hf-vrl export-llava` / `llava-align`) with lmms-eval (`hf-vrl
llava-eval`, `pip install "hf-vrl[llava-eval]"`), one run per model into --eval-dir (default
runs/dcr-table3/<label>/), on mmvp, naturalbench, cv_bench_2d, cv_bench_3d, pope_random / pope_pop /
pope_adv, scienceqa_img and hallusion_bench_image (`TABLE3_LMMS` in `hf_vrl.methods.dcr.paper` gives each
column's metric, and where it had to be inferred: MMVP pair accuracy, POPE F1, HallusionBench's mean of aAcc,
fAcc and qAcc, which lmms-eval judges with GPT: OPENAI_API_KEY). `--task "POPE rand=my_task:exact_match"`
scores a column with another task (one of your own in --include-path), `--sets "POPE rand"` picks columns,
--limit takes the first N samples of each task (NaturalBench needs all).

A model labelled with a paper row's name (Original, Ours, DIVA, GenHancer, ...) fills that row; others get
rows of their own. Models: a CLIP folder or Hub id (a DCR run's final/ is the base CLIP with the enhanced
tower, as the official release), or the DCRModel export (exports/dcr-model), which needs --text-model for
Tables 1 and 6 (the original CLIP: the paper scores the enhanced image embedding against the original text
tower); the plain vision tower (exports/vision-tower) serves Table 2.

--data-root holds one folder per benchmark, named by its key (or pass --source KEY=NAME[@SPLIT], e.g.
--source cifar10=hf:uoft-cs/cifar10), in one of the layouts its publisher ships (listed at the end of --help):
mmvp_vlm/ (Table 1), mnist/ cifar10/ eurosat/ caltech101/ dtd/ imagenet/ (Tables 2 and 6: the test split;
ImageNet's test is its validation set), flickr30k/ mscoco/ (Table 6: Karpathy's test splits). Without
--data-root or --source a set is read from its Hub mirror (hf:clip-benchmark/wds_<name>, with the mirror's own
class names, templates and counts; noted beside the table with where it differs). Every set is
counted against the official numbers before a model is loaded; a partial copy is refused, or scored with
--allow-partial and its cells marked. Clustering is k-means with k = the number of classes on L2-normalised
image embeddings (NMI / ACC / ARI, App. E.4); zero-shot and retrieval follow LAION's clip_benchmark (OpenAI's
templates and class names; R@5 per image and per caption). Each cell is kept in --output-dir/cells/ as it is
measured: a stopped run resumes at the first missing cell.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable, Sequence
from typing import Any

from hf_vrl.errors import UserError
from hf_vrl.methods.dcr.paper import (
    CLUSTERING_SETS,
    PAPER_TABLES,
    TABLE3_LMMS,
    TABLE6_CLASSIFICATION,
)
from hf_vrl.paper_eval import (
    CellCache,
    LazyModels,
    TableCells,
    TableData,
    add_llava_arguments,
    add_model_and_data_arguments,
    data_help,
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

CLUSTERING_KEYS = dict(zip(CLUSTERING_SETS, ("mnist", "cifar10", "eurosat", "caltech101", "dtd", "imagenet")))
CLASSIFICATION_KEYS = dict(zip(TABLE6_CLASSIFICATION, CLUSTERING_KEYS.values()))
RETRIEVAL_KEYS = {"Flickr30k": "flickr30k", "COCO": "mscoco"}
TABLE_SETS = {
    1: ["mmvp_vlm"],
    2: list(CLUSTERING_KEYS.values()),
    6: [*CLASSIFICATION_KEYS.values(), *RETRIEVAL_KEYS.values()],
}
TABLE_COLUMNS = {  # the columns each set's cells fill
    1: {"mmvp_vlm": None},  # every column
    2: {key: [f"{name} {m}" for m in ("NMI", "ACC", "ARI")] for name, key in CLUSTERING_KEYS.items()},
    6: {key: [name] for name, key in CLASSIFICATION_KEYS.items()}
    | {key: [f"Image@5 {name}", f"Text@5 {name}"] for name, key in RETRIEVAL_KEYS.items()},
}


def _mmvp(loaded: tuple, table: TableCells, args: argparse.Namespace, label: str) -> dict[str, float]:
    from hf_vrl.evaluation import evaluate_mmvp, has_text_tower

    model, image_processor, tokenizer = loaded
    if not has_text_tower(model):
        raise UserError(f"{label} has no text tower; MMVP-VLM needs --text-model (the original CLIP)")
    pairs = table.data.mmvp()
    return mmvp_row(evaluate_mmvp(model, image_processor, tokenizer, pairs, batch_size=args.batch_size))


def table1(table: TableCells, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """MMVP-VLM accuracy per visual pattern and their mean (the paper's Avg), percent."""
    return {label: table.cell(label, "mmvp_vlm", _mmvp, table, args, label) for label in table.models}


def _scores(
    loaded: tuple, table: TableCells, args: argparse.Namespace, label: str, key: str, task: str
) -> dict[str, Any]:
    """`evaluate_clip`'s `task` section on set `key`."""
    from hf_vrl.evaluation import evaluate_clip

    model, image_processor, tokenizer = loaded
    report = evaluate_clip(
        model,
        image_processor,
        tokenizer,
        table.data.load(key),
        tasks=[task],
        dataset_name=key,
        mirror=table.data.mirror(key),
        batch_size=args.batch_size,
        seed=args.seed,
    )
    if task not in report:
        raise UserError(f"{label} on {key}: {report['skipped'][task]} (a vision tower needs --text-model)")
    return report[task]


def _per_set(
    table: TableCells, args: argparse.Namespace, keys: dict[str, str], task: str, cells: Callable
) -> dict[str, dict[str, float]]:
    """{label: {column: value}} from `evaluate_clip(tasks=[task])` on each set in `keys` ({column: key})."""
    out: dict[str, dict[str, float]] = {label: {} for label in table.models}
    for column, key in keys.items():
        if key in args.sets:
            for label in table.models:
                scores = table.cell(label, key, _scores, table, args, label, key, task)
                out[label] |= cells(column, scores)
    return out


def table2(table: TableCells, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """NMI / ACC / ARI of k-means on each set's image embeddings, and their means over the six sets."""
    out = _per_set(
        table,
        args,
        CLUSTERING_KEYS,
        "clustering",
        lambda name, scores: {f"{name} {m.upper()}": scores[m] for m in ("nmi", "acc", "ari")},
    )
    for row in out.values():  # the paper's averages are over all six sets
        for metric in ("NMI", "ACC", "ARI"):
            values = [row.get(f"{name} {metric}") for name in CLUSTERING_KEYS]
            row[f"Avg {metric}"] = None if None in values else statistics.mean(values)
    return out


def table6(table: TableCells, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Zero-shot top-1 on six sets and image / text R@5 on Flickr30k and COCO, percent."""
    out = _per_set(
        table, args, CLASSIFICATION_KEYS, "zero_shot", lambda name, scores: {name: 100 * scores["top1"]}
    )

    def recall(name: str, scores: dict[str, float]) -> dict[str, float]:
        return {f"Image@5 {name}": percent(scores, "t2i_R@5"), f"Text@5 {name}": percent(scores, "i2t_R@5")}

    for label, row in _per_set(table, args, RETRIEVAL_KEYS, "retrieval", recall).items():
        out[label] |= row
    return out


TABLES = {1: table1, 2: table2, 6: table6}  # and Table 3: LLaVAs through lmms-eval (`run`)
TABLE3_LLM = "Vicuna-7B"


def marked_columns(table: int, data: TableData, columns: Sequence[str]) -> list[str]:
    """The columns measured on a partial set (or a subset), and the averages over them."""
    marked = []
    for key, filled in TABLE_COLUMNS[table].items():
        if data.partial(key):
            marked += list(columns) if filled is None else filled
    if table == 2 and marked:
        marked += [f"Avg {metric}" for metric in ("NMI", "ACC", "ARI")]
    return marked


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python examples/reproduce_dcr.py",
        description=__doc__,
        epilog=data_help([k for sets in TABLE_SETS.values() for k in sets]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--table",
        type=int,
        choices=sorted([*TABLES, 3]),
        required=True,
        help="1 (MMVP-VLM), 2 (zero-shot clustering), 3 (LLaVA-1.5 on MLLM benchmarks, lmms-eval) or 6 "
        "(zero-shot classification and retrieval)",
    )
    add_model_and_data_arguments(
        parser, model_required=True, model_example="Ours=runs/dcr/final (a paper row's name fills that row)"
    )
    parser.add_argument(
        "--backbone",
        default="OpenAI ViT-L-14 224",
        help="the paper's block to print (Tables 1 and 2; Table 6 names none, Table 3 has Vicuna-7B only): "
        + "; ".join(PAPER_TABLES[1]),
    )
    parser.add_argument("--text-model", help="the text tower for vision-only models (the original CLIP)")
    parser.add_argument(
        "--sets", nargs="+", help="only these benchmarks (Table 3: columns; default: all the table's)"
    )
    parser.add_argument(
        "--limit",
        type=int,
        help="evaluate a seeded subset of this many images per set (Table 3: each task's first N)",
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--device", help="e.g. cuda (default: the CPU)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", help="also write the measured numbers to this JSON file")
    add_llava_arguments(parser)
    return parser


def run(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.table == 3:
        paper = PAPER_TABLES[3][TABLE3_LLM]
        title = f"DCR Table 3: {paper.title}"
        measured = llava_table_command(args, TABLE3_LMMS, paper.rows, title, default_dir="runs/dcr-table3")
        return write_measured(args.output, {"table": 3, "backbone": TABLE3_LLM, "measured": measured})
    if not args.model:
        raise UserError(f"--table {args.table} evaluates models: pass --model [LABEL=]PATH (repeatable)")
    args.sets = args.sets or TABLE_SETS[args.table]
    unknown = sorted(set(args.sets) - set(TABLE_SETS[args.table]))
    if unknown:
        raise UserError(f"--sets {unknown}: Table {args.table} uses {TABLE_SETS[args.table]}")
    blocks = PAPER_TABLES[args.table]
    backbone = "unstated" if args.table == 6 else args.backbone  # Table 6 names no backbone
    if backbone not in blocks:
        raise UserError(f"--backbone {backbone!r}: Table {args.table} has {', '.join(blocks)}")
    paper = blocks[backbone]
    paths = parse_labelled(args.model, "--model")
    check_models([*paths.values(), args.text_model])
    sources = parse_labelled(args.source, "--source")
    data = TableData(args.data_root, sources, args.allow_partial, args.limit, args.seed)
    for key in args.sets:  # every set loaded and counted before the first model
        data.mmvp() if key == "mmvp_vlm" else data.load(key)
    output = args.output_dir or f"runs/dcr-table{args.table}"
    table = TableCells(
        LazyModels(paths, lambda path: load_model(path, args.text_model, args.device)),
        data,
        CellCache(output, f"table{args.table}-{backbone}"),
        {"limit": args.limit, "seed": args.seed},
        also={"text_model": args.text_model},
    )
    measured = TABLES[args.table](table, args)
    header = {
        "models": paths,
        "text model": args.text_model,
        "data": {name: record["described"] for name, record in data.counts.items()},
        "limit": args.limit,
        "cells": str(table.cache.folder),
    }
    print(ran_header(f"\nDCR Table {args.table}: {paper.title} ({backbone}); paper / measured", header))
    marked = marked_columns(args.table, data, paper.columns)
    digits = 2 if args.table == 2 else 1
    print(paper_comparison(paper.columns, paper.rows, measured, digits=digits, marked=marked))
    for note in data.notes():
        print(note)
    for key, note in table.notes.items():
        print(f"{key}: {note}")
    record = {"table": args.table, "backbone": backbone, "measured": measured}
    return write_measured(args.output, record, data)


def check_models(paths: Sequence[str | None]) -> None:
    """Each model path or Hub id can be loaded (a one-line UserError otherwise), before any data is scored."""
    from hf_vrl.run.preflight import check_source

    for path in paths:
        check_source(path, "--model")


def main(argv: list[str] | None = None) -> int:
    return main_with_user_errors(run, argv)


if __name__ == "__main__":
    sys.exit(main())
