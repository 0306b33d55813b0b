"""`hf-vrl eval`: evaluate a CLIP-like model or vision tower on a dataset (`hf_vrl.evaluation.evaluate_clip`),
write report.json and figures, print the summary."""

from __future__ import annotations

import argparse
import logging
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from hf_vrl import eval_inputs, evaluation
from hf_vrl.data.images import SampleFilter
from hf_vrl.run.data import rows_summary
from hf_vrl.run.layout import OutputDir, atomic_write_json

logger = logging.getLogger(__name__)


def _limit(value: str) -> int | None:
    """argparse type: a positive count, or "all" for no limit."""
    if value == "all":
        return None
    count = int(value)
    if count < 1:
        raise argparse.ArgumentTypeError(f"expected a positive count or 'all', got {value}")
    return count


def dataset_help() -> str:
    """What --dataset takes, from the registry: its names, its prefixes, and each benchmark's layouts."""
    from hf_vrl.data import registry
    from hf_vrl.data.layouts import layouts_help

    prefixes = ", ".join(f"{prefix}:<path>" for prefix in registry.PREFIXES)
    return "\n".join(
        [
            f"--dataset names: {', '.join(registry.NAMED)}; or PREFIX:<path>, one of:",
            textwrap.fill(prefixes, width=100, initial_indent="  ", subsequent_indent="  "),
            "a bare path is recognised (a benchmark's annotated layout, shards, a save_to_disk folder, an",
            "image folder). The benchmarks (<key>:<path>), each read from one of its published layouts:",
            layouts_help(),
        ]
    )


def _build_parser() -> argparse.ArgumentParser:
    from hf_vrl.data.prompts import OPENAI_TEMPLATES

    parser = argparse.ArgumentParser(
        prog="hf-vrl eval",
        description=textwrap.fill(
            "Evaluate a CLIP-like model (CLIPModel, SiglipModel, DiffCLIP, ...) or a vision tower: "
            "zero-shot classification, retrieval, clustering, linear probe, CLUE granularity metrics "
            "(CDNV, NCC), RSA against a reference model and MMVP-VLM. Logs progress per task and rewrites "
            "report.json as each task finishes; PNG figures at the end.",
            width=100,
        ),
        epilog=f"{dataset_help()}\n\nexample (after `make demo`): {eval_inputs.EXAMPLE}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", required=True, help="local model directory, hub_configs preset or hub id")
    parser.add_argument(
        "--trust-remote-code", action="store_true", help="allow custom model code from the model dir"
    )
    parser.add_argument(
        "--dataset",
        help="registry name or path: shapes, digits, fashion_mnist, animal_mnist, cub:<root>, "
        "imagefolder:<dir>, hf:<name>, webdataset:<glob>, or a benchmark in its published layout, "
        "<benchmark>:<root> (imagenet, imagenet-r, objectnet, cifar10, flickr30k, ...: "
        "hf_vrl.data.benchmarks), whose image and class counts are checked against the official ones; "
        "<benchmark>:hf:<Hub mirror> or hf:clip-benchmark/wds_<name> reads a benchmark's Hub mirror with its "
        "own class names, templates and counts",
    )
    parser.add_argument(
        "--allow-partial",
        action="store_true",
        help="score a benchmark copy (or MMVP-VLM file) that lacks images or classes; its counts go into "
        "report.json beside the numbers, marked partial",
    )
    parser.add_argument("--split", default="test", help="split to evaluate on (default: test)")
    parser.add_argument(
        "--train-split", default="train", help="split the linear probe trains on (default: train)"
    )
    parser.add_argument(
        "--limit", type=_limit, help="use at most this many evaluation samples (default: all)"
    )
    parser.add_argument(
        "--train-limit",
        type=_limit,
        default=evaluation.DEFAULT_PROBE_TRAIN_LIMIT,
        help="linear-probe training images, a seeded subset of the train split, or 'all' "
        f"(default: {evaluation.DEFAULT_PROBE_TRAIN_LIMIT})",
    )
    parser.add_argument(
        "--probe-c",
        type=float,
        help="the linear probe's C (inverse L2 strength), instead of CLIP's sweep chosen on a validation "
        "split of the train split (which a small copy may be too small for)",
    )
    parser.add_argument("--image-size", type=int, help="resize images to this size when loading the dataset")
    parser.add_argument(
        "--tasks",
        nargs="+",
        default=list(evaluation.DEFAULT_TASKS),
        choices=evaluation.TASKS,
        metavar="TASK",
        help=f"tasks to run, from {', '.join(evaluation.TASKS)} "
        f"(default: {' '.join(evaluation.DEFAULT_TASKS)})",
    )
    parser.add_argument(
        "--protocol",
        choices=evaluation.PROTOCOLS,
        default=evaluation.DEFAULT_PROTOCOL,
        help="zero-shot and retrieval protocol: clip_benchmark (all captions of each image, OpenAI's "
        "templates for the dataset; comparable with published numbers) or hf_vrl (distinct captions, "
        f"hf_vrl's 8 templates) (default: {evaluation.DEFAULT_PROTOCOL})",
    )
    parser.add_argument(
        "--templates",
        choices=sorted(OPENAI_TEMPLATES),
        metavar="SET",
        help="OpenAI template set for zero-shot (default: the dataset's own, else imagenet's 80); one of "
        + ", ".join(sorted(OPENAI_TEMPLATES)),
    )
    parser.add_argument(
        "--reference-model", help="model to compare against for the rsa task (e.g. the pre-trained)"
    )
    parser.add_argument(
        "--mmvp-dir",
        help="MMVP-VLM folder (Questions.csv + 'MLLM_VLM Images/'), or hf:MMVP/MMVP_VLM, to score as well",
    )
    parser.add_argument("--output-dir", required=True, help="folder for report.json and the figures")
    parser.add_argument("--batch-size", type=int, default=64, help="embedding batch size (default: 64)")
    parser.add_argument("--device", help="torch device (default: cuda when available, else cpu)")
    parser.add_argument(
        "--seed", type=int, default=0, help="seed for subsets, k-means and the probe split (default: 0)"
    )
    parser.add_argument(
        "--scatter", choices=("pca", "tsne"), default="pca", help="2-D projection of the scatter"
    )
    parser.add_argument("--no-figures", action="store_true", help="write report.json only")
    return parser


def _write_figures(args, report: dict[str, Any], embeddings: dict[str, Any] | None, out: Path) -> list[str]:
    from hf_vrl import viz

    written = []
    if embeddings is not None:
        path = out / f"embeddings_{args.scatter}.png"
        viz.plot_embedding_scatter(
            embeddings["image"],
            embeddings["labels"],
            class_names=embeddings["class_names"],
            method=args.scatter,
            title=f"{Path(args.model).name} on {args.dataset}/{args.split}",
            path=path,
            seed=args.seed,
        )
        written.append(path.name)
    if "mmvp" in report:
        path = out / "mmvp.png"
        viz.plot_mmvp_categories(report["mmvp"], title=f"MMVP: {Path(args.model).name}", path=path)
        written.append(path.name)
    return written


def _show_progress_logs() -> None:
    """Log hf_vrl's INFO messages (the per-task progress) to stderr unless logging is configured already."""
    package = logging.getLogger("hf_vrl")
    if not package.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
        package.addHandler(handler)
    if package.getEffectiveLevel() > logging.INFO:
        package.setLevel(logging.INFO)


def _summary(report: Mapping[str, Any]) -> str:
    """One line per task: its headline numbers."""
    rows = [["task", "result"]]
    rows += [
        [task, evaluation.headline(result)] for task, result in report.items() if isinstance(result, dict)
    ]
    table = evaluation.text_table([row for row in rows if row[0] != "skipped"], left_columns=2)
    return "\n".join(line.rstrip() for line in table.splitlines())


def main(argv: list[str] | None = None) -> int:
    """`hf-vrl eval`: evaluate a model and write report.json (+ figures) to --output-dir, the report being
    rewritten as each task finishes (`complete` is false until the end). The folder is new, empty or an
    earlier `hf-vrl eval`'s, held by this process until the end (`OutputDir`)."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.dataset is None and args.mmvp_dir is None:
        parser.error("give --dataset, --mmvp-dir or both")
    _show_progress_logs()
    output = OutputDir(Path(args.output_dir), "eval")
    output.check()  # before the checks below read anything: a folder eval must not write is one line
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    from hf_vrl.run.preflight import check_data, check_finished_run, check_remote_code, check_source

    check_finished_run(args.model, "--model")
    check_source(args.model, "--model")  # before loading: one line naming what to change
    check_remote_code(args.model, "--model", args.trust_remote_code)
    check_remote_code(args.reference_model, "--reference-model", args.trust_remote_code)
    check_data(args.dataset, "--dataset")
    dataset = train = None
    counts: dict[str, Any] = {}
    skips = {split: SampleFilter(f"{args.dataset} ({split})") for split in (args.split, args.train_split)}
    if args.dataset is not None:  # the data and its counts before any model is loaded
        data = {"image_size": args.image_size, "seed": args.seed, "allow_partial": args.allow_partial}
        data["tasks"] = args.tasks
        dataset, counts[args.split] = eval_inputs.load_counted_dataset(
            args.dataset, split=args.split, limit=args.limit, sample_filter=skips[args.split], **data
        )
        if "linear_probe" in args.tasks:
            train, counts[args.train_split] = eval_inputs.load_counted_dataset(
                args.dataset,
                split=args.train_split,
                limit=args.train_limit,
                **data,
                sample_filter=skips[args.train_split],
            )
    mmvp = args.mmvp_dir
    if mmvp is not None:
        from hf_vrl.data.benchmarks import BENCHMARKS
        from hf_vrl.data.layouts import counts_of
        from hf_vrl.data.readers import local_copy
        from hf_vrl.metrics import load_mmvp_vlm

        mirror = BENCHMARKS["mmvp_vlm"].mirror(repo_id=mmvp.removeprefix("hf:"))
        mmvp = load_mmvp_vlm(local_copy(mmvp), allow_partial=args.allow_partial)
        counts["mmvp"] = counts_of(mmvp, BENCHMARKS["mmvp_vlm"], "test", mirror).as_dict()
    models = _load_models(args)  # a model that cannot be scored is refused before the folder is written
    with output.claim():  # one writer per folder, until the last report
        return _evaluate(args, device, models, (dataset, train, mmvp), counts, skips)


def _load_models(args: argparse.Namespace) -> tuple[Any, Any, Any, Any]:
    """(model, image processor, tokenizer, the rsa task's reference model or None)."""
    remote = args.trust_remote_code
    model, image_processor, tokenizer = eval_inputs.load_model_and_processors(
        args.model, trust_remote_code=remote
    )
    reference = None
    if "rsa" in args.tasks and args.reference_model:
        reference, _, _ = eval_inputs.load_model_and_processors(
            args.reference_model, trust_remote_code=remote
        )
    return model, image_processor, tokenizer, reference


def _evaluate(
    args: argparse.Namespace,
    device: str,
    models: tuple[Any, Any, Any, Any],
    data: tuple[Any, Any, Any],
    counts: dict[str, Any],
    skips: Mapping[str, SampleFilter],
) -> int:
    """Evaluate `data` (test set, probe's training set, MMVP), write report.json (rewritten as each task
    ends) and the figures; `skips` counts each split's unusable images."""
    model, image_processor, tokenizer, reference = models
    dataset, train, mmvp = data
    model.to(device).eval()
    out = Path(args.output_dir)
    report: dict[str, Any] = {
        "model": args.model,
        "dataset": args.dataset,
        "split": args.split,
        "limit": args.limit,
        "train_limit": args.train_limit if train is not None else None,
        "probe_c": args.probe_c if train is not None else None,
        "protocol": args.protocol,
        "seed": args.seed,
        "skipped_samples": {split: dict(skips[split].counts) for split in skips if split in counts},
        "complete": False,
    }
    counts = {split: record for split, record in counts.items() if record is not None}
    if counts:  # what a benchmark copy held against its official counts (partial: marked)
        report["counts"] = counts
        report["partial"] = not all(record["complete"] for record in counts.values())

    def write(partial: dict[str, Any]) -> None:
        atomic_write_json(out / "report.json", {**report, **partial})

    embeddings = None
    if dataset is not None:
        result, embeddings = evaluation.evaluate_clip(
            model,
            image_processor,
            tokenizer,
            dataset,
            tasks=args.tasks,
            train_dataset=train,
            mmvp=mmvp,
            reference_model=reference,
            templates=args.templates,
            protocol=args.protocol,
            dataset_name=args.dataset,
            data=eval_inputs.data_record(args.dataset, args.split, dataset, limit=args.limit, seed=args.seed),
            mirror=eval_inputs.mirror_prompts(args.dataset),
            batch_size=args.batch_size,
            device=device,
            seed=args.seed,
            probe_cs=None if args.probe_c is None else [args.probe_c],
            return_embeddings=True,
            on_task_end=write,
        )
        report.update(result)
    else:
        report["mmvp"] = evaluation.evaluate_mmvp(
            model, image_processor, tokenizer, mmvp, batch_size=args.batch_size
        )
    if not args.no_figures:
        report["figures"] = _write_figures(args, report, embeddings, out)
    report["complete"] = True
    write(report)
    print(_summary(report))
    for split, skipped in report["skipped_samples"].items():
        print(f"skipped samples ({split}): {rows_summary(skipped)}")
    for split, record in report.get("counts", {}).items():
        if not record["complete"]:
            print(f"PARTIAL {split}: {record['described']} (these numbers are not the benchmark's)")
        if record.get("source"):
            differs = record.get("differs")
            differs = (
                f"; where it differs from hf_vrl's reading of the benchmark: {differs}" if differs else ""
            )
            print(f"MIRROR {split}: scored on {record['source']}{differs}")
    print(f"wrote {out / 'report.json'}")
    return 0
