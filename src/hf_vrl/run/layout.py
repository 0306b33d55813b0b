"""The run folder every method writes, and the rules that keep a run from being lost or silently changed.

    <run>/config.json        the resolved configuration (`--config <run>/config.json` repeats the run)
    <run>/report.json        before / after / train, rewritten as the run advances
    <run>/checkpoints/<stage>/checkpoint-<step>/   Trainer checkpoints, each written atomically
    <run>/checkpoints/<stage>/done/                the result of a finished intermediate stage
    <run>/final/             what `from_pretrained` loads (the last stage's result), with its processors
    (each checkpoint, done/ and final/ lists its files and names the run that wrote it in checkpoint.json)
    <run>/exports/<name>/    other exports (a plain vision tower, ...)
    <run>/figures/           figures
    <run>/inputs/            models a run builds for itself before training (toy-world stand-ins)
    <run>/logs/              skipped-sample logs

One writer per folder (`RunLock`): a run holds `<run>/.lock` (an OS file lock, released by the kernel when
the process dies, even by SIGKILL) from before it reads the folder until it ends; a second process is refused.
`<run>/.hf-vrl-run` marks a folder hf_vrl made and names the command that made it. Every command that writes
a folder (`train`, `eval`, `llava-align`, `export-llava`, `convert`, `push`'s staging) takes it through
`OutputDir`: a new or empty folder, or one the same command made (its marker); anything else (a file, a
foreign folder, a folder of another command, even one holding an hf_vrl config.json) is refused in one line
before anything is written, so that hf_vrl never clears or overwrites what it did not write.

A checkpoint is complete when every file its writer listed in `checkpoint.json` is there and readable (JSON
parses, a safetensors header matches its file, a torch file's zip directory reads); an incomplete one is
skipped, with the reason in the run log, and the newest complete one is resumed.

Rules (`RunDir.open`): a new run refuses a folder that holds a run (a trained step: a complete checkpoint, a
finished stage or `final/`; a folder whose run never saved a step may be taken over by any command, its
`inputs/` kept only when its recorded configuration defines the same run, unless a folder the take-over
clears holds another command's output: that is refused);
`--resume` refuses a configuration that differs from the recorded one in anything that defines the run; a
stage whose result exists is never trained again; a folder is written under a temporary name and renamed into
place, so a killed run never leaves a half-written result that a later run would take for complete.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from hf_vrl.errors import UserError, is_disk_full
from hf_vrl.run.trust import drop_foreign_auto_maps

__all__ = [
    "CHECKPOINT_MANIFEST",
    "Launch",
    "OutputDir",
    "RunDir",
    "RunLock",
    "atomic_dir",
    "atomic_write_json",
    "atomic_write_bytes",
    "checkpoint_problem",
    "checkpoint_run",
    "disk_full_is_one_line",
    "folder_size",
    "last_complete_checkpoint",
    "readable_as_umask",
    "write_checkpoint_manifest",
]

logger = logging.getLogger("hf_vrl.run")

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
# the Trainer's last file: a folder without it never held a checkpoint (a tool that writes in place left it)
CHECKPOINT_COMPLETE_FILE = "trainer_state.json"
CHECKPOINT_MANIFEST = (
    "checkpoint.json"  # the files of a checkpoint, listed by its writer once all are written
)
RUN_MARKER = ".hf-vrl-run"  # a folder hf_vrl made for a run


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


def atomic_write_bytes(path: Path, write: Callable[[Path], Any]) -> None:
    """Write a file at `path` through `write(temporary path)` in the same folder and a rename, with the
    mode the umask gives (`readable_as_umask`): a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, staged = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(handle)
    try:
        write(Path(staged))
        readable_as_umask(staged)
        os.replace(staged, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staged)
        raise


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def folder_size(folder: str | os.PathLike, pattern: str = "*") -> int:
    """Bytes of the files in `folder` (and below) whose names match `pattern`."""
    return sum(p.stat().st_size for p in Path(folder).rglob(pattern) if p.is_file())


RESUME_AFTER_DISK_FULL = "then continue with --resume auto"


@contextlib.contextmanager
def disk_full_is_one_line(
    staging: str | os.PathLike,
    what: Any,
    needed: int | None = None,
    then: str = RESUME_AFTER_DISK_FULL,
) -> Iterator[None]:
    """Around writing `what` into the folder `staging`: a full disk ends the run in one line naming the disk,
    its free space and the space needed (`needed`, else what was written before it filled); the half-written
    folder is removed, so that its space is free again."""
    staging = Path(staging)
    try:
        yield
    except Exception as error:
        if not is_disk_full(error):
            raise
        written = folder_size(staging) if staging.is_dir() else 0
        shutil.rmtree(staging, ignore_errors=True)
        mount = staging.parent.resolve()
        while not os.path.ismount(mount):
            mount = mount.parent
        free = shutil.disk_usage(mount).free
        space = [f"{_size(free)} free"]
        space += (
            [f"about {_size(needed)} needed"] if needed else [f"{_size(written)} written"] if written else []
        )
        raise UserError(
            f"no space left on the disk of {mount} while writing {what} ({', '.join(space)}): free some "
            f"space or choose another --output-dir, {then}"
        ) from None


@contextlib.contextmanager
def _staging(
    parent: Path, prefix: str, target: Path, needed: int | None = None, then: str = RESUME_AFTER_DISK_FULL
) -> Iterator[Path]:
    """Yield a new temporary folder in `parent` for what will become `target`; removed on any failure (a full
    disk is one line: `disk_full_is_one_line`); on success its contents carry no `auto_map` naming code
    hf_vrl did not write (`drop_foreign_auto_maps`) and have the modes the umask gives."""
    staging = Path(tempfile.mkdtemp(dir=parent, prefix=prefix))
    staging.chmod(0o777 & ~_umask())  # as `mkdir` would make it, not mkdtemp's 0700
    try:
        with disk_full_is_one_line(staging, target, needed, then):
            yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    drop_foreign_auto_maps(staging)
    readable_as_umask(staging)


@contextlib.contextmanager
def atomic_dir(path: Path, needed: int | None = None) -> Iterator[Path]:
    """Yield a temporary folder beside `path`; on success it replaces `path` in one rename (a full disk is
    one line: `disk_full_is_one_line`, with `needed` bytes when the caller knows them), without an `auto_map`
    naming code hf_vrl did not write (`drop_foreign_auto_maps`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _staging(path.parent, f".{path.name}.tmp-", path, needed) as staging:
        yield staging
    if path.exists():
        shutil.rmtree(path)
    os.replace(staging, path)


def readable_as_umask(path: str | os.PathLike) -> None:
    """Give what libraries wrote through private temporary files (0600: safetensors, torch) the permissions
    the umask allows, as a plain `open` would have: the file `path`, or everything in the folder `path`."""
    mask = _umask()
    walked = os.walk(path) if os.path.isdir(path) else [(os.path.dirname(path), [], [os.path.basename(path)])]
    for parent, dirs, files in walked:
        for name, allowed in [(d, 0o777) for d in dirs] + [(f, 0o666) for f in files]:
            target = os.path.join(parent, name)
            mode = os.lstat(target).st_mode
            if not os.path.islink(target):
                os.chmod(target, (mode & 0o777) | (allowed & ~mask))


def write_checkpoint_manifest(folder: str | os.PathLike, run: dict[str, Any] | None = None) -> None:
    """List every file of the checkpoint `folder` in its `checkpoint.json` (call once all are written), with
    `run`, the identity of the run that wrote it (`RunConfig.identity`), when the run gave one; an `auto_map`
    naming code hf_vrl did not write is dropped first: `drop_foreign_auto_maps`)."""
    folder = Path(folder)
    drop_foreign_auto_maps(folder)
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    manifest: dict[str, Any] = {"files": [f for f in files if f != CHECKPOINT_MANIFEST]}
    atomic_write_json(folder / CHECKPOINT_MANIFEST, manifest | ({"run": run} if run is not None else {}))


def checkpoint_run(folder: Path) -> dict[str, Any] | None:
    """The identity of the run that wrote the checkpoint `folder` (its checkpoint.json's `run`), or None
    (a checkpoint of an earlier release, or of a trainer outside a run)."""
    try:
        run = json.loads((folder / CHECKPOINT_MANIFEST).read_text()).get("run")
    except (OSError, ValueError, AttributeError):
        return None
    return run if isinstance(run, dict) else None


def _unreadable(path: Path) -> str | None:
    """Why the file at `path` cannot be read (its format checked, cheaply), or None."""
    try:
        if path.suffix == ".json":
            json.loads(path.read_text())
        elif path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as handle:  # checks the header against the size
                handle.keys()
        elif path.suffix in (".pt", ".pth", ".bin"):
            import zipfile

            with zipfile.ZipFile(path) as archive:  # torch.save's format: its directory is the file's end
                archive.infolist()
    except Exception as error:  # any failure to read is damage, whatever the library raises
        return f"{path.name} cannot be read ({type(error).__name__})"
    return None


# what every Trainer checkpoint holds beside its weights: one of an earlier release (no checkpoint.json)
# without them would resume with a fresh optimiser and schedule (FSDP saves the optimiser as optimizer_0/)
OPTIMIZER_STATES = ("optimizer.pt", "optimizer.bin", "optimizer_0")
SCHEDULER_STATE = "scheduler.pt"


def _listed(folder: Path) -> tuple[list[str], str | None]:
    """The files `checkpoint.json` of `folder` lists, or what is wrong with it (not a list of names inside
    the checkpoint)."""
    problem = _unreadable(folder / CHECKPOINT_MANIFEST)
    if problem is not None:
        return [], problem
    manifest = json.loads((folder / CHECKPOINT_MANIFEST).read_text())
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, list) or not all(isinstance(name, str) and name for name in files):
        return [], f"{CHECKPOINT_MANIFEST} does not list the checkpoint's files"
    outside = [name for name in files if Path(name).is_absolute() or ".." in Path(name).parts]
    if outside:
        return [], f"{CHECKPOINT_MANIFEST} names a file outside the checkpoint ({outside[0]})"
    return files, None


def _earlier_release_gaps(folder: Path) -> list[str]:
    """The optimiser and schedule states a checkpoint without `checkpoint.json` lacks."""
    gaps = [] if any((folder / name).exists() for name in OPTIMIZER_STATES) else [OPTIMIZER_STATES[0]]
    return gaps + ([] if (folder / SCHEDULER_STATE).is_file() else [SCHEDULER_STATE])


def checkpoint_problem(folder: Path) -> str | None:
    """What keeps the checkpoint `folder` from being resumed (a listed file missing or unreadable, a
    malformed `checkpoint.json`), or None. A checkpoint of an earlier release (no `checkpoint.json`) is
    checked by the files it has, and must hold its optimiser and schedule states."""
    if not (folder / CHECKPOINT_COMPLETE_FILE).is_file():
        return f"no {CHECKPOINT_COMPLETE_FILE}"
    if (folder / CHECKPOINT_MANIFEST).is_file():
        names, problem = _listed(folder)
        if problem is not None:
            return problem
        files = [folder / name for name in names]
        missing = [name for name, path in zip(names, files) if not path.is_file()]
    else:
        files = [path for path in folder.rglob("*") if path.is_file()]
        missing = _earlier_release_gaps(folder)
    if missing:
        return f"{', '.join(missing[:3])} {'is' if len(missing) == 1 else 'are'} missing"
    return next((problem for path in files if (problem := _unreadable(path))), None)


def _checkpoints(folder: Path) -> list[Path]:
    """The `checkpoint-<step>` folders that hold a checkpoint, newest first."""
    if not folder.is_dir():
        return []
    found = [
        (int(match.group(1)), child)
        for child in folder.iterdir()
        if (match := _CHECKPOINT.match(child.name)) and (child / CHECKPOINT_COMPLETE_FILE).is_file()
    ]
    return [path for _, path in sorted(found, reverse=True)]


def last_complete_checkpoint(folder: Path, report: bool = False) -> Path | None:
    """The complete `checkpoint-<step>` of `folder` with the highest step, or None; with `report`, the run
    log says which newer ones were skipped and why."""
    for checkpoint in _checkpoints(folder):
        problem = checkpoint_problem(checkpoint)
        if problem is None:
            return checkpoint
        if report:
            logger.warning("%s is incomplete (%s): skipped", checkpoint, problem)
    return None


class RunLock:
    """One writer per run folder: an exclusive OS lock on `<run>/.lock` (`filelock`), held for the whole run.

    The kernel drops the lock when its process dies (even by SIGKILL), so a lock left by a killed run is taken
    over without a word; `<run>/.lock.owner` names the holder (PID, host) for the refusal message.
    """

    _held: ClassVar[set[Path]] = set()  # the folders this process holds

    def __init__(self, root: Path, flag: str = "--output-dir"):
        self.root = Path(root)
        self.flag = flag
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
                f"another {self.flag}"
            ) from None
        self._lock = lock
        RunLock._held.add(self.root.resolve())
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

    @classmethod
    def held_here(cls, root: Path) -> bool:
        """Whether this process holds the lock of `root` (a run that publishes itself at its end)."""
        return Path(root).resolve() in cls._held

    def release(self) -> None:
        if self._lock is not None:
            RunLock._held.discard(self.root.resolve())
            with contextlib.suppress(OSError):
                self.owner_file.unlink()
            self._lock.release()
            self._lock = None

    def __enter__(self) -> RunLock:
        return self if self._lock is not None else self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


LOCK_FILES = frozenset({".lock", ".lock.owner"})
STAGING_PREFIX = ".staging-"  # `OutputDir.staged`'s temporary folders


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _holds_marked(path: Path) -> bool:
    """Whether `path` is, or holds, a folder an hf_vrl command marked (links not followed)."""
    return path.is_dir() and not path.is_symlink() and any(path.rglob(RUN_MARKER))


def marker_command(folder: str | os.PathLike) -> str | None:
    """The command that made `folder` (its `RUN_MARKER`; a marker that names none is `train`'s, as written
    before markers named their command), or None where there is no marker."""
    marker = Path(folder) / RUN_MARKER
    if not marker.is_file():
        return None
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, ValueError):
        recorded = None
    command = recorded.get("command") if isinstance(recorded, dict) else None
    return command if isinstance(command, str) else "train"


@dataclass
class OutputDir:
    """The folder one command writes (module docstring): new, empty (lock files aside) or made by the same
    `command` (its marker); `flag` is the option that named it, for the refusal messages."""

    root: Path
    command: str
    flag: str = "--output-dir"

    def __post_init__(self) -> None:
        self.root = Path(self.root)

    def is_ours(self) -> bool:
        """Whether this command may write here: the folder is new, empty, or this command's."""
        if not self.root.is_dir():
            return not self.root.exists()
        if not {p.name for p in self.root.iterdir()} - LOCK_FILES:
            return True
        return marker_command(self.root) == self.command

    def check(self) -> None:
        """Refuse, before anything is written, a folder this command must not write into (one line)."""
        if self.root.is_symlink() and not self.root.exists():
            raise UserError(f"{self.flag} {self.root} is a link to nothing: give a folder")
        if self.root.exists() and not self.root.is_dir():
            raise UserError(
                f"{self.flag} {self.root} is a file: give a folder (new, or one hf-vrl {self.command} wrote)"
            )
        if self.is_ours():
            self._check_can_write()
            return
        other = marker_command(self.root)
        what = f"a folder `hf-vrl {other}` wrote" if other else "not a folder hf_vrl wrote"
        raise UserError(
            f"{self.flag} {self.root} is not empty and is {what}: give a new or empty folder (`hf-vrl "
            f"{self.command}` writes only into folders it made)"
        )

    def _check_can_write(self) -> None:
        """A folder (or its nearest existing parent) this process cannot write into, refused in one line."""
        existing = self.root
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not os.access(existing, os.W_OK | os.X_OK, effective_ids=True):  # the rights it writes with
            raise UserError(
                f"{self.flag} {self.root}: {existing} is not writable; give a folder you can write"
            )

    def mark(self) -> None:
        """Mark the folder as this command's (`RUN_MARKER`), before its first write."""
        if marker_command(self.root) != self.command:
            from hf_vrl import __version__

            atomic_write_json(self.root / RUN_MARKER, {"hf_vrl": __version__, "command": self.command})

    def claim(self) -> RunLock:
        """Check the folder, take its writer lock (`RunLock`), check again (another writer may have taken
        it meanwhile) and mark it: the folder is this command's until the lock is released. What a killed
        writer left half-done (`staged`'s temporary folders) goes."""
        self.check()
        lock = RunLock(self.root, self.flag).acquire()
        try:
            self.check()
            self.mark()
        except BaseException:
            lock.release()
            raise
        for leftover in self.root.glob(f"{STAGING_PREFIX}*"):
            shutil.rmtree(leftover, ignore_errors=True)
        return lock

    @contextlib.contextmanager
    def staged(self, replace: bool = False) -> Iterator[Path]:
        """Yield a temporary folder inside this (claimed) folder; on success each of its files and folders
        takes its place in the folder in one rename, with the modes the umask gives (`replace`: what else
        the folder held goes, its marker and lock aside, and any folder holding another command's output,
        such as `hf-vrl llava-eval`'s results inside an `export-llava` folder). A failure (a full disk: one
        line) leaves the folder as it was, so that the same command can run again into it."""
        with _staging(self.root, STAGING_PREFIX, self.root, then="then run the command again") as staging:
            yield staging
        kept = {RUN_MARKER, staging.name, *LOCK_FILES}
        for old in self.root.iterdir() if replace else ():
            if old.name not in kept and not (staging / old.name).exists() and not _holds_marked(old):
                _remove(old)
        for item in staging.iterdir():
            target = self.root / item.name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            os.replace(item, target)
        staging.rmdir()


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
        """Whether a run here saved trained work (a checkpoint, even a damaged one, a finished stage,
        `final/`); a folder whose run never got that far holds nothing to lose and may be taken over."""
        if self.final.is_dir():
            return True
        stages = self.root / "checkpoints"
        for stage in stages.iterdir() if stages.is_dir() else ():
            if (stage / "done").is_dir() or _checkpoints(stage):
                return True
        return False

    @property
    def output(self) -> OutputDir:
        """The folder as `hf-vrl train`'s output (`OutputDir`)."""
        return OutputDir(self.root, "train")

    def check_writable(self) -> None:
        """Refuse, before anything is written, an output folder hf_vrl must not write into: a file, or a
        non-empty folder `hf-vrl train` did not make (`OutputDir.check`), or one this user cannot write in."""
        blocked = self._unwritable() if self.output.is_ours() else None  # named more closely than check's
        if blocked is not None:
            made = "" if blocked == self.root else f" (--output-dir {self.root} is made and written in it)"
            raise UserError(
                f"{blocked} is not writable here{made}: give this user write permission to it, or choose "
                "another --output-dir"
            )
        self.output.check()

    def _unwritable(self) -> Path | None:
        """The first folder a run writes in that this process may not write in (permissions, a read-only
        file system): the run folder and its folders, or the nearest existing folder above a new one."""
        if not self.root.exists():
            above = self.root.absolute().parent
            while not above.exists():
                above = above.parent
            folders = [above]
        else:
            stages = self.root / "checkpoints"
            folders = [self.root, stages, self.final, self.inputs, self.logs, self.exports, self.figures]
            folders += sorted(stages.iterdir()) if stages.is_dir() else []
        writable = os.W_OK | os.X_OK
        return next(
            (f for f in folders if f.is_dir() and not os.access(f, writable, effective_ids=True)), None
        )

    def mark(self) -> None:
        """Mark the folder as `hf-vrl train`'s (`RUN_MARKER`), before the run's first write."""
        self.output.mark()

    def lock(self) -> RunLock:
        """Take this folder's writer lock (`RunLock`); raises `UserError` when another process holds it."""
        return RunLock(self.root).acquire()  # checked and marked by the run itself (`RunDir.open`)

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

    def clear_unstarted(self, config: Any) -> None:
        """Remove what a run that never saved a step left (its report, skip logs, half-written checkpoints),
        so that the run taking the folder over with `config` starts clean; `inputs/` stays when the recorded
        configuration defines the same run (what it holds was made by the same settings), else it goes too."""
        recorded = self.recorded_config()
        if self.inputs.is_dir() and not (recorded is not None and self._same_run(config, recorded)):
            logger.info("%s was made by other settings than this run's: rebuilding it", self.inputs)
            shutil.rmtree(self.inputs)
        for name in ("config.json", "report.json"):
            with contextlib.suppress(FileNotFoundError):
                (self.root / name).unlink()
        for folder in (self.logs, self.root / "checkpoints", self.figures, self.exports):
            shutil.rmtree(folder, ignore_errors=True)

    def _check_take_over_loses_no_output(self) -> None:
        """Refuse to take the folder over (`clear_unstarted`) while a folder it clears holds what another
        hf_vrl command wrote (its marker: an `hf-vrl eval --output-dir <run>/exports/eval`), in one line."""
        for folder in (self.logs, self.root / "checkpoints", self.figures, self.exports, self.inputs):
            marker = next(folder.rglob(RUN_MARKER), None) if folder.is_dir() else None
            if marker is not None:
                raise UserError(
                    f"{marker.parent} holds what `hf-vrl {marker_command(marker.parent)}` wrote, and a new "
                    f"run in {self.root} clears {folder.name}/: move it out of {self.root}, or choose "
                    "another --output-dir"
                )

    def recorded_config(self) -> dict[str, Any] | None:
        """The recorded configuration (config.json), None when there is none or it cannot be read."""
        try:
            recorded = json.loads(self.config_file.read_text())
        except (OSError, ValueError):
            return None
        return recorded if isinstance(recorded, dict) else None

    def record_config(
        self,
        config: Any,
        launch: Launch,
        data: Mapping[str, Any] | None = None,
        hub_commits: Mapping[str, str] | None = None,
    ) -> None:
        """Write config.json: the configuration, the launch that runs it (`Launch`, what a resume on another
        launch is checked against), `data`, the fingerprints of the local data it reads ({setting:
        `hf_vrl.run.data.data_fingerprint`}, what a resume compares; none: nothing local) and `hub_commits`,
        the commit of each Hub dataset it reads (`hf_vrl.data.hub.pinned_commits`, what a resume reads)."""
        from hf_vrl.run.config import DATA_FILES, HUB_COMMITS, LAUNCH

        recorded = {**config.to_dict(), LAUNCH: dataclasses.asdict(launch)}
        recorded |= {DATA_FILES: dict(data)} if data else {}
        atomic_write_json(
            self.config_file, recorded | ({HUB_COMMITS: dict(hub_commits)} if hub_commits else {})
        )

    def recorded_launch(self, recorded_config: dict[str, Any]) -> Launch | None:
        """The launch of the recorded run (`recorded_config`'s, as config.json holds it; for an earlier
        release's run, what its newest checkpoint's files say: one RNG state per process, FSDP's model
        shards); None when unknown."""
        from hf_vrl.run.config import LAUNCH

        recorded = recorded_config.get(LAUNCH)
        if isinstance(recorded, dict):
            with contextlib.suppress(TypeError):
                return Launch(**recorded)
        stages = self.root / "checkpoints"
        for stage in sorted(stages.iterdir()) if stages.is_dir() else ():
            for checkpoint in _checkpoints(stage):
                ranks = len(list(checkpoint.glob("rng_state_*.pth")))
                processes = ranks or int((checkpoint / "rng_state.pth").is_file())
                if processes:
                    return Launch(processes, (checkpoint / "pytorch_model_fsdp_0").is_dir())
        return None

    def open(
        self,
        config: Any,
        resume: str | None,
        launch: Launch | None = None,
        data: Mapping[str, Any] | None = None,
    ) -> bool:
        """Check the resume rules for `config` run by `launch` (default: this process's) on `data` (the
        fingerprints `record_config` records); returns whether this continues a recorded run.

        Without `resume` the folder must not hold a run. With `resume="auto"` a folder without a run starts
        fresh. Resuming compares the recorded configuration's identity on its launch (`RunConfig.identity`)
        with this one's on `launch`, the recorded data's fingerprints with `data`, and the run that wrote
        each checkpoint to be resumed (its checkpoint.json) with this one.
        """
        launch = launch or Launch.current()
        self.check_writable()
        if not self.holds_run():
            if resume not in (None, "auto"):
                raise UserError(f"--resume {resume}: {self.root} holds no run to resume")
            recorded = self.recorded_config() if resume == "auto" else None
            resumed = recorded is not None and self._same_run(config, recorded, launch)
            if not resumed:
                self._check_take_over_loses_no_output()
            return resumed
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
        self._check_same_run(config, recorded, launch)
        self._check_same_data(recorded, data or {})
        self._check_checkpoints_are_this_runs(config.identity(launch.processes), resume)
        return True

    def _check_same_data(self, recorded: dict[str, Any], data: Mapping[str, Any]) -> None:
        """The local data the run read is as it was (`record_config`'s fingerprints; a run of an earlier
        release recorded none)."""
        from hf_vrl.run.config import DATA_FILES

        for setting, then in (recorded.get(DATA_FILES) or {}).items():
            now = data.get(setting)
            if now is None or then == now:
                continue
            files = f"{then.get('files')} files, {_size(then.get('bytes', 0))} then; "
            files += f"{now['files']} files, {_size(now['bytes'])} now"
            raise UserError(
                f"the files of {setting} changed since {self.root} started ({files}; edits, deletions or "
                "new times): restore them, or start a new run in another --output-dir"
            )

    def _check_checkpoints_are_this_runs(self, identity: Mapping[str, Any], resume: str) -> None:
        """Each checkpoint this resume would load, each finished stage's `done/` and `final/` was written by
        this run (their checkpoint.json's `run`, as `RunConfig.identity` gives it; those of an earlier
        release name none)."""
        stages = self.root / "checkpoints"
        if resume != "auto":
            found = [Path(resume)]
        else:
            found = (
                [last_complete_checkpoint(s) for s in stages.iterdir() if s.is_dir()]
                if stages.is_dir()
                else []
            )
        results = [stage / "done" for stage in sorted(stages.iterdir())] if stages.is_dir() else []
        identity = json.loads(json.dumps(identity))  # as checkpoint.json holds it (lists, string keys)
        for folder in [c for c in found if c is not None] + [*results, self.final]:
            then = checkpoint_run(folder) if folder.is_dir() else None  # an earlier release's: none
            changed = [
                key for key in {**identity, **(then or {})} if then and then.get(key) != identity.get(key)
            ]
            if changed:
                listing = "; ".join(
                    f"{key}: {then.get(key)!r} there, {identity.get(key)!r} now" for key in changed[:3]
                )
                raise UserError(
                    f"{folder} was written by another run ({listing}): move it out of {self.root}, or "
                    "resume it in its own run folder"
                )

    def _same_run(self, config: Any, recorded: dict[str, Any], launch: Launch | None = None) -> bool:
        try:
            self._check_same_run(config, recorded, launch or Launch.current())
        except UserError:
            return False
        return True

    def _check_same_run(self, config: Any, recorded: dict[str, Any], launch: Launch) -> None:
        from hf_vrl.run.config import SAMPLES_PER_STEP, resolve

        if recorded.get("method") != config.method:
            raise UserError(
                f"{self.root} holds a {recorded.get('method')!r} run, not a {config.method!r} one: "
                "choose another --output-dir"
            )
        then = self.recorded_launch(recorded) or launch
        before = resolve(type(config), recorded, source=str(self.config_file)).identity(then.processes)
        now = config.identity(launch.processes)
        before[SHARDED], now[SHARDED] = then.fsdp, launch.fsdp
        changed = [key for key in now if before.get(key) != now[key]]
        if not changed:
            return
        listing = "; ".join(f"{key}: {before.get(key)!r} there, {now[key]!r} now" for key in changed[:6])
        layout = set(config.layout_identity(config.batch_plan(launch.processes))) | {SHARDED}
        if then == launch or not set(changed) <= layout:
            measured = [key for key in changed if key in config.measured_settings()]
            why = f" ({', '.join(measured)}: what its before and after are measured on)" if measured else ""
            raise UserError(
                f"{self.root} was started with other settings ({listing}){why}. Resume with the same "
                f"settings (--config {self.config_file}), or use another --output-dir"
            )
        keep = (
            f" (or give --global-batch-size {before[SAMPLES_PER_STEP]}, its step on any process count)"
            if changed == [SAMPLES_PER_STEP]
            else ""
        )
        raise UserError(
            f"{self.root} ran on {then.describe()}, this launch is {launch.describe()}, which changes what "
            f"defines the run ({listing}): resume it on {then.describe()}{keep}, or start a new run in "
            "another --output-dir"
        )


SHARDED = "checkpoints sharded by FSDP"


@dataclass(frozen=True)
class Launch:
    """How a run is launched, as far as its result may depend on it: the process count and FSDP (whose
    checkpoints hold each process's shard instead of the weights)."""

    processes: int = 1
    fsdp: bool = False

    @classmethod
    def current(cls) -> Launch:
        """This process's launch (torchrun / accelerate set WORLD_SIZE; FSDP through accelerate launch)."""
        from hf_vrl.run.batch import process_count
        from hf_vrl.run.fsdp import fsdp_requested

        return cls(process_count(), fsdp_requested())

    def describe(self) -> str:
        count = f"{self.processes} process{'es' * (self.processes != 1)}"
        return f"{count} with FSDP" if self.fsdp else count
