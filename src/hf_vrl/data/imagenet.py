"""ImageNet and its distribution shifts in the layouts their publishers ship (the classes: OpenAI's curated
names, `hf_vrl.data.prompts`; the counts: `hf_vrl.data.benchmarks`).

- ILSVRC-2012: `train/<wnid>/*.JPEG`, and `val/` either flat (`ILSVRC2012_val_00000001.JPEG` ...) with the
  devkit's `ILSVRC2012_devkit_t12/data/ILSVRC2012_validation_ground_truth.txt` (one ILSVRC2012_ID per image,
  in file-number order) and `data/meta.mat` (its `synsets`: ILSVRC2012_ID -> WNID, read with
  `scipy.io.loadmat`), or Kaggle's `LOC_val_solution.csv` (`ImageId,PredictionString`, the WNID first), or
  already sorted into `val/<wnid>/`. Kaggle's `ILSVRC/Data/CLS-LOC/{train,val}` is found too.
- ImageNet-R, -A (`imagenet-r/<wnid>/`, `imagenet-a/<wnid>/`: 200 WNIDs each) and -Sketch (`sketch/<wnid>/`):
  class folders without a split level.
- ImageNet-V2 (`imagenetv2-matched-frequency-format-val/<0..999>/`): folders by ImageNet label id. Its three
  published variants hold the same counts (10,000 images, 10 a class): the variant is read from the name its
  archive extracts to (`imagenetv2-<variant>-format-val`, on the folder or above it); threshold0.7 and
  top-images are refused in one line (the tables score matched-frequency), a copy named for none is read as
  given.
- ObjectNet 1.0 (`objectnet-1.0/images/<folder>/`): only the 113 folders FLYP / WiSE-FT map to ImageNet
  classes are read (`OBJECTNET_FOLDER_TO_IMAGENET`), labelled by folder name in sorted order, as they score
  them; the folder names stay as published ("alarm_clock"). Its images are scored without a 2-pixel border
  (`OBJECTNET_BORDER`, `border_crop`: FLYP / WiSE-FT's objectnet.py crop, which DiVE's evaluation follows),
  applied where any command embeds them (`hf_vrl.evaluation.scored_images`).
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from datasets import Dataset

from hf_vrl.errors import UserError

from .benchmarks import Benchmark
from .imagenet_classes import OBJECTNET_FOLDER_TO_IMAGENET
from .readers import Layout, class_folders, image_files, lazy_dataset, loadmat, official_labels, prompt_names

WNID = re.compile(r"^n\d{8}$")
DEVKIT_GROUND_TRUTH = "ILSVRC2012_validation_ground_truth.txt"
KAGGLE_SOLUTION = "LOC_val_solution.csv"


def _wnid_folders(folder: Path) -> list[Path]:
    return [d for d in class_folders(folder) if WNID.match(d.name)]


def _labelled_folders(folders: list[Path], benchmark: Benchmark) -> Dataset:
    """The images of class folders named by WNID or label id, labelled in the benchmark's classes."""
    labels = official_labels(benchmark, [d.name for d in folders])
    paths, ids = [], []
    for label, folder in zip(labels, folders):
        files = image_files(folder)
        paths += files
        ids += [label] * len(files)
    return lazy_dataset(paths, ids, benchmark.class_names, caption_names=prompt_names(benchmark))


# -- ILSVRC-2012 ------------------------------------------------------------------------------------------


def _ilsvrc_base(root: Path) -> Path | None:
    """The folder holding train/ and/or val/: `root` or Kaggle's ILSVRC/Data/CLS-LOC under it."""
    for base in (root, root / "ILSVRC" / "Data" / "CLS-LOC"):
        train, val = base / "train", base / "val"
        if (train.is_dir() and _wnid_folders(train)) or (
            val.is_dir() and (_wnid_folders(val) or image_files(val))
        ):
            return base
    return None


def _devkit_labels(root: Path, base: Path) -> dict[str, str] | None:
    """{val file stem: WNID} from the devkit's ground truth and meta.mat, None without a devkit."""
    for data in (
        root / "ILSVRC2012_devkit_t12" / "data",
        base / "ILSVRC2012_devkit_t12" / "data",
        root / "data",
    ):
        truth = data / DEVKIT_GROUND_TRUTH
        if truth.is_file():
            meta = data / "meta.mat"
            if not meta.is_file():
                raise UserError(f"{truth} needs the devkit's meta.mat beside it (ILSVRC2012_ID -> WNID)")
            wnid_of = _meta_wnids(meta)
            ids = [int(line) for line in truth.read_text().split()]
            return {f"ILSVRC2012_val_{n:08d}": wnid_of[i] for n, i in enumerate(ids, start=1)}
    return None


def _meta_wnids(meta: Path) -> dict[int, str]:
    """{ILSVRC2012_ID: WNID} of the devkit's meta.mat `synsets` (the 1,000 leaves; ids 1..1000)."""
    synsets = loadmat(meta)["synsets"]
    return {int(s["ILSVRC2012_ID"]): str(s["WNID"]) for s in synsets if int(s["ILSVRC2012_ID"]) <= 1000}


def _kaggle_labels(root: Path, base: Path) -> dict[str, str] | None:
    """{val file stem: WNID} from Kaggle's LOC_val_solution.csv (the first WNID of each row's boxes)."""
    for folder in dict.fromkeys((root, base)):
        path = folder / KAGGLE_SOLUTION
        if path.is_file():
            with path.open(newline="") as f:
                return {row["ImageId"]: row["PredictionString"].split()[0] for row in csv.DictReader(f)}
    return None


def _read_ilsvrc(base: Path, split: str, benchmark: Benchmark) -> Dataset:
    """A split of ILSVRC-2012 from `base` (its train/ and val/; the devkit or Kaggle's solution file in it or,
    for Kaggle's layout, three levels up)."""
    root = base.parents[2] if base.name == "CLS-LOC" else base
    folder = base / ("train" if split == "train" else "val")
    if not folder.is_dir():
        raise UserError(f"ILSVRC-2012 at {base}: no {folder.name}/ folder for the {split} split")
    if _wnid_folders(folder):
        return _labelled_folders(_wnid_folders(folder), benchmark)
    truth = _devkit_labels(root, base) or _kaggle_labels(root, base)
    if truth is None:
        raise UserError(
            f"{folder} is ImageNet's flat validation folder: put the devkit (ILSVRC2012_devkit_t12/data/"
            f"{DEVKIT_GROUND_TRUTH} and meta.mat) or Kaggle's {KAGGLE_SOLUTION} in {root}"
        )
    files = [f for f in image_files(folder) if f.stem in truth]
    unlabelled = len(image_files(folder)) - len(files)
    if unlabelled:
        raise UserError(
            f"{folder}: {unlabelled} images have no ground truth (not ILSVRC-2012 validation images)"
        )
    labels = official_labels(benchmark, [truth[f.stem] for f in files])
    return lazy_dataset(files, labels, benchmark.class_names, caption_names=prompt_names(benchmark))


# -- the distribution shifts ------------------------------------------------------------------------------


def _nested(root: Path, has: Callable[[Path], bool]) -> Path | None:
    """`root`, or its only sub-folder, when `has(folder)` (an archive extracted into a folder of its own)."""
    if has(root):
        return root
    children = class_folders(root) if root.is_dir() else []
    return children[0] if len(children) == 1 and has(children[0]) else None


def _find_wnid_folders(root: Path) -> Path | None:
    return _nested(root, lambda folder: bool(_wnid_folders(folder)))


def _read_wnid_folders(folder: Path, split: str, benchmark: Benchmark) -> Dataset:
    return _labelled_folders(_wnid_folders(folder), benchmark)


def _label_id_folders(folder: Path) -> list[Path]:
    return [d for d in class_folders(folder) if d.name.isdigit() and int(d.name) < 1000]


def _find_imagenetv2(root: Path) -> Path | None:
    return _nested(root, lambda folder: bool(_label_id_folders(folder)))


IMAGENETV2_VARIANT = re.compile(r"^imagenetv2-(matched-frequency|threshold-?0\.7|top-images)(-format-val)?$")
IMAGENETV2_SCORED = "matched-frequency"


def imagenetv2_variant(folder: Path) -> str | None:
    """The ImageNet-V2 variant `folder` holds, by the name its archive extracts to (on it or above it)."""
    for name in (part.name for part in (folder, *folder.resolve().parents)):
        match = IMAGENETV2_VARIANT.match(name)
        if match:
            return match.group(1).replace("threshold-", "threshold")
    return None


def _read_imagenetv2(folder: Path, split: str, benchmark: Benchmark) -> Dataset:
    variant = imagenetv2_variant(folder)
    if variant not in (None, IMAGENETV2_SCORED):
        raise UserError(
            f"{folder} is ImageNet-V2's {variant} variant (its archive's folder name), whose counts equal "
            f"matched-frequency's: the tables score {IMAGENETV2_SCORED}; give "
            "imagenetv2-matched-frequency-format-val/ (imagenetv2-matched-frequency.tar.gz)"
        )
    return _labelled_folders(_label_id_folders(folder), benchmark)


OBJECTNET_BORDER = 2  # pixels FLYP / WiSE-FT's objectnet.py crop off every side before preprocessing


def border_crop(image: Any, pixels: int) -> Any:
    """`image` without `pixels` on every side (WiSE-FT's ObjectNet `crop`: `(2, 2, w - 2, h - 2)`)."""
    return image if pixels <= 0 else image.crop((pixels, pixels, image.width - pixels, image.height - pixels))


class BorderCropped(Sequence):
    """A lazy view of an image column with `border_crop` applied to what is read (ObjectNet)."""

    def __init__(self, images: Any, pixels: int) -> None:
        self.images, self.pixels = images, pixels

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [border_crop(im, self.pixels) for im in self.images[index]]
        return border_crop(self.images[index], self.pixels)


def _objectnet_images(root: Path) -> Path | None:
    for folder in (root / "objectnet-1.0" / "images", root / "images", root):
        if folder.is_dir() and any(d.name in OBJECTNET_FOLDER_TO_IMAGENET for d in class_folders(folder)):
            return folder
    return None


def _read_objectnet(folder: Path, split: str, benchmark: Benchmark) -> Dataset:
    """The images of the 113 mapped folders, labelled by folder in sorted order (the other 200 folders are
    not ImageNet classes: not read)."""
    names = sorted(OBJECTNET_FOLDER_TO_IMAGENET)
    paths, labels = [], []
    for label, name in enumerate(names):
        if (folder / name).is_dir():
            files = image_files(folder / name)
            paths += files
            labels += [label] * len(files)
    return lazy_dataset(paths, labels, names)


LAYOUTS = (
    Layout(
        "ilsvrc",
        "ILSVRC-2012 as published: train/<wnid>/ and val/ (flat, with ILSVRC2012_devkit_t12/ or Kaggle's "
        "LOC_val_solution.csv beside it; or val/<wnid>/), also under Kaggle's ILSVRC/Data/CLS-LOC/",
        _ilsvrc_base,
        _read_ilsvrc,
        tree=True,  # train/<wnid>/ is also how a user's own WNID folders look (Imagenette): not rerouted
    ),
    Layout(
        "wnid-folders",
        "<wnid>/<image> folders without a split level, as the archive extracts (imagenet-r/, imagenet-a/, "
        "sketch/)",
        _find_wnid_folders,
        _read_wnid_folders,
        tree=True,
    ),
    Layout(
        "imagenetv2",
        "imagenetv2-matched-frequency-format-val/<0..999>/<image> (folders by ImageNet label id)",
        _find_imagenetv2,
        _read_imagenetv2,
        tree=True,
    ),
    Layout(
        "objectnet",
        "objectnet-1.0/images/<folder>/<image> (ObjectNet 1.0; its 113 ImageNet-mapped folders are scored)",
        _objectnet_images,
        _read_objectnet,
        tree=True,
    ),
)
