"""Any image folder (class subfolders, optional metadata.csv/jsonl captions) or any HF dataset, mapped to
the column contract.

`to_contract` does the mapping: picks (or is told) the image / caption / label columns and renames them
to `image`, `caption`, `label` (a clashing column keeps its data as `source_<name>`), cleans ClassLabel
names ("001.Black_footed_Albatross" -> "black footed albatross"), captions from the templates when the
source has class names only, sets `label = -1` when it has no labels, and decodes images robustly:
map-style datasets get a `with_transform`; streaming ones a filtering map that skips and counts bad samples.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import datasets
import numpy as np
from datasets import ClassLabel, Dataset, Features, IterableDataset, Value
from datasets import Image as ImageFeature

from .images import (
    EMPTY_CAPTION,
    MISSING_CAPTION,
    DecodeTransform,
    SampleError,
    SampleFilter,
    decode_image,
)
from .offline import subsample
from .prompts import CAPTION_TEMPLATES, captions_for_labels, clean_class_name, fill_template
from .schema import CAPTION, IMAGE, LABEL, NO_LABEL

IMAGE_CANDIDATES = ("image", "img", "jpg", "png", "picture")
CAPTION_CANDIDATES = ("caption", "text", "sentence", "title", "alt_text", "txt")
LABEL_CANDIDATES = ("label", "labels", "fine_label", "class", "target")
# the `id` of the caption feature where hf_vrl wrote the captions from the class names (the data has none)
TEMPLATE_CAPTIONS = "hf_vrl:class-name-templates"

AnyDataset = Dataset | IterableDataset


def _column_names(ds: AnyDataset) -> list[str]:
    if ds.column_names is not None:
        return list(ds.column_names)
    return list(ds.features or next(iter(ds)))


def _find(features: Features | None, names: list[str], candidates: tuple[str, ...], typed=None) -> str | None:
    if features is not None and typed is not None:
        match = next((n for n in names if isinstance(features.get(n), typed)), None)
        if match is not None:
            return match
    return next((c for c in candidates if c in names), None)


def resolve_columns(ds: AnyDataset, columns: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """{contract name: source column or None} for image / caption / label; `columns` overrides the guesses
    (image: the first Image feature, else a common name; label: the first ClassLabel, else a common name)."""
    names, features, columns = _column_names(ds), ds.features, dict(columns or {})
    unknown = set(columns) - {IMAGE, CAPTION, LABEL}
    if unknown:
        raise KeyError(f"column mapping keys must be 'image', 'caption' or 'label', got {sorted(unknown)}")
    for target, source in columns.items():
        if source not in names:
            raise KeyError(f"column {source!r} (given for {target!r}) is not among the columns {names}")
    found = {
        IMAGE: columns.get(IMAGE) or _find(features, names, IMAGE_CANDIDATES, ImageFeature),
        CAPTION: columns.get(CAPTION) or _find(features, names, CAPTION_CANDIDATES),
        LABEL: columns.get(LABEL) or _find(features, names, LABEL_CANDIDATES, ClassLabel),
    }
    if found[IMAGE] is None:
        raise KeyError(f"no image column among {names}; pass columns={{'image': <column name>}}")
    return found


def _rename(ds: AnyDataset, found: Mapping[str, str | None]) -> AnyDataset:
    mapping = {src: dst for dst, src in found.items() if src is not None and src != dst}
    clashing = [dst for dst in mapping.values() if dst in _column_names(ds) and dst not in mapping]
    if clashing:
        ds = ds.rename_columns({name: f"source_{name}" for name in clashing})
    return ds.rename_columns(mapping) if mapping else ds


def _contract_label_feature(features: Features | None) -> ClassLabel | Value:
    feature = (features or {}).get(LABEL)
    if isinstance(feature, ClassLabel):
        return ClassLabel(names=[clean_class_name(n) for n in feature.names])
    return feature if feature is not None else Value("int64")


def to_contract(
    ds: AnyDataset,
    columns: Mapping[str, str] | None = None,
    *,
    seed: int = 0,
    limit: int | None = None,
    sample_filter: SampleFilter | None = None,
) -> AnyDataset:
    """Map a Dataset or IterableDataset to the row contract (see the module docstring)."""
    found = resolve_columns(ds, columns)
    ds = _rename(ds, found).cast_column(IMAGE, ImageFeature(decode=False))
    has_caption = found[CAPTION] is not None
    if not has_caption and not isinstance((ds.features or {}).get(LABEL), ClassLabel):
        raise ValueError("the dataset has no caption column and no ClassLabel to caption from; "
                         "pass columns={'caption': <column name>}")  # fmt: skip
    sample_filter = sample_filter or SampleFilter("dataset")
    if isinstance(ds, IterableDataset):
        return _stream_contract(ds, has_caption, seed, limit, sample_filter)
    return _map_contract(ds, has_caption, seed, limit, sample_filter)


def _map_contract(
    ds: Dataset, has_caption: bool, seed: int, limit: int | None, sample_filter: SampleFilter
) -> Dataset:
    if has_caption:
        ds = ds.select(_good_caption_rows(ds[CAPTION], sample_filter))
    ds = ds.select(subsample(len(ds), limit, seed)) if limit is not None else ds
    label = _contract_label_feature(ds.features)
    if LABEL not in ds.column_names:
        ds = ds.add_column(LABEL, [NO_LABEL] * len(ds), feature=Value("int64"))
    elif label != ds.features[LABEL]:
        ds = ds.cast_column(LABEL, label)
    if not has_caption:
        ds = ds.add_column(
            CAPTION,
            captions_for_labels(ds[LABEL], label.names, seed),
            feature=Value("string", id=TEMPLATE_CAPTIONS),
        )
    return ds.with_transform(DecodeTransform(IMAGE))


def _good_caption_rows(captions: list[Any], sample_filter: SampleFilter) -> list[int]:
    keep = []
    for index, caption in enumerate(captions):
        if caption is None:
            sample_filter.skip(MISSING_CAPTION, f"row {index}", f"row {index}")
        elif not isinstance(caption, str) or not caption.strip():
            sample_filter.skip(EMPTY_CAPTION, f"row {index}", f"row {index}")
        else:
            keep.append(index)
    return keep


def _stream_captions(
    batch: dict[str, list], indices: list[int], names: list[str], seed: int
) -> dict[str, list]:
    """Template captions for a streamed batch, seeded by (seed, first row index): deterministic."""
    rng = np.random.default_rng([seed, indices[0] if indices else 0])
    picks = rng.integers(len(CAPTION_TEMPLATES), size=len(indices))
    return {CAPTION: [fill_template(CAPTION_TEMPLATES[p], names[y]) for p, y in zip(picks, batch[LABEL])]}


def _stream_contract(
    ds: IterableDataset, has_caption: bool, seed: int, limit: int | None, sample_filter: SampleFilter
) -> IterableDataset:
    features = None
    if ds.features is not None:
        caption = Value("string", id=None if has_caption else TEMPLATE_CAPTIONS)
        features = Features({**ds.features, IMAGE: ImageFeature(), CAPTION: caption})
        features[LABEL] = _contract_label_feature(ds.features)
    if LABEL not in _column_names(ds):
        ds = ds.map(lambda batch: {LABEL: [NO_LABEL] * len(batch[IMAGE])}, batched=True)
    if not has_caption:
        names = list(features[LABEL].names)
        ds = ds.map(
            _stream_captions, batched=True, with_indices=True, fn_kwargs={"names": names, "seed": seed}
        )
    ds = ds.map(sample_filter.filter_batch, batched=True, features=features)
    return ds.take(limit) if limit is not None else ds


def load_imagefolder(
    root: str | os.PathLike,
    split: str = "train",
    *,
    streaming: bool = False,
    columns: Mapping[str, str] | None = None,
    limit: int | None = None,
    seed: int = 0,
    sample_filter: SampleFilter | None = None,
    **load_kwargs: Any,
) -> AnyDataset:
    """An image folder (`root/<class>/*.jpg`, or `root/<split>/<class>/*.jpg`; a metadata.csv/jsonl with a
    caption column is used when present) via datasets' `imagefolder` builder, mapped to the contract."""
    if not os.path.isdir(root):
        raise FileNotFoundError(f"image folder not found: {root}")
    ds = datasets.load_dataset(
        "imagefolder", data_dir=os.fspath(root), split=split, streaming=streaming, **load_kwargs
    )
    sample_filter = sample_filter or SampleFilter(f"imagefolder:{os.fspath(root)}")
    if not streaming:  # streams skip bad images as they are read; a map-style folder is checked once here
        ds = _without_bad_images(ds, resolve_columns(ds, columns)[IMAGE], sample_filter)
    return to_contract(ds, columns, seed=seed, limit=limit, sample_filter=sample_filter)


def _without_bad_images(ds: Dataset, column: str, sample_filter: SampleFilter) -> Dataset:
    """The rows whose image decodes and is large enough, by the streamed path's rules (`SampleFilter`); the
    others are skipped and counted, so a damaged file never stops a run at the step that draws it."""
    keep = []
    raw = ds.cast_column(column, ImageFeature(decode=False))[column]
    for index, value in enumerate(raw):
        key = (value or {}).get("path") or f"row {index}"
        try:
            decode_image(value, min_side=sample_filter.min_side, draft_size=sample_filter.draft_size or 64)
        except SampleError as error:
            sample_filter.skip(error.kind, f"{error} [{key}]", key)
            continue
        keep.append(index)
    return ds if len(keep) == len(ds) else ds.select(keep)


def load_hf_dataset(
    name: str,
    split: str = "train",
    *,
    columns: Mapping[str, str] | None = None,
    streaming: bool = False,
    limit: int | None = None,
    seed: int = 0,
    sample_filter: SampleFilter | None = None,
    **load_kwargs: Any,
) -> AnyDataset:
    """A dataset by Hub name, local builder folder or `save_to_disk` folder, mapped to the contract with
    `columns` ({"image": ..., "caption": ..., "label": ...}; unspecified ones are guessed)."""
    path = Path(name)
    if path.is_dir() and ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file()):
        ds = datasets.load_from_disk(name)
        ds = ds[split] if isinstance(ds, datasets.DatasetDict) else ds
        ds = ds.to_iterable_dataset() if streaming else ds
    else:
        ds = datasets.load_dataset(name, split=split, streaming=streaming, **load_kwargs)
    sample_filter = sample_filter or SampleFilter(f"hf:{name}")
    image = resolve_columns(ds, columns)[IMAGE]
    if not streaming and image is not None:  # as an image folder: a damaged image is skipped and counted
        ds = _without_bad_images(ds, image, sample_filter)
    return to_contract(ds, columns, seed=seed, limit=limit, sample_filter=sample_filter)
