"""Real labelled images that install without the Hub, as captioned contract datasets.

- Fashion-MNIST (Debian package `dataset-fashion-mnist`, or its four idx files in the folder the environment
  variable HF_VRL_FASHION_MNIST names): the official 60k/10k split.
- Animal-MNIST (PyPI `animal-mnist`): 10k animal silhouettes in gzipped pickles, read with an allow-list
  unpickler that can only rebuild numpy arrays (no code runs). No official split: a fixed stratified
  80/20 split (the same whatever `seed`).
- scikit-learn digits (1,797 8x8 images): the same fixed stratified 80/20 split.

Images are greyscale, returned as RGB resized to `image_size` (bicubic, antialiased; None keeps the native
size); captions come from `prompts.CAPTION_TEMPLATES`; `label` is a ClassLabel with the class names.
"""

from __future__ import annotations

import gzip
import importlib.util
import io
import os
import pickle
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from datasets import Dataset

from .prompts import captions_for_labels
from .schema import contract_features, dataset_from_arrays

FASHION_MNIST_DIR = Path(os.environ.get("HF_VRL_FASHION_MNIST", "/usr/share/datasets/fashion-mnist"))
FASHION_MNIST_CLASSES = (
    "t-shirt/top",
    "trouser",
    "pullover",
    "dress",
    "coat",
    "sandal",
    "shirt",
    "sneaker",
    "bag",
    "ankle boot",
)
ANIMAL_MNIST_CLASSES = ("bear", "bird", "cat", "cow", "dog", "elephant", "giraffe", "horse", "sheep", "zebra")
DIGITS_CLASSES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
SPLITS = ("train", "test")
TEST_FRACTION = 0.2  # for the sources without an official split
_SPLIT_SEED = 0  # fixed: the train/test split never depends on the caller's seed
DEFAULT_IMAGE_SIZE = 32


class DatasetUnavailableError(FileNotFoundError):
    """An offline source is not installed; the message says how to install it."""


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def read_idx(path: Path) -> np.ndarray:
    """An unsigned-byte idx file (LeCun's MNIST format, gzipped or not) as an array of the shape its header
    gives: two zero bytes, the type 0x08, the number of dimensions, then each size as a big-endian int32."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    if data[:3] != b"\x00\x00\x08":
        raise ValueError(f"{path} is not an unsigned-byte idx file")
    shape = np.frombuffer(data, dtype=">i4", count=data[3], offset=4)
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * data[3]).reshape(shape)


def fashion_mnist_arrays(split: str, root: str | Path = FASHION_MNIST_DIR) -> tuple[np.ndarray, np.ndarray]:
    """(images [N, 28, 28] uint8, labels [N]) of the official Fashion-MNIST split."""
    _check_split(split)
    prefix = "train" if split == "train" else "t10k"
    images_path = Path(root) / f"{prefix}-images-idx3-ubyte.gz"
    labels_path = Path(root) / f"{prefix}-labels-idx1-ubyte.gz"
    if not images_path.is_file() or not labels_path.is_file():
        raise DatasetUnavailableError(
            f"Fashion-MNIST not found in {root} (looked for {images_path.name}, {labels_path.name}). "
            "Install it with `sudo apt-get install dataset-fashion-mnist`, or point HF_VRL_FASHION_MNIST (or "
            "root=) at the folder holding the four idx .gz files."
        )
    return read_idx(images_path), read_idx(labels_path).astype(np.int64)


try:
    from numpy._core.multiarray import _reconstruct
except ImportError:  # numpy < 2
    from numpy.core.multiarray import _reconstruct


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickler that can only rebuild numpy arrays and dtypes: any other global is refused."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
    }

    def find_class(self, module: str, name: str):
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}: only numpy arrays are allowed")
        return {"_reconstruct": _reconstruct, "ndarray": np.ndarray, "dtype": np.dtype}[name]


def load_safe_pickle(data: bytes, encoding: str = "ASCII") -> Any:
    """A pickle of built-in containers and numpy arrays (CIFAR's batches: `encoding="latin1"` reads their
    Python 2 strings), refusing every global other than numpy's array rebuilders: no code runs."""
    return _NumpyOnlyUnpickler(io.BytesIO(data), encoding=encoding).load()


def load_numpy_pickle(data: bytes) -> np.ndarray:
    """A numpy array from pickle bytes, refusing every global other than numpy's array rebuilders."""
    array = load_safe_pickle(data)
    if not isinstance(array, np.ndarray) or array.dtype == object:
        raise pickle.UnpicklingError(f"expected a numeric numpy array, got {type(array).__name__}")
    return array


def animal_mnist_dir() -> Path:
    spec = importlib.util.find_spec(
        "animal_mnist"
    )  # locate the package without importing it (needs tensorflow)
    if spec is None or not spec.submodule_search_locations:
        raise DatasetUnavailableError(
            "Animal-MNIST is not installed. Install it with `pip install --no-deps animal-mnist` "
            "(its tensorflow dependency is not needed), or `pip install hf-vrl[data]`."
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "Animal_MNIST"


def animal_mnist_arrays() -> tuple[np.ndarray, np.ndarray]:
    """(images [10000, 28, 28] uint8, labels [10000]) of Animal-MNIST, all rows."""
    folder = animal_mnist_dir()
    with gzip.open(folder / "animal_data_version_3.gz", "rb") as f:
        images = load_numpy_pickle(f.read())
    with gzip.open(folder / "animal_label_version_3.gz", "rb") as f:
        labels = load_numpy_pickle(f.read())
    return images.reshape(-1, 28, 28).astype(np.uint8), labels.astype(np.int64)


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """(images [1797, 8, 8] uint8 scaled from 0..16, labels) of scikit-learn's digits, all rows."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as error:
        raise DatasetUnavailableError(
            "sklearn digits need scikit-learn: `pip install scikit-learn` (or `pip install hf-vrl[eval]`)."
        ) from error
    bunch = load_digits()
    images = np.rint(bunch.images * (255.0 / 16.0)).astype(np.uint8)
    return images, bunch.target.astype(np.int64)


def stratified_split(labels: np.ndarray, split: str, test_fraction: float = TEST_FRACTION) -> np.ndarray:
    """Sorted row indices of `split` in a fixed stratified split (test = `test_fraction` of every class)."""
    _check_split(split)
    rng = np.random.default_rng(_SPLIT_SEED)
    test = []
    for cls in np.unique(labels):
        rows = rng.permutation(np.flatnonzero(labels == cls))
        test.append(rows[: int(round(test_fraction * len(rows)))])
    in_test = np.zeros(len(labels), dtype=bool)
    in_test[np.concatenate(test)] = True
    return np.flatnonzero(in_test if split == "test" else ~in_test)


def resize_grey_batch(images: np.ndarray, image_size: int | None) -> np.ndarray:
    """[N, H, W] uint8 greyscale -> [N, S, S, 3] uint8 RGB (bicubic, antialiased when shrinking)."""
    if image_size is not None and image_size != images.shape[1]:
        import torch

        x = torch.from_numpy(np.ascontiguousarray(images)).unsqueeze(1).float()
        x = torch.nn.functional.interpolate(x, size=(image_size, image_size), mode="bicubic", antialias=True)
        images = x.round().clamp(0, 255).to(torch.uint8).squeeze(1).numpy()
    return np.repeat(images[..., None], 3, axis=-1)


def subsample(n: int, limit: int | None, seed: int) -> np.ndarray:
    """Sorted indices of a seeded random subset of size `limit` (all of range(n) when limit is None)."""
    if limit is None or limit >= n:
        return np.arange(n)
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    return np.sort(np.random.default_rng(seed).permutation(n)[:limit])


def captioned_grey_dataset(
    images: np.ndarray, labels: np.ndarray, class_names: Sequence[str], *, image_size: int | None, seed: int
) -> Dataset:
    """Contract Dataset from greyscale arrays: RGB at `image_size`, template captions seeded by `seed`."""
    return dataset_from_arrays(
        resize_grey_batch(images, image_size),
        {"caption": captions_for_labels(labels, list(class_names), seed), "label": labels.tolist()},
        contract_features(class_names),
    )


def load_fashion_mnist(
    split: str = "train",
    *,
    image_size: int | None = DEFAULT_IMAGE_SIZE,
    limit: int | None = None,
    seed: int = 0,
    root: str | Path = FASHION_MNIST_DIR,
) -> Dataset:
    """Fashion-MNIST (60,000 train / 10,000 test) as a captioned contract Dataset."""
    images, labels = fashion_mnist_arrays(split, root)
    keep = subsample(len(labels), limit, seed)
    return captioned_grey_dataset(
        images[keep], labels[keep], FASHION_MNIST_CLASSES, image_size=image_size, seed=seed
    )


def _load_split(
    arrays: tuple[np.ndarray, np.ndarray], names: Sequence[str], split: str, image_size, limit, seed
) -> Dataset:
    images, labels = arrays
    rows = stratified_split(labels, split)
    rows = rows[subsample(len(rows), limit, seed)]
    return captioned_grey_dataset(images[rows], labels[rows], names, image_size=image_size, seed=seed)


def load_animal_mnist(
    split: str = "train",
    *,
    image_size: int | None = DEFAULT_IMAGE_SIZE,
    limit: int | None = None,
    seed: int = 0,
) -> Dataset:
    """Animal-MNIST (8,000 train / 2,000 test in the fixed stratified split) as a captioned Dataset."""
    return _load_split(animal_mnist_arrays(), ANIMAL_MNIST_CLASSES, split, image_size, limit, seed)


def load_digits(
    split: str = "train",
    *,
    image_size: int | None = DEFAULT_IMAGE_SIZE,
    limit: int | None = None,
    seed: int = 0,
) -> Dataset:
    """scikit-learn digits (1,437 train / 360 test in the fixed stratified split) as a captioned Dataset."""
    return _load_split(digits_arrays(), DIGITS_CLASSES, split, image_size, limit, seed)


OFFLINE_LOADERS: dict[str, Callable[..., Dataset]] = {
    "fashion_mnist": load_fashion_mnist,
    "animal_mnist": load_animal_mnist,
    "digits": load_digits,
}


def load_first_available(
    split: str = "train", candidates: Sequence[str] = tuple(OFFLINE_LOADERS), **kwargs
) -> tuple[str, Dataset]:
    """(name, dataset) of the first offline source in `candidates` that is installed."""
    reasons = []
    for name in candidates:
        try:
            return name, OFFLINE_LOADERS[name](split, **kwargs)
        except DatasetUnavailableError as error:
            reasons.append(f"{name}: {error}")
    raise DatasetUnavailableError("no offline dataset is installed:\n" + "\n".join(reasons))
