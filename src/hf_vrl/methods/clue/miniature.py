"""CLUE's ablation ladder (Table 2) in miniature, on the embedded shapes world: InfoNCE -> + global soft
(Sinkhorn targets) -> + part (VLAD term) -> + text (description term), each rung trained from the same
random initialisation on the same data, then evaluated on the fine classes (colour + shape: linear probe
top-1, image retrieval Rank-1/5) and with the granularity metrics (CDNV within each shape, NCC fine / coarse).

The paper starts from supervised ImageNet weights and VLM descriptions. Offline, the miniature first trains a
tiny ResNet to name the shape (the coarse label) of separately generated images, its stand-in for ImageNet
weights (`pretrain_backbone`; colour, half of the fine label, is never supervised), then runs every rung from
that start; the scene captions ("two small rotated red triangles at the top left") serve as the descriptions,
embedded by a fixed random tiny-clip text tower. The numbers say how the pieces behave at this scale, not what
they do on CUB-200.

    python -m hf_vrl.methods.clue.miniature --seeds 0 1 2 --output-dir runs/clue-ladder   # the table
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

__all__ = [
    "COARSE_GROUPS",
    "pretrain_backbone",
    "LADDER",
    "LadderConfig",
    "format_ladder",
    "ladder_data",
    "run_ladder",
    "toy_settings",
]

# (rung, the settings that differ from the full objective)
LADDER: tuple[tuple[str, dict[str, Any]], ...] = (
    ("InfoNCE", {"targets": "identity", "beta": 0.0, "gamma": 0.0}),
    ("+ global soft", {"targets": "sinkhorn", "beta": 0.0, "gamma": 0.0}),
    ("+ part", {"targets": "sinkhorn", "beta": 1.0, "gamma": 0.0}),
    ("+ text", {"targets": "sinkhorn", "beta": 1.0, "gamma": 1.0}),
)
TOY_BACKBONE = {
    "model_type": "resnet",
    "embedding_size": 16,
    "hidden_sizes": [32, 64],
    "depths": [1, 1],
    "layer_type": "basic",
}
# coarse groups of the one-level offline sets (fine = their class): ours, by garment / animal kind
COARSE_GROUPS: dict[str, dict[str, tuple[str, ...]]] = {
    "fashion_mnist": {
        "top": ("t-shirt/top", "pullover", "coat", "shirt"),
        "bottom or dress": ("trouser", "dress"),
        "footwear": ("sandal", "sneaker", "ankle boot"),
        "bag": ("bag",),
    },
    "animal_mnist": {
        "hoofed": ("cow", "giraffe", "horse", "sheep", "zebra"),
        "carnivoran": ("bear", "cat", "dog"),
        "other": ("bird", "elephant"),
    },
}
# (report path, column title) of the table
COLUMNS = (
    (("linear_probe", "top1"), "probe top-1"),
    (("retrieval", "i2i_R@1"), "R@1"),
    (("retrieval", "i2i_R@5"), "R@5"),
    (("granularity", "ncc_fine"), "NCC fine"),
    (("granularity", "ncc_coarse"), "NCC coarse"),
    (("granularity", "cdnv_coarse_mean"), "CDNV_A"),
)


def toy_settings(**overrides: Any) -> Any:
    """CLUESettings of the miniature: a 2-stage ResNet (64-d features) on 32-px images, small heads, the
    captions as descriptions embedded by the random tiny-clip text tower; the paper's loss settings."""
    from hf_vrl.methods.clue.settings import CLUESettings

    fields = dict(
        backbone=None,
        backbone_config=dict(TOY_BACKBONE),
        image_size=32,
        projection_hidden_dim=256,
        projection_dim=64,
        predictor_hidden_dim=256,
        text_encoder="tiny-clip",
        text_source="caption",
    )
    return CLUESettings(**(fields | overrides))


@dataclass
class LadderConfig:
    """Size of the miniature: steps and batch per rung, data sizes, optimiser (SGD, cosine, as the paper)."""

    steps: int = 100
    pretrain_steps: int = 200
    pretrain_size: int = 2000
    pretrain_learning_rate: float = 0.1
    batch_size: int = 64
    learning_rate: float = 0.05
    weight_decay: float = 1e-5
    train_size: int = 2000
    test_size: int = 500
    probe_cs: tuple[float, ...] = (0.1, 1.0, 10.0)
    num_workers: int = 1
    threads: int | None = None


def ladder_data(name: str, split: str, size: int, seed: int) -> Any:
    """`size` images of `split` with a coarse `label` and a `fine_label`: the shapes world as generated
    (shape / colour + shape), or an offline set of COARSE_GROUPS (its classes become `fine_label`, their
    group `label`). Descriptions: the `caption` column."""
    from datasets import ClassLabel

    from hf_vrl.data.registry import load_dataset_by_name

    data = load_dataset_by_name(name, split=split, limit=size, seed=seed, image_size=32)
    if "fine_label" in data.column_names:
        return data
    if name not in COARSE_GROUPS:
        raise ValueError(f"no coarse grouping for {name!r}; use shapes or one of {sorted(COARSE_GROUPS)}")
    groups = COARSE_GROUPS[name]
    fine_names = data.features["label"].names
    group_of = {fine: index for index, members in enumerate(groups.values()) for fine in members}
    coarse = [group_of[fine_names[label]] for label in data["label"]]
    data = data.rename_column("label", "fine_label")
    return data.add_column("label", coarse).cast_column("label", ClassLabel(names=list(groups)))


def pretrain_backbone(cfg: LadderConfig, seed: int) -> Any:
    """The miniature's stand-in for ImageNet weights: the toy ResNet trained (SGD, no augmentation) for
    `cfg.pretrain_steps` steps to classify the shape of `cfg.pretrain_size` images from a separate stream
    of the shapes world (split "pretrain": no image in common with the ladder's data); returns the
    ResNetModel."""
    import torch
    from transformers import ResNetConfig, ResNetForImageClassification

    from hf_vrl.data.toy import SHAPES, shapes_dataset
    from hf_vrl.methods.clue.augment import image_to_tensor
    from hf_vrl.methods.clue.trainer import IMAGENET_MEAN, IMAGENET_STD

    data = shapes_dataset(cfg.pretrain_size, seed=seed, split="pretrain")
    mean, std = torch.tensor(IMAGENET_MEAN).view(3, 1, 1), torch.tensor(IMAGENET_STD).view(3, 1, 1)
    images = torch.stack([(image_to_tensor(image) - mean) / std for image in data["image"]])
    labels = torch.tensor(data["label"])
    config = ResNetConfig(
        **{k: v for k, v in TOY_BACKBONE.items() if k != "model_type"}, num_labels=len(SHAPES)
    )
    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        classifier = ResNetForImageClassification(config).train()
        optimizer = torch.optim.SGD(classifier.parameters(), lr=cfg.pretrain_learning_rate, momentum=0.9)
        for _ in range(cfg.pretrain_steps):
            batch = torch.randint(len(labels), (cfg.batch_size,), generator=generator)
            classifier(pixel_values=images[batch], labels=labels[batch]).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    return classifier.resnet.eval()


def _start(settings: Any, bank: Any, backbone: Any, seed: int) -> Any:
    """The model every rung starts from: the pretrained backbone (or a random one) with heads drawn from
    `seed` (text head included, so every rung has the same initial weights)."""
    import torch

    from hf_vrl.methods.clue.model import build_model, from_backbone

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        if backbone is None:
            return build_model(settings, text_embed_dim=bank.dim)
        return from_backbone(backbone, **settings.model_config(), text_embed_dim=bank.dim)


def _train(model: Any, settings: Any, bank: Any, data: Any, cfg: LadderConfig, seed: int, out: Path) -> Any:
    import torch
    from transformers import TrainingArguments

    from hf_vrl.methods.clue.trainer import CLUETrainer

    args = TrainingArguments(
        output_dir=str(out),
        max_steps=cfg.steps,
        per_device_train_batch_size=cfg.batch_size,
        learning_rate=cfg.learning_rate,
        weight_decay=cfg.weight_decay,
        optim="sgd",
        optim_args="momentum=0.9",
        lr_scheduler_type="cosine",
        warmup_steps=max(1, cfg.steps // 20),
        logging_steps=max(1, cfg.steps // 5),
        save_strategy="no",
        report_to="none",
        use_cpu=not torch.cuda.is_available(),
        seed=seed,
        dataloader_drop_last=True,
        dataloader_num_workers=cfg.num_workers,
        remove_unused_columns=False,
        disable_tqdm=True,
    )
    text = bank if settings.uses_text else None
    trainer = CLUETrainer(model=model, args=args, train_dataset=data, settings=settings, text_bank=text)
    trainer.train()
    return trainer.model


def _evaluate(
    model: Any, settings: Any, train: Any, test: Any, cfg: LadderConfig, seed: int
) -> dict[str, Any]:
    from threadpoolctl import threadpool_limits

    from hf_vrl.methods.clue.evaluate import evaluate_clue
    from hf_vrl.methods.clue.model import build_image_processor

    processor = build_image_processor(settings)
    with threadpool_limits(cfg.threads):  # BLAS threads of the probe (None: unchanged)
        return evaluate_clue(model, processor, test, train, seed=seed, probe_cs=cfg.probe_cs, batch_size=256)


def run_ladder(
    seeds: Sequence[int] = (0,),
    config: LadderConfig | None = None,
    output_dir: str | Path = "runs/clue-ladder",
    rungs: Sequence[str] | None = None,
    dataset: str = "shapes",
) -> dict[str, Any]:
    """Train and evaluate every rung for every seed on `dataset` (see `ladder_data`); returns (and writes to
    `<output_dir>/clue_ladder.json`) {"config", "rungs": {rung: {"seeds": [report, ...], "mean", "std"}},
    "init": {...}, "seconds"} where "init" evaluates the common starting point (the pretrained backbone, or a
    random one with `pretrain_steps=0`).

    On Fashion-MNIST / Animal-MNIST the captions name the class ("a photo of a sneaker"), so there the text
    term is weak class supervision; on the shapes world they describe the instance, as VLM descriptions do."""
    import torch

    from hf_vrl.methods.clue.text import build_text_bank, descriptions_of

    cfg = config or LadderConfig()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    chosen = [(name, diff) for name, diff in LADDER if rungs is None or name in rungs]
    out = Path(output_dir)
    start = time.perf_counter()
    results: dict[str, dict[str, Any]] = {name: {"seeds": []} for name, _ in [("init", {}), *chosen]}
    for seed in seeds:
        train = ladder_data(dataset, "train", cfg.train_size, seed)
        test = ladder_data(dataset, "test", cfg.test_size, seed)
        settings = toy_settings()
        bank = build_text_bank(
            descriptions_of(train, settings.text_source), settings.text_encoder, device="cpu"
        )
        backbone = pretrain_backbone(cfg, seed) if cfg.pretrain_steps else None
        init = _start(settings, bank, backbone, seed)
        results["init"]["seeds"].append(_evaluate(init, settings, train, test, cfg, seed))
        for name, diff in chosen:
            rung = toy_settings(**diff)
            out_dir = out / f"seed{seed}" / name.strip("+ ").replace(" ", "_")
            model = _train(_start(rung, bank, backbone, seed), rung, bank, train, cfg, seed, out_dir)
            results[name]["seeds"].append(_evaluate(model, rung, train, test, cfg, seed))
            logger.info("seed %d, %s: %s", seed, name, _row(results[name]["seeds"][-1]))
    for entry in results.values():
        entry.update(_summary(entry["seeds"]))
    report = {
        "dataset": dataset,
        "config": {**cfg.__dict__, "seeds": list(seeds)},
        "rungs": {name: results[name] for name, _ in chosen},
        "init": results["init"],
        "seconds": round(time.perf_counter() - start, 1),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "clue_ladder.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def _value(report: dict[str, Any], path: tuple[str, str]) -> float:
    return float(report[path[0]][path[1]])


def _row(report: dict[str, Any]) -> dict[str, float]:
    return {title: round(_value(report, path), 4) for path, title in COLUMNS}


def _summary(reports: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    values = {title: [_value(r, path) for r in reports] for path, title in COLUMNS}
    return {
        "mean": {title: float(np.mean(v)) for title, v in values.items()},
        "std": {title: float(np.std(v)) for title, v in values.items()},
    }


def format_ladder(report: dict[str, Any]) -> str:
    """The ladder as a text table: percent (CDNV_A as is), mean +- std over the seeds."""
    from hf_vrl.evaluation import text_table

    rows = [["rung", *(title for _, title in COLUMNS)]]
    start = "start (pretrained)" if report["config"].get("pretrain_steps") else "start (untrained)"
    for name, entry in [(start, report["init"]), *report["rungs"].items()]:
        cells = []
        for _, title in COLUMNS:
            scale = 1.0 if title == "CDNV_A" else 100.0
            mean, std = entry["mean"][title] * scale, entry["std"][title] * scale
            cells.append(f"{mean:.2f}" if len(entry["seeds"]) == 1 else f"{mean:.2f}±{std:.2f}")
        rows.append([name, *cells])
    seeds = report["config"]["seeds"]
    note = (
        f"(shapes world, fine = colour + shape; {len(seeds)} seed(s); percent except CDNV_A, lower is better)"
    )
    return text_table(rows, left_columns=1) + "\n" + note


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hf_vrl.methods.clue.miniature",
        description="CLUE's ablation ladder on the shapes world.",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--dataset",
        default="shapes",
        choices=["shapes", *COARSE_GROUPS],
        help="shapes (default) or an offline set",
    )
    parser.add_argument("--steps", type=int, default=LadderConfig.steps)
    parser.add_argument("--batch-size", type=int, default=LadderConfig.batch_size)
    parser.add_argument(
        "--pretrain-steps", type=int, default=LadderConfig.pretrain_steps, help="0: start from random weights"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch and BLAS threads (default: as set)")
    parser.add_argument("--workers", type=int, default=LadderConfig.num_workers, help="data loader workers")
    parser.add_argument(
        "--rungs",
        nargs="+",
        choices=[name for name, _ in LADDER],
        help="a subset of the ladder (default: all)",
    )
    parser.add_argument("--train-size", type=int, default=LadderConfig.train_size)
    parser.add_argument("--test-size", type=int, default=LadderConfig.test_size)
    parser.add_argument("--output-dir", default="runs/clue-ladder")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    config = LadderConfig(
        steps=args.steps,
        pretrain_steps=args.pretrain_steps,
        batch_size=args.batch_size,
        threads=args.threads,
        num_workers=args.workers,
        train_size=args.train_size,
        test_size=args.test_size,
    )
    report = run_ladder(args.seeds, config, args.output_dir, rungs=args.rungs, dataset=args.dataset)
    print(format_ladder(report))
    print(f"{report['seconds']} s; report: {Path(args.output_dir) / 'clue_ladder.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
