"""CLUE's ablation ladder (Table 2) and K sweep (Table 3) in miniature: InfoNCE (#1) -> text only (#2) ->
+ global soft (#3, Sinkhorn targets) -> + part (#4, VLAD term) -> + text (#5, description term), plus a
control rung with the descriptions shuffled across images; each rung a run of
`hf_vrl.train("clue", config="clue-tiny", ...)` from the same start (one pretrained backbone and text encoder
per seed, built by the first rung that needs them and reused by the others) on the same data and seed,
evaluated on the fine classes (colour + shape: linear probe top-1, image retrieval Rank-1/5) and with the
granularity metrics (CDNV within each shape, NCC fine / coarse; on the training split, as §3).

The paper starts from supervised ImageNet weights, VLM descriptions and a pretrained CLIP text encoder.
Offline, `clue-tiny` first trains its tiny ResNet to name the shape (the coarse label) of separately
generated images, a stand-in for ImageNet weights (`pretrain_backbone`; colour, half of the fine label, is
never supervised), trains tiny-clip with the CLIP loss on separate image-caption pairs, a stand-in for
pretrained CLIP (`pretrain_text_encoder`), and describes every training image with a label-blind describer
that reads only pixels and errs (`toy_describer`: dominant colour, sometimes wrong or missing, and where the
foreground lies; never the shape). The shuffled control keeps the same texts and text head but pairs them with
other images, so what "+ text" gains over it is the descriptions' information, not the added capacity. The
numbers say how the pieces behave at this scale, not what they do on CUB-200.
`hf-vrl demo --runs clue` runs the InfoNCE and full rungs; `run_ladder` runs any rungs over several seeds (the
same rungs run on real data through `examples/reproduce_clue.py`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "K_SWEEP",
    "LADDER",
    "PRETRAIN_SIZE",
    "RUNGS",
    "SHUFFLED",
    "format_ladder",
    "pretrain_backbone",
    "pretrain_text_encoder",
    "run_ladder",
    "train_rung",
]

PRETRAIN_SIZE = 2000  # images of the shapes world's "pretrain" split each toy pre-training learns from
# (rung, the settings that differ from the full objective); the numbers are CLUE Table 2's row ids
LADDER: dict[str, dict[str, Any]] = {
    "InfoNCE": {"targets": "identity", "beta": 0.0, "gamma": 0.0},  # #1
    "text only": {"alpha": 0.0, "beta": 0.0, "gamma": 1.0},  # #2
    "+ global soft": {"targets": "sinkhorn", "beta": 0.0, "gamma": 0.0},  # #3
    "+ part": {"targets": "sinkhorn", "beta": 1.0, "gamma": 0.0},  # #4
    "+ text": {"targets": "sinkhorn", "beta": 1.0, "gamma": 1.0},  # #5, the full objective
}
# the control of the miniature: #5 with every description moved to another image (toy_describer)
SHUFFLED = {"+ shuffled text": {**LADDER["+ text"], "text_source": "pixel_describer_shuffled"}}
# Table 3: the number of part centroids K with the global and part terms (#4's objective)
K_SWEEP = {f"K = {k}": {**LADDER["+ part"], "num_parts": k} for k in (2, 3, 4, 8)}
RUNGS = {**LADDER, **SHUFFLED, **K_SWEEP}
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
    size: int = PRETRAIN_SIZE,
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


def pretrain_text_encoder(
    config: str,
    out_dir: str | Path,
    steps: int,
    *,
    seed: int = 0,
    size: int = PRETRAIN_SIZE,
    batch_size: int = 64,
) -> Path:
    """The toy stand-in for a pretrained CLIP: the config-only CLIP `config` (a hub_configs name such as
    `tiny-clip`, or a folder with config, processor and tokenizer) trained with the CLIP loss for `steps`
    steps on `size` image-caption pairs of a separate stream of the shapes world (split "pretrain", never
    the training images; `hf_vrl.methods.dcr.toy.pretrain_clip`), saved to `out_dir`. Only its text tower is
    used: it embeds the descriptions, as CLIP's does in the paper."""
    from hf_vrl.data.toy import shapes_dataset
    from hf_vrl.methods.dcr.toy import pretrain_clip
    from hf_vrl.presets import HUB_CONFIGS

    folder = HUB_CONFIGS / config if (HUB_CONFIGS / config).is_dir() else Path(config)
    data = shapes_dataset(size, seed=seed, split="pretrain").select_columns(["image", "caption"])
    return pretrain_clip(folder, data, out_dir, steps, batch_size=batch_size, seed=seed)


def train_rung(
    name: str, output_dir: str | Path, *, config: str = "clue-tiny", **overrides: Any
) -> dict[str, Any]:
    """One rung of `RUNGS` as a run of preset `config` into `output_dir` (resumed when interrupted); returns
    its report. `overrides` are any `hf_vrl.train` settings (they win over the rung's)."""
    import hf_vrl

    settings = {**RUNGS[name], **overrides}
    return hf_vrl.train("clue", config=config, output_dir=str(output_dir), resume="auto", **settings)


def _slug(name: str) -> str:
    return name.strip("+ ").replace(" = ", "").replace(" ", "_")


def _shared_start(inputs: Path) -> dict[str, Any]:
    """The toy stand-ins a run built in `inputs/`, as settings that make the next rungs start from them."""
    start: dict[str, Any] = {}
    if (inputs / "backbone").is_dir():
        start |= {"backbone": str(inputs / "backbone"), "backbone_config": None, "backbone_pretrain_steps": 0}
    if (inputs / "text_encoder").is_dir():
        start |= {"text_encoder": str(inputs / "text_encoder"), "text_encoder_pretrain_steps": 0}
    return start


def run_ladder(
    seeds: Sequence[int] = (0, 1, 2),
    output_dir: str | Path = "runs/clue-ladder",
    rungs: Sequence[str] | None = None,
    *,
    config: str = "clue-tiny",
    **overrides: Any,
) -> dict[str, Any]:
    """Every rung (default: `LADDER` and the shuffled control) for every seed into
    `<output_dir>/seed<s>/<rung>/`, each seed's rungs from one start (the first rung's pretrained stand-ins);
    returns (and writes to `<output_dir>/clue_ladder.json`) {"seeds", "rungs": {rung: {"seeds": [after,
    ...], "mean", "std"}}, "start": {...}, "seconds"}, where "start" is the evaluation before training. With
    granularity metrics (data with coarse labels) it draws them per rung into
    `<output_dir>/figures/granularity.png` (Fig. 5, `figures.plot_granularity`)."""
    out = Path(output_dir)
    started = time.perf_counter()
    chosen = list(rungs or {**LADDER, **SHUFFLED})
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in ["start", *chosen]}
    for seed in seeds:
        start: dict[str, Any] = {}
        for name in chosen:
            folder = out / f"seed{seed}" / _slug(name)
            report = train_rung(name, folder, config=config, **{**overrides, "seed": seed, **start})
            results[name].append(report["after"])
            start = _shared_start(folder / "inputs") | start
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
    if any(np.isfinite(entry["mean"]["NCC fine"]) for entry in report["rungs"].values()):
        from hf_vrl.methods.clue.figures import plot_granularity

        plot_granularity(report, out / "figures" / "granularity.png")  # Fig. 5 (needs coarse labels)
    return report


def _value(report: dict[str, Any], path: tuple[str, str]) -> float:
    """A metric of a report; NaN where the evaluation skipped it (granularity without coarse labels) or
    left it undefined (CDNV_A is None when every coarse class holds a single fine class)."""
    value = report.get(path[0], {}).get(path[1])
    return float("nan") if value is None else float(value)


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
