"""Retrieval benchmarks (Flickr30k, Flickr8k, MSCOCO) with every caption of each image: Karpathy's split files
as published (`caption_datasets.zip`: dataset_flickr30k.json, dataset_flickr8k.json, dataset_coco.json) beside
the images, or a `datasets` copy with an image column and a list of captions per row.

A Karpathy file is `{"images": [{"filename", "split" (train / val / test / restval), "sentences": [{"raw",
...}], "filepath" (COCO: train2014 / val2014)}, ...]}`; only the split asked for is read (the tables score
"test": 1,000 Flickr images, 5,000 COCO images). Images: Flickr30k's `flickr30k-images/`, Flickr8k's
`Flicker8k_Dataset/` (the official spelling), COCO's `<filepath>/<filename>` (val2014/ ...), or `images/`,
in the folder of the JSON file or the one above it. Rows: image (read lazily), caption (list of str), key.
"""

from __future__ import annotations

import json
from pathlib import Path

from datasets import Dataset, Features, Value
from datasets import Image as ImageFeature
from datasets import List as ListFeature

from hf_vrl.errors import UserError

from .benchmarks import Benchmark
from .images import DecodeTransform
from .readers import Layout, find_datasets_copy, load_datasets_copy

KARPATHY_FILES = {
    "flickr30k": "dataset_flickr30k.json",
    "flickr8k": "dataset_flickr8k.json",
    "mscoco": "dataset_coco.json",
}
IMAGE_FOLDERS = {
    "flickr30k": ("flickr30k-images", "flickr30k_images", "images"),
    "flickr8k": ("Flicker8k_Dataset", "Flickr8k_Dataset", "images"),
    "mscoco": ("", "images"),
}
CAPTION_COLUMNS = ("caption", "captions", "sentences", "text", "raw")


def _karpathy_file(root: Path) -> Path | None:
    for folder in (root, root / "caption_datasets", root / "karpathy"):
        found = [folder / name for name in KARPATHY_FILES.values() if (folder / name).is_file()]
        if found:
            return found[0]
    return None


def _image_path(base: Path, key: str, entry: dict) -> Path | None:
    """Where an entry's image is: under the JSON file's folder or the one above it."""
    for folder in (base, base.parent):
        for sub in IMAGE_FOLDERS[key]:
            path = folder / sub / entry.get("filepath", "") / entry["filename"]
            if path.is_file():
                return path
    return None


def load_karpathy(path: Path, split: str, benchmark: Benchmark) -> Dataset:
    """Karpathy's `split` of `benchmark` from its split file `path` (rows: image, caption list, key); entries
    whose image is absent are left out (the count check sees them)."""
    expected = KARPATHY_FILES[benchmark.key]
    if path.name != expected:
        path = path.parent / expected
    if not path.is_file():
        raise UserError(
            f"{benchmark.title}: no {expected} in {path.parent} (Karpathy's caption_datasets.zip)"
        )
    entries = [e for e in json.loads(path.read_text())["images"] if e["split"] == split]
    rows = {"image": [], "caption": [], "key": []}
    for entry in entries:
        image = _image_path(path.parent, benchmark.key, entry)
        if image is not None:
            rows["image"].append({"bytes": None, "path": str(image)})
            rows["caption"].append([sentence["raw"] for sentence in entry["sentences"]])
            rows["key"].append(entry["filename"])
    features = Features(
        {"image": ImageFeature(decode=False), "caption": ListFeature(Value("string")), "key": Value("string")}
    )
    return Dataset.from_dict(rows, features=features).with_transform(DecodeTransform("image"))


def load_caption_copy(root: Path | str, split: str, benchmark: Benchmark) -> Dataset:
    """A `datasets` copy with an image column and a caption column (a list of strings per image)."""
    import datasets

    dataset = load_datasets_copy(str(root), split=split)
    image = next((c for c, f in dataset.features.items() if isinstance(f, datasets.Image)), None)
    caption = next((c for c in CAPTION_COLUMNS if c in dataset.column_names), None)
    if image is None or caption is None:
        raise UserError(f"{root}: needs an image column and a caption column, found {dataset.column_names}")
    renames = {old: new for old, new in ((image, "image"), (caption, "caption")) if old != new}
    return dataset.select_columns([image, caption]).rename_columns(renames)


LAYOUTS = (
    Layout(
        "karpathy",
        "Karpathy's dataset_<name>.json beside the images (flickr30k-images/, Flicker8k_Dataset/, COCO's "
        "val2014/): its test split",
        _karpathy_file,
        load_karpathy,
    ),
    Layout(
        "hf-captions",
        "a datasets copy (hf:<Hub id>, save_to_disk or <split>-*.parquet) with an image and a caption-list "
        "column",
        find_datasets_copy,
        load_caption_copy,
    ),
)
