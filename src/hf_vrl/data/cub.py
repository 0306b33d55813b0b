"""CUB-200-2011 from its official layout (Wah et al. 2011; the `CUB_200_2011.tgz` archive).

`root` is the extracted `CUB_200_2011/` folder or its parent. Required: images.txt (`<id> <path>`),
image_class_labels.txt (`<id> <class id>`), train_test_split.txt (`<id> <1 = train>`), classes.txt
(`<class id> <NNN.Name>`), images/. Optional: bounding_boxes.txt (`<id> <x> <y> <w> <h>`, for `bbox_crop`)
and attributes/image_attribute_labels.txt + attributes.txt (for `with_attributes`).
Images are read lazily from disk (a `with_transform` decodes them to RGB and applies the crop).
"""

from __future__ import annotations

import os
from pathlib import Path

from datasets import Dataset, List, Value

from .images import MISSING_IMAGE, DecodeTransform, ImageDecodeError, SampleFilter, decode_image
from .offline import SPLITS, subsample
from .prompts import captions_for_labels, clean_class_name
from .readers import Layout
from .schema import contract_features

REQUIRED_FILES = ("images.txt", "image_class_labels.txt", "train_test_split.txt", "classes.txt")


def find_cub_root(root: str | os.PathLike) -> Path:
    """The folder holding images.txt etc.: `root` itself or `root/CUB_200_2011`."""
    for candidate in (Path(root), Path(root) / "CUB_200_2011"):
        if all((candidate / name).is_file() for name in REQUIRED_FILES):
            return candidate
    raise FileNotFoundError(
        f"{root} is not a CUB-200-2011 folder: expected {', '.join(REQUIRED_FILES)} and images/ in it or in "
        f"{Path(root) / 'CUB_200_2011'} (extract CUB_200_2011.tgz from https://www.vision.caltech.edu/datasets/cub_200_2011/)"
    )


def _read_table(path: Path) -> dict[int, list[str]]:
    with open(path, encoding="utf-8") as f:
        rows = (line.split() for line in f if line.strip())
        return {int(row[0]): row[1:] for row in rows}


def _read_attributes(base: Path) -> dict[int, list[str]]:
    """Present attribute names per image id ("has_bill_shape::dagger", ...)."""
    labels = base / "attributes" / "image_attribute_labels.txt"
    candidates = (
        base / "attributes.txt",
        base.parent / "attributes.txt",
        base / "attributes" / "attributes.txt",
    )
    names_file = next((p for p in candidates if p.is_file()), None)
    if not labels.is_file() or names_file is None:
        raise FileNotFoundError(
            f"with_attributes needs {labels} and attributes.txt (in {base} or its parent)"
        )
    names = {k: v[0] for k, v in _read_table(names_file).items()}
    present: dict[int, list[str]] = {}
    with open(labels, encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 3 and fields[2] == "1":
                present.setdefault(int(fields[0]), []).append(names[int(fields[1])])
    return present


def load_cub(
    root: str | os.PathLike,
    split: str = "train",
    *,
    bbox_crop: bool = False,
    with_attributes: bool = False,
    limit: int | None = None,
    seed: int = 0,
    verify: bool = False,
    sample_filter: SampleFilter | None = None,
) -> Dataset:
    """CUB-200-2011 `split` ("train" 5,994 / "test" 5,794 images in the official split) as a contract Dataset:
    image (RGB, cropped to the bird's box with `bbox_crop`), caption from the templates, label (200 cleaned
    class names), key (the image's relative path), bbox [x, y, w, h] when bounding_boxes.txt exists, and
    attributes (present attribute names) with `with_attributes`.

    Missing image files are skipped (counted and warned once). `verify=True` also decodes every image once
    and skips the ones that fail, so that training never meets a corrupt file (slow: a full pass). Pass a
    `sample_filter` to collect the skip counts.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    base = find_cub_root(root)
    paths = {k: v[0] for k, v in _read_table(base / "images.txt").items()}
    classes = {k: v[0] for k, v in _read_table(base / "image_class_labels.txt").items()}
    is_train = {k: v[0] == "1" for k, v in _read_table(base / "train_test_split.txt").items()}
    class_table = _read_table(base / "classes.txt")
    names = [clean_class_name(class_table[k][0]) for k in sorted(class_table)]
    boxes_file = base / "bounding_boxes.txt"
    boxes = (
        {k: [float(x) for x in v] for k, v in _read_table(boxes_file).items()}
        if boxes_file.is_file()
        else None
    )
    if bbox_crop and boxes is None:
        raise FileNotFoundError(f"bbox_crop=True needs {boxes_file}")
    attributes = _read_attributes(base) if with_attributes else None

    checker = sample_filter or SampleFilter(f"CUB {split}")
    ids = []
    for image_id in sorted(i for i in paths if is_train[i] == (split == "train")):
        path = base / "images" / paths[image_id]
        if not path.is_file():
            checker.skip(MISSING_IMAGE, str(path), paths[image_id])
            continue
        if verify and not _decodes(path, checker):
            continue
        ids.append(image_id)
    ids = [ids[i] for i in subsample(len(ids), limit, seed)]
    labels = [int(classes[i]) - 1 for i in ids]
    columns: dict[str, list] = {
        "image": [{"bytes": None, "path": str(base / "images" / paths[i])} for i in ids],
        "caption": captions_for_labels(labels, names, seed),
        "label": labels,
        "key": [paths[i] for i in ids],
    }
    extra = {"key": Value("string")}
    if boxes is not None:
        columns["bbox"], extra["bbox"] = [boxes[i] for i in ids], List(Value("float32"), length=4)
    if attributes is not None:
        columns["attributes"], extra["attributes"] = (
            [attributes.get(i, []) for i in ids],
            List(Value("string")),
        )
    dataset = Dataset.from_dict(columns, features=contract_features(names, extra, decode=False))
    return dataset.with_transform(DecodeTransform("image", "bbox" if bbox_crop else None))


def _decodes(path: Path, checker: SampleFilter) -> bool:
    try:
        decode_image(path)
    except ImageDecodeError as error:
        checker.skip(error.kind, str(error), str(path))
        return False
    return True


def _find(root: Path) -> Path | None:
    try:
        return find_cub_root(root)
    except FileNotFoundError:
        return None


LAYOUT = Layout(
    "cub",
    "CUB_200_2011/ as extracted from CUB_200_2011.tgz (images.txt, image_class_labels.txt, "
    "train_test_split.txt, classes.txt, images/)",
    _find,
    lambda root, split, benchmark: load_cub(root, split),
)
