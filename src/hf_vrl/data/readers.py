"""What every layout reader shares (`hf_vrl.data.layouts` gathers the readers): the `Layout` record, folder
listings, lazily decoded datasets, and the mapping of a source's class names to a benchmark's official labels.

Layers of `hf_vrl.data` (imports run downwards only): the catalogue (`registry.py`: names -> sources;
`layouts.py`: every layout of every benchmark) above the readers (`imagenet.py`, `fine_grained.py`,
`transfer.py`, `packed.py`, `cub.py`, `wilds.py`, `captions.py`, `clip_benchmark.py`, `generic.py`,
`webdataset.py`) and the sources they read (local folders; the Hub, `hub.py`), which build on this module,
above the benchmark table (`benchmarks.py`), class names and templates (`prompts.py`, `*_classes.py`) and
decoding (`images.py`, `schema.py`).
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np
from datasets import ClassLabel, Dataset, Value

from hf_vrl.errors import UserError

from .benchmarks import Benchmark
from .hub import dataset_file, dataset_repo_files, is_hub_spec, parse_hub_spec
from .images import DecodeTransform, decode_image
from .prompts import IMAGENET_FAMILY, _normalise, captions_for_labels, imagenet_class_wnids
from .schema import IMAGE, LABEL, contract_features
from .transfer_classes import PUBLISHER_CLASSNAMES
from .webdataset import IMAGE_EXTENSIONS

__all__ = [
    "Layout",
    "ReadTarMember",
    "SourceFiles",
    "TarSample",
    "class_folders",
    "find_datasets_copy",
    "folder_with",
    "image_files",
    "lazy_dataset",
    "load_datasets_copy",
    "loadmat",
    "local_copy",
    "official_labels",
    "prompt_names",
    "relabel",
    "split_dirs",
    "tar_samples",
]

TAR_IMAGE_SUFFIXES = ("webp", "png", "jpg", "jpeg")  # clip_benchmark's order of preference


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


@dataclass(frozen=True)
class SourceFiles:
    """The files of a source, local or on the Hub, read alike: `names` relative to its root (posix), `fetch`
    a local path for one of them (a Hub file is downloaded into the Hub cache online, read from it offline:
    `hf_vrl.data.hub`)."""

    where: str  # the folder, or hf:<org>/<name>[/<path>]
    names: tuple[str, ...]
    fetch: Callable[[str], Path]

    @classmethod
    def of(cls, source: Path | str) -> SourceFiles:
        """The files of a folder or of `hf:<org>/<name>[@<revision>][/<path>]` (the files under `path`)."""
        if isinstance(source, str) and is_hub_spec(source):
            spec = parse_hub_spec(source)
            prefix = spec.path.strip("/") + "/" if spec.path.strip("/") else ""
            files = dataset_repo_files(spec.repo_id, spec.revision)
            names = tuple(f[len(prefix) :] for f in files if f.startswith(prefix))
            return cls(
                str(spec), names, lambda name: dataset_file(spec.repo_id, prefix + name, spec.revision)
            )
        root = Path(source)
        names = tuple(sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()))
        return cls(str(root), names, lambda name: root / name)

    def local_folder(self) -> Path:
        """A local folder holding every file (a Hub repo's are fetched into the Hub cache: its snapshot)."""
        paths = [self.fetch(name) for name in self.names]
        if not paths:
            raise UserError(f"{self.where} holds no files")
        return paths[0].parents[len(Path(self.names[0]).parts) - 1]

    def text(self, name: str) -> str | None:
        """The text of file `name`, None when the source has no such file."""
        return self.fetch(name).read_text(encoding="utf-8") if name in self.names else None


def local_copy(source: str | Path) -> Path:
    """A local folder of `source`: a folder as it is, `hf:<org>/<name>` fetched into the Hub cache (online
    once, offline from the cache) and its snapshot folder (MMVP-VLM's official layout on the Hub)."""
    if isinstance(source, str) and is_hub_spec(source):
        return SourceFiles.of(source).local_folder()
    return Path(source)


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
        from scipy.io import loadmat as read  # an optional dependency (hf-vrl[eval]), not a circle
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


# -- split folders and datasets copies --------------------------------------------------------------------


def split_dirs(benchmark: Benchmark, split: str) -> list[str]:
    """The folder names a split may have: its own and its aliases."""
    return [split, *(alias for alias, target in benchmark.aliases.items() if target == split)]


def find_datasets_copy(root: Path) -> Path | None:
    """`root` when it holds a `datasets` copy (save_to_disk or parquet files)."""
    if (root / "state.json").is_file() or (root / "dataset_dict.json").is_file():
        return root
    return root if root.is_dir() and next(root.rglob("*.parquet"), None) is not None else None


def load_datasets_copy(target: str, revision: str | None = None, *, split: str) -> Dataset:
    """A `datasets` copy: a save_to_disk folder, parquet files under a folder, or a Hub id (at `revision`)."""
    path = Path(target)
    if (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
        loaded = datasets.load_from_disk(target)
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise UserError(f"{target} has no split {split!r}; it has {', '.join(loaded)}")
            return loaded[split]
        return loaded
    return datasets.load_dataset(target, split=split, revision=revision)


# -- webdataset shards read in place -------------------------------------------------------------------


@dataclass(frozen=True)
class TarSample:
    """A webdataset sample of a shard: its key, where its image is, its `.cls` label or `.txt` captions."""

    key: str
    image: tuple[str, int, int] | None = None  # shard, offset, size
    label: int | None = None
    captions: tuple[str, ...] | None = None


def tar_samples(shard: Path, task: str) -> list[TarSample]:
    """The samples of one shard, grouped by key (a member's name up to its first dot, as webdataset groups
    them), in shard order."""
    found: dict[str, dict[str, Any]] = {}
    with tarfile.open(shard) as tar:
        for member in tar:
            if not member.isfile():
                continue
            folder, _, base = member.name.rpartition("/")
            stem, _, suffix = base.partition(".")
            sample = found.setdefault(f"{folder}/{stem}" if folder else stem, {})
            suffix = suffix.lower()
            if suffix in TAR_IMAGE_SUFFIXES and "image" not in sample:
                sample["image"] = (str(shard), member.offset_data, member.size)
            elif suffix == "cls" and task == "classification":
                sample["label"] = int(tar.extractfile(member).read().decode().strip())
            elif suffix == "txt" and task == "retrieval":
                sample["captions"] = tuple(tar.extractfile(member).read().decode("utf-8").splitlines())
    return [TarSample(key, **members) for key, members in found.items()]


@dataclass(frozen=True)
class ReadTarMember:
    """`Dataset.with_transform`: the `image` column's (shard, offset, size) read and decoded to RGB."""

    def __call__(self, batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        if IMAGE not in batch:
            return batch
        images = []
        for where in batch[IMAGE]:
            with open(where["path"], "rb") as shard:
                shard.seek(where["offset"])
                images.append(decode_image(shard.read(where["size"])))
        return {**batch, IMAGE: images}
