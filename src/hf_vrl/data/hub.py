"""The Hugging Face Hub as a data source beside local layouts: a dataset repo named `hf:<org>/<name>` (or
`hf://datasets/<org>/<name>`), its files listed and fetched through huggingface_hub.

Online, files are listed with `HfApi.dataset_info` (with the commit they belong to: a run reads one version
of the repo) and fetched one by one with `hf_hub_download` (into the Hub cache, so a shard is downloaded once
and read from disk after); offline (`HF_HUB_OFFLINE=1`, or the Hub unreachable) both come from the local Hub
cache (`snapshot_download(..., local_files_only=True)`): the files a snapshot holds, which for a repo
downloaded in part are only those. When neither has the repo, a one-line `UserError` says so; no connection
or cache error reaches the user raw.

A run reads every Hub dataset at the commit it recorded (`pinned_commits`): inside that context each
repo's revision resolves once to a commit, every later read of the repo (its listing, its files, `datasets`'
copy) reads that commit, and a resume entered with the recorded commits reads them again however far the
branch moved since (offline: the cache's snapshot of that commit; a commit neither has is one line).

Spellings (`parse_hub_spec`): `hf:<org>/<name>`, `hf:<org>/<name>@<revision>`, `hf:<org>/<name>/<path or
glob>`, `hf://datasets/<org>/<name>[@<revision>]/<path or glob>` (HfFileSystem's URL; a revision holding a
slash is written URL-encoded there, `refs%2Fconvert%2Fparquet`).
"""

from __future__ import annotations

import contextlib
import contextvars
import fnmatch
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote

import httpx2
from huggingface_hub import HfApi, constants, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from hf_vrl.errors import UserError

__all__ = [
    "HF_PREFIX",
    "HF_URL_PREFIX",
    "HubSpec",
    "dataset_file",
    "dataset_repo_files",
    "dataset_snapshot",
    "file_url",
    "is_hub_spec",
    "is_offline",
    "local_snapshot",
    "matching_files",
    "parse_hub_spec",
    "pinned_commits",
]

HF_PREFIX = "hf:"
HF_URL_PREFIX = "hf://datasets/"
_TRUE = ("1", "ON", "YES", "TRUE")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
# {repo_id or repo_id@revision: commit} of the run being read (`pinned_commits`); None outside a run
_PINS: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("hf_vrl_hub_pins", default=None)
_OFFLINE_HINT = "run once online (or huggingface-cli download {repo} --repo-type dataset) to fill the cache"


@dataclass(frozen=True)
class HubSpec:
    """A dataset repo on the Hub, a revision (None: the default branch) and a path or glob inside it ("" for
    the whole repo)."""

    repo_id: str
    revision: str | None = None
    path: str = ""

    def __str__(self) -> str:
        revision = f"@{self.revision}" if self.revision else ""
        return f"hf:{self.repo_id}{revision}" + (f"/{self.path}" if self.path else "")


def is_hub_spec(spec: str) -> bool:
    """Whether `spec` names a Hub dataset (`hf:<org>/<name>...` or `hf://datasets/...`), not a local path
    (`hf:/abs/path`, `hf:./x`, `hf:~/x` name local `datasets` copies)."""
    if spec.startswith(HF_URL_PREFIX):
        return True
    if not spec.startswith(HF_PREFIX):
        return False
    target = spec[len(HF_PREFIX) :]
    return bool(target) and not target.startswith(("/", ".", "~")) and not os.path.exists(target)


def parse_hub_spec(spec: str) -> HubSpec:
    """`HubSpec` of `hf:<org>/<name>[@<revision>][/<path>]` or `hf://datasets/<org>/<name>[@<revision>][/<path>]`
    (the `hf:` may be left out). A repo id that is not `<org>/<name>` raises a one-line UserError."""
    if spec.startswith(HF_URL_PREFIX):
        target = spec[len(HF_URL_PREFIX) :]
    elif spec.startswith(HF_PREFIX):
        target = spec[len(HF_PREFIX) :]
    else:
        target = spec
    parts = target.strip("/").split("/")
    if len(parts) < 2 or not parts[0] or not parts[1]:
        raise UserError(f"{spec!r} does not name a Hub dataset: write hf:<org>/<name>[@<revision>][/<path>]")
    org, name, rest = parts[0], parts[1], "/".join(parts[2:])
    revision = None
    if "@" in name:  # hf:<org>/<name>@<revision>/<path>
        name, revision = name.split("@", 1)
        revision = unquote(revision) or None
    return HubSpec(f"{org}/{name}", revision, rest)


def is_offline() -> bool:
    """Whether the Hub is offline (`HF_HUB_OFFLINE`, read now: huggingface_hub reads it at import)."""
    return constants.is_offline_mode() or os.environ.get("HF_HUB_OFFLINE", "").upper() in _TRUE


def _not_reachable(repo_id: str, revision: str | None, error: BaseException) -> UserError:
    """The one-line error for a repo (or file) neither the Hub nor the local cache can give."""
    at = f" at revision {revision}" if revision else ""
    if isinstance(error, GatedRepoError):
        return UserError(
            f"dataset {repo_id} is gated: accept its terms on the Hub, then huggingface-cli login"
        )
    if isinstance(error, RevisionNotFoundError):
        return UserError(f"dataset {repo_id} has no revision {revision!r} on the Hub")
    if isinstance(error, RepositoryNotFoundError):
        return UserError(
            f"no dataset {repo_id} on the Hub (or it is private: huggingface-cli login); check the name"
        )
    if isinstance(error, HFValidationError):
        return UserError(f"{repo_id!r} is not a valid Hub dataset id: write hf:<org>/<name>")
    if is_offline():
        return UserError(
            f"dataset {repo_id}{at} is not in the local Hub cache ({constants.HF_HUB_CACHE}) and the Hub is "
            f"offline (HF_HUB_OFFLINE=1): {_OFFLINE_HINT.format(repo=repo_id)}, or unset HF_HUB_OFFLINE"
        )
    reason = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
    return UserError(
        f"dataset {repo_id}{at} cannot be reached on the Hub ({reason}) and is not in the local Hub cache: "
        "check the network, or run where the cache holds it"
    )


_REMOTE_ERRORS = (httpx2.HTTPError, OfflineModeIsEnabled, ConnectionError, TimeoutError, HfHubHTTPError)


def _cached_snapshot(repo_id: str, revision: str | None) -> tuple[str, list[str]]:
    """(commit, files) of the repo's snapshot in the local Hub cache (LocalEntryNotFoundError when none)."""
    folder = Path(snapshot_download(repo_id, repo_type="dataset", revision=revision, local_files_only=True))
    files = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]
    return folder.name, sorted(files)


def _snapshot(repo_id: str, revision: str | None) -> tuple[str, list[str]]:
    error: BaseException | None = None
    if not is_offline():
        try:
            info = HfApi().dataset_info(repo_id, revision=revision)
            return info.sha, sorted(sibling.rfilename for sibling in info.siblings or ())
        except (RepositoryNotFoundError, RevisionNotFoundError, HFValidationError) as found:
            raise _not_reachable(repo_id, revision, found) from None
        except _REMOTE_ERRORS as unreachable:  # the network is down: the cache may still hold it
            error = unreachable
    try:
        return _cached_snapshot(repo_id, revision)
    except (LocalEntryNotFoundError, EntryNotFoundError, *_REMOTE_ERRORS, HFValidationError) as missing:
        raise _not_reachable(repo_id, revision, error or missing) from None


@contextlib.contextmanager
def pinned_commits(recorded: Mapping[str, str] | None = None) -> Iterator[dict[str, str]]:
    """Inside: each Hub dataset's revision resolves to a commit once and is read at it after (`recorded`,
    {repo_id[@revision]: commit} as an earlier run of the same data yielded, is read as it was). Yields the
    commits read so far, which a run records (`hf_vrl.run.runner`)."""
    pins = dict(recorded or {})
    token = _PINS.set(pins)
    try:
        yield pins
    finally:
        _PINS.reset(token)


def _pin_key(repo_id: str, revision: str | None) -> str:
    return f"{repo_id}@{revision}" if revision else repo_id


def _pinned(repo_id: str, revision: str | None) -> str | None:
    """The commit a revision of `repo_id` is read at in this run (None: none yet, or outside a run)."""
    pins = _PINS.get()
    return None if pins is None else pins.get(_pin_key(repo_id, revision))


def _pin(repo_id: str, revision: str | None, commit: str) -> None:
    """Record that this run reads `revision` of `repo_id` at `commit` (a revision that is a commit itself,
    as shard URLs name it, needs no record)."""
    pins = _PINS.get()
    if pins is not None and not (revision and _COMMIT.match(revision)):
        pins.setdefault(_pin_key(repo_id, revision), commit)


def _commit_gone(repo_id: str, commit: str) -> UserError:
    where = "the local Hub cache" if is_offline() else "the Hub nor the local Hub cache"
    return UserError(
        f"this run read dataset {repo_id} at commit {commit} (its config.json's hub_commits), which neither "
        f"{where} holds now: restore that snapshot to the cache, or start a new run in another --output-dir"
    )


def dataset_snapshot(repo_id: str, revision: str | None = None) -> tuple[str, list[str]]:
    """(commit, files) of dataset repo `repo_id` at `revision` (default branch when None): from the Hub
    online (`HfApi.dataset_info`), else from the local Hub cache; a one-line UserError when neither has it.
    Reading files at that commit keeps a run on one version of the repo; inside `pinned_commits` the
    commit the run read before is read again."""
    pinned = _pinned(repo_id, revision)
    try:
        commit, files = _snapshot(repo_id, pinned or revision)
    except UserError:
        if pinned is None:
            raise
        raise _commit_gone(repo_id, pinned) from None
    _pin(repo_id, revision, commit)
    return commit, files


def dataset_repo_files(repo_id: str, revision: str | None = None) -> list[str]:
    """The files of dataset repo `repo_id` (paths inside the repo, sorted): from the Hub online, else from
    the local Hub cache; a one-line UserError when neither has it."""
    return dataset_snapshot(repo_id, revision)[1]


def dataset_file(repo_id: str, filename: str, revision: str | None = None) -> Path:
    """The local path of one file of dataset repo `repo_id`: downloaded into the Hub cache online (once),
    from the cache offline; a one-line UserError when neither has it. Inside `pinned_commits`, the file
    of the commit the run reads."""
    pinned = _pinned(repo_id, revision)
    try:
        path = Path(
            hf_hub_download(
                repo_id,
                filename,
                repo_type="dataset",
                revision=pinned or revision,
                local_files_only=is_offline(),
            )
        )
    except RemoteEntryNotFoundError as error:
        raise UserError(f"dataset {repo_id} has no file {filename!r}") from error
    except (LocalEntryNotFoundError, *_REMOTE_ERRORS, HFValidationError) as error:
        if isinstance(error, LocalEntryNotFoundError) and _in_cache(repo_id, pinned or revision):
            raise UserError(
                f"the local Hub cache holds dataset {repo_id} but not its file {filename!r}, and the Hub is "
                f"{'offline (HF_HUB_OFFLINE=1)' if is_offline() else 'unreachable'}: "
                f"{_OFFLINE_HINT.format(repo=repo_id)}"
            ) from None
        raise (
            _commit_gone(repo_id, pinned) if pinned else _not_reachable(repo_id, revision, error)
        ) from None
    _pin(repo_id, revision, _snapshot_commit(path, filename))
    return path


def _snapshot_commit(path: Path, filename: str) -> str:
    """The commit of a file's snapshot folder (`.../snapshots/<commit>/<filename>`)."""
    return path.parents[len(Path(filename).parts) - 1].name


def _in_cache(repo_id: str, revision: str | None) -> bool:
    try:
        snapshot_download(repo_id, repo_type="dataset", revision=revision, local_files_only=True)
    except (LocalEntryNotFoundError, HFValidationError):
        return False
    return True


def file_url(repo_id: str, filename: str, revision: str | None = None) -> str:
    """The `hf://datasets/<org>/<name>[@<revision>]/<file>` URL of a repo file (a revision's slashes
    URL-encoded, as HfFileSystem writes them)."""
    at = "@" + quote(revision, safe="") if revision else ""
    return f"{HF_URL_PREFIX}{repo_id}{at}/{filename}"


def local_snapshot(repo_id: str, revision: str | None = None) -> Path:
    """The folder of the repo's snapshot in the local Hub cache (what it holds; nothing is downloaded); a
    one-line UserError when the cache has none. Inside `pinned_commits`, the snapshot of the commit the run
    reads."""
    pinned = _pinned(repo_id, revision)
    try:
        folder = Path(
            snapshot_download(
                repo_id, repo_type="dataset", revision=pinned or revision, local_files_only=True
            )
        )
    except (LocalEntryNotFoundError, HFValidationError) as error:
        raise (
            _commit_gone(repo_id, pinned) if pinned else _not_reachable(repo_id, revision, error)
        ) from None
    _pin(repo_id, revision, folder.name)
    return folder


def matching_files(spec: HubSpec, files: list[str]) -> list[str]:
    """The repo files `spec.path` names: a glob (`cc3m-train-*.tar`), a folder (its files) or one file; all
    files when the path is empty."""
    pattern = spec.path.strip("/")
    if not pattern:
        return list(files)
    if any(ch in pattern for ch in "*?["):
        return [f for f in files if fnmatch.fnmatchcase(f, pattern)]
    return [f for f in files if f == pattern or f.startswith(pattern + "/")]
