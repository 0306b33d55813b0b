"""CC3M as people have it, streamed: img2dataset webdataset shards, and parquet / CSV tables of image paths
and captions.

- Webdataset: `.tar` files whose members are grouped by key (`000123.jpg`, `000123.txt`, `000123.json`);
  the caption is the `.txt` member (else the `caption` field of the `.json`), the label a `.cls` member.
  A shard is a local `.tar` (or gzip-compressed `.tar.gz` / `.tgz`, read streaming), or a URL: `hf://datasets/
  <org>/<name>[@rev]/<file>` or `https://huggingface.co/datasets/<org>/<name>/resolve/<rev>/<file>` (fetched
  once into the Hub cache, `hf_vrl.data.hub`; offline from it), another `http(s)://` URL (streamed), or
  `pipe:<command>` (the command's standard output, as webdataset reads it). A member larger than
  `MAX_MEMBER_BYTES` (64 MiB; `max_member_bytes=`) is skipped and counted ("oversized_member") without being
  read, so a sparse or decompression-bomb member never fills memory. A Hub shard that cannot be fetched
  (the network drops mid-run, the cache lacks it offline) is tried `FETCH_TRIES` times, then skipped and
  counted ("unfetchable_shard") with one logged line naming it, as a truncated shard is.
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

import contextlib
import csv
import glob
import itertools
import json
import logging
import os
import re
import subprocess
import tarfile
import time
import urllib.request
import warnings
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from braceexpand import UnbalancedBracesError, braceexpand
from datasets import Features, IterableDataset, Value
from datasets import Image as ImageFeature
from datasets.distributed import split_dataset_by_node

from hf_vrl.errors import UserError

from . import hub
from .images import DEFAULT_MIN_SIDE, TRUNCATED_SHARD, SampleFilter
from .schema import NO_LABEL
from .splits import files_of_split

TAR_EXTENSIONS = (".tar", ".tar.gz", ".tgz")
URL_PREFIXES = ("hf://", "http://", "https://", "pipe:")
# a tar member above this is skipped unread (the largest web images are a few MB)
MAX_MEMBER_BYTES = 64 * 2**20
OVERSIZED_MEMBER = "oversized_member"
UNFETCHABLE_SHARD = "unfetchable_shard"
FETCH_TRIES = 3  # a Hub shard's fetch is tried this often, FETCH_BACKOFF_S * 2**try apart, then skipped
FETCH_BACKOFF_S = 2.0
CHECK_SAMPLES = 256  # raw samples read at most to find a trainable one before a run starts
_HUB_RESOLVE = re.compile(r"^https://huggingface\.co/datasets/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")
TABLE_EXTENSIONS = (".parquet", ".csv", ".tsv")
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff", "ppm")
CAPTION_EXTENSIONS = ("txt", "caption", "text")
IMAGE_COLUMNS = ("image", "image_path", "filepath", "file_name", "filename", "path", "img", "jpg")
CAPTION_COLUMNS = ("caption", "text", "title", "txt", "sentence", "alt")
_KEY_RE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # webdataset's base_plus_ext: key, extensions
logger = logging.getLogger(__name__)


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


def is_url(spec: str) -> bool:
    """Whether a shard spec is a URL or a `pipe:` command rather than a local path."""
    return spec.startswith(URL_PREFIXES)


def data_files(names: Sequence[str]) -> list[str]:
    """The data files among `names`: the .tar shards where there are any (img2dataset writes a .parquet and
    a _stats.json of metadata beside each shard: not data), else the .parquet/.csv/.tsv tables."""
    files = sorted(n for n in names if n.endswith(TAR_EXTENSIONS + TABLE_EXTENSIONS))
    shards = [f for f in files if f.endswith(TAR_EXTENSIONS)]
    return shards or files


def hub_shards(spec: hub.HubSpec, split: str | None) -> list[str]:
    """The `hf://` URLs of a Hub repo's webdataset shards of `split` (by the repo's own split names,
    `hf_vrl.data.splits`) under `spec.path`, at the commit the revision names now (a run reads one version
    of the repo); a glob in `spec.path` is read as named. Empty when the repo holds no shards (a parquet or
    image repo: `datasets` reads it)."""
    commit, files = hub.dataset_snapshot(spec.repo_id, spec.revision)
    found = [name for name in hub.matching_files(spec, files) if name.endswith(TAR_EXTENSIONS)]
    if found and not glob.has_magic(spec.path):
        found = files_of_split(found, split, str(spec), relative_to=spec.path.strip("/"))
    return [hub.file_url(spec.repo_id, name, commit) for name in found]


def _folder_files(folder: Path) -> list[str]:
    """A folder's data files (`data_files`): in the folder itself, else one level down (split folders,
    `train/`, `test/`)."""
    found = data_files([str(p) for p in folder.iterdir() if p.is_file()])
    if not found:
        found = data_files([str(p) for sub in folder.iterdir() if sub.is_dir() for p in sub.iterdir()])
    return found


def resolve_files(
    source: str | os.PathLike | Sequence[str | os.PathLike], split: str | None = None
) -> list[str]:
    """Sorted files from a glob, a brace pattern (``{00000..00331}.tar``), a file, a URL or `pipe:` command,
    a folder (its .tar shards, else its .parquet/.csv/.tsv tables) or a list of those. A folder gives the
    files of `split` only when its files are named by split (`hf_vrl.data.splits`: `cc3m-train-*.tar` and
    `cc3m-validation-*.tar` side by side, or `train/` and `test/`); a glob or file is read as named."""
    if isinstance(source, (str, os.PathLike)):
        source = [source]
    source = [expanded for item in source for expanded in expand_braces(os.fspath(item))]
    files: list[str] = []
    for item in source:
        if is_url(item):
            files.append(item)
            continue
        if os.path.isdir(item):
            found = files_of_split(_folder_files(Path(item)), split, item, relative_to=item)
        else:
            found = (
                sorted(glob.glob(item)) if glob.has_magic(item) else ([item] if os.path.isfile(item) else [])
            )
        if not found:
            raise FileNotFoundError(
                f"no data files match {item!r} (give .tar shards, .parquet or .csv/.tsv files)"
            )
        files.extend(found)
    unknown = [f for f in files if not is_url(f) and not f.endswith(TAR_EXTENSIONS + TABLE_EXTENSIONS)]
    if unknown:
        raise ValueError(
            f"unsupported data files {unknown[:3]}: expected {TAR_EXTENSIONS + TABLE_EXTENSIONS}"
        )
    return files


def _member(fields: dict[str, bytes], name: str) -> Any:
    """A member's bytes (`txt`, `cls`), or a field of the `.json` member (`json:caption`); None if absent
    (or the metadata is malformed)."""
    if not name.startswith("json:"):
        return fields.get(name.lower())
    try:
        return json.loads(fields["json"]).get(name[len("json:") :])
    except (KeyError, ValueError, AttributeError):
        return None


def _label(value: Any) -> int:
    try:
        return int(value) if value is not None else NO_LABEL
    except (TypeError, ValueError):
        return NO_LABEL


def _tar_sample(
    key: str, fields: dict[str, bytes], image: str | None, caption: str | None, label: str | None
) -> dict[str, Any]:
    """A raw sample from a key's members; `image`/`caption`/`label` name the member (or `json:<field>`),
    None for the defaults: the first image extension, `txt` (or `caption`, `text`, else the .json's
    `caption`), `cls`."""
    if image is not None:
        picture = _member(fields, image)
    else:
        picture = next((fields[e] for e in IMAGE_EXTENSIONS if e in fields), None)
    if caption is not None:
        text = _member(fields, caption)
    else:
        text = next((fields[e] for e in CAPTION_EXTENSIONS if e in fields), None)
        text = _member(fields, "json:caption") if text is None and "json" in fields else text
    return {"key": key, "image": picture, "caption": text, "label": _label(_member(fields, label or "cls"))}


def _ends_cleanly(path: str, end: int) -> bool:
    """Whether an uncompressed shard has its end-of-archive marker (two zero blocks) after its last member
    (compressed shards report a cut themselves)."""
    if not path.endswith(".tar"):
        return True
    with open(path, "rb") as handle:
        handle.seek(end)
        tail = handle.read(1024)
    return len(tail) == 1024 and not any(tail)


def local_shard(spec: str) -> str | None:
    """The local path a shard spec is read from: the path itself, or for a Hub file (`hf://datasets/...`,
    `https://huggingface.co/datasets/.../resolve/...`) its copy in the Hub cache (fetched once); None for a
    URL streamed as it is read and a `pipe:` command."""
    match = _HUB_RESOLVE.match(spec)
    if match is not None:
        repo, revision, filename = match.groups()
        return _fetch(repo, filename, revision)
    if spec.startswith(hub.HF_URL_PREFIX):
        found = hub.parse_hub_spec(spec)
        return _fetch(found.repo_id, found.path, found.revision)
    return None if is_url(spec) else spec


def _fetch(repo_id: str, filename: str, revision: str | None) -> str:
    """A Hub file's local path, tried `FETCH_TRIES` times (a dropped connection mid-run may come back);
    the last failure's one-line UserError after that."""
    for attempt in range(FETCH_TRIES - 1):
        try:
            return str(hub.dataset_file(repo_id, filename, revision))
        except UserError:
            time.sleep(FETCH_BACKOFF_S * 2**attempt)
    return str(hub.dataset_file(repo_id, filename, revision))


def _unfetchable(spec: str, error: UserError, sample_filter: SampleFilter) -> None:
    """Skip and count a shard that could not be fetched, with one line naming it."""
    logger.warning("skipping shard %s: not fetched after %d tries (%s)", spec, FETCH_TRIES, error)
    sample_filter.skip(UNFETCHABLE_SHARD, f"{spec}: {error}", spec)


@contextlib.contextmanager
def open_shard(spec: str) -> Iterator[tuple[Any, str | None]]:
    """(binary stream, local path or None) of a shard spec (see the module docstring); a `pipe:` command
    that fails raises OSError when its output is closed."""
    path = local_shard(spec)
    if path is not None:
        with open(path, "rb") as handle:
            yield handle, path
    elif spec.startswith("pipe:"):
        with subprocess.Popen(spec[len("pipe:") :], shell=True, stdout=subprocess.PIPE) as process:
            yield process.stdout, None
            process.stdout.close()
            if process.wait() != 0:
                raise OSError(f"{spec!r} exited with status {process.returncode}")
    else:
        with urllib.request.urlopen(spec) as response:  # noqa: S310 (http(s) only: URL_PREFIXES)
            yield response, None


def _read_member(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    handle = tar.extractfile(member)
    return handle.read(member.size) if handle else b""


def iter_tar(
    spec: str,
    sample_filter: SampleFilter,
    max_member_bytes: int = MAX_MEMBER_BYTES,
    columns: tuple[str | None, str | None, str | None] = (None, None, None),
) -> Iterator[dict[str, Any]]:
    """Raw samples of one webdataset shard, streamed (gzip shards too); members are grouped by key, a
    sample is complete when the next key's header is read. A member above `max_member_bytes` is skipped
    unread and counted (its sample keeps its other members). A truncated/unreadable shard ends early (its
    incomplete last sample is dropped) and is counted. `columns`: the (image, caption, label) members
    (`_tar_sample`)."""
    key, fields = None, {}
    try:
        with open_shard(spec) as (stream, path), tarfile.open(fileobj=stream, mode="r|*") as tar:
            for member in tar:
                match = _KEY_RE.match(member.name)
                if not member.isfile() or match is None or os.path.basename(member.name).startswith("."):
                    continue
                if key is not None and match.group(1) != key:
                    yield _tar_sample(key, fields, *columns)
                    fields = {}
                key = match.group(1)
                if member.size > max_member_bytes:
                    detail = (
                        f"{spec}: member {member.name} holds {member.size} bytes (limit {max_member_bytes})"
                    )
                    sample_filter.skip(OVERSIZED_MEMBER, detail, f"{spec}:{member.name}")
                    continue
                fields[match.group(2).lower()] = _read_member(tar, member)
            end = tar.offset
        if path is not None and not _ends_cleanly(path, end):  # a cut inside a header reads as a clean end
            raise tarfile.ReadError(f"no end-of-archive marker after byte {end}: the shard is cut short")
    except UserError as error:  # a Hub shard not fetched (its tries are spent)
        _unfetchable(spec, error, sample_filter)
        return
    except (tarfile.TarError, EOFError, OSError, zlib.error) as error:
        sample_filter.skip(TRUNCATED_SHARD, f"{spec}: {error} (its incomplete last sample is dropped)", spec)
        return
    if key is not None:
        yield _tar_sample(key, fields, *columns)


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


def _table_file(spec: str) -> str:
    """The local file a table spec is read from (a Hub file is fetched into the Hub cache)."""
    path = local_shard(spec)
    if path is None:
        raise ValueError(f"{spec}: tables are read from files or the Hub (hf://...), not streamed from a URL")
    return path


def iter_table(
    spec: str,
    sample_filter: SampleFilter,
    image_column: str | None,
    caption_column: str | None,
    label_column: str | None,
    delimiter: str | None,
) -> Iterator[dict[str, Any]]:
    """Raw samples of one parquet/CSV table (a Hub table that cannot be fetched is skipped and counted)."""
    try:
        path = _table_file(spec)
    except UserError as error:
        _unfetchable(spec, error, sample_filter)
        return
    names = _table_columns(path, delimiter)
    image_col = _pick_column(names, image_column, IMAGE_COLUMNS, "image", spec)
    caption_col = _pick_column(names, caption_column, CAPTION_COLUMNS, "caption", spec)
    columns = [image_col, caption_col] + ([label_column] if label_column else [])
    folder, stem = os.path.dirname(os.path.abspath(path)), Path(spec).stem
    for index, row in enumerate(_table_rows(path, columns, delimiter)):
        label = row.get(label_column) if label_column else None
        yield {
            "key": f"{stem}:{index}",
            "image": _image_value(row.get(image_col), folder),
            "caption": row.get(caption_col),
            "label": _label(label) if label not in (None, "") else NO_LABEL,
        }


def _generate(
    shards: list[str],
    sample_filter: SampleFilter,
    image_column: str | None,
    caption_column: str | None,
    label_column: str | None,
    delimiter: str | None,
    max_member_bytes: int = MAX_MEMBER_BYTES,
) -> Iterator[dict[str, Any]]:
    for spec in shards:
        if spec.endswith(TABLE_EXTENSIONS):
            yield from iter_table(spec, sample_filter, image_column, caption_column, label_column, delimiter)
        else:
            columns = (image_column, caption_column, label_column)
            yield from iter_tar(spec, sample_filter, max_member_bytes, columns)


def _no_trainable_sample(source: Any, read: int, counts: dict[str, int]) -> UserError:
    if read == 0:
        return UserError(f"{source} holds no samples (empty shards or tables): point --dataset at data")
    skipped = ", ".join(f"{kind} {n}" for kind, n in sorted(counts.items()))
    hint = "check the data"
    if counts.get("missing_caption") or counts.get("empty_caption"):
        hint = "name the caption with --caption-column (a member: txt, json:<field>; or a table column)"
    return UserError(f"{source}: none of its first {read} samples can be trained on ({skipped}): {hint}")


def check_trainable(
    shards: list[str],
    kwargs: dict[str, Any],
    *,
    min_side: int,
    decode_size: int | None,
    source: Any,
    limit: int = CHECK_SAMPLES,
) -> None:
    """Raise a one-line UserError when none of the first `limit` raw samples of `shards` (in order) passes
    the sample filter: data that would train no step (no caption anywhere, empty shards) is refused before
    a run writes anything. Reads until the first good sample (typically one)."""
    probe = SampleFilter("check", min_side=min_side, draft_size=decode_size)
    read = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for raw in itertools.islice(_generate(shards, probe, **kwargs), limit):
            read += 1
            if probe.check(raw["image"], raw["caption"], raw["key"]) is not None:
                return
    raise _no_trainable_sample(source, read, dict(probe.counts))


def load_image_text(
    source: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    split: str | None = None,
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
    max_member_bytes: int = MAX_MEMBER_BYTES,
    require_trainable: bool = False,
) -> IterableDataset:
    """A streaming contract dataset (image, caption, label=-1 unless `.cls`/`label_column`, key) from
    webdataset shards and/or parquet/CSV tables (a glob, folder, file, shard URL or list).

    `split`: a folder's files of that split where they are named by split (`resolve_files`).
    `shuffle_buffer`: shuffle shard order and a buffer of that many raw samples (seeded; call
    `set_epoch` for a new order each epoch). `rank`/`world_size`: keep this rank's part
    (`split_dataset_by_node`). `image_column` / `caption_column` / `label_column`: a table's columns, or a
    shard's members (`jpg`, `txt`, `cls`) or fields of its .json member (`json:caption`, `json:label`).
    `decode_size`: decode JPEGs at reduced scale with the shorter side kept >= decode_size (set it to the
    model's input size for speed). `max_member_bytes`: tar members above it are skipped and counted.
    `require_trainable`: refuse (UserError) data whose first samples are all bad (`check_trainable`).
    Pass your own `sample_filter` to read the skip counts (per process; see SampleFilter).
    """
    shards = resolve_files(source, split)
    tables = [spec for spec in shards if spec.endswith(TABLE_EXTENSIONS)]
    local = [spec for spec in tables if not is_url(spec)]
    for spec in local or tables[:1]:  # column mistakes now, not mid-run (a Hub table: its first one)
        names = _table_columns(_table_file(spec), delimiter)
        _pick_column(names, image_column, IMAGE_COLUMNS, "image", spec)
        _pick_column(names, caption_column, CAPTION_COLUMNS, "caption", spec)
    gen_kwargs = {
        "image_column": image_column,
        "caption_column": caption_column,
        "label_column": label_column,
        "delimiter": delimiter,
        "max_member_bytes": max_member_bytes,
    }
    if require_trainable:
        check_trainable(shards, gen_kwargs, min_side=min_side, decode_size=decode_size, source=source)
    sample_filter = sample_filter or SampleFilter(
        "image-text data", min_side=min_side, draft_size=decode_size
    )
    raw = IterableDataset.from_generator(
        _generate, gen_kwargs={"shards": shards, "sample_filter": sample_filter, **gen_kwargs}
    )
    if world_size is not None and world_size > 1:
        raw = split_dataset_by_node(raw, rank=rank or 0, world_size=world_size)
    if shuffle_buffer:
        raw = raw.shuffle(seed=seed, buffer_size=shuffle_buffer)
    return raw.map(
        sample_filter.filter_batch, batched=True, batch_size=decode_batch_size, features=stream_features()
    )
