"""CC3M as people have it, streamed: img2dataset webdataset shards, and parquet / CSV tables of image paths
and captions.

- Webdataset: `.tar` files whose members are grouped by key (`000123.jpg`, `000123.txt`, `000123.json`);
  the caption is the `.txt` member (else the `caption` field of the `.json`), the label a `.cls` member.
- Tables (`.parquet`, `.csv`, `.tsv`): one row per sample, an image column holding a path (relative to the
  table's folder unless absolute), image bytes, or a datasets `{"bytes", "path"}` struct, and a caption column
  (auto-detected from common names, or given).

Every file is one shard of an `IterableDataset.from_generator`, so `shuffle` shuffles shards and a buffer,
`split_dataset_by_node` gives each rank whole shards (or every world_size-th sample when the shard count is
not a multiple), and DataLoader workers split the shards. Raw bytes are buffered; decoding runs after the
shuffle. Bad samples (corrupt/truncated image, empty or missing caption, unconvertible mode, too small) and
truncated shards are skipped and counted in the SampleFilter, never raised.

datasets' own `webdataset` builder is not used (checked with datasets 5.2; the tests show each case). Given
`features=` with `Image(decode=False)` it does give None for a missing caption and keep a corrupt JPEG's bytes
(without `features=` it infers the columns from the first 5 samples and raises when one lacks a member; with
a decoding `Image()` one corrupt JPEG ends the run). But it decodes the `.txt`/`.cls`/`.json` members inside
its iterator, so one caption that is not UTF-8, one non-integer `.cls` or one malformed `.json` raises and
ends the run; a shard cut inside a member raises `tarfile.ReadError` and ends the run (the shards after it
are lost); a shard cut at a member's header ends quietly, uncounted. The reader below keeps raw bytes,
skips bad samples one by one and counts truncated shards.
"""

from __future__ import annotations

import csv
import glob
import json
import os
import re
import tarfile
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from braceexpand import UnbalancedBracesError, braceexpand
from datasets import Features, IterableDataset, Value
from datasets import Image as ImageFeature
from datasets.distributed import split_dataset_by_node

from .images import DEFAULT_MIN_SIDE, TRUNCATED_SHARD, SampleFilter
from .schema import NO_LABEL

TAR_EXTENSIONS = (".tar",)
TABLE_EXTENSIONS = (".parquet", ".csv", ".tsv")
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff", "ppm")
CAPTION_EXTENSIONS = ("txt", "caption", "text")
IMAGE_COLUMNS = ("image", "image_path", "filepath", "file_name", "filename", "path", "img", "jpg")
CAPTION_COLUMNS = ("caption", "text", "title", "txt", "sentence", "alt")
_KEY_RE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # webdataset's base_plus_ext: key, extensions


def stream_features() -> Features:
    return Features(
        {"image": ImageFeature(), "caption": Value("string"), "label": Value("int64"), "key": Value("string")}
    )


_RANGES = re.compile(r"\{([^{},.]*)\.\.([^{},.]*)(?:\.\.[^{}]*)?\}")  # {start..stop} and {start..stop..step}


def expand_braces(pattern: str) -> list[str]:
    """Expand webdataset/img2dataset brace patterns with `braceexpand` (webdataset's own expander):
    ``cc3m-{00000..00002}.tar`` (zero-padded ranges) and ``{train,val}.tar`` (alternatives), several groups
    allowed; a pattern without braces, or with unbalanced ones, is returned as is. Ranges must be numeric."""
    for start, stop in _RANGES.findall(pattern):
        if not (start.isdigit() and stop.isdigit()):
            raise ValueError(
                f"brace range {{{start}..{stop}}} in {pattern!r} must be two integers, e.g. {{00000..00331}}"
            )
    try:
        return list(braceexpand(pattern, escape=False))
    except UnbalancedBracesError:
        return [pattern]


def _folder_files(folder: Path) -> list[str]:
    """A folder's data files: its .tar shards where it has any (img2dataset writes a .parquet and a
    _stats.json of metadata beside each shard: not data), else its .parquet/.csv/.tsv tables."""
    files = sorted(str(p) for p in folder.iterdir() if p.suffix in TAR_EXTENSIONS + TABLE_EXTENSIONS)
    shards = [f for f in files if f.endswith(TAR_EXTENSIONS)]
    return shards or files


def resolve_files(source: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """Sorted files from a glob, a brace pattern (``{00000..00331}.tar``), a file, a folder (its .tar shards,
    else its .parquet/.csv/.tsv tables) or a list of those."""
    if isinstance(source, (str, os.PathLike)):
        source = [source]
    source = [expanded for item in source for expanded in expand_braces(os.fspath(item))]
    files: list[str] = []
    for item in source:
        if os.path.isdir(item):
            found = _folder_files(Path(item))
        else:
            found = (
                sorted(glob.glob(item)) if glob.has_magic(item) else ([item] if os.path.isfile(item) else [])
            )
        if not found:
            raise FileNotFoundError(
                f"no data files match {item!r} (give .tar shards, .parquet or .csv/.tsv files)"
            )
        files.extend(found)
    unknown = [f for f in files if not f.endswith(TAR_EXTENSIONS + TABLE_EXTENSIONS)]
    if unknown:
        raise ValueError(
            f"unsupported data files {unknown[:3]}: expected {TAR_EXTENSIONS + TABLE_EXTENSIONS}"
        )
    return files


def _tar_sample(key: str, fields: dict[str, bytes]) -> dict[str, Any]:
    image = next((fields[e] for e in IMAGE_EXTENSIONS if e in fields), None)
    caption = next((fields[e] for e in CAPTION_EXTENSIONS if e in fields), None)
    if caption is None and "json" in fields:
        try:
            caption = json.loads(fields["json"]).get("caption")
        except (ValueError, AttributeError):  # malformed metadata: the caption stays missing
            caption = None
    try:
        label = int(fields["cls"]) if "cls" in fields else NO_LABEL
    except ValueError:
        label = NO_LABEL
    return {"key": key, "image": image, "caption": caption, "label": label}


def _ends_cleanly(path: str, end: int) -> bool:
    """Whether an uncompressed shard has its end-of-archive marker (two zero blocks) after its last member
    (compressed shards report a cut themselves)."""
    if not path.endswith(".tar"):
        return True
    with open(path, "rb") as handle:
        handle.seek(end)
        tail = handle.read(1024)
    return len(tail) == 1024 and not any(tail)


def iter_tar(path: str, sample_filter: SampleFilter) -> Iterator[dict[str, Any]]:
    """Raw samples of one webdataset shard, streamed; members are grouped by key, a sample is complete when
    the next key's header is read. A truncated/unreadable shard ends early (its incomplete last sample is
    dropped) and is counted."""
    key, fields = None, {}
    try:
        with tarfile.open(path, mode="r|*") as tar:
            for member in tar:
                match = _KEY_RE.match(member.name)
                if not member.isfile() or match is None or os.path.basename(member.name).startswith("."):
                    continue
                if key is not None and match.group(1) != key:
                    yield _tar_sample(key, fields)
                    fields = {}
                key = match.group(1)
                handle = tar.extractfile(member)
                fields[match.group(2).lower()] = handle.read() if handle else b""
            end = tar.offset
        if not _ends_cleanly(path, end):  # tarfile reads a shard cut inside a header as a clean end
            raise tarfile.ReadError(f"no end-of-archive marker after byte {end}: the shard is cut short")
    except (tarfile.TarError, EOFError, OSError, zlib.error) as error:
        sample_filter.skip(TRUNCATED_SHARD, f"{path}: {error} (its incomplete last sample is dropped)", path)
        return
    if key is not None:
        yield _tar_sample(key, fields)


def _pick_column(
    names: Sequence[str], wanted: str | None, candidates: Sequence[str], what: str, path: str
) -> str:
    if wanted is not None:
        if wanted not in names:
            raise KeyError(f"{path}: no {what} column {wanted!r}; columns are {list(names)}")
        return wanted
    for name in candidates:
        if name in names:
            return name
    raise KeyError(f"{path}: cannot find the {what} column among {list(names)}; pass {what}_column=")


def _table_columns(path: str, delimiter: str | None) -> list[str]:
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        return list(pq.ParquetFile(path).schema_arrow.names)
    with open(path, newline="", encoding="utf-8") as f:
        return next(csv.reader(f, delimiter=_delimiter(path, delimiter)), [])


def _delimiter(path: str, delimiter: str | None) -> str:
    if delimiter is not None:
        return delimiter
    if path.endswith(".tsv"):
        return "\t"
    with open(path, newline="", encoding="utf-8") as f:
        head = f.read(65536)
    try:
        return csv.Sniffer().sniff(head.splitlines()[0] if head else ",", delimiters=",\t;|").delimiter
    except csv.Error:
        return ","


def _table_rows(path: str, columns: list[str], delimiter: str | None) -> Iterator[dict[str, Any]]:
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        for batch in pq.ParquetFile(path).iter_batches(batch_size=256, columns=columns):
            yield from batch.to_pylist()
    else:
        with open(path, newline="", encoding="utf-8") as f:
            yield from csv.DictReader(f, delimiter=_delimiter(path, delimiter))


def _image_value(value: Any, folder: str) -> Any:
    """Bytes or struct as is; a relative path joined to the table's folder."""
    if isinstance(value, str) and value and not os.path.isabs(value):
        return os.path.join(folder, value)
    if isinstance(value, dict) and value.get("bytes") is None and value.get("path"):
        return _image_value(value["path"], folder)
    return value or None


def iter_table(
    path: str,
    image_column: str | None,
    caption_column: str | None,
    label_column: str | None,
    delimiter: str | None,
) -> Iterator[dict[str, Any]]:
    """Raw samples of one parquet/CSV table."""
    names = _table_columns(path, delimiter)
    image_col = _pick_column(names, image_column, IMAGE_COLUMNS, "image", path)
    caption_col = _pick_column(names, caption_column, CAPTION_COLUMNS, "caption", path)
    columns = [image_col, caption_col] + ([label_column] if label_column else [])
    folder, stem = os.path.dirname(os.path.abspath(path)), Path(path).stem
    for index, row in enumerate(_table_rows(path, columns, delimiter)):
        label = row.get(label_column) if label_column else None
        yield {
            "key": f"{stem}:{index}",
            "image": _image_value(row.get(image_col), folder),
            "caption": row.get(caption_col),
            "label": int(label) if label not in (None, "") else NO_LABEL,
        }


def _generate(
    shards: list[str],
    sample_filter: SampleFilter,
    image_column: str | None,
    caption_column: str | None,
    label_column: str | None,
    delimiter: str | None,
) -> Iterator[dict[str, Any]]:
    for path in shards:
        if path.endswith(TAR_EXTENSIONS):
            yield from iter_tar(path, sample_filter)
        else:
            yield from iter_table(path, image_column, caption_column, label_column, delimiter)


def load_image_text(
    source: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    shuffle_buffer: int | None = None,
    seed: int = 0,
    rank: int | None = None,
    world_size: int | None = None,
    image_column: str | None = None,
    caption_column: str | None = None,
    label_column: str | None = None,
    delimiter: str | None = None,
    min_side: int = DEFAULT_MIN_SIDE,
    decode_size: int | None = None,
    sample_filter: SampleFilter | None = None,
    decode_batch_size: int = 32,
) -> IterableDataset:
    """A streaming contract dataset (image, caption, label=-1 unless `.cls`/`label_column`, key) from
    webdataset shards and/or parquet/CSV tables (a glob, folder, file or list).

    `shuffle_buffer`: shuffle shard order and a buffer of that many raw samples (seeded; call
    `set_epoch` for a new order each epoch). `rank`/`world_size`: keep this rank's part
    (`split_dataset_by_node`). `decode_size`: decode JPEGs at reduced scale with the shorter side kept
    >= decode_size (set it to the model's input size for speed). Pass your own `sample_filter` to read
    the skip counts (per process; see SampleFilter).
    """
    shards = resolve_files(source)
    for path in shards:  # surface column mistakes now, not mid-run
        if path.endswith(TABLE_EXTENSIONS):
            names = _table_columns(path, delimiter)
            _pick_column(names, image_column, IMAGE_COLUMNS, "image", path)
            _pick_column(names, caption_column, CAPTION_COLUMNS, "caption", path)
    sample_filter = sample_filter or SampleFilter(
        "image-text data", min_side=min_side, draft_size=decode_size
    )
    raw = IterableDataset.from_generator(
        _generate,
        gen_kwargs={
            "shards": shards,
            "sample_filter": sample_filter,
            "image_column": image_column,
            "caption_column": caption_column,
            "label_column": label_column,
            "delimiter": delimiter,
        },
    )
    if world_size is not None and world_size > 1:
        raw = split_dataset_by_node(raw, rank=rank or 0, world_size=world_size)
    if shuffle_buffer:
        raw = raw.shuffle(seed=seed, buffer_size=shuffle_buffer)
    return raw.map(
        sample_filter.filter_batch, batched=True, batch_size=decode_batch_size, features=stream_features()
    )
