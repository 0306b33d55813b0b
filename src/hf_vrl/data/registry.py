"""One entry point for the CLI and the evaluation code: `load_dataset_by_name(name, split, ...)`.

Names: "shapes", "fashion_mnist", "animal_mnist", "digits" (offline), "cub:<root>", "aircraft:<root>",
"cars:<root>" (label hierarchies, `fine_grained.py`: `label` the coarse level, `fine_label` the fine one, as
CLUE's granularity reads them; "fgvc_aircraft:<root>" / "stanford_cars:<root>" label the 100 variants / 196
models instead, as zero-shot tables and probes score them), "<benchmark>:<root>" for every other benchmark of
`hf_vrl.data.benchmarks` ("imagenet:/data/ILSVRC2012", "imagenet-r:/data/imagenet-r", "objectnet:...",
"fmow:/data/fmow_v1.1", "iwildcam:...", "flickr30k:...", "cifar10:hf:uoft-cs/cifar10", ...: read from its
published layout, `layouts.py`; "cc3m:<img2dataset folder>" streams its shards), "webdataset:<glob>"
(also "parquet:<glob>", "csv:<glob>": image-path tables; these always stream; a folder gives the files of
`split` where its files are named by split, `cc3m-train-*.tar` beside `cc3m-validation-*.tar` or `train/`
beside `test/`, and a glob the files it names), "imagefolder:<dir>",
"hf:<name or path>": a Hub dataset id (`hf:<org>/<name>[@<revision>][/<path or glob>]`, or
`hf://datasets/<org>/<name>/...`, `hf_vrl.data.hub`) streams its webdataset shards shard by shard (the split
chosen by the repo's own file and folder names); other repos (parquet, image folders) are read by `datasets`,
streamed unless streaming=False asks for map-style (a run's training data streams for the methods that take
streams; DiVE's and CLUE's labelled sets load map-style: `RunConfig.map_style_data`); online from the Hub,
offline from the local Hub cache. Shard URLs (`hf://...`,
`https://huggingface.co/.../resolve/...`, `pipe:<command>`) are read as webdataset shards.
A bare path is recognised: a .tar/.parquet/.csv/.tsv file or glob, a folder holding a
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

from hf_vrl.errors import UserError

from . import clip_benchmark, cub, fine_grained, generic, hub, offline, toy, webdataset
from .benchmarks import BENCHMARKS
from .hub import is_hub_spec
from .images import SampleFilter
from .layouts import load_benchmark, published_benchmark, resolve, subset
from .readers import SourceFiles

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


COLUMN_OPTIONS = ("image_column", "caption_column", "label_column")


def _stream(target: Any, *, limit: int | None, seed: int, **kwargs) -> IterableDataset:
    ds = webdataset.load_image_text(target, seed=seed, **kwargs)
    return ds.take(limit) if limit is not None else ds


def parse_name(name: str) -> tuple[str, str]:
    """(prefix, target) of a registry name ("" for a bare path); `hf://datasets/...` is prefix "hf" with the
    whole URL as its target (not cut at its first colon)."""
    if name.startswith(hub.HF_URL_PREFIX):
        return "hf", name
    if name.split(":", 1)[0] in PREFIXES:
        prefix, _, target = name.partition(":")
        return prefix, target
    return "", name


def _on_hub(target: str) -> bool:
    """Whether a target names a Hub dataset (`<org>/<name>...` after `hf:`, or a `hf://datasets/` URL)."""
    return target.startswith(hub.HF_URL_PREFIX) or hub.is_hub_spec(hub.HF_PREFIX + target)


def _hub_target(prefix: str, target: str) -> str | None:
    """The Hub spec a name reads from (`hf:<id>`, `cc3m:hf:<id>`, `webdataset:hf://...`), else None."""
    if prefix == "hf" and _on_hub(target):
        return target
    if prefix in ("cc3m", "webdataset", "parquet", "csv"):
        inner, _, rest = target.partition(":")
        if target.startswith(hub.HF_URL_PREFIX) or (inner == "hf" and _on_hub(rest)):
            return target if target.startswith(hub.HF_URL_PREFIX) else rest
    return None


def _load_hub(target: str, split: str, streaming: bool | None, options: dict[str, Any], **common: Any) -> Any:
    """A Hub dataset: its webdataset shards streamed (`webdataset.hub_shards`), else (a parquet or image
    repo) read by `datasets`, streamed unless `streaming` is False (map-style, as a labelled set DiVE
    fine-tunes on needs), from the Hub online, from the local Hub cache's snapshot offline."""
    spec = hub.parse_hub_spec(target)
    shards = webdataset.hub_shards(spec, split)
    if shards:
        return _stream(shards, **common, **options)
    columns = {key.removesuffix("_column"): options[key] for key in COLUMN_OPTIONS if options.get(key)}
    commit = hub.dataset_snapshot(spec.repo_id, spec.revision)[0]  # the run's commit (`pinned_commits`)
    source, extra = spec.repo_id, {"revision": commit}
    if hub.is_offline():
        source, extra = str(hub.local_snapshot(spec.repo_id, commit)), {}
    if spec.path:
        extra["data_dir"] = spec.path
    streams = streaming is not False
    return generic.load_hf_dataset(
        source, split, columns=columns or None, streaming=streams, **common, **extra
    )


def _detect(path: str) -> str:
    """The prefix a bare path stands for."""
    if (
        webdataset.is_url(path)
        or glob.has_magic(path)
        or path.endswith(webdataset.TAR_EXTENSIONS + webdataset.TABLE_EXTENSIONS)
    ):
        return "webdataset"
    folder = Path(path)
    if not folder.exists():
        raise FileNotFoundError(
            f"unknown dataset {path!r}: not a registered name ({', '.join(NAMED)}), not 'prefix:target' "
            f"({', '.join(PREFIXES)}), and no such path"
        )
    if (folder / "state.json").is_file() or (folder / "dataset_dict.json").is_file():
        return "hf"
    if folder.is_dir() and any(folder.glob("*.tar")):
        return "webdataset"
    return published_benchmark(folder) or "imagefolder"


def _published(prefix: str, target: str) -> str:
    """`prefix`, or for "imagefolder:" a folder holding a benchmark's annotated layout, that benchmark's; for
    "hf:" a local copy of a webdataset repo (a folder of .tar shards, not a save_to_disk folder) "webdataset":
    it streams as the repo does."""
    folder = Path(target)
    if prefix == "hf" and folder.is_dir() and not (folder / "state.json").is_file():
        return "webdataset" if any(folder.glob("*.tar")) else prefix
    return (prefix == "imagefolder" and published_benchmark(folder)) or prefix


def _is_mirror(source: str) -> bool:
    """Whether `source` (a folder, or `hf:<org>/<name>`) is in clip_benchmark's layout."""
    if is_hub_spec(source):
        return any(name.endswith("/nshards.txt") for name in SourceFiles.of(source).names)
    return clip_benchmark.find_mirror(Path(source)) is not None


def mirror_source(name: str) -> tuple[str, str | None] | None:
    """(where, split) of the clip_benchmark layout `name` reads: `<key>:<where>`, `hf:<org>/<name>`, `hf:`
    or a bare folder in that layout (split None: the one asked for), or `webdataset:<where>/<split>/*.tar`,
    one of its splits' shards; None for any other data."""
    prefix, target = parse_name(name)
    target = os.path.expanduser(target)
    if prefix in ("webdataset", "parquet", "csv"):
        if _hub_target(prefix, target) is not None or webdataset.is_url(target):
            return None
        try:
            folders = {Path(f).parent for f in webdataset.resolve_files(target)}
        except (FileNotFoundError, ValueError):
            return None
        folder = folders.pop() if len(folders) == 1 else None
        found = folder is not None and (folder / "nshards.txt").is_file()
        return (str(folder.parent), folder.name) if found else None
    if prefix == "hf" and is_hub_spec(name):
        target = name
    elif prefix not in ("", "hf", *BENCHMARKS, *LEVEL_PREFIXES) or prefix in ("cub", "cc3m"):
        return None
    return (target, None) if (is_hub_spec(target) or Path(target).is_dir()) and _is_mirror(target) else None


def load_dataset_by_name(
    name: str,
    split: str = "train",
    *,
    streaming: bool | None = False,
    limit: int | None = None,
    seed: int = 0,
    image_size: int | None = None,
    sample_filter: SampleFilter | None = None,
    stream_options: dict[str, Any] | None = None,
    **kwargs: Any,
) -> Dataset | IterableDataset:
    """Load a contract dataset by name (see the module docstring). `image_size` resizes the generated and
    offline sets (others keep their size: the model's processor resizes); `limit` caps the number of rows
    (a seeded random subset, or the first rows of a stream); extra kwargs go to the loader. `streaming`:
    True streams every source that can, False loads map-style every source that can (webdataset shards and
    tables always stream), None each source's own way (a Hub repo streams, whatever its files).

    `sample_filter` collects the skipped samples of the sources that can hold bad ones (files on disk; the
    generated and offline sets have none); `stream_options` go to the streamed sources only
    (`shuffle_buffer`, `decode_size`, `require_trainable`, the `*_column` names: see
    `webdataset.load_image_text`)."""
    if name in NAMED:
        ds = NAMED[name](split, limit=limit, seed=seed, image_size=image_size, **kwargs)
        return ds.to_iterable_dataset() if streaming else ds
    on_hub = _hub_target(*parse_name(name))
    if on_hub is None:
        streaming = bool(streaming)  # a local source's own way is map-style
    prefix, target = parse_name(name)
    mirror = mirror_source(name) if prefix in ("", "hf", "webdataset") else None
    if mirror is not None:  # clip_benchmark's layout: its own classes, templates and captions
        return subset(clip_benchmark.load_mirror(mirror[0], mirror[1] or split), limit, seed)
    common: dict[str, Any] = {"limit": limit, "seed": seed}
    if sample_filter is not None:
        common["sample_filter"] = sample_filter
    if on_hub is not None:
        return _load_hub(on_hub, split, streaming, {**(stream_options or {}), **kwargs}, **common)
    target = os.path.expanduser(target)
    prefix = _published(prefix, target) if prefix else _detect(target)
    if prefix in HIERARCHIES and target.startswith("hf:"):  # a Hub copy: its one (fine) level of labels
        return subset(load_benchmark(prefix, target, split)[0], limit, seed)
    if prefix == "cub":
        if streaming:
            raise ValueError("CUB loads map-style (11,788 local images, read lazily); drop streaming=True")
        return cub.load_cub(target, split, **common, **kwargs)
    if prefix in ("aircraft", "cars"):
        load = fine_grained.load_fgvc_aircraft if prefix == "aircraft" else fine_grained.load_stanford_cars
        return load(target, split, limit=limit, seed=seed, **kwargs)
    if prefix in (*BENCHMARK_PREFIXES, *LEVEL_PREFIXES):
        if streaming:
            raise ValueError(f"{prefix} loads map-style (its images are read lazily); drop streaming=True")
        key, level = LEVEL_PREFIXES.get(prefix, (prefix, None))
        return subset(load_benchmark(key, target, split, level=level, **kwargs)[0], limit, seed)
    if prefix == "cc3m":
        resolve(BENCHMARKS["cc3m"], target)  # img2dataset's folder (a UserError names it otherwise)
        return _stream(target, split=split, **common, **(stream_options or {}), **kwargs)
    if prefix in ("webdataset", "parquet", "csv"):
        return _stream(target, split=split, **common, **(stream_options or {}), **kwargs)
    if prefix == "imagefolder":
        return generic.load_imagefolder(target, split, streaming=streaming, **common, **kwargs)
    return generic.load_hf_dataset(target, split, streaming=streaming, **common, **kwargs)


def is_streamed(name: str, streaming: bool | None = False) -> bool:
    """Whether `load_dataset_by_name(name, streaming=streaming)` loads a stream (image-text shards and
    tables; a Hub repo unless `streaming` is False), from the name alone (no data read)."""
    if name in NAMED:
        return bool(streaming)
    prefix, target = parse_name(name)
    on_hub = _hub_target(prefix, target)
    if on_hub is not None:  # a webdataset repo streams; its files are listed (from the cache offline)
        try:
            if prefix in ("", "hf", "webdataset") and mirror_source(name) is not None:
                return False  # clip_benchmark's layout: read map-style, with its classes
            return streaming is not False or bool(webdataset.hub_shards(hub.parse_hub_spec(on_hub), None))
        except UserError:
            return True  # unreachable: check_dataset_name says so before anything is written
    target = os.path.expanduser(target)
    try:
        prefix = _published(prefix, target) if prefix else _detect(target)
    except FileNotFoundError:
        return False
    return prefix in ("cc3m", "webdataset", "parquet", "csv") and mirror_source(name) is None


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
    Cheap (no data is read; a Hub dataset's files are listed, from the local cache offline): a run checks its
    data before it writes anything."""
    if name in NAMED:
        return
    prefix, target = parse_name(name)
    on_hub = _hub_target(prefix, target)
    if on_hub is not None:
        spec = hub.parse_hub_spec(on_hub)
        if not hub.matching_files(spec, hub.dataset_repo_files(spec.repo_id, spec.revision)):
            raise UserError(
                f"{what} {name}: the Hub dataset {spec.repo_id} has no files matching {spec.path!r}"
            )
        return
    target = os.path.expanduser(target)
    try:
        prefix = prefix or _detect(target)
        if prefix in ("webdataset", "parquet", "csv"):
            webdataset.resolve_files(target)
        elif prefix in (*BENCHMARK_PREFIXES, *LEVEL_PREFIXES, "cc3m") or (
            prefix in HIERARCHIES and target.startswith("hf:")
        ):
            key = LEVEL_PREFIXES.get(prefix, (prefix,))[0]
            resolve(BENCHMARKS[key], target)  # the layout is there (a UserError names the expected one)
        elif prefix in (*HIERARCHIES, "imagefolder") and not Path(target).is_dir():
            raise FileNotFoundError("no such folder")
        elif prefix == "hf" and target.startswith(("/", ".", "~")) and not Path(target).exists():
            raise FileNotFoundError("no such folder")
    except (FileNotFoundError, ValueError, UserError) as error:
        raise UserError(f"{what} {name}: {error}") from None
