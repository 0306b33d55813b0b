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

--data-root holds one folder per benchmark (or pass --source KEY=NAME[@SPLIT], e.g.
--source cifar10=hf:uoft-cs/cifar10):

    mmvp_vlm/                              Table 1: the official MMVP-VLM folder (Questions.csv, images)
    mnist/ cifar10/ eurosat/ caltech101/ dtd/ imagenet/     Tables 2 and 6 (the test split; ImageNet's
                                           validation images as imagenet/test/)
    flickr30k/ mscoco/                     Table 6: retrieval test sets (image + caption, a list per image)

each an image folder with one folder per class inside each split folder, a save_to_disk folder or parquet
files (`test-*.parquet`). Clustering is k-means with k = the number of classes on L2-normalised image
embeddings (NMI / ACC / ARI, App. E.4); zero-shot and retrieval follow LAION's clip_benchmark (OpenAI's
templates and class names; R@5 per image and per caption).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from typing import Any

from hf_vrl.errors import UserError
from hf_vrl.methods.dcr.paper import (
    CLUSTERING_SETS,
    PAPER_TABLES,
    TABLE3_LMMS,
    TABLE6_CLASSIFICATION,
)
from hf_vrl.paper_eval import (
    add_llava_arguments,
    add_model_and_data_arguments,
    check_sources,
    llava_table_command,
    load_benchmark,
    load_model,
    load_retrieval,
    main_with_user_errors,
    mmvp_row,
    mmvp_source,
    paper_comparison,
    parse_labelled,
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

Models = dict[str, tuple[Any, Any, Any]]


def table1(models: Models, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """MMVP-VLM accuracy per visual pattern and their mean (the paper's Avg), percent."""
    from hf_vrl.evaluation import evaluate_mmvp, has_text_tower

    pairs = mmvp_source(args.data_root, args.sources)
    out = {}
    for label, (model, image_processor, tokenizer) in models.items():
        if not has_text_tower(model):
            raise UserError(f"{label} has no text tower; MMVP-VLM needs --text-model (the original CLIP)")
        out[label] = mmvp_row(
            evaluate_mmvp(model, image_processor, tokenizer, pairs, batch_size=args.batch_size)
        )
    return out


def _per_set(models: Models, args: argparse.Namespace, keys: dict[str, str], task: str, cells: Callable):
    """{label: {column: value}} from `evaluate_clip(tasks=[task])` on each set in `keys` ({column: key})."""
    from hf_vrl.evaluation import evaluate_clip
    from hf_vrl.paper_eval import BENCHMARKS

    out: dict[str, dict[str, float]] = {label: {} for label in models}
    for column, key in keys.items():
        if key not in args.sets:
            continue
        load = load_retrieval if task == "retrieval" else load_benchmark
        dataset = load(key, args.data_root, args.sources, limit=args.limit, seed=args.seed)
        for label, (model, image_processor, tokenizer) in models.items():
            report = evaluate_clip(
                model,
                image_processor,
                tokenizer,
                dataset,
                tasks=[task],
                dataset_name=BENCHMARKS[key].name,
                batch_size=args.batch_size,
                seed=args.seed,
            )
            if task not in report:
                raise UserError(
                    f"{label} on {key}: {report['skipped'][task]} (a vision tower needs --text-model)"
                )
            out[label] |= cells(column, report[task])
    return out


def table2(models: Models, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """NMI / ACC / ARI of k-means on each set's image embeddings, and their means over the six sets."""
    out = _per_set(
        models,
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


def table6(models: Models, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Zero-shot top-1 on six sets and image / text R@5 on Flickr30k and COCO, percent."""
    out = _per_set(
        models, args, CLASSIFICATION_KEYS, "zero_shot", lambda name, scores: {name: 100 * scores["top1"]}
    )

    def recall(name: str, scores: dict[str, float]) -> dict[str, float]:
        return {f"Image@5 {name}": 100 * scores["t2i_R@5"], f"Text@5 {name}": 100 * scores["i2t_R@5"]}

    for label, row in _per_set(models, args, RETRIEVAL_KEYS, "retrieval", recall).items():
        out[label] |= row
    return out


TABLES = {1: table1, 2: table2, 6: table6}  # and Table 3: LLaVAs through lmms-eval (`run`)
TABLE3_LLM = "Vicuna-7B"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python examples/reproduce_dcr.py",
        description=__doc__,
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
    args.sources = parse_labelled(args.source, "--source")
    args.sets = args.sets or TABLE_SETS[args.table]
    unknown = sorted(set(args.sets) - set(TABLE_SETS[args.table]))
    if unknown:
        raise UserError(f"--sets {unknown}: Table {args.table} uses {TABLE_SETS[args.table]}")
    blocks = PAPER_TABLES[args.table]
    backbone = "unstated" if args.table == 6 else args.backbone  # Table 6 names no backbone
    if backbone not in blocks:
        raise UserError(f"--backbone {backbone!r}: Table {args.table} has {', '.join(blocks)}")
    paper = blocks[backbone]
    check_sources(args.sets, args.data_root, args.sources)
    models = {
        label: load_model(path, args.text_model, args.device)
        for label, path in parse_labelled(args.model, "--model").items()
    }
    measured = TABLES[args.table](models, args)
    print(f"\nDCR Table {args.table}: {paper.title} ({backbone}); paper / measured")
    print(paper_comparison(paper.columns, paper.rows, measured, digits=2 if args.table == 2 else 1))
    return write_measured(args.output, {"table": args.table, "backbone": backbone, "measured": measured})


def main(argv: list[str] | None = None) -> int:
    return main_with_user_errors(run, argv)


if __name__ == "__main__":
    sys.exit(main())
