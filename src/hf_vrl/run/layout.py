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

Rules (`RunDir.open`): a new run refuses a folder that holds a run; `--resume` refuses a configuration that
differs from the recorded one in anything that defines the run; a stage whose result exists is never trained
again; a folder is written under a temporary name and renamed into place, so a killed run never leaves a
half-written result that a later run would take for complete.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf_vrl.errors import UserError

__all__ = ["RunDir", "atomic_dir", "atomic_write_json", "last_complete_checkpoint"]

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
# a checkpoint is complete when the Trainer's last file is there (the rename makes it all-or-nothing; this
# also rejects half-written folders left by tools that write in place)
CHECKPOINT_COMPLETE_FILE = "trainer_state.json"


def atomic_write_json(path: Path, data: Any) -> None:
    """Write JSON to `path` through a temporary file in the same folder and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as handle:
        json.dump(data, handle, indent=2)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(handle.name, path)


@contextlib.contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Yield a temporary folder beside `path`; on success it replaces `path` in one rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp-"))
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if path.exists():
        shutil.rmtree(path)
    os.replace(staging, path)


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
        return self.config_file.is_file() or (self.root / "checkpoints").is_dir() or self.final.is_dir()

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
            return False
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
