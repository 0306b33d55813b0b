"""Synthetic benchmarks in the layouts the reproduce examples read (image folders, parquet, the official
MMVP-VLM folder) and tiny models to evaluate on them."""

from __future__ import annotations

import csv
import importlib.util
import io
from pathlib import Path

import numpy as np
from PIL import Image

from hf_vrl.metrics.mmvp import MMVP_CATEGORIES

EXAMPLES = Path(__file__).parents[2] / "examples"
COLOURS = [(220, 30, 30), (30, 200, 40), (40, 60, 230)]


def example(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _image(colour: tuple[int, int, int], rng: np.random.Generator, size: int = 16) -> Image.Image:
    noise = rng.integers(-30, 30, (size, size, 3))
    return Image.fromarray(np.clip(np.array(colour) + noise, 0, 255).astype(np.uint8))


def image_folder(root: Path, splits=("train", "test"), classes=("red", "green", "blue"), per_class=4) -> Path:
    """root/<split>/<class>/<i>.png, each class one noisy colour."""
    rng = np.random.default_rng(0)
    for split in splits:
        for name, colour in zip(classes, COLOURS):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(per_class):
                _image(colour, rng).save(folder / f"{i}.png")
    return root


def retrieval_parquet(root: Path, n: int = 6) -> Path:
    """root/test-00000-of-00001.parquet: image + caption (two per image), as datasets writes a split."""
    import datasets

    rng = np.random.default_rng(1)
    rows = {"image": [], "caption": []}
    for i in range(n):
        colour = COLOURS[i % 3]
        buffer = io.BytesIO()
        _image(colour, rng).save(buffer, format="PNG")
        rows["image"].append({"bytes": buffer.getvalue(), "path": None})
        rows["caption"].append([f"a photo of colour {i}", f"picture number {i}"])
    features = datasets.Features(
        {"image": datasets.Image(), "caption": datasets.Sequence(datasets.Value("string"))}
    )
    root.mkdir(parents=True)
    datasets.Dataset.from_dict(rows, features=features).to_parquet(root / "test-00000-of-00001.parquet")
    return root


def mmvp_folder(root: Path) -> Path:
    """The official MMVP-VLM layout: Questions.csv and MLLM_VLM Images/<Type>/<qid>.jpg, one pair a type."""
    rng = np.random.default_rng(2)
    rows = []
    for n, category in enumerate(MMVP_CATEGORIES):
        folder = root / "MLLM_VLM Images" / category
        folder.mkdir(parents=True)
        for qid, colour in ((2 * n + 1, COLOURS[0]), (2 * n + 2, COLOURS[2])):
            _image(colour, rng).save(folder / f"{qid}.jpg")
            rows.append({"Question ID": qid, "Type": category, "Statement": f"the thing is {colour}"})
    with (root / "Questions.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["Question ID", "Type", "Statement"])
        writer.writeheader()
        writer.writerows(rows)
    return root


def tiny_clip_folder(out: Path) -> Path:
    """A random tiny CLIP (hub_configs/tiny-clip) saved with its processor and tokenizer."""
    import torch
    from transformers import AutoConfig, AutoImageProcessor, AutoTokenizer, CLIPModel

    from hf_vrl.presets import HUB_CONFIGS

    torch.manual_seed(0)
    config = HUB_CONFIGS / "tiny-clip"
    CLIPModel(AutoConfig.from_pretrained(config)).save_pretrained(out)
    AutoImageProcessor.from_pretrained(config).save_pretrained(out)
    AutoTokenizer.from_pretrained(config).save_pretrained(out)
    return out
