"""Errors a user can act on, and how the command line words the library errors users meet most.

Raise `UserError` for an expected mistake (a missing path, an impossible setting, a model of the wrong kind):
its message says in one or two lines what to change. The `hf-vrl` command prints that message alone and exits
with status 2; `--debug` shows the traceback as well. `explain` also recognises the errors that reach users
from the libraries underneath (a model folder or Hub id that cannot be found, a damaged weight file) and says
what to do about them; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import re

__all__ = ["UserError", "explain", "is_disk_full"]


class UserError(Exception):
    """An expected, user-fixable error; the message names what to change."""


_NOT_FOUND = re.compile(
    r"(Repo id must be|is not a local folder and is not a valid model identifier|couldn't connect to|"
    r"outgoing traffic has been disabled|offline mode is enabled|Can't load the configuration of|"
    r"does not appear to have a file named|not a valid model identifier)",
    re.IGNORECASE,
)
_NAME = re.compile(r"'([^']+)'")


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def explain(error: BaseException) -> str | None:
    """One or two lines for an error the user can fix; None for anything else (a bug: show the traceback)."""
    if isinstance(error, UserError):
        return str(error)
    if isinstance(error, FileNotFoundError):
        return _first_line(str(error)) or "a file or folder was not found"
    if isinstance(error, KeyboardInterrupt):
        return "interrupted"
    text = str(error)
    if type(error).__name__ in (
        "HFValidationError",
        "RepositoryNotFoundError",
        "LocalEntryNotFoundError",
    ) or (isinstance(error, OSError) and _NOT_FOUND.search(text)):
        names = [n for n in _NAME.findall(text) if n not in ("repo_name", "namespace/repo_name")]
        what = f"{max(names, key=lambda n: ('/' in n, len(n)))!r}" if names else "a model or dataset"
        return (
            f"{what} is neither a local folder nor reachable on the Hugging Face Hub: check the path, or "
            "download it first (the Hub is offline when HF_HUB_OFFLINE=1)"
        )
    network = _network_error(error)
    if network is not None:
        reason = f"{type(network).__name__}: {_first_line(str(network))}"
        return (
            f"the Hugging Face Hub cannot be reached ({reason}): check the network connection or proxy, "
            "then run the command again"
        )
    if is_disk_full(error):
        return (
            f"no space left on the disk ({type(error).__name__}: {_first_line(text)}): free some space, then "
            "run the command again"
        )
    if type(error).__name__ == "SafetensorError":
        file = _safetensors_file(error) or "a .safetensors file"
        reason = _first_line(text)
        return f"{file} cannot be read ({reason}): it is truncated or damaged; re-download or re-save it"
    return None


def is_disk_full(error: BaseException | None) -> bool:
    """Whether `error` (or an error behind it) is a write that found the disk or the quota full, as Python,
    safetensors or torch's writer (`inline_container.cc`, whose message names no cause) report it."""
    import errno

    seen = 0
    while error is not None and seen < 10:
        text = str(error)
        if getattr(error, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or any(
            mark in text for mark in ("No space left", "os error 28", "Disk quota", "inline_container.cc")
        ):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


_NETWORK_ERRORS = (
    "ConnectError",
    "ConnectTimeout",
    "ReadTimeout",
    "WriteTimeout",
    "PoolTimeout",
    "ProxyError",
)


def _network_error(error: BaseException) -> BaseException | None:
    """The connection failure (httpx / requests) behind `error`, following its causes; None if none."""
    seen = 0
    while error is not None and seen < 10:
        if type(error).__name__ in _NETWORK_ERRORS:
            return error
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None


def _safetensors_file(error: BaseException) -> str | None:
    """The .safetensors path being read when `error` was raised (from the traceback's local variables)."""
    traceback = error.__traceback__
    found = None
    while traceback is not None:
        for value in traceback.tb_frame.f_locals.values():
            if isinstance(value, (str, bytes)) is False and hasattr(value, "__fspath__"):
                value = str(value)
            if isinstance(value, str) and value.endswith(".safetensors"):
                found = value
        traceback = traceback.tb_next
    return found
