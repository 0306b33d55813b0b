"""`hf-vrl demo`: the README's main job. Tiny models trained on the embedded data, evaluated before and after.

Each run in RUNS trains one model on the same data with the same seed and returns its before/after reports;
the command prints one table and writes `<output-dir>/demo_report.json`.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

TINY_CLIP = "tiny-clip"
DUAL_ENCODER_PRESET = "diffclip-tiny"
EVAL_TASKS = ("zero_shot", "retrieval", "clustering")
# (report path, column title) of the numbers the table shows
TABLE_COLUMNS = (
    (("zero_shot", "top1"), "zero-shot top-1"),
    (("retrieval", "i2t_R@1"), "i2t R@1"),
    (("retrieval", "t2i_R@1"), "t2i R@1"),
    (("clustering", "nmi"), "cluster NMI"),
    (("clustering", "acc"), "cluster acc"),
)


@dataclass
class DemoData:
    name: str
    train: Any
    test: Any


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-vrl demo",
        description=(
            "Train tiny models on the embedded data (Fashion-MNIST if installed, else the generated shapes "
            "world) on the CPU, evaluate them before and after (zero-shot accuracy, retrieval, clustering) "
            "and print a table."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--runs", nargs="+", default=list(RUNS), choices=list(RUNS), help="which models to train"
    )
    parser.add_argument("--dataset", default="fashion_mnist", help="registry name of the training data")
    parser.add_argument("--steps", type=int, default=500, help="optimisation steps per run")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--eval-limit", type=int, default=2000, help="test images used for evaluation")
    parser.add_argument("--train-limit", type=int, default=None, help="cap on training images (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default="runs/demo")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads: models this small run fastest on one, which cannot stall on a busy core",
    )
    parser.add_argument(
        "--workers", type=int, default=1, help="DataLoader workers preparing the next batches"
    )
    return parser


def load_demo_data(name: str, *, eval_limit: int, train_limit: int | None, seed: int) -> DemoData:
    """The requested dataset, or the generated shapes world when it is not installed (with a warning)."""
    from hf_vrl.data.registry import load_dataset_by_name

    size = _tiny_image_size()
    try:
        train = load_dataset_by_name(name, split="train", limit=train_limit, image_size=size, seed=seed)
        test = load_dataset_by_name(name, split="test", limit=eval_limit, image_size=size, seed=seed)
    except (FileNotFoundError, ImportError) as err:
        logger.warning("%s; the demo uses the generated shapes world instead", err)
        name = "shapes"
        train = load_dataset_by_name(
            name, split="train", limit=train_limit or 20000, image_size=size, seed=seed
        )
        test = load_dataset_by_name(name, split="test", limit=eval_limit, image_size=size, seed=seed)
    return DemoData(name, train, test)


def _tiny_image_size() -> int:
    from transformers import AutoConfig

    from hf_vrl.presets import preset_path

    return AutoConfig.from_pretrained(preset_path(TINY_CLIP)).vision_config.image_size


def tiny_processors() -> tuple[Any, Any]:
    """The tiny-clip image processor and tokenizer shipped in hub_configs/."""
    from transformers import AutoImageProcessor, AutoTokenizer

    from hf_vrl.presets import preset_path

    path = preset_path(TINY_CLIP)
    return AutoImageProcessor.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def train_contrastive(model: Any, data: DemoData, args: argparse.Namespace, run_dir: Path) -> None:
    """Train a CLIP-like model with ContrastiveTrainer on `data.train` (progress bar and logs: Trainer)."""
    from transformers import TrainingArguments

    from hf_vrl.data.collate import ImageTextCollator
    from hf_vrl.trainer import ContrastiveTrainer

    image_processor, tokenizer = tiny_processors()
    training_args = TrainingArguments(
        output_dir=str(run_dir),
        max_steps=args.steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        weight_decay=0.1,
        warmup_steps=max(1, args.steps // 20),
        lr_scheduler_type="cosine",
        logging_steps=max(1, args.steps // 10),
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=args.seed,
        dataloader_drop_last=True,
        remove_unused_columns=False,
        dataloader_num_workers=args.workers,
    )
    trainer = ContrastiveTrainer(
        model=model,
        args=training_args,
        train_dataset=data.train,
        data_collator=ImageTextCollator(image_processor, tokenizer),
    )
    trainer.train()


def evaluate(model: Any, data: DemoData) -> dict[str, Any]:
    from hf_vrl.evaluation import evaluate_clip

    image_processor, tokenizer = tiny_processors()
    return evaluate_clip(model, image_processor, tokenizer, data.test, tasks=EVAL_TASKS, batch_size=256)


def run_dual_encoder(arch: str, data: DemoData, args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    """A 2-layer, 64-wide dual encoder (`diffclip-tiny` sizes = `tiny-clip`) trained with the CLIP loss.

    `arch` is "clip" (transformers CLIPModel) or "diffclip" (differential attention in both towers); both
    start from the same seed and see the same batches, so the two rows of the table compare like with like.
    """
    import torch

    from hf_vrl.methods.diffclip.train import build_model

    torch.manual_seed(args.seed)
    _, tokenizer = tiny_processors()
    model = build_model(arch, DUAL_ENCODER_PRESET, tokenizer=tokenizer)
    before = evaluate(model, data)
    train_contrastive(model, data, args, run_dir)
    return {"before": before, "after": evaluate(model, data)}


def run_dcr(data: DemoData, args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    """DCR's tiny preset (hub_configs/dcr-tiny.json) on the shapes world, its own data: a tiny CLIP and a tiny
    latent diffusion model are pretrained, then both DCR stages run; before/after D-ability (clustering of the
    vision embeddings) and P-ability (toy MMVP pairs)."""
    from hf_vrl.methods.dcr.train import main as train_dcr

    train_dcr(["--output-dir", str(run_dir), "--seed", str(args.seed)])
    return json.loads((run_dir / "report.json").read_text())


RUNS: dict[str, Callable[[DemoData, argparse.Namespace, Path], dict[str, Any]]] = {
    "clip": partial(run_dual_encoder, "clip"),
    "diffclip": partial(run_dual_encoder, "diffclip"),
    "dcr": run_dcr,
}
# runs evaluated with evaluate_clip on the demo data (the table); the others print their own report
DUAL_ENCODER_RUNS = ("clip", "diffclip")


def format_table(results: dict[str, dict[str, Any]]) -> str:
    """One row per run and stage, one column per headline metric."""
    from hf_vrl.evaluation import report_percent, text_table

    rows = [["run", "stage", *(title for _, title in TABLE_COLUMNS)]]
    for name, result in results.items():
        for stage in ("before", "after"):
            rows.append([name, stage, *(report_percent(result[stage], path) for path, _ in TABLE_COLUMNS)])
    return text_table(rows)


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logger.setLevel(logging.INFO)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = load_demo_data(
        args.dataset, eval_limit=args.eval_limit, train_limit=args.train_limit, seed=args.seed
    )
    print(f"data: {data.name}, {len(data.train)} training and {len(data.test)} test images")
    results: dict[str, dict[str, Any]] = {}
    for name in args.runs:
        start = time.perf_counter()
        results[name] = RUNS[name](data, args, out / name)
        results[name]["seconds"] = round(time.perf_counter() - start, 1)
    dual = {name: results[name] for name in args.runs if name in DUAL_ENCODER_RUNS}
    if dual:
        print(f"\n{format_table(dual)}\n(percent; {data.name} test split, {len(data.test)} images)")
    if "dcr" in results:
        from hf_vrl.methods.dcr.train import format_report

        print("\nDCR on the shapes world (D-ability: clustering; P-ability: toy MMVP pairs)")
        print(format_report(results["dcr"]))
    report = {"dataset": data.name, "steps": args.steps, "seed": args.seed, "results": results}
    (out / "demo_report.json").write_text(json.dumps(report, indent=2))
    print(f"report: {out / 'demo_report.json'}")
    return 0
