"""A full disk while a checkpoint is written ends the run in one line that names the disk, its free space and
the space needed; what was half written is removed and the complete checkpoints stay (issue 29: 55 lines of
traceback ending in torch's `inline_container.cc:672`). The run's folder lies on a real, small filesystem:
a tmpfs mounted in a private mount namespace (`unshare -Urm`, no privileges needed)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest
from test_run_resume import DIFFCLIP, SRC, WORKER


def _namespaces() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-Urm", "true"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not _namespaces(), reason="needs unprivileged mount namespaces (unshare -Urm)")
def test_a_full_disk_during_a_checkpoint_is_one_line_and_keeps_the_complete_ones(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    run = disk / "run"
    train = [sys.executable, str(WORKER), *DIFFCLIP, "--save-steps", "1", "--output-dir", str(run)]
    # room for config.json and one checkpoint of the tiny DiffCLIP (3.3 MB), not for two; what the disk holds
    # afterwards is listed before the namespace (and its tmpfs) goes
    after = tmp_path / "after.txt"
    script = (
        f"mount -t tmpfs -o size=5m tmpfs {shlex.quote(str(disk))} && {{ {shlex.join(train)}; code=$?; "
        f"ls -A {shlex.quote(str(run / 'checkpoints/train'))} > {shlex.quote(str(after))}; exit $code; }}"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(SRC)}
    proc = subprocess.run(["unshare", "-Urm", "sh", "-c", script], env=env, capture_output=True, text=True)
    lines = [line for line in proc.stderr.splitlines() if line.startswith(("hf-vrl:", "(run with"))]
    assert proc.returncode == 2 and len(lines) == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    message = lines[0]
    assert (
        f"no space left on the disk of {disk} while writing {run}/checkpoints/train/checkpoint-2" in message
    )
    assert re.search(r"MB free, about 3\.\d MB needed\)", message) and "--resume auto" in message
    assert after.read_text().split() == [".staging", "checkpoint-1"]  # the half-written one is gone


WRITE_FINAL = """
import sys, torch
from pathlib import Path
from safetensors.torch import save_file
from hf_vrl.errors import UserError
from hf_vrl.run.layout import atomic_dir

final = Path(sys.argv[1]) / "final"
try:
    with atomic_dir(final) as folder:  # as the runner writes final/, exports/ and inputs/
        save_file({"w": torch.zeros(2_000_000)}, str(folder / "model.safetensors"))  # 8 MB on a 5 MB disk
except UserError as error:
    print(error)
print(sorted(p.name for p in final.parent.iterdir()))
"""


@pytest.mark.skipif(not _namespaces(), reason="needs unprivileged mount namespaces (unshare -Urm)")
def test_a_full_disk_while_writing_final_names_the_disk_not_a_damaged_download(tmp_path):
    """safetensors says 'I/O error: No space left on device (os error 28)'; the run said the file 'cannot be
    read ... re-download or re-save it'."""
    disk = tmp_path / "disk"
    disk.mkdir()
    command = shlex.join([sys.executable, "-c", WRITE_FINAL, str(disk)])
    script = f"mount -t tmpfs -o size=5m tmpfs {shlex.quote(str(disk))} && {command}"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.run(["unshare", "-Urm", "sh", "-c", script], env=env, capture_output=True, text=True)
    message, left = proc.stdout.strip().splitlines()
    assert (
        message.startswith(f"no space left on the disk of {disk} while writing {disk}/final (")
        and "MB free)" in message
    )
    assert left == "[]"  # the half-written folder is removed, its space free again
