"""The column contract every hf_vrl loader returns, and the feature definitions they share.

Rows: `image` (PIL RGB), `caption` (non-empty str), `label` (int; a ClassLabel with class names where the
source has classes, -1 where it has none), optional `fine_label`, `attributes`, `key`.
Batches (see `collate.py`): `pixel_values`, `input_ids`, `attention_mask`, `class_labels`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from datasets import ClassLabel, Dataset, Features, Value
from datasets import Image as ImageFeature
from PIL import Image

IMAGE, CAPTION, LABEL, FINE_LABEL, KEY = "image", "caption", "label", "fine_label", "key"
NO_LABEL = -1


def label_feature(class_names: Sequence[str] | None) -> ClassLabel | Value:
    """ClassLabel with `class_names`, or a plain int64 (always -1) when the source has no classes."""
    return ClassLabel(names=list(class_names)) if class_names is not None else Value("int64")


def contract_features(
    class_names: Sequence[str] | None, extra: Mapping[str, Any] | None = None, *, decode: bool = True
) -> Features:
    """Features of a contract dataset: image, caption, label (+ `extra` columns)."""
    features = {
        IMAGE: ImageFeature(decode=decode),
        CAPTION: Value("string"),
        LABEL: label_feature(class_names),
    }
    return Features({**features, **(extra or {})})


def class_names_of(dataset: Any) -> list[str] | None:
    """The class names of `dataset["label"]`, or None when it is not a ClassLabel."""
    feature = (dataset.features or {}).get(LABEL)
    return list(feature.names) if isinstance(feature, ClassLabel) else None


def rgb_array_to_ppm(array: np.ndarray) -> bytes:
    """Binary PPM (P6) bytes of an `[H, W, 3]` uint8 array: lossless, and ~100x cheaper to write than PNG."""
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3:
        raise ValueError(f"expected an [H, W, 3] uint8 array, got {array.dtype} {array.shape}")
    height, width = array.shape[:2]
    return b"P6\n%d %d\n255\n" % (width, height) + np.ascontiguousarray(array).tobytes()


def dataset_from_arrays(
    images: np.ndarray | Sequence[np.ndarray], columns: Mapping[str, Sequence[Any]], features: Features
) -> Dataset:
    """An in-memory Dataset whose `image` column holds RGB uint8 arrays stored losslessly (as PPM bytes),
    decoded back to PIL RGB by the `Image` feature on access."""
    encoded = [{"bytes": rgb_array_to_ppm(np.asarray(a)), "path": None} for a in images]
    return Dataset.from_dict({IMAGE: encoded, **columns}, features=features)


def validate_row(row: Mapping[str, Any]) -> None:
    """Raise ValueError when `row` breaks the row contract (used by tests and by users' own loaders)."""
    image, caption, label = row.get(IMAGE), row.get(CAPTION), row.get(LABEL)
    if not isinstance(image, Image.Image) or image.mode != "RGB":
        raise ValueError(
            f"'image' must be a PIL image in RGB, got {type(image).__name__} {getattr(image, 'mode', '')}"
        )
    if not isinstance(caption, str) or not caption.strip():
        raise ValueError(f"'caption' must be a non-empty string, got {caption!r}")
    if not isinstance(label, (int, np.integer)) or label < NO_LABEL:
        raise ValueError(f"'label' must be an int >= -1, got {label!r}")
