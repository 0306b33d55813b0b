"""One entry point for the CLI and the evaluation code: `load_dataset_by_name(name, split, ...)`.

Names: "shapes", "fashion_mnist", "animal_mnist", "digits" (offline), "cub:<root>", "aircraft:<root>",
"cars:<root>" (label hierarchies, `fine_grained.py`: `label` the coarse level, `fine_label` the fine one, as
CLUE's granularity reads them; "fgvc_aircraft:<root>" / "stanford_cars:<root>" label the 100 variants / 196
models instead, as zero-shot tables and probes score them), "<benchmark>:<root>" for every other benchmark of
`hf_vrl.data.benchmarks` ("imagenet:/data/ILSVRC2012", "imagenet-r:/data/imagenet-r", "objectnet:...",
"fmow:/data/fmow_v1.1", "iwildcam:...", "flickr30k:...", "cifar10:hf:uoft-cs/cifar10", ...: read from its
published layout, `layouts.py`; "cc3m:<img2dataset folder>" streams its shards), "webdataset:<glob>"
(also "parquet:<glob>", "csv:<glob>": image-path tables; these always stream and ignore `split`: point
the glob at the split's files), "imagefolder:<dir>",
"hf:<name or path>". A bare path is recognised: a .tar/.parquet/.csv/.tsv file or glob, a folder holding a
benchmark's annotated layout (read as that benchmark, `hf_vrl.data.layouts.published_benchmark`: CUB, WILDS'
FMoW, Flowers-102's .mat files, ...; an `imagefolder:` folder too, which read as class folders would be
mislabelled), a folder of .tar shards, a `save_to_disk` folder, else an image folder.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from datasets import Dataset, IterableDataset

from . import cub, fine_grained, generic, offline, toy, webdataset
from .benchmarks import BENCHMARKS
from .images import SampleFilter

SHAPES_SPLIT_SIZES = {"train": 2000, "test": 500}
HIERARCHIES = ("cub", "aircraft", "cars")  # their own loaders: label = the coarse level (CLUE's reading)
LEVEL_PREFIXES = {"fgvc_aircraft": ("aircraft", "variant"), "stanford_cars": ("cars", "model")}  # fine level
BENCHMARK_PREFIXES = tuple(k for k in BENCHMARKS if k not in (*HIERARCHIES, "mmvp_vlm", "cc3m"))
PREFIXES = (*HIERARCHIES, *LEVEL_PREFIXES, *BENCHMARK_PREFIXES, "cc3m", "webdataset", "parquet", "csv")
PREFIXES += ("imagefolder", "hf")


def _shapes(split: str, *, limit: int | None = None, seed: int = 0, image_size: int | None = None, **kwargs):
    if split not in SHAPES_SPLIT_SIZES:
        raise ValueError(f"shapes splits are {tuple(SHAPES_SPLIT_SIZES)}, got {split!r}")
    n = limit if limit is not None else SHAPES_SPLIT_SIZES[split]
    return toy.shapes_dataset(n, seed=seed, image_size=image_size or 32, split=split, **kwargs)


def _offline(loader: Callable[..., Dataset]) -> Callable[..., Dataset]:
    def load(split: str, *, image_size: int | None = None, **kwargs) -> Dataset:
        if image_size is not None:
            kwargs["image_size"] = image_size
        return loader(split, **kwargs)

    return load


NAMED: dict[str, Callable[..., Dataset]] = {
    "shapes": _shapes,
    "fashion_mnist": _offline(offline.load_fashion_mnist),
    "animal_mnist": _offline(offline.load_animal_mnist),
    "digits": _offline(offline.load_digits),
}


def _stream(target: str, *, limit: int | None, seed: int, **kwargs) -> IterableDataset:
    ds = webdataset.load_image_text(target, seed=seed, **kwargs)
    return ds.take(limit) if limit is not None else ds


def _detect(path: str) -> str:
    """The prefix a bare path stands for."""
    if glob.has_magic(path) or path.endswith(webdataset.TAR_EXTENSIONS + webdataset.TABLE_EXTENSIONS):
        return "webdataset"
    folder = Path(path)
    if not folder.exists():
        raise FileNotFoundError(
            f"unknown dataset {path!r}: not a registered name ({', '.join(NAMED)}), not 'prefix:target' "
            f"({', '.join(PREFIXES)}), and no such path"
        )
    from .layouts import published_benchmark

    if (folder / "state.json").is_file() or (folder / "dataset_dict.json").is_file():
        return "hf"
    if folder.is_dir() and any(folder.glob("*.tar")):
        return "webdataset"
    return published_benchmark(folder) or "imagefolder"


def _published(prefix: str, target: str) -> str:
    """`prefix`, or for "imagefolder:" a folder holding a benchmark's annotated layout, that benchmark's."""
    from .layouts import published_benchmark

    return (prefix == "imagefolder" and published_benchmark(Path(target))) or prefix


def load_dataset_by_name(
    name: str,
    split: str = "train",
    *,
    streaming: bool = False,
    limit: int | None = None,
    seed: int = 0,
    image_size: int | None = None,
    sample_filter: SampleFilter | None = None,
    stream_options: dict[str, Any] | None = None,
    **kwargs: Any,
) -> Dataset | IterableDataset:
    """Load a contract dataset by name (see the module docstring). `image_size` resizes the generated and
    offline sets (others keep their size: the model's processor resizes); `limit` caps the number of rows
    (a seeded random subset, or the first rows of a stream); extra kwargs go to the loader.

    `sample_filter` collects the skipped samples of the sources that can hold bad ones (files on disk; the
    generated and offline sets have none); `stream_options` go to the streamed sources only
    (`shuffle_buffer`, `decode_size`: see `webdataset.load_image_text`)."""
    if name in NAMED:
        ds = NAMED[name](split, limit=limit, seed=seed, image_size=image_size, **kwargs)
        return ds.to_iterable_dataset() if streaming else ds
    prefix, _, target = name.partition(":") if name.split(":", 1)[0] in PREFIXES else ("", "", name)
    target = os.path.expanduser(target)
    prefix = _published(prefix, target) if prefix else _detect(target)
    common: dict[str, Any] = {"limit": limit, "seed": seed}
    if sample_filter is not None:
        common["sample_filter"] = sample_filter
    if prefix == "cub":
        if streaming:
            raise ValueError("CUB loads map-style (11,788 local images, read lazily); drop streaming=True")
        return cub.load_cub(target, split, **common, **kwargs)
    if prefix in ("aircraft", "cars"):
        load = fine_grained.load_fgvc_aircraft if prefix == "aircraft" else fine_grained.load_stanford_cars
        return load(target, split, limit=limit, seed=seed, **kwargs)
    if prefix in (*BENCHMARK_PREFIXES, *LEVEL_PREFIXES):
        from .layouts import load_benchmark, subset

        if streaming:
            raise ValueError(f"{prefix} loads map-style (its images are read lazily); drop streaming=True")
        key, level = LEVEL_PREFIXES.get(prefix, (prefix, None))
        return subset(load_benchmark(key, target, split, level=level, **kwargs)[0], limit, seed)
    if prefix == "cc3m":
        from .layouts import resolve

        resolve(BENCHMARKS["cc3m"], target)  # img2dataset's folder (a UserError names it otherwise)
        return _stream(target, **common, **(stream_options or {}), **kwargs)
    if prefix in ("webdataset", "parquet", "csv"):
        return _stream(target, **common, **(stream_options or {}), **kwargs)
    if prefix == "imagefolder":
        return generic.load_imagefolder(target, split, streaming=streaming, **common, **kwargs)
    return generic.load_hf_dataset(target, split, streaming=streaming, **common, **kwargs)


def is_streamed(name: str) -> bool:
    """Whether `name` loads as a stream (image-text shards and tables), from the name alone (no data read)."""
    if name in NAMED:
        return False
    prefix, _, target = name.partition(":") if name.split(":", 1)[0] in PREFIXES else ("", "", name)
    try:
        prefix = prefix or _detect(os.path.expanduser(target))
    except FileNotFoundError:
        return False
    return prefix in ("cc3m", "webdataset", "parquet", "csv")


GENERATED = frozenset({"shapes"})  # drawn afresh from a seed: `limit` is how many are generated
TEMPLATE_CAPTIONS = frozenset({"fashion_mnist", "animal_mnist", "digits"})  # captions hf_vrl writes


def how_drawn(name: str | None, n_samples: int | None, limit: int | None) -> str:
    """How the rows `load_dataset_by_name(name, limit=limit)` gave were drawn: "generated" (the shapes world,
    from the seed), "whole split" (no limit, or fewer rows than it), "stream start" (the first `limit` rows
    of a stream, in its order), else "seeded subset" (a seeded random subset of `limit` rows)."""
    if name in GENERATED:
        return "generated"
    if limit is None or (n_samples is not None and n_samples < limit):
        return "whole split"
    return "stream start" if name is not None and is_streamed(name) else "seeded subset"


def text_source(name: str | None, dataset: Any = None) -> str | None:
    """Where the captions of `name`'s rows (`dataset`, as loaded) come from when hf_vrl writes them:
    "generated" (the shapes world's captions of its factors), "templates" (hf_vrl's caption templates
    filled with the class name: the offline sets, and a Hub or local dataset without a caption column, whose
    caption feature says so); None: the data's own captions (or a benchmark copy's class-name captions)."""
    if name in GENERATED:
        return "generated"
    caption = (getattr(dataset, "features", None) or {}).get("caption")
    made = getattr(caption, "id", None) == generic.TEMPLATE_CAPTIONS
    return "templates" if name in TEMPLATE_CAPTIONS or made else None


def check_dataset_name(name: str, what: str = "--dataset") -> None:
    """Raise `UserError` when `name` cannot name data: an unknown name, a path or glob that matches nothing.
    Cheap (no data is read): a run checks its data before it writes anything. Hub ids are left to loading."""
    from hf_vrl.errors import UserError

    if name in NAMED:
        return
    prefix, _, target = name.partition(":") if name.split(":", 1)[0] in PREFIXES else ("", "", name)
    target = os.path.expanduser(target)
    try:
        prefix = prefix or _detect(target)
        if prefix in ("webdataset", "parquet", "csv"):
            webdataset.resolve_files(target)
        elif prefix in (*BENCHMARK_PREFIXES, *LEVEL_PREFIXES, "cc3m"):
            from .layouts import resolve

            key = LEVEL_PREFIXES.get(prefix, (prefix,))[0]
            resolve(BENCHMARKS[key], target)  # the layout is there (a UserError names the expected one)
        elif prefix in (*HIERARCHIES, "imagefolder") and not Path(target).is_dir():
            raise FileNotFoundError("no such folder")
        elif prefix == "hf" and target.startswith(("/", ".", "~")) and not Path(target).exists():
            raise FileNotFoundError("no such folder")
    except (FileNotFoundError, ValueError, UserError) as error:
        raise UserError(f"{what} {name}: {error}") from None
