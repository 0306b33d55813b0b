"""The Hugging Face Hub as a data source beside local layouts: a dataset repo named `hf:<org>/<name>` (or
`hf://datasets/<org>/<name>`), its files listed and fetched through huggingface_hub.

Online, files are listed with `HfApi.dataset_info` (with the commit they belong to: a run reads one version
of the repo) and fetched one by one with `hf_hub_download` (into the Hub cache, so a shard is downloaded once
and read from disk after); offline (`HF_HUB_OFFLINE=1`, or the Hub unreachable) both come from the local Hub
cache (`snapshot_download(..., local_files_only=True)`): the files a snapshot holds, which for a repo
downloaded in part are only those. When neither has the repo, a one-line `UserError` says so; no connection
or cache error reaches the user raw.

Spellings (`parse_hub_spec`): `hf:<org>/<name>`, `hf:<org>/<name>@<revision>`, `hf:<org>/<name>/<path or
glob>`, `hf://datasets/<org>/<name>[@<revision>]/<path or glob>` (HfFileSystem's URL; a revision holding a
slash is written URL-encoded there, `refs%2Fconvert%2Fparquet`).
"""

from __future__ import annotations

import fnmatch
import os
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
]

HF_PREFIX = "hf:"
HF_URL_PREFIX = "hf://datasets/"
_TRUE = ("1", "ON", "YES", "TRUE")
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


def dataset_snapshot(repo_id: str, revision: str | None = None) -> tuple[str, list[str]]:
    """(commit, files) of dataset repo `repo_id` at `revision` (default branch when None): from the Hub
    online (`HfApi.dataset_info`), else from the local Hub cache; a one-line UserError when neither has it.
    Reading files at that commit keeps a run on one version of the repo."""
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


def dataset_repo_files(repo_id: str, revision: str | None = None) -> list[str]:
    """The files of dataset repo `repo_id` (paths inside the repo, sorted): from the Hub online, else from
    the local Hub cache; a one-line UserError when neither has it."""
    return dataset_snapshot(repo_id, revision)[1]


def dataset_file(repo_id: str, filename: str, revision: str | None = None) -> Path:
    """The local path of one file of dataset repo `repo_id`: downloaded into the Hub cache online (once),
    from the cache offline; a one-line UserError when neither has it."""
    try:
        return Path(
            hf_hub_download(
                repo_id, filename, repo_type="dataset", revision=revision, local_files_only=is_offline()
            )
        )
    except RemoteEntryNotFoundError as error:
        raise UserError(f"dataset {repo_id} has no file {filename!r}") from error
    except (LocalEntryNotFoundError, *_REMOTE_ERRORS, HFValidationError) as error:
        if isinstance(error, LocalEntryNotFoundError) and _in_cache(repo_id, revision):
            raise UserError(
                f"the local Hub cache holds dataset {repo_id} but not its file {filename!r}, and the Hub is "
                f"{'offline (HF_HUB_OFFLINE=1)' if is_offline() else 'unreachable'}: "
                f"{_OFFLINE_HINT.format(repo=repo_id)}"
            ) from None
        raise _not_reachable(repo_id, revision, error) from None


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
    one-line UserError when the cache has none."""
    try:
        return Path(snapshot_download(repo_id, repo_type="dataset", revision=revision, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError) as error:
        raise _not_reachable(repo_id, revision, error) from None


def matching_files(spec: HubSpec, files: list[str]) -> list[str]:
    """The repo files `spec.path` names: a glob (`cc3m-train-*.tar`), a folder (its files) or one file; all
    files when the path is empty."""
    pattern = spec.path.strip("/")
    if not pattern:
        return list(files)
    if any(ch in pattern for ch in "*?["):
        return [f for f in files if fnmatch.fnmatchcase(f, pattern)]
    return [f for f in files if f == pattern or f.startswith(pattern + "/")]
