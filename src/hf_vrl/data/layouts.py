"""Every layout the benchmarks of `hf_vrl.data.benchmarks` are published in, read as published, and
`load_benchmark`: a benchmark's split from whichever of its layouts a folder (or Hub id) holds, labelled in
the benchmark's official classes (its `ClassLabel` holds every official class, so a partial copy is still
scored over all of them) and counted against the official numbers.

Layouts (`all_layouts()`; `hf_vrl.data.benchmarks.layouts_help` prints them per benchmark):
- ILSVRC-2012 (`imagenet.py`): train/<wnid>/ and the flat val/ with the devkit's ground truth or Kaggle's
  LOC_val_solution.csv; ImageNet-R / -A / -Sketch archives (<wnid>/ folders, no split level); ImageNet-V2
  (<0..999>/); ObjectNet 1.0 (images/<folder>/, the 113 folders mapped to ImageNet).
- CUB-200-2011, the FGVC-Aircraft archive, Stanford Cars' devkit (`cub.py`, `fine_grained.py`).
- WILDS' FMoW and iWildCam folders (`wilds.py`), Karpathy's caption splits (`captions.py`), MMVP-VLM
  (`hf_vrl.metrics.mmvp`), img2dataset shard folders (`webdataset.py`).
- The CLIP transfer sets with their publishers' annotation files (`transfer.py`: Flowers-102's .mat files,
  Pets', DTD's, Food-101's and SUN397's split lists, Caltech-101's and EuroSAT's class folders) and the packed
  ones (`packed.py`: CIFAR's pickles, MNIST's idx files, UCF-101's clips).
- Generic: <split>/<class>/ image folders and `datasets` copies (Hub id, save_to_disk, parquet), whose class
  names are matched to the official ones (OpenAI's names, the publisher's folder names, WordNet ids, or
  label ids); a class that matches none is refused.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from datasets import ClassLabel, Dataset, Value

from hf_vrl.errors import UserError

from .benchmarks import BENCHMARKS, Benchmark, Counts
from .images import DecodeTransform
from .offline import subsample
from .prompts import _normalise, captions_for_labels
from .schema import FINE_LABEL, LABEL, contract_features
from .webdataset import IMAGE_EXTENSIONS

__all__ = [
    "Layout",
    "all_layouts",
    "counts_of",
    "folder_with",
    "image_files",
    "lazy_dataset",
    "load_benchmark",
    "official_labels",
    "published_benchmark",
]


@dataclass(frozen=True)
class Layout:
    """A published layout: what it looks like (for --help and errors), where in a folder it is (`find`: the
    folder it reads, or None), and how a split is read (`load(folder, split, benchmark)`). `tree`: a plain
    class-folder tree or datasets copy, which an image-folder reader reads alike (the others carry annotation
    files: read as an image folder they would be mislabelled, `published_benchmark`)."""

    name: str
    description: str
    find: Callable[[Path], Path | None]
    load: Callable[[Path, str, Benchmark], Dataset]
    tree: bool = False


def image_files(folder: Path) -> list[Path]:
    """The image files directly in `folder`, sorted."""
    with os.scandir(folder) as entries:
        files = [
            Path(e.path)
            for e in entries
            if e.is_file() and e.name.rsplit(".", 1)[-1].lower() in IMAGE_EXTENSIONS
        ]
    return sorted(files)


def class_folders(folder: Path) -> list[Path]:
    """The sub-folders of `folder`, sorted by name."""
    with os.scandir(folder) as entries:
        return sorted((Path(e.path) for e in entries if e.is_dir()), key=lambda p: p.name)


def folder_with(root: Path, required: Sequence[str], *places: str) -> Path | None:
    """The first of `root` and `root/<place>` (the folders an archive extracts to) that holds every path of
    `required`; None when none does."""
    for base in (root, *(root / place for place in places)):
        if all((base / name).exists() for name in required):
            return base
    return None


def loadmat(path: Path) -> dict[str, Any]:
    """A MATLAB file (the devkits' annotations) with `scipy.io.loadmat(squeeze_me=True)`."""
    try:
        from scipy.io import loadmat as read
    except ImportError:
        raise UserError(f"reading {path.name} needs scipy: pip install scipy (or hf-vrl[eval])") from None
    return read(path, squeeze_me=True)


def lazy_dataset(
    paths: Sequence[str | Path],
    labels: Sequence[int],
    names: Sequence[str],
    *,
    columns: Mapping[str, Sequence[Any]] | None = None,
    features: Mapping[str, Any] | None = None,
    caption_names: Sequence[str] | None = None,
    seed: int = 0,
) -> Dataset:
    """A contract Dataset whose images are read from `paths` when accessed; `label` a ClassLabel of `names`,
    template captions of them (or of `caption_names`), `key` the file name, plus `columns` (with their
    `features`)."""
    data = {
        "image": [{"bytes": None, "path": str(p)} for p in paths],
        "caption": captions_for_labels(list(labels), list(caption_names or names), seed),
        LABEL: list(labels),
        "key": [Path(p).name for p in paths],
        **(columns or {}),
    }
    extra = {"key": Value("string"), **(features or {})}
    extra |= {name: Value("string") for name in (columns or {}) if name not in extra}
    dataset = Dataset.from_dict(data, features=contract_features(list(names), extra, decode=False))
    return dataset.with_transform(DecodeTransform("image"))


# -- class names: a source's classes in the benchmark's official ones ----------------------------------------


def _wnid_index(benchmark: Benchmark) -> dict[str, int]:
    """{WordNet id: official label} of an ImageNet-family benchmark (empty for the others)."""
    from .prompts import IMAGENET_FAMILY, imagenet_class_wnids

    if benchmark.key not in IMAGENET_FAMILY.values() or benchmark.key == "objectnet":
        return {}
    member = benchmark.key if benchmark.key in ("imagenet-r", "imagenet-a") else None
    return {wnid: i for i, wnid in enumerate(imagenet_class_wnids(member))}


def prompt_names(benchmark: Benchmark) -> list[str]:
    """The names a benchmark's classes are prompted and captioned with, in label order: OpenAI's for the
    ImageNet family (its labels are WordNet ids), FLYP's for iWildCam, else its labels' own."""
    return list(benchmark.prompt_names or benchmark.class_names or ())


def official_labels(benchmark: Benchmark, names: Sequence[str]) -> list[int]:
    """The official label of each source class name: by name (OpenAI's, the publisher's folder names,
    compared without case, spaces or punctuation), WordNet id (ImageNet family), or label id (digits: 0-based
    where a "0" class exists or for the ImageNet family, else the publisher's 1-based ids); an ImageNet-family
    copy with names of its own and all its classes ("tench, Tinca tinca", ...) maps by position, the standard
    order. A name that is none of these raises a UserError naming it."""
    from .transfer_classes import PUBLISHER_CLASSNAMES

    official = benchmark.class_names or ()
    wnids = _wnid_index(benchmark)
    lookup = {_normalise(n): i for i, n in enumerate(prompt_names(benchmark))}
    publisher = PUBLISHER_CLASSNAMES.get(benchmark.templates or "", ())
    lookup |= {_normalise(n): i for i, n in enumerate(publisher)}
    digits = all(n.isdigit() for n in names)
    base = 0 if (wnids or "0" in names) else 1
    if digits and wnids and len(wnids) != 1000:  # R / A by label id: ids in ImageNet's 1000
        raise UserError(f"{benchmark.title}: classes named by number are ambiguous; name them by WordNet id")
    out, unknown = [], []
    for name in names:
        if name in wnids:
            out.append(wnids[name])
        elif _normalise(name) in lookup and not digits:
            out.append(lookup[_normalise(name)])
        elif digits and 0 <= int(name) - base < len(official):
            out.append(int(name) - base)
        else:
            unknown.append(name)
    if unknown and wnids and len(names) == len(official):  # a copy's own names in the standard order
        return list(range(len(names)))
    if unknown:
        shown = ", ".join(repr(n) for n in unknown[:4])
        raise UserError(
            f"{benchmark.title}: classes {shown}{' ...' if len(unknown) > 4 else ''} are not its classes; "
            f"name the class folders as the publisher does (or {'WordNet ids' if wnids else 'OpenAI names'})"
        )
    return out


def relabel(dataset: Dataset, benchmark: Benchmark, names: Sequence[str], seed: int = 0) -> Dataset:
    """`dataset` (label ids into `names`) with `label` in the benchmark's official classes, and captions
    from their names."""
    mapping = np.asarray(official_labels(benchmark, names), dtype=np.int64)
    labels = mapping[np.asarray(dataset[LABEL][:], dtype=np.int64)].tolist()
    dataset = dataset.remove_columns([LABEL, "caption"])
    dataset = dataset.add_column(LABEL, labels, feature=ClassLabel(names=list(benchmark.class_names)))
    captions = captions_for_labels(labels, prompt_names(benchmark), seed)
    return dataset.add_column("caption", captions, feature=Value("string"))


# -- generic layouts ---------------------------------------------------------------------------------------


def _split_dirs(benchmark: Benchmark, split: str) -> list[str]:
    """The folder names a split may have: its own and its aliases."""
    return [split, *(alias for alias, target in benchmark.aliases.items() if target == split)]


def _find_split_folders(root: Path) -> Path | None:
    return root if root.is_dir() and any(class_folders(d) for d in class_folders(root)) else None


def _load_split_folders(root: Path, split: str, benchmark: Benchmark) -> Dataset:
    folder = next((root / d for d in _split_dirs(benchmark, split) if (root / d).is_dir()), None)
    if folder is None:
        raise UserError(
            f"{root} has no {split} folder (looked for {', '.join(_split_dirs(benchmark, split))}/)"
        )
    classes = class_folders(folder)
    labels = official_labels(benchmark, [c.name for c in classes])
    paths, ids = [], []
    for label, sub in zip(labels, classes):
        files = image_files(sub)
        paths += files
        ids += [label] * len(files)
    return lazy_dataset(paths, ids, benchmark.class_names, caption_names=prompt_names(benchmark))


def find_datasets_copy(root: Path) -> Path | None:
    """`root` when it holds a `datasets` copy (save_to_disk or parquet files)."""
    if (root / "state.json").is_file() or (root / "dataset_dict.json").is_file():
        return root
    return root if root.is_dir() and next(root.rglob("*.parquet"), None) is not None else None


def load_datasets_copy(target: str, split: str) -> Dataset:
    """A `datasets` copy: a save_to_disk folder, parquet files under a folder, or a Hub id."""
    import datasets

    path = Path(target)
    if (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
        loaded = datasets.load_from_disk(target)
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise UserError(f"{target} has no split {split!r}; it has {', '.join(loaded)}")
            return loaded[split]
        return loaded
    return datasets.load_dataset(target, split=split)


def _load_hf(root: Path | str, split: str, benchmark: Benchmark) -> Dataset:
    from .generic import resolve_columns, to_contract

    candidates = _split_dirs(benchmark, split)
    last: Exception | None = None
    for name in candidates:  # a copy names the split by one of its names ("validation", "test", ...)
        try:
            raw = load_datasets_copy(str(root), name)
            break
        except (ValueError, KeyError, UserError) as error:
            last = error
    else:
        raise UserError(f"{root}: no split named {' / '.join(candidates)} ({last})")
    label = resolve_columns(raw)[LABEL]
    feature = raw.features.get(label) if label else None
    if not isinstance(feature, ClassLabel):
        raise UserError(
            f"{root}: {benchmark.title} needs a ClassLabel column of its classes, found {raw.features}"
        )
    dataset = to_contract(raw)
    return relabel(dataset, benchmark, feature.names).with_transform(DecodeTransform("image"))


# -- the registry of layouts ------------------------------------------------------------------------------


@functools.cache
def all_layouts() -> dict[str, Layout]:
    """Every layout by name (built on first use: the layout modules import this one)."""
    from hf_vrl.metrics.mmvp import load_mmvp_vlm

    from . import captions, cub, fine_grained, imagenet, packed, transfer, webdataset, wilds

    generic = [
        Layout(
            "split-folders",
            "<split>/<class>/<image> folders (class folders named as the publisher names them)",
            _find_split_folders,
            _load_split_folders,
            tree=True,
        ),
        Layout(
            "hf",
            "a datasets copy (hf:<Hub id>, a save_to_disk folder, or <split>-*.parquet files) with a "
            "ClassLabel",
            find_datasets_copy,
            _load_hf,
            tree=True,
        ),
        Layout(
            "img2dataset",
            "img2dataset's output folder: <n>.tar shards (the .parquet and _stats.json beside each are its "
            "metadata, not read)",
            lambda root: root if root.is_dir() and any(root.glob("*.tar")) else None,
            lambda root, split, benchmark: webdataset.load_image_text(str(root)),
        ),
        Layout(
            "mmvp",
            "the official MMVP-VLM folder: Questions.csv and 'MLLM_VLM Images/<Type>/<qid>.jpg'",
            lambda root: root if (root / "Questions.csv").is_file() else None,
            lambda root, split, benchmark: load_mmvp_vlm(root, allow_partial=True),
        ),
    ]
    layouts = [
        *generic,
        *imagenet.LAYOUTS,
        cub.LAYOUT,
        *fine_grained.LAYOUTS,
        *wilds.LAYOUTS,
        *captions.LAYOUTS,
        *transfer.LAYOUTS,
        *packed.LAYOUTS,
    ]
    return {layout.name: layout for layout in layouts}


# -- loading a benchmark -----------------------------------------------------------------------------------


def resolve(benchmark: Benchmark, source: str) -> tuple[Layout, Path | str]:
    """(layout, folder) of `source` for `benchmark`: "hf:<id>" a datasets copy, a path or "<prefix>:<path>"
    the first of the benchmark's layouts found in it. A one-line UserError names the layouts it expected."""
    prefix, _, target = source.partition(":")
    if not target or len(prefix) == 1:  # no prefix (or a Windows drive)
        prefix, target = "", source
    target = os.path.expanduser(target)
    if prefix == "hf":
        copy = next((name for name in benchmark.layouts if name in ("hf", "hf-captions")), None)
        if copy is None:
            raise UserError(
                f"{benchmark.title} is not read from a datasets copy: expected {expected(benchmark)}"
            )
        found = find_datasets_copy(Path(target)) if Path(target).exists() else None
        return all_layouts()[copy], found or target
    folder = Path(target)
    if not folder.exists():
        raise UserError(f"{benchmark.title}: {folder} does not exist; expected {expected(benchmark)}")
    copies = ("hf", "hf-captions")  # "imagefolder:" names a folder layout, not a datasets copy
    names = [n for n in benchmark.layouts if prefix != "imagefolder" or n not in copies]
    for name in names:
        found = all_layouts()[name].find(folder)
        if found is not None:
            return all_layouts()[name], found
    raise UserError(f"{folder} is not a {benchmark.title} layout; expected {expected(benchmark)}")


def published_benchmark(folder: Path) -> str | None:
    """The classification benchmark whose publisher's annotated layout `folder` holds (the first in registry
    order), None when it holds none: a folder given as an image folder (`imagefolder:` or a bare path) is read
    as that benchmark, not as class folders that would mislabel it (WILDS' FMoW as one class "images")."""
    for key, benchmark in BENCHMARKS.items():
        if benchmark.task != "classification":
            continue
        for name in benchmark.layouts:
            layout = all_layouts()[name]
            if not layout.tree and layout.find(folder) is not None:
                return key
    return None


def expected(benchmark: Benchmark) -> str:
    """The layouts `benchmark` loads, as one phrase."""
    return " or ".join(all_layouts()[name].description for name in benchmark.layouts)


def counts_of(dataset: Any, benchmark: Benchmark, split: str) -> Counts:
    """`dataset`'s images (pairs), classes present (the fine level where there is one) and captions against
    the official counts of `split`."""
    official = benchmark.splits[split]
    if benchmark.task == "retrieval":
        texts = sum(len(c) for c in dataset["caption"][:])
        return Counts(
            benchmark.key, split, len(dataset), official.images, texts=texts, official_texts=official.texts
        )
    if benchmark.task == "pairs":
        present = sorted(set(dataset["category"][:]))
        return Counts(benchmark.key, split, len(dataset), official.images, len(present), official.classes)
    column = FINE_LABEL if FINE_LABEL in dataset.column_names else LABEL
    feature = dataset.features[column]
    labels = np.unique(np.asarray(dataset[column][:], dtype=np.int64))
    names = list(feature.names) if isinstance(feature, ClassLabel) else []
    missing = tuple(n for i, n in enumerate(names) if i not in set(labels.tolist()))
    classes = int(labels.size) if official.classes is not None else None
    return Counts(
        benchmark.key,
        split,
        len(dataset),
        official.images,
        classes,
        official.classes,
        missing_classes=missing if official.classes is not None else (),
    )


def load_benchmark(
    key: str, source: str, split: str = "test", *, level: str | None = None
) -> tuple[Any, Counts]:
    """(dataset, counts) of benchmark `key`'s `split` (or an alias) from `source` (a folder in one of its
    layouts, "hf:<id>", or "<prefix>:<path>"). `level`: for FGVC-Aircraft / Stanford Cars, the level `label`
    holds ("variant" / "model"; default: the coarse level, with the fine one in `fine_label`, as CLUE reads
    them). Nothing is checked against the counts here (`hf_vrl.data.benchmarks.check_counts` does)."""
    benchmark = BENCHMARKS[key]
    official = benchmark.split(split)
    layout, folder = resolve(benchmark, source)
    dataset = layout.load(folder, official, benchmark)
    if level is not None:
        from .fine_grained import at_level

        dataset = at_level(dataset, level, benchmark)
    return dataset, counts_of(dataset, benchmark, official)


def subset(dataset: Any, limit: int | None, seed: int) -> Any:
    """A seeded random subset of `limit` rows (all of them without a limit)."""
    return dataset if limit is None else dataset.select(subsample(len(dataset), limit, seed))
