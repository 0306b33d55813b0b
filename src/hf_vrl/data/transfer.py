"""The transfer and probe sets of the CLIP paper's suite in their publishers' own layouts and annotation
files (the classes: OpenAI's names, `hf_vrl.data.transfer_classes`; the counts: `hf_vrl.data.benchmarks`).
Each is found in the folder given or in the folder its archive extracts to (torchvision's place in brackets).

- Oxford Flowers-102 (`102flowers.tgz` + `imagelabels.mat` + `setid.mat`) [flowers-102/]: `jpg/image_
  <00001..08189>.jpg`; `imagelabels.mat`'s `labels` (class 1..102 of image i), `setid.mat`'s `trnid` / `valid`
  / `tstid` (1-based image ids of train 1,020 / val 1,020 / test 6,149; the publisher's split).
- Oxford-IIIT Pets [oxford-iiit-pet/]: `images/<Breed>_<n>.jpg` and `annotations/trainval.txt`, `test.txt`
  ("Abyssinian_100 1 1 1": image, class id, species, breed id); the class is the file name's breed.
- DTD (`dtd-r1.0.1.tar.gz`) [dtd/dtd/]: `images/<class>/<image>` and `labels/train1.txt`, `val1.txt`,
  `test1.txt` ("banded/banded_0002.jpg"): split 1, as torchvision and clip_benchmark read it.
- Food-101 [food-101/]: `images/<class>/<id>.jpg` and `meta/classes.txt`, `meta/train.txt`, `meta/test.txt`
  ("apple_pie/1005649", no extension).
- SUN397 (`SUN397.tar.gz` + `Partitions.zip`): `SUN397/<letter>/<class>[/<sub>]/sun_<id>.jpg`, `ClassName.txt`
  ("/a/abbey") and the first of the publisher's ten partitions, `Training_01.txt` / `Testing_01.txt`
  ("/a/abbey/sun_aaalbzqrimafwbiv.jpg", 50 + 50 images a class), in `Partitions/` beside or inside `SUN397/`:
  the split of the CLIP paper's Table 9 (19,850 / 19,850).
- Caltech-101 (`caltech-101.zip`) [caltech101/]: `101_ObjectCategories/<class>/image_<n>.jpg`, 102 folders
  with BACKGROUND_Google. No published split: train is 30 images a class drawn with a fixed seed, test the
  rest (3,060 / 6,084), the usual protocol (tfds, which the CLIP paper and LGSSL read).
- EuroSAT RGB (`EuroSAT.zip`: `2750/`, or `EuroSAT_RGB.zip`) [eurosat/2750/]: `<Class>/<Class>_<n>.jpg`, ten
  classes. No published split: the archive is read whole as the test set (27,000 images), as clip_benchmark
  scores it; a train split needs <split>/<class>/ folders of your split.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from datasets import Dataset

from hf_vrl.errors import UserError

from .benchmarks import Benchmark
from .readers import (
    Layout,
    class_folders,
    folder_with,
    image_files,
    lazy_dataset,
    loadmat,
    official_labels,
    prompt_names,
)
from .transfer_classes import PUBLISHER_CLASSNAMES

CALTECH_TRAIN_PER_CLASS = 30  # tfds / VTAB / the CLIP paper: 30 train images a class, the rest test
CALTECH_SEED = 0
FLOWERS_SPLITS = {"train": "trnid", "validation": "valid", "test": "tstid"}
PETS_SPLITS = {"train": "trainval.txt", "test": "test.txt"}
DTD_SPLITS = {"train": "train1.txt", "validation": "val1.txt", "test": "test1.txt"}
SUN397_SPLITS = {"train": "Training_01.txt", "test": "Testing_01.txt"}
EUROSAT_FOLDERS = ("2750", "EuroSAT_RGB", "eurosat/2750")


def labelled(files: Sequence[Path], classes: Sequence[str], benchmark: Benchmark) -> Dataset:
    """A lazily read dataset of `files`, each of the publisher's class `classes[i]`, labelled in the
    benchmark's official classes (by name: `official_labels`)."""
    names = sorted(set(classes))
    index = dict(zip(names, official_labels(benchmark, names)))
    labels = [index[name] for name in classes]
    return lazy_dataset(files, labels, benchmark.class_names, caption_names=prompt_names(benchmark))


def _present(files: Sequence[Path], classes: Sequence[str]) -> tuple[list[Path], list[str]]:
    """The files that exist with their classes (a missing image is left out: the count check sees it)."""
    kept = [(f, c) for f, c in zip(files, classes) if f.is_file()]
    return [f for f, _ in kept], [c for _, c in kept]


def split_lines(path: Path) -> list[str]:
    """The non-empty, non-comment lines of an annotation file."""
    if not path.is_file():
        raise UserError(f"{path} is missing (the publisher's split file)")
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and line[0] != "#"]


# -- Oxford Flowers-102 -------------------------------------------------------------------------------------


def _load_flowers(root: Path, split: str, benchmark: Benchmark) -> Dataset:
    """The images of `split`'s ids in setid.mat, labelled by imagelabels.mat (class 1 = label 0)."""
    labels = np.atleast_1d(loadmat(root / "imagelabels.mat")["labels"]).astype(int)
    ids = sorted(np.atleast_1d(loadmat(root / "setid.mat")[FLOWERS_SPLITS[split]]).astype(int).tolist())
    rows = [(root / "jpg" / f"image_{i:05d}.jpg", int(labels[i - 1]) - 1) for i in ids]
    rows = [(path, label) for path, label in rows if path.is_file()]
    return lazy_dataset(
        [path for path, _ in rows],
        [label for _, label in rows],
        benchmark.class_names,
        caption_names=prompt_names(benchmark),
    )


# -- Oxford-IIIT Pets, DTD, Food-101, SUN397: split files of image paths ------------------------------------


def _load_pets(root: Path, split: str, benchmark: Benchmark) -> Dataset:
    names = [line.split()[0] for line in split_lines(root / "annotations" / PETS_SPLITS[split])]
    files = [root / "images" / f"{name}.jpg" for name in names]
    return labelled(*_present(files, [name.rsplit("_", 1)[0] for name in names]), benchmark)


def _load_dtd(root: Path, split: str, benchmark: Benchmark) -> Dataset:
    lines = split_lines(root / "labels" / DTD_SPLITS[split])
    files = [root / "images" / line for line in lines]
    return labelled(*_present(files, [line.split("/")[0] for line in lines]), benchmark)


def _load_food(root: Path, split: str, benchmark: Benchmark) -> Dataset:
    lines = split_lines(root / "meta" / f"{split}.txt")
    files = [root / "images" / f"{line}.jpg" for line in lines]
    return labelled(*_present(files, [line.split("/")[0] for line in lines]), benchmark)


def _sun397_partitions(root: Path) -> Path:
    for folder in (root / "Partitions", root.parent / "Partitions", root, root.parent):
        if (folder / SUN397_SPLITS["train"]).is_file():
            return folder
    raise UserError(
        f"SUN397 at {root}: no {SUN397_SPLITS['train']} / {SUN397_SPLITS['test']} (the publisher's "
        f"Partitions.zip); extract it into {root / 'Partitions'}"
    )


def _load_sun397(root: Path, split: str, benchmark: Benchmark) -> Dataset:
    """Partition 1's `split`; a line "/a/apartment_building/outdoor/sun_x.jpg" is of class
    "apartment building outdoor" (OpenAI's name, compared without spaces or punctuation)."""
    lines = split_lines(_sun397_partitions(root) / SUN397_SPLITS[split])
    files = [root / line.lstrip("/") for line in lines]
    classes = [" ".join(line.strip("/").split("/")[1:-1]) for line in lines]
    return labelled(*_present(files, classes), benchmark)


# -- Caltech-101 and EuroSAT: class folders, no published split ---------------------------------------------


def caltech_split(count: int, label: int, split: str) -> list[int]:
    """The positions (in sorted file order) of a class's `split`: CALTECH_TRAIN_PER_CLASS drawn for train
    with a seed of the class's own (a class's draw does not depend on the others), the rest for test."""
    rng = np.random.default_rng((CALTECH_SEED, label))
    train = set(rng.choice(count, min(CALTECH_TRAIN_PER_CLASS, count), replace=False).tolist())
    return [i for i in range(count) if (i in train) == (split == "train")]


def _load_caltech(folder: Path, split: str, benchmark: Benchmark) -> Dataset:
    classes = class_folders(folder)
    files, names = [], []
    for label, sub in zip(official_labels(benchmark, [c.name for c in classes]), classes):
        images = image_files(sub)
        chosen = [images[i] for i in caltech_split(len(images), label, split)]
        files += chosen
        names += [sub.name] * len(chosen)
    return labelled(files, names, benchmark)


def _publisher_folders(root: Path, key: str, places: Sequence[str]) -> Path | None:
    """The first of `root` and `root/<place>` whose sub-folders are all class folders of the publisher's
    names for `key`."""
    known = set(PUBLISHER_CLASSNAMES[key])
    for folder in (root, *(root / place for place in places)):
        names = [d.name for d in class_folders(folder)] if folder.is_dir() else []
        if names and set(names) <= known:
            return folder
    return None


def _load_eurosat(folder: Path, split: str, benchmark: Benchmark) -> Dataset:
    if split != "test":
        raise UserError(
            f"EuroSAT's publisher defines no split: {folder} is read whole as the test set (clip_benchmark's "
            "protocol); for a train split give <split>/<class>/ folders of your split"
        )
    classes = class_folders(folder)
    files = [f for sub in classes for f in image_files(sub)]
    return labelled(files, [f.parent.name for f in files], benchmark)


LAYOUTS = (
    Layout(
        "flowers102",
        "Oxford Flowers-102 as published: jpg/image_<n>.jpg, imagelabels.mat and setid.mat (trnid / valid / "
        "tstid)",
        lambda root: folder_with(root, ("jpg", "imagelabels.mat", "setid.mat"), "flowers-102"),
        _load_flowers,
    ),
    Layout(
        "oxford-pets",
        "Oxford-IIIT Pets as published: images/<Breed>_<n>.jpg and annotations/trainval.txt, test.txt",
        lambda root: folder_with(root, ("images", "annotations/trainval.txt"), "oxford-iiit-pet"),
        _load_pets,
    ),
    Layout(
        "dtd",
        "DTD as published: images/<class>/<image> and labels/train1.txt, val1.txt, test1.txt (split 1)",
        lambda root: folder_with(root, ("images", "labels/test1.txt"), "dtd", "dtd/dtd"),
        _load_dtd,
    ),
    Layout(
        "food-101",
        "Food-101 as published: images/<class>/<id>.jpg and meta/classes.txt, train.txt, test.txt",
        lambda root: folder_with(root, ("images", "meta/classes.txt", "meta/test.txt"), "food-101"),
        _load_food,
    ),
    Layout(
        "sun397",
        "SUN397 as published: SUN397/<letter>/<class>/<image>, ClassName.txt, and Partitions.zip's "
        "Training_01.txt / Testing_01.txt in SUN397/Partitions/ (partition 1)",
        lambda root: folder_with(root, ("ClassName.txt",), "SUN397"),
        _load_sun397,
    ),
    Layout(
        "caltech101",
        "Caltech-101 as published: 101_ObjectCategories/<class>/image_<n>.jpg (102 folders with "
        "BACKGROUND_Google; 30 images a class drawn for train, the rest test)",
        lambda root: _publisher_folders(
            root,
            "caltech101",
            ("101_ObjectCategories", "caltech-101/101_ObjectCategories", "caltech101/101_ObjectCategories"),
        ),
        _load_caltech,
        tree=True,
    ),
    Layout(
        "eurosat",
        "EuroSAT RGB as published: 2750/ or EuroSAT_RGB/ with <Class>/<Class>_<n>.jpg (read whole as the "
        "test set)",
        lambda root: _publisher_folders(root, "eurosat", EUROSAT_FOLDERS),
        _load_eurosat,
        tree=True,
    ),
)
