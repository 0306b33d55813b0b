"""clip_benchmark's webdataset layout, as its reader (LAION-AI/CLIP_benchmark `build_wds_dataset`) reads it
and as the `clip-benchmark/wds_*` mirrors on the Hub publish it, in a folder or Hub repo (`hf:<org>/<name>`):

    classnames.txt                          class i = line i (classification)
    zeroshot_classification_templates.txt   one template a line, the class name as `{c}`
    dataset_type.txt                        "retrieval" for caption sets (absent: classification)
    <split>/nshards.txt                     n, the number of shards
    <split>/0.tar ... <split>/<n-1>.tar     members <key>.<webp|png|jpg|jpeg> with <key>.cls (a class index
                                            into classnames.txt) or <key>.txt (one caption a line)

A mirror's classes, their order and names, and its templates are its own (EuroSAT's mirror is VTAB's, with
5,400 test images): they are read from the mirror and scored as such, never replaced by a registry's list.
Images are read lazily from their place in the shard (nothing is copied or decoded before it is scored).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datasets import ClassLabel, Dataset, Features, List, Value

from hf_vrl.errors import UserError

from .prompts import captions_for_labels
from .readers import ReadTarMember, SourceFiles, TarSample, tar_samples
from .schema import CAPTION, IMAGE, LABEL

__all__ = [
    "CLASSNAMES",
    "TEMPLATES",
    "WdsMirror",
    "fill_mirror_template",
    "find_mirror",
    "load_mirror",
    "read_mirror",
]

CLASSNAMES = "classnames.txt"
TEMPLATES = "zeroshot_classification_templates.txt"
DATASET_TYPE = "dataset_type.txt"


@dataclass(frozen=True)
class WdsMirror:
    """What a clip_benchmark layout says of itself: its task, class names and templates (classification),
    and its splits with their shard counts."""

    where: str
    task: str  # "classification" or "retrieval"
    class_names: tuple[str, ...] | None
    templates: tuple[str, ...] | None
    shards: dict[str, int]


def find_mirror(root: Path) -> Path | None:
    """`root` when it is a clip_benchmark layout (a `<split>/nshards.txt`), else None."""
    if not root.is_dir():
        return None
    return root if any((sub / "nshards.txt").is_file() for sub in root.iterdir() if sub.is_dir()) else None


def _lines(text: str | None) -> tuple[str, ...] | None:
    """The stripped lines of a file, as clip_benchmark reads classnames and templates (None: no file)."""
    return None if text is None else tuple(line.strip() for line in text.splitlines())


def read_mirror(files: SourceFiles) -> WdsMirror:
    """The layout of `files`; a one-line UserError when it has no `<split>/nshards.txt`."""
    shards = {}
    for name in files.names:
        split, _, base = name.rpartition("/")
        if base == "nshards.txt" and split and "/" not in split:
            shards[split] = int((files.text(name) or "0").strip())
    if not shards:
        raise UserError(
            f"{files.where} is not a clip_benchmark webdataset layout: no <split>/nshards.txt "
            "(LAION-AI/CLIP_benchmark build_wds_dataset)"
        )
    task = (files.text(DATASET_TYPE) or "classification").strip().lower()
    if task not in ("classification", "retrieval"):
        raise UserError(
            f"{files.where}: dataset_type.txt says {task!r}; hf_vrl reads classification, retrieval"
        )
    class_names = _lines(files.text(CLASSNAMES)) if task == "classification" else None
    if task == "classification" and not class_names:
        raise UserError(f"{files.where}: a classification layout needs {CLASSNAMES} (class i on line i)")
    templates = [t for t in _lines(files.text(TEMPLATES)) or () if t] if task == "classification" else []
    return WdsMirror(files.where, task, class_names, tuple(templates) or None, shards)


def fill_mirror_template(template: str, class_name: str) -> str:
    """A mirror's template filled as clip_benchmark fills it: `template.format(c=class_name)`."""
    return template.format(c=class_name)


def _unique(names: Sequence[str]) -> list[str]:
    """`names` with a repeated name marked by its index (a ClassLabel needs distinct names; prompts use the
    mirror's names as they are)."""
    seen = {name: names.count(name) for name in names}
    return [name if seen[name] == 1 else f"{name} (class {i})" for i, name in enumerate(names)]


def load_mirror(source: Path | str, split: str, benchmark: Any = None) -> Dataset:
    """Split `split` of the clip_benchmark layout at `source` (a folder or `hf:<org>/<name>`): a
    classification split labelled with its own `classnames.txt` (`label` = the `.cls` index), a retrieval
    split with every caption of each image (`caption`: a list). A sample without its image or its label /
    captions is left out (the count check sees it). `benchmark` is unused (every layout's signature)."""
    files = SourceFiles.of(source)
    mirror = read_mirror(files)
    if split not in mirror.shards:
        raise UserError(
            f"{files.where} has no split {split!r}; its splits: {', '.join(sorted(mirror.shards))}"
        )
    samples = []
    for index in range(mirror.shards[split]):
        name = f"{split}/{index}.tar"
        if name not in files.names:
            raise UserError(
                f"{files.where}: {split}/nshards.txt says {mirror.shards[split]} shards; {name} is missing"
            )
        samples += tar_samples(files.fetch(name), mirror.task)
    return _dataset(mirror, [s for s in samples if s.image and (s.label is not None or s.captions)])


def _dataset(mirror: WdsMirror, samples: list[TarSample]) -> Dataset:
    where = Features({"path": Value("string"), "offset": Value("int64"), "size": Value("int64")})
    rows: dict[str, list[Any]] = {
        IMAGE: [{"path": s.image[0], "offset": s.image[1], "size": s.image[2]} for s in samples],
        "key": [s.key for s in samples],
    }
    features = {IMAGE: where, "key": Value("string")}
    if mirror.task == "retrieval":
        rows[CAPTION] = [list(s.captions) for s in samples]
        features[CAPTION] = List(Value("string"))
    else:
        names = list(mirror.class_names)
        labels = [s.label for s in samples]
        outside = sorted({y for y in labels if not 0 <= y < len(names)})
        if outside:
            raise UserError(
                f"{mirror.where}: .cls labels {outside[:5]} are outside classnames.txt's {len(names)}"
            )
        rows[LABEL] = labels
        rows[CAPTION] = captions_for_labels(labels, names, 0)
        features |= {LABEL: ClassLabel(names=_unique(names)), CAPTION: Value("string")}
    return Dataset.from_dict(rows, features=Features(features)).with_transform(ReadTarMember())
