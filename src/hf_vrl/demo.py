"""`hf-vrl demo`: the README's main job. One tiny run of each method, each a miniature of its paper's claim.

Every part runs through the shared run design (`hf_vrl.train`), so it leaves run folders in the common layout
under `<output-dir>/<part>/` (a part of several runs: `<part>/<run>/`; `final/` loads with `from_pretrained`,
`report.json` holds before/after), and the README's next commands (`hf-vrl eval --model
runs/demo/clip/final ...`, `hf-vrl compare runs/demo/clip runs/demo/diffclip`) work on them. Parts run on one
torch thread (tiny models gain nothing from more, and one thread cannot stall on a busy core); `--runs`
selects parts. Parts resume: a finished part reprints its report, an interrupted one continues where it
stopped. Each table compares the runs of like parts on the metrics that carry their claim.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


@dataclass
class Part:
    """One demo part: what it shows (one line), how it runs into its folder, and the table it joins (parts
    of one table compare like with like on `metrics`)."""

    shows: str
    run: Callable[[argparse.Namespace, Path], dict[str, dict[str, Any]]]
    table: str
    metrics: tuple[str, ...]


def _dataset(args: argparse.Namespace) -> str:
    """The requested dataset, or the generated shapes world when it is not installed."""
    from hf_vrl.data.registry import load_dataset_by_name

    try:
        load_dataset_by_name(args.dataset, split="test", limit=1)
        return args.dataset
    except (FileNotFoundError, ImportError) as error:
        logger.warning("%s; the demo uses the generated shapes world instead", error)
        return "shapes"


def dual_encoder(arch: str) -> Callable[[argparse.Namespace, Path], dict[str, dict[str, Any]]]:
    """CLIP or DiffCLIP (diffclip-tiny sizes = tiny-clip) trained with the CLIP loss on the same data, seed
    and batches: the two rows compare like with like."""

    def run(args: argparse.Namespace, out: Path) -> dict[str, dict[str, Any]]:
        import hf_vrl

        dataset = _dataset(args)
        report = hf_vrl.train(
            "diffclip",
            arch=arch,
            dataset=dataset,
            eval_dataset=dataset,
            eval_limit=args.eval_limit,
            train_limit=args.train_limit,
            tasks=["zero_shot", "clustering"],
            max_steps=args.steps,
            batch_size=args.batch_size,
            learning_rate=args.learning_rate,
            weight_decay=0.1,
            warmup_steps=max(1, args.steps // 20),
            warmup_ratio=0.0,
            crop_scale=None,
            num_workers=args.workers,
            save_steps=args.steps,
            logging_steps=max(1, args.steps // 10),
            seed=args.seed,
            output_dir=str(out),
            resume="auto",
        )
        return {arch: report}

    return run


def dcr(args: argparse.Namespace, out: Path) -> dict[str, dict[str, Any]]:
    """DCR's tiny preset on the shapes world, with a toy CLIP blind to colour (its captions never name it)
    and a toy diffusion model that learned from full captions; then the paper's reconstruction-only baseline
    (L_rec alone) from the same CLIP and diffusion model (`out/dcr/inputs/`)."""
    import hf_vrl

    # stage 2 at 1e-3 (the preset's 1e-4 barely moves a 2-layer tower in 100 steps)
    common = dict(config="dcr-tiny", learning_rate=1e-3, seed=args.seed, resume="auto")
    contrastive = hf_vrl.train("dcr", clip_blind_to=["colour"], output_dir=str(out / "dcr"), **common)
    inputs = out / "dcr" / "inputs"
    reconstruction = hf_vrl.train(
        "dcr",
        objective="reconstruction",
        clip=str(inputs / "base-clip"),
        clip_pretrain_steps=0,
        diffusion=str(inputs / "tiny-sd"),
        output_dir=str(out / "reconstruction"),
        **common,
    )
    return {"dcr": contrastive, "reconstruction": reconstruction}


def dive(args: argparse.Namespace, out: Path) -> dict[str, dict[str, Any]]:
    """DiVE's tiny preset twice on the same data and seed: FLYP (its run pre-trains the tiny CLIP into
    `flyp/inputs/pretrained`), then DiVE from that same pre-trained model."""
    import hf_vrl

    common = {"config": "dive-tiny", "seed": args.seed, "resume": "auto"}
    flyp = hf_vrl.train("dive", objective="flyp", output_dir=str(out / "flyp"), **common)
    pretrained = str(out / "flyp" / "inputs" / "pretrained")
    dive = hf_vrl.train(
        "dive", pretrained=pretrained, pretrain_steps=0, output_dir=str(out / "dive"), **common
    )
    return {"FLYP": flyp, "DiVE": dive}


def clue(args: argparse.Namespace, out: Path) -> dict[str, dict[str, Any]]:
    """CLUE's ablation ladder in miniature (`clue-tiny`, methods/clue/miniature.py): the InfoNCE baseline and
    the full Eq. 8 from the same pretrained start (built once, by the first rung), data and seed. The full
    run's "before" is the baseline's: the same backbone, evaluated the same way (not measured twice)."""
    from hf_vrl.methods.clue.miniature import train_rung

    baseline = train_rung("InfoNCE", out / "InfoNCE", seed=args.seed)
    start = dict(backbone=str(out / "InfoNCE" / "inputs" / "backbone"), backbone_config=None)
    full = train_rung(
        "+ text", out / "full", seed=args.seed, backbone_pretrain_steps=0, eval_before=False, **start
    )
    return {"clue InfoNCE": baseline, "clue full": {**full, "before": baseline["before"]}}


DUAL_ENCODER_METRICS = ("zero_shot.top1", "clustering.nmi", "clustering.acc")
DCR_METRICS = (
    "clustering.nmi",
    "clustering_fine.nmi",
    "pairs.accuracy",
    "pairs.per_category.colour",
    "mmvp.accuracy",
)
DIVE_METRICS = ("zero_shot.top1", "ood.top1", "transfer.top1", "rsa.image")
CLUE_METRICS = ("linear_probe.top1", "retrieval.i2i_R@1", "retrieval.i2i_R@5", "granularity.ncc_fine")

PARTS: dict[str, Part] = {
    "clip": Part(
        "a 2-layer CLIP learns zero-shot classification from captions (the baseline)",
        dual_encoder("clip"),
        "CLIP and DiffCLIP, same data, seed and batches",
        DUAL_ENCODER_METRICS,
    ),
    "diffclip": Part(
        "the same network with differential attention in both towers (DiffCLIP), same data and seed",
        dual_encoder("diffclip"),
        "CLIP and DiffCLIP, same data, seed and batches",
        DUAL_ENCODER_METRICS,
    ),
    "dcr": Part(
        "DCR gives a CLIP blind to colour what a diffusion model knows of it, against the "
        "reconstruction-only baseline (colour pairs up, shape clustering kept)",
        dcr,
        "DCR against reconstruction only, CLIP blind to colour",
        DCR_METRICS,
    ),
    "dive": Part(
        "DiVE vs FLYP fine-tuning a pre-trained tiny CLIP on five garment classes (the paper: DiVE keeps OOD "
        "and zero-shot transfer accuracy and the pre-trained geometry, rsa.image, at FLYP's ID accuracy)",
        dive,
        "DiVE against FLYP (zero_shot = ID classes; ood = style-shifted; transfer = other datasets)",
        DIVE_METRICS,
    ),
    "clue": Part(
        "CLUE's full objective (soft-InfoNCE + parts + descriptions) against its InfoNCE baseline, same "
        "start, data and seed: fine-grained linear probe and image retrieval (Rank-1/5)",
        clue,
        "CLUE against its InfoNCE baseline (fine classes = colour + shape)",
        CLUE_METRICS,
    ),
}


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-vrl demo",
        description=(
            "One tiny run of each method on the embedded data (CPU, minutes), evaluated before and after; "
            "every run leaves its model and report in <output-dir>/<part>/. Parts: "
            + "; ".join(f"{name}: {part.shows}" for name, part in PARTS.items())
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--runs", nargs="+", default=list(PARTS), choices=list(PARTS), help="which parts to run"
    )
    parser.add_argument("--dataset", default="fashion_mnist", help="data of the CLIP / DiffCLIP parts")
    parser.add_argument(
        "--steps", type=int, default=300, help="optimisation steps of the CLIP / DiffCLIP parts"
    )
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--eval-limit", type=int, default=2000, help="test images used for evaluation")
    parser.add_argument("--train-limit", type=int, default=None, help="cap on training images (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default="runs/demo")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (tiny models run fastest on one)"
    )
    parser.add_argument(
        "--workers", type=int, default=1, help="DataLoader workers preparing the next batches"
    )
    return parser


def _tables(names: list[str]) -> dict[str, list[str]]:
    """The parts of each table, in the order asked."""
    tables: dict[str, list[str]] = {}
    for name in names:
        tables.setdefault(PARTS[name].table, []).append(name)
    return tables


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    import torch

    from hf_vrl.run.report import compare_table

    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("hf_vrl").setLevel(logging.INFO)
    out = Path(args.output_dir)
    reports: dict[str, dict[str, Any]] = {}
    results: dict[str, list[str]] = {}
    seconds: dict[str, float] = {}
    for name in args.runs:
        print(f"\n== {name}: {PARTS[name].shows}")
        start = time.perf_counter()
        part_reports = PARTS[name].run(args, out / name)
        reports.update(part_reports)
        results[name] = list(part_reports)
        seconds[name] = round(time.perf_counter() - start, 1)
    print()
    for name in args.runs:
        print(f"{name}: {PARTS[name].shows} ({seconds[name]:.0f} s)")
    for title, names in _tables(args.runs).items():
        part = PARTS[names[0]]
        shown = {run: reports[run] for name in names for run in results[name]}
        print(f"\n{title}\n{compare_table(shown, part.metrics)}")
    print(f"\n(percent; before and after training; models and reports in {out}/<part>/)")
    summary = {
        "parts": {name: PARTS[name].shows for name in args.runs},
        "seconds": seconds,
        "reports": reports,
    }
    (out / "demo_report.json").write_text(json.dumps(summary, indent=2))
    print(f"report: {out / 'demo_report.json'}")
    return 0
