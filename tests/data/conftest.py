"""Fixtures for the data tests: a mixed webdataset shard, parquet/CSV tables of image paths, a CUB-200-2011
layout folder (all written in real formats under tmp_path)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from data_fixtures import CORRUPT, CUB_CLASSES, noise, write_mixed_shard
from hub_fixtures import offline_hub_cache
from PIL import Image


@pytest.fixture
def mixed_shard(tmp_path: Path) -> Path:
    return write_mixed_shard(tmp_path / "mixed-000000.tar")


@pytest.fixture
def image_table(tmp_path: Path) -> dict[str, Path]:
    """images/ with 4 good files + 1 corrupt, referenced by relative paths from a parquet and a CSV
    (which also list a missing file and an empty caption)."""
    folder = tmp_path / "table"
    (folder / "images").mkdir(parents=True)
    rows = []
    for i in range(4):
        noise((32, 24), seed=10 + i).save(folder / "images" / f"{i}.jpg")
        rows.append((f"images/{i}.jpg", f"picture number {i}"))
    (folder / "images" / "bad.jpg").write_bytes(CORRUPT)
    rows += [
        ("images/bad.jpg", "a corrupt file"),
        ("images/missing.jpg", "a missing file"),
        ("images/0.jpg", ""),
    ]
    table = pa.table({"filepath": [r[0] for r in rows], "title": [r[1] for r in rows]})
    pq.write_table(table, folder / "pairs.parquet")
    with open(folder / "pairs.tsv", "w", encoding="utf-8") as f:
        f.write("filepath\ttitle\n" + "".join(f"{p}\t{c}\n" for p, c in rows))
    return {"parquet": folder / "pairs.parquet", "tsv": folder / "pairs.tsv"}


@pytest.fixture
def cub_root(tmp_path: Path) -> Path:
    """A CUB_200_2011 layout with 3 classes x 4 images (2 train, 2 test each), boxes and attributes."""
    base = tmp_path / "cub" / "CUB_200_2011"
    lines = {"images": [], "labels": [], "split": [], "boxes": [], "attrs": []}
    image_id = 0
    for c, folder in enumerate(CUB_CLASSES, start=1):
        (base / "images" / folder).mkdir(parents=True)
        for j in range(4):
            image_id += 1
            rel = f"{folder}/{folder.split('.')[1]}_{j:04d}_{image_id}.jpg"
            mode = "L" if image_id == 5 else "RGB"  # CUB really holds a few greyscale JPEGs
            Image.new(mode, (60, 40), 120 if mode == "L" else (10 * c, 20, 30)).save(base / "images" / rel)
            lines["images"].append(f"{image_id} {rel}")
            lines["labels"].append(f"{image_id} {c}")
            lines["split"].append(f"{image_id} {1 if j < 2 else 0}")
            lines["boxes"].append(f"{image_id} 10.0 5.0 30.0 20.0")
            lines["attrs"] += [f"{image_id} 1 {j % 2} 3 0.5", f"{image_id} 2 1 3 0.5"]
    (base / "attributes").mkdir()
    files = {
        "images.txt": lines["images"],
        "image_class_labels.txt": lines["labels"],
        "train_test_split.txt": lines["split"],
        "bounding_boxes.txt": lines["boxes"],
        "classes.txt": [f"{i} {name}" for i, name in enumerate(CUB_CLASSES, start=1)],
        "attributes/image_attribute_labels.txt": lines["attrs"],
    }
    for name, content in files.items():
        (base / name).write_text("\n".join(content) + "\n")
    (base.parent / "attributes.txt").write_text("1 has_bill_shape::curved\n2 has_wing_color::blue\n")
    return base.parent


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty Hub cache of this test (`HF_HUB_CACHE`), offline: Hub repos are copied in by the test."""
    return offline_hub_cache(tmp_path, monkeypatch)


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory) -> Path:
    """A random tiny CLIP (hub_configs/tiny-clip) saved with its image processor and tokenizer."""
    from transformers import AutoConfig, AutoImageProcessor, AutoTokenizer, CLIPModel

    from hf_vrl.presets import HUB_CONFIGS

    out = tmp_path_factory.mktemp("clip")
    torch.manual_seed(0)
    config = HUB_CONFIGS / "tiny-clip"
    CLIPModel(AutoConfig.from_pretrained(config)).save_pretrained(out)
    AutoImageProcessor.from_pretrained(config).save_pretrained(out)
    AutoTokenizer.from_pretrained(config).save_pretrained(out)
    return out
