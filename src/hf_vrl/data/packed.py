"""The sets published packed (arrays in binary files, or videos) read as published: CIFAR's Python pickles,
MNIST's idx files and UCF-101's clips (the classes: OpenAI's names; the counts: `hf_vrl.data.benchmarks`).

- CIFAR-10 (`cifar-10-python.tar.gz` -> `cifar-10-batches-py/`): `data_batch_1` .. `data_batch_5` (train),
  `test_batch`, `batches.meta` (`label_names`); each batch a pickled dict with `data` (N x 3072 uint8: the
  red, green and blue 32 x 32 planes), `labels` and `filenames`.
- CIFAR-100 (`cifar-100-python.tar.gz` -> `cifar-100-python/`): `train`, `test`, `meta`
  (`fine_label_names`), each with `data`, `fine_labels`, `coarse_labels`, `filenames`; the 100 fine classes.
  The pickles are Python 2's: read with `encoding="latin1"` by an unpickler that can only rebuild numpy
  arrays (`hf_vrl.data.offline.load_safe_pickle`).
- MNIST (LeCun's four idx files, gzipped or not; torchvision's MNIST/raw/): `train-images-idx3-ubyte`,
  `train-labels-idx1-ubyte`, `t10k-images-idx3-ubyte`, `t10k-labels-idx1-ubyte`.
- UCF-101 (`UCF101.rar` -> `UCF-101/<Class>/v_<Class>_g<gg>_c<cc>.avi`, and
  `UCF101TrainTestSplits-RecognitionTask.zip` -> `ucfTrainTestlist/`: `trainlist01.txt`
  ("ApplyEyeMakeup/v_ApplyEyeMakeup_g08_c01.avi 1"), `testlist01.txt`): split 1 (9,537 / 3,783 clips), each
  clip scored by its middle frame as the CLIP paper does, decoded with decord when the row is read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from datasets import Dataset, Value, concatenate_datasets
from PIL import Image

from hf_vrl.errors import UserError

from .benchmarks import Benchmark
from .images import CORRUPT_IMAGE, ImageDecodeError
from .offline import captioned_grey_dataset, load_safe_pickle, read_idx
from .prompts import captions_for_labels
from .readers import Layout, class_folders, folder_with, official_labels, prompt_names
from .schema import contract_features, dataset_from_arrays
from .transfer import labelled, split_lines

CIFAR10_FILES = {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]}
CIFAR100_FILES = {"train": ["train"], "test": ["test"]}
MNIST_PREFIXES = {"train": "train", "test": "t10k"}
UCF_LISTS = "ucfTrainTestlist"
UCF_SPLITS = {"train": "trainlist01.txt", "test": "testlist01.txt"}


# -- CIFAR ---------------------------------------------------------------------------------------------------


def _text(value: Any) -> str:
    return value.decode("latin1") if isinstance(value, bytes) else str(value)


def _unpickle(path: Path) -> dict[str, Any]:
    """A CIFAR pickle as a dict with str keys (Python 2's strings read as latin-1)."""
    if not path.is_file():
        raise UserError(f"{path} is missing (part of the published CIFAR archive)")
    return {_text(k): v for k, v in load_safe_pickle(path.read_bytes(), encoding="latin1").items()}


def _cifar(files: Mapping[str, list[str]], meta: str, names_key: str, labels_key: str):
    """The loader of a CIFAR archive: the batches of a split, labelled through the meta file's class names,
    built one batch file at a time (a 10,000-image batch's encoding at a time in memory)."""

    def batch(path: Path, mapping: np.ndarray, benchmark: Benchmark, seed: int) -> Dataset:
        loaded = _unpickle(path)
        labels = mapping[np.asarray(loaded[labels_key], dtype=np.int64)].tolist()
        columns = {
            "caption": captions_for_labels(labels, prompt_names(benchmark), seed),
            "label": labels,
            "key": [_text(name) for name in loaded["filenames"]],
        }
        images = np.asarray(loaded["data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
        features = contract_features(benchmark.class_names, {"key": Value("string")})
        return dataset_from_arrays(images, columns, features)

    def load(root: Path, split: str, benchmark: Benchmark) -> Dataset:
        names = [_text(name) for name in _unpickle(root / meta)[names_key]]
        mapping = np.asarray(official_labels(benchmark, names))
        parts = [batch(root / name, mapping, benchmark, seed) for seed, name in enumerate(files[split])]
        return concatenate_datasets(parts)

    return load


def _find_cifar(root: Path, files: tuple[str, ...], place: str) -> Path | None:
    found = folder_with(root, files, place)
    return found if found is not None and all((found / name).is_file() for name in files) else None


# -- MNIST ---------------------------------------------------------------------------------------------------


def _idx(root: Path, name: str) -> Path:
    return next(
        (root / f"{name}{ext}" for ext in (".gz", "") if (root / f"{name}{ext}").is_file()), root / name
    )


def _find_mnist(root: Path) -> Path | None:
    for folder in (root, root / "MNIST" / "raw", root / "mnist"):
        if all(_idx(folder, f"{p}-images-idx3-ubyte").is_file() for p in MNIST_PREFIXES.values()):
            return folder
    return None


def _load_mnist(root: Path, split: str, benchmark: Benchmark) -> Dataset:
    prefix = MNIST_PREFIXES[split]
    images = read_idx(_idx(root, f"{prefix}-images-idx3-ubyte"))
    labels = read_idx(_idx(root, f"{prefix}-labels-idx1-ubyte")).astype(np.int64)
    if len(labels) != len(images):
        raise UserError(f"MNIST at {root}: {len(images)} {split} images but {len(labels)} labels")
    return captioned_grey_dataset(images, labels, benchmark.class_names, image_size=None, seed=0)


# -- UCF-101 -------------------------------------------------------------------------------------------------


def middle_frame(path: str) -> Image.Image:
    """The middle frame (frame count // 2) of a video, RGB (decord; an unreadable clip: ImageDecodeError)."""
    import decord

    try:
        reader = decord.VideoReader(path)
        return Image.fromarray(reader[len(reader) // 2].asnumpy()).convert("RGB")
    except decord.DECORDError as error:
        raise ImageDecodeError(CORRUPT_IMAGE, f"cannot decode video {path}: {error}") from error


@dataclass
class MiddleFrames:
    """`Dataset.with_transform` callable: each row's `image` (a video file) read as its middle frame."""

    image_column: str = "image"

    def __call__(self, batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        return {**batch, self.image_column: [middle_frame(v["path"]) for v in batch[self.image_column]]}


def _ucf_lists(videos: Path) -> Path | None:
    """The split lists of a UCF-101 video folder: inside it or beside it."""
    return next((d for d in (videos / UCF_LISTS, videos.parent / UCF_LISTS) if d.is_dir()), None)


def _find_ucf(root: Path) -> Path | None:
    for videos in (root / "UCF-101", root):
        if videos.is_dir() and _ucf_lists(videos) is not None and class_folders(videos):
            return videos
    return None


def _load_ucf(videos: Path, split: str, benchmark: Benchmark) -> Dataset:
    try:
        import decord  # noqa: F401
    except ImportError:
        raise UserError("UCF-101's .avi clips are read with decord: pip install decord") from None
    lists = _ucf_lists(videos)
    lines = [line.split()[0] for line in split_lines(lists / UCF_SPLITS[split])]
    rows = [(videos / line, line.split("/")[0]) for line in lines if (videos / line).is_file()]
    dataset = labelled([path for path, _ in rows], [name for _, name in rows], benchmark)
    return dataset.with_transform(MiddleFrames())


LAYOUTS = (
    Layout(
        "cifar-10-python",
        "CIFAR-10 as published: cifar-10-batches-py/ (data_batch_1..5, test_batch, batches.meta)",
        lambda root: _find_cifar(root, ("batches.meta", "test_batch"), "cifar-10-batches-py"),
        _cifar(CIFAR10_FILES, "batches.meta", "label_names", "labels"),
    ),
    Layout(
        "cifar-100-python",
        "CIFAR-100 as published: cifar-100-python/ (train, test, meta)",
        lambda root: _find_cifar(root, ("meta", "test", "train"), "cifar-100-python"),
        _cifar(CIFAR100_FILES, "meta", "fine_label_names", "fine_labels"),
    ),
    Layout(
        "mnist-idx",
        "MNIST as published: {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] (or torchvision's MNIST/raw/)",
        _find_mnist,
        _load_mnist,
    ),
    Layout(
        "ucf101",
        "UCF-101 as published: UCF-101/<Class>/<clip>.avi and ucfTrainTestlist/ (trainlist01.txt, "
        "testlist01.txt: split 1; each clip's middle frame, read with decord)",
        _find_ucf,
        _load_ucf,
    ),
)
