"""CLUE's ablation ladder (Table 2) in miniature: InfoNCE -> + global soft (Sinkhorn targets) -> + part (VLAD
term) -> + text (description term), each rung a run of `hf_vrl.train("clue", config="clue-tiny", ...)` from
the same start on the same data and seed, evaluated on the fine classes (colour + shape: linear probe top-1,
image retrieval Rank-1/5) and with the granularity metrics (CDNV within each shape, NCC fine / coarse).

The paper starts from supervised ImageNet weights and VLM descriptions. Offline, `clue-tiny` first trains its
tiny ResNet to name the shape (the coarse label) of separately generated images, a stand-in for ImageNet
weights (`pretrain_backbone`; colour, half of the fine label, is never supervised), and the scene captions
("two small rotated red triangles at the top left") serve as the descriptions, embedded by a fixed random
tiny-clip text tower. The numbers say how the pieces behave at this scale, not what they do on CUB-200.
`hf-vrl demo --runs clue` runs the InfoNCE and full rungs; `run_ladder` runs any rungs over several seeds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["LADDER", "format_ladder", "pretrain_backbone", "run_ladder", "train_rung"]

# (rung, the clue settings that differ from the full objective)
LADDER: dict[str, dict[str, Any]] = {
    "InfoNCE": {"targets": "identity", "beta": 0.0, "gamma": 0.0},
    "+ global soft": {"targets": "sinkhorn", "beta": 0.0, "gamma": 0.0},
    "+ part": {"targets": "sinkhorn", "beta": 1.0, "gamma": 0.0},
    "+ text": {"targets": "sinkhorn", "beta": 1.0, "gamma": 1.0},
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


def pretrain_backbone(
    backbone_config: dict[str, Any],
    steps: int,
    *,
    seed: int = 0,
    image_size: int = 32,
    size: int = 2000,
    batch_size: int = 64,
    learning_rate: float = 0.1,
) -> Any:
    """The toy stand-in for ImageNet weights: a ResNet from `backbone_config` trained (SGD, momentum 0.9, no
    augmentation) for `steps` steps to classify the shape of `size` images of a separate stream of the shapes
    world (split "pretrain": no image in common with the training data); returns the ResNetModel."""
    import torch
    from transformers import ResNetConfig, ResNetForImageClassification

    from hf_vrl.data.toy import SHAPES, shapes_dataset
    from hf_vrl.methods.clue.augment import image_to_tensor
    from hf_vrl.methods.clue.trainer import IMAGENET_MEAN, IMAGENET_STD

    data = shapes_dataset(size, seed=seed, image_size=image_size, split="pretrain")
    mean, std = torch.tensor(IMAGENET_MEAN).view(3, 1, 1), torch.tensor(IMAGENET_STD).view(3, 1, 1)
    images = torch.stack([(image_to_tensor(image) - mean) / std for image in data["image"]])
    labels = torch.tensor(data["label"])
    config = {k: v for k, v in backbone_config.items() if k != "model_type"}
    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        classifier = ResNetForImageClassification(ResNetConfig(**config, num_labels=len(SHAPES))).train()
        optimizer = torch.optim.SGD(classifier.parameters(), lr=learning_rate, momentum=0.9)
        for _ in range(steps):
            batch = torch.randint(len(labels), (batch_size,), generator=generator)
            classifier(pixel_values=images[batch], labels=labels[batch]).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    return classifier.resnet.eval()


def train_rung(name: str, output_dir: str | Path, **overrides: Any) -> dict[str, Any]:
    """One rung as a `clue-tiny` run into `output_dir` (resumed when interrupted); returns its report."""
    import hf_vrl

    settings = {**LADDER[name], **overrides}
    return hf_vrl.train("clue", config="clue-tiny", output_dir=str(output_dir), resume="auto", **settings)


def _slug(name: str) -> str:
    return name.strip("+ ").replace(" ", "_")


def run_ladder(
    seeds: Sequence[int] = (0, 1, 2),
    output_dir: str | Path = "runs/clue-ladder",
    rungs: Sequence[str] | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """Every rung (default: all) for every seed into `<output_dir>/seed<s>/<rung>/`; returns (and writes to
    `<output_dir>/clue_ladder.json`) {"seeds", "rungs": {rung: {"seeds": [after, ...], "mean", "std"}},
    "start": {...}, "seconds"}, where "start" is the evaluation before training (the common start)."""
    out = Path(output_dir)
    started = time.perf_counter()
    chosen = list(rungs or LADDER)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in ["start", *chosen]}
    for seed in seeds:
        for name in chosen:
            report = train_rung(name, out / f"seed{seed}" / _slug(name), seed=seed, **overrides)
            results[name].append(report["after"])
        results["start"].append(report["before"])
    summary = {name: {"seeds": reports, **_summary(reports)} for name, reports in results.items()}
    report = {
        "seeds": list(seeds),
        "rungs": {name: summary[name] for name in chosen},
        "start": summary["start"],
        "seconds": round(time.perf_counter() - started, 1),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "clue_ladder.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def _value(report: dict[str, Any], path: tuple[str, str]) -> float:
    return float(report[path[0]][path[1]])


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
    for name, entry in [("start", report["start"]), *report["rungs"].items()]:
        cells = []
        for _, title in COLUMNS:
            scale = 1.0 if title == "CDNV_A" else 100.0
            mean, std = entry["mean"][title] * scale, entry["std"][title] * scale
            cells.append(f"{mean:.2f}" if len(entry["seeds"]) == 1 else f"{mean:.2f}±{std:.2f}")
        rows.append([name, *cells])
    seeds = report["seeds"]
    note = (
        f"(shapes world, fine = colour + shape; {len(seeds)} seed(s); percent except CDNV_A, lower is better)"
    )
    return text_table(rows, left_columns=1) + "\n" + note
