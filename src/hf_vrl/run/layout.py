"""The run folder every method writes, and the rules that keep a run from being lost or silently changed.

    <run>/config.json        the resolved configuration (`--config <run>/config.json` repeats the run)
    <run>/report.json        before / after / train, rewritten as the run advances
    <run>/checkpoints/<stage>/checkpoint-<step>/   Trainer checkpoints, each written atomically
    <run>/checkpoints/<stage>/done/                the result of a finished intermediate stage
    <run>/final/             what `from_pretrained` loads (the last stage's result), with its processors
    <run>/exports/<name>/    other exports (a plain vision tower, ...)
    <run>/figures/           figures
    <run>/inputs/            models a run builds for itself before training (toy-world stand-ins)
    <run>/logs/              skipped-sample logs

One writer per folder (`RunLock`): a run holds `<run>/.lock` (an OS file lock, released by the kernel when
the process dies, even by SIGKILL) from before it reads the folder until it ends; a second process is refused.

Rules (`RunDir.open`): a new run refuses a folder that holds a run (a trained step: a complete checkpoint, a
finished stage or `final/`; a folder whose run never saved a step may be taken over by any command);
`--resume` refuses a configuration that differs from the recorded one in anything that defines the run; a
stage whose result exists is never trained again; a folder is written under a temporary name and renamed into
place, so a killed run never leaves a half-written result that a later run would take for complete.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf_vrl.errors import UserError

__all__ = ["RunDir", "RunLock", "atomic_dir", "atomic_write_json", "last_complete_checkpoint"]

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
# a checkpoint is complete when the Trainer's last file is there (the rename makes it all-or-nothing; this
# also rejects half-written folders left by tools that write in place)
CHECKPOINT_COMPLETE_FILE = "trainer_state.json"


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_json(path: Path, data: Any) -> None:
    """Write JSON to `path` through a temporary file in the same folder and a rename (mode from the umask,
    as a plain `open` would give, not the temporary file's 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as handle:
        json.dump(data, handle, indent=2)
        handle.write("\n")
        handle.flush()
        os.fchmod(handle.fileno(), 0o666 & ~_umask())
        os.fsync(handle.fileno())
    os.replace(handle.name, path)


@contextlib.contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Yield a temporary folder beside `path`; on success it replaces `path` in one rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp-"))
    staging.chmod(0o777 & ~_umask())  # as `mkdir` would make it, not mkdtemp's 0700
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _readable_as_umask(staging)
    if path.exists():
        shutil.rmtree(path)
    os.replace(staging, path)


def _readable_as_umask(folder: Path) -> None:
    """Give what libraries wrote through private temporary files (0600) the permissions the umask allows."""
    mask = _umask()
    for parent, dirs, files in os.walk(folder):
        for name, allowed in [(d, 0o777) for d in dirs] + [(f, 0o666) for f in files]:
            target = os.path.join(parent, name)
            mode = os.lstat(target).st_mode
            if not os.path.islink(target):
                os.chmod(target, (mode & 0o777) | (allowed & ~mask))


def last_complete_checkpoint(folder: Path) -> Path | None:
    """The complete `checkpoint-<step>` of `folder` with the highest step, or None."""
    if not folder.is_dir():
        return None
    complete = [
        (int(match.group(1)), child)
        for child in folder.iterdir()
        if (match := _CHECKPOINT.match(child.name)) and (child / CHECKPOINT_COMPLETE_FILE).is_file()
    ]
    return max(complete)[1] if complete else None


class RunLock:
    """One writer per run folder: an exclusive OS lock on `<run>/.lock` (`filelock`), held for the whole run.

    The kernel drops the lock when its process dies (even by SIGKILL), so a lock left by a killed run is taken
    over without a word; `<run>/.lock.owner` names the holder (PID, host) for the refusal message.
    """

    def __init__(self, root: Path):
        self.root = Path(root)
        self.path = self.root / ".lock"
        self.owner_file = self.root / ".lock.owner"
        self._lock: Any = None

    def acquire(self) -> RunLock:
        """Take the lock now, or raise `UserError` naming the process that holds it."""
        from filelock import FileLock, Timeout

        self.root.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(self.path), timeout=0, thread_local=False)
        try:
            lock.acquire()
        except Timeout:
            raise UserError(
                f"{self.root} is in use by {self.holder()}: wait for that run to end (or stop it), or choose "
                "another --output-dir"
            ) from None
        self._lock = lock
        owner = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        atomic_write_json(self.owner_file, owner)
        return self

    def holder(self) -> str:
        try:
            owner = json.loads(self.owner_file.read_text())
            return f"process {owner['pid']} on {owner['host']} (since {owner['since']})"
        except (OSError, ValueError, KeyError):
            return "another process"

    def release(self) -> None:
        if self._lock is not None:
            with contextlib.suppress(OSError):
                self.owner_file.unlink()
            self._lock.release()
            self._lock = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


@dataclass
class RunDir:
    """Paths of one run folder (module docstring)."""

    root: Path

    def __post_init__(self) -> None:
        self.root = Path(self.root)

    config_file = property(lambda self: self.root / "config.json")
    report_file = property(lambda self: self.root / "report.json")
    final = property(lambda self: self.root / "final")
    exports = property(lambda self: self.root / "exports")
    figures = property(lambda self: self.root / "figures")
    inputs = property(lambda self: self.root / "inputs")
    logs = property(lambda self: self.root / "logs")

    def checkpoints(self, stage: str) -> Path:
        return self.root / "checkpoints" / stage

    def stage_result(self, stage: str, last: bool) -> Path:
        """Where a finished stage's result lives: `final/` for the last stage, `checkpoints/<stage>/done`."""
        return self.final if last else self.checkpoints(stage) / "done"

    def holds_run(self) -> bool:
        """Whether a run here saved trained work (a complete checkpoint, a finished stage, `final/`); a folder
        whose run never got that far holds nothing to lose and may be taken over."""
        if self.final.is_dir():
            return True
        stages = self.root / "checkpoints"
        for stage in stages.iterdir() if stages.is_dir() else ():
            if (stage / "done").is_dir() or last_complete_checkpoint(stage) is not None:
                return True
        return False

    def lock(self) -> RunLock:
        """Take this folder's writer lock (`RunLock`); raises `UserError` when another process holds it."""
        return RunLock(self.root).acquire()

    def sweep_temporaries(self) -> None:
        """Remove what killed writers left half-done (`.<name>.tmp-*` folders of `atomic_dir`, checkpoints
        half-written under `.staging/`): only the lock's holder calls this, so none is being written now."""
        places = [self.root, self.inputs, self.exports]
        stages = self.root / "checkpoints"
        places += [p for p in stages.iterdir() if p.is_dir()] if stages.is_dir() else []
        for place in places:
            for leftover in place.glob(".*.tmp-*") if place.is_dir() else ():
                shutil.rmtree(leftover, ignore_errors=True)
            if place.parent == stages:
                shutil.rmtree(place / ".staging", ignore_errors=True)

    def clear_unstarted(self) -> None:
        """Remove what a run that never saved a step left (its report, skip logs, half-written checkpoints),
        so that the run taking the folder over starts clean; `inputs/` stays (checked where it is used)."""
        for name in ("config.json", "report.json"):
            with contextlib.suppress(FileNotFoundError):
                (self.root / name).unlink()
        for folder in (self.logs, self.root / "checkpoints", self.figures, self.exports):
            shutil.rmtree(folder, ignore_errors=True)

    def recorded_config(self) -> dict[str, Any] | None:
        return json.loads(self.config_file.read_text()) if self.config_file.is_file() else None

    def open(self, config: Any, resume: str | None) -> bool:
        """Check the resume rules for `config`; returns whether this continues a recorded run.

        Without `resume` the folder must not hold a run. With `resume="auto"` a folder without a run starts
        fresh. Resuming compares the recorded configuration's identity (`RunConfig.identity`) with this one.
        """
        if not self.holds_run():
            if resume not in (None, "auto"):
                raise UserError(f"--resume {resume}: {self.root} holds no run to resume")
            recorded = self.recorded_config() if resume == "auto" else None
            return recorded is not None and self._same_run(config, recorded)
        if resume is None:
            raise UserError(
                f"{self.root} already holds a run: continue it with --resume, or choose another --output-dir"
            )
        recorded = self.recorded_config()
        if recorded is None:
            raise UserError(
                f"{self.root} holds checkpoints but no config.json, so it cannot be checked against this "
                "configuration: choose another --output-dir"
            )
        self._check_same_run(config, recorded)
        return True

    def _same_run(self, config: Any, recorded: dict[str, Any]) -> bool:
        try:
            self._check_same_run(config, recorded)
        except UserError:
            return False
        return True

    def _check_same_run(self, config: Any, recorded: dict[str, Any]) -> None:
        from hf_vrl.run.config import resolve

        if recorded.get("method") != config.method:
            raise UserError(
                f"{self.root} holds a {recorded.get('method')!r} run, not a {config.method!r} one: "
                "choose another --output-dir"
            )
        before = resolve(type(config), recorded, source=str(self.config_file)).identity()
        now = config.identity()
        changed = [key for key in now if before.get(key) != now[key]]
        if changed:
            listing = "; ".join(f"{key}: {before.get(key)!r} there, {now[key]!r} now" for key in changed[:6])
            raise UserError(
                f"{self.root} was started with other settings ({listing}). Resume with the same settings "
                f"(--config {self.config_file}), or use another --output-dir"
            )
