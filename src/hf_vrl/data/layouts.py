"""Every layout the benchmarks of `hf_vrl.data.benchmarks` are published in, read as published, and
`load_benchmark`: a benchmark's split from whichever of its layouts a folder (or Hub id) holds, labelled in
the benchmark's official classes (its `ClassLabel` holds every official class, so a partial copy is still
scored over all of them) and counted against the official numbers.

Layouts (`all_layouts()`; `layouts_help` prints them per benchmark):
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
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from datasets import ClassLabel, Dataset

from hf_vrl.errors import UserError
from hf_vrl.metrics.mmvp import load_mmvp_vlm

from . import (
    captions,
    clip_benchmark,
    cub,
    fine_grained,
    hub,
    imagenet,
    packed,
    timm_wds,
    transfer,
    webdataset,
    wilds,
)
from .benchmarks import BENCHMARKS, CLIP_BENCHMARK_LAYOUT, Benchmark, Counts, HubMirror, Split
from .generic import resolve_columns, to_contract
from .hub import HF_URL_PREFIX, is_hub_spec
from .images import DecodeTransform
from .offline import subsample
from .prompts import clean_class_name
from .readers import (
    Layout,
    class_folders,
    find_datasets_copy,
    image_files,
    lazy_dataset,
    load_datasets_copy,
    official_labels,
    prompt_names,
    relabel,
    split_dirs,
)
from .schema import FINE_LABEL, LABEL

__all__ = [
    "all_layouts",
    "counts_of",
    "expected",
    "layouts_help",
    "load_benchmark",
    "published_benchmark",
    "resolve",
    "subset",
]


# -- generic layouts ---------------------------------------------------------------------------------------


def _find_split_folders(root: Path) -> Path | None:
    return root if root.is_dir() and any(class_folders(d) for d in class_folders(root)) else None


def _load_split_folders(root: Path, split: str, benchmark: Benchmark) -> Dataset:
    folder = next((root / d for d in split_dirs(benchmark, split) if (root / d).is_dir()), None)
    if folder is None:
        raise UserError(
            f"{root} has no {split} folder (looked for {', '.join(split_dirs(benchmark, split))}/)"
        )
    classes = class_folders(folder)
    labels = official_labels(benchmark, [c.name for c in classes])
    paths, ids = [], []
    for label, sub in zip(labels, classes):
        files = image_files(sub)
        paths += files
        ids += [label] * len(files)
    return lazy_dataset(paths, ids, benchmark.class_names, caption_names=prompt_names(benchmark))


def _load_hf(root: Path | str, split: str, benchmark: Benchmark) -> Dataset:
    candidates = split_dirs(benchmark, split)
    last: Exception | None = None
    for name in candidates:  # a copy names the split by one of its names ("validation", "test", ...)
        try:
            raw = load_datasets_copy(*_datasets_source(root), split=name)
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
    if (
        benchmark.class_names is None
    ):  # CUB: its classes are the publisher's classes.txt, as the copy has them
        names = ClassLabel(names=[clean_class_name(n) for n in feature.names])
        return dataset.cast_column(LABEL, names).with_transform(DecodeTransform("image"))
    return relabel(dataset, benchmark, feature.names).with_transform(DecodeTransform("image"))


def _datasets_source(root: Path | str) -> tuple[str, str | None]:
    """(where, revision) `datasets` reads a copy from: a Hub id at the run's commit online
    (`hub.pinned_commits`), its local Hub-cache snapshot of that commit offline; a folder as it is."""
    if not (isinstance(root, str) and is_hub_spec(f"hf:{root}")):
        return str(root), None
    spec = hub.parse_hub_spec(f"hf:{root}")
    commit = hub.dataset_snapshot(spec.repo_id, spec.revision)[0]
    if hub.is_offline():
        return str(hub.local_snapshot(spec.repo_id, commit)), None
    return (spec.repo_id, commit) if not spec.path else (root, None)


# -- the registry of layouts ------------------------------------------------------------------------------


@functools.cache
def all_layouts() -> dict[str, Layout]:
    """Every layout by name."""
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
            CLIP_BENCHMARK_LAYOUT,
            "clip_benchmark's webdataset layout (hf:clip-benchmark/wds_<name> or its folder): "
            "<split>/nshards.txt, <split>/<i>.tar, classnames.txt, zeroshot_classification_templates.txt",
            clip_benchmark.find_mirror,
            clip_benchmark.load_mirror,
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
        timm_wds.LAYOUT,
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
    if source.startswith(HF_URL_PREFIX):  # hf://datasets/<org>/<name>: not cut at its first colon
        prefix, target = "hf", source
    target = os.path.expanduser(target)
    if prefix == "hf":
        return _resolve_hf(benchmark, target)
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


def _resolve_hf(benchmark: Benchmark, target: str) -> tuple[Layout, Path | str]:
    """(layout, source) of `hf:<target>`: a Hub repo (or folder) in one of the benchmark's shard layouts
    (clip_benchmark's `<split>/nshards.txt`, timm's `imagenet1k-<split>-*.tar`), else a `datasets` copy (a
    Hub id, save_to_disk folder or parquet files)."""
    spec = target if target.startswith(HF_URL_PREFIX) else f"hf:{target}"
    shard_layouts = [n for n in (CLIP_BENCHMARK_LAYOUT, timm_wds.LAYOUT.name) if n in benchmark.layouts]
    if shard_layouts and is_hub_spec(spec):
        names = clip_benchmark.SourceFiles.of(spec).names
        if CLIP_BENCHMARK_LAYOUT in shard_layouts and any(n.endswith("/nshards.txt") for n in names):
            return all_layouts()[CLIP_BENCHMARK_LAYOUT], spec
        if timm_wds.LAYOUT.name in shard_layouts and any(timm_wds.SHARD.fullmatch(n) for n in names):
            return timm_wds.LAYOUT, spec
    copy = next((name for name in benchmark.layouts if name in ("hf", "hf-captions")), None)
    if copy is None:
        raise UserError(f"{benchmark.title} is not read from a datasets copy: expected {expected(benchmark)}")
    found = find_datasets_copy(Path(target)) if Path(target).exists() else None
    for name in shard_layouts if found is None and Path(target).is_dir() else ():
        if all_layouts()[name].find(Path(target)) is not None:
            return all_layouts()[name], Path(target)
    return all_layouts()[copy], found or target


def published_benchmark(folder: Path) -> str | None:
    """The classification benchmark whose publisher's annotated layout `folder` holds (the first in registry
    order), None when it holds none: a folder given as an image folder (`imagefolder:` or a bare path) is read
    as that benchmark, not as class folders that would mislabel it (WILDS' FMoW as one class "images")."""
    for key, benchmark in BENCHMARKS.items():
        if benchmark.task != "classification":
            continue
        for name in benchmark.layouts:  # clip_benchmark's layout is many benchmarks': it names none
            layout = all_layouts()[name]
            if not layout.tree and name != CLIP_BENCHMARK_LAYOUT and layout.find(folder) is not None:
                return key
    return None


def expected(benchmark: Benchmark) -> str:
    """The layouts `benchmark` loads, as one phrase."""
    return " or ".join(all_layouts()[name].description for name in benchmark.layouts)


def counts_of(dataset: Any, benchmark: Benchmark, split: str, mirror: HubMirror | None = None) -> Counts:
    """`dataset`'s images (pairs), classes present (the fine level where there is one) and captions against
    the official counts of `split` (a `mirror`'s own counts of it, when the data are that mirror's)."""
    official = (
        benchmark.splits[split] if mirror is None else mirror.splits.get(mirror.split(split), Split(None))
    )
    counts = _counts(dataset, benchmark, split, official)
    if mirror is None:
        return counts
    return replace(
        counts, source=f"{mirror.repo_id} ({mirror.counts_source})", differs=mirror.differs or None
    )


def _counts(dataset: Any, benchmark: Benchmark, split: str, official: Split) -> Counts:
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


def _mirror_of(benchmark: Benchmark, layout: Layout, where: Path | str) -> HubMirror | None:
    """The registered Hub mirror the data are: a copy in a mirror's own layout (clip_benchmark's, timm's), or
    the mirror's repo read as a `datasets` copy (`hf:ILSVRC/imagenet-1k`); None for other data."""
    if layout.name not in ("hf", "hf-captions"):
        return benchmark.mirror(layout.name)
    return benchmark.mirror(repo_id=str(where).removeprefix("hf:"))


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
    mirror = _mirror_of(benchmark, layout, folder)
    dataset = layout.load(folder, mirror.split(official) if mirror else official, benchmark)
    if level is not None:
        dataset = fine_grained.at_level(dataset, level, benchmark)
    return dataset, counts_of(dataset, benchmark, official, mirror)


def subset(dataset: Any, limit: int | None, seed: int) -> Any:
    """A seeded random subset of `limit` rows (all of them without a limit)."""
    return dataset if limit is None else dataset.select(subsample(len(dataset), limit, seed))


def layouts_help(keys: Sequence[str] | None = None, only: Sequence[str] | None = None) -> str:
    """The layouts each benchmark of `keys` (default: all) loads (those in `only`, where given), one line
    each, for --help."""
    lines = []
    for key in keys or BENCHMARKS:
        names = [name for name in BENCHMARKS[key].layouts if only is None or name in only]
        accepted = "; or ".join(all_layouts()[name].description for name in names)
        lines.append(f"  {key}: {accepted}")
    return "\n".join(lines)
