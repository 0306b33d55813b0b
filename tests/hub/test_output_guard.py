"""Every command that writes a folder writes only one it made (issue 37): `train`, `eval`, `llava-align`,
`export-llava`, `llava-eval`, `convert`, `push --dry-run --staging-dir` and `compare --plot`, each against a
foreign folder (holding a copy of a run's config.json), a folder of another command and a run folder a live
run holds, is refused in one line and leaves every file as it was (names, modes, sizes, contents, times)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from test_push_model_folder import _clip_folder

from hf_vrl import cli
from hf_vrl.run.layout import OutputDir, RunLock


def snapshot(root: Path) -> dict[str, tuple]:
    """`ls -lR` and the contents: {path: (mode, size, mtime, bytes or link target)}; the lock file's time
    aside (taking a lock opens it)."""
    found = {}
    for parent, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(parent, name)
            stat = path.lstat()
            content = (
                os.readlink(path) if path.is_symlink() else path.read_bytes() if path.is_file() else None
            )
            mtime = None if name == ".lock" else stat.st_mtime_ns
            found[str(path.relative_to(root))] = (stat.st_mode, stat.st_size, mtime, content)
    return found


@pytest.fixture(scope="module")
def places(tmp_path_factory, diffclip_run):
    """{kind: folder}: a foreign folder, a run of `train`, a folder of `convert`, and a live run (its lock
    held by another writer while the test runs)."""
    root = tmp_path_factory.mktemp("guard")
    clip = _clip_folder(root / "inputs" / "clip")
    converted = root / "places" / "converted"
    argv = [
        "convert",
        "diffclip",
        "--clip",
        str(clip),
        "--output",
        str(converted),
        "--calibration",
        "synthetic",
    ]
    assert cli.main(argv) == 0
    foreign = root / "places" / "foreign"
    for name in ("figures", "logs", "exports", "checkpoints"):
        (foreign / name).mkdir(parents=True)
        (foreign / name / "mine.txt").write_text(name)
    shutil.copy(diffclip_run / "config.json", foreign / "config.json")  # a copy: not a run
    shutil.copytree(diffclip_run, root / "places" / "run")
    shutil.copytree(diffclip_run, root / "places" / "live")
    lock = RunLock(root / "places" / "live").acquire()
    yield {"root": root, "clip": clip, "converted": converted, "run": diffclip_run} | {
        kind: root / "places" / kind for kind in ("foreign", "run", "live")
    }
    lock.release()


def commands(places: dict[str, Path]) -> dict[str, tuple[list[str], str]]:
    """{command: (argv without the output, the output flag)}: arguments that pass, so the output decides."""
    clip, model = str(places["clip"]), str(places["converted"])
    return {
        "train": (["train", "diffclip", "--max-steps", "1", "--train-limit", "64"], "--output-dir"),
        "eval": (["eval", "--model", clip, "--dataset", "shapes", "--limit", "8"], "--output-dir"),
        "llava-align": (["llava-align", "--llava", clip], "--output"),
        "export-llava": (["export-llava", "--llava", clip, "--vision", clip], "--output-dir"),
        "convert": (["convert", "diffclip", "--clip", clip, "--calibration", "synthetic"], "--output-dir"),
        "llava-eval": (["llava-eval", clip, "--tasks", "pope"], "--output-dir"),
        "push": (["push", model, "me/x", "--dry-run"], "--staging-dir"),
        "compare": (["compare", str(places["run"])], "--plot"),
    }


TARGETS = {  # what each command is pointed at, and what its one line says
    "foreign": ("foreign", "is not empty and is not a folder hf_vrl wrote"),
    "another command's": ("run", "is not empty and is a folder `hf-vrl train` wrote"),
    "live run": ("live", "is not empty and is a folder `hf-vrl train` wrote"),
}
COMMANDS = ["train", "eval", "llava-align", "export-llava", "llava-eval", "convert", "push", "compare"]


def _expected(command: str, target: str) -> tuple[str, str]:
    kind, message = TARGETS[target]
    if command == "train":  # train's own kind of folder: another command's is convert's; a live one is held
        kind, message = {
            "run": ("converted", "is a folder `hf-vrl convert` wrote"),
            "live": ("live", "is in use by process"),
        }.get(kind, (kind, message))
    if command == "compare":  # a plot is a file: over a foreign one, or into another command's folder
        message = {
            "foreign": "exists and is not a plot `hf-vrl compare` wrote",
        }.get(kind, "a folder another hf-vrl command made")
    return kind, message


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_refuses_a_folder_it_did_not_make_and_leaves_it_unchanged(
    places, command, target, capsys, monkeypatch
):
    kind, message = _expected(command, target)
    argv, flag = commands(places)[command]
    output = places[kind]
    if command == "compare":
        output = output / ("config.json" if kind == "foreign" else "figures/compare.png")
    monkeypatch.chdir(places["root"])
    before = snapshot(places["root"] / "places")
    capsys.readouterr()
    code = cli.main([*argv, flag, str(output)])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("hf-vrl")]
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert snapshot(places["root"] / "places") == before


def test_a_command_reruns_into_its_own_folder_but_not_while_another_writer_holds_it(places, tmp_path):
    """Its own folder (its marker) is written again; the same folder held by another process is refused
    in one line naming the holder, and left as it was."""
    out = tmp_path / "eval"
    argv = [
        "eval",
        "--model",
        str(places["clip"]),
        "--dataset",
        "shapes",
        "--limit",
        "8",
        "--image-size",
        "16",
    ]
    argv += ["--tasks", "clustering", "--no-figures", "--output-dir", str(out)]
    for _ in range(2):
        assert cli.main(argv) == 0
    assert json.loads((out / "report.json").read_text())["complete"] is True
    with OutputDir(out, "eval").claim():  # another eval, live
        before = snapshot(out)
        assert cli.main(argv) == 2
        assert snapshot(out) == before


def test_an_output_that_is_a_file_or_read_only_is_one_line_before_anything_runs(places, tmp_path, capsys):
    (tmp_path / "a-file").write_text("x")
    argv = ["eval", "--model", str(places["clip"]), "--dataset", "shapes", "--output-dir"]
    assert cli.main([*argv, str(tmp_path / "a-file")]) == 2
    assert "--output-dir" in capsys.readouterr().err and (tmp_path / "a-file").read_text() == "x"
    if os.geteuid() != 0:  # root writes into read-only folders
        (tmp_path / "ro").mkdir(mode=0o500)
        assert cli.main([*argv, str(tmp_path / "ro" / "out")]) == 2
        assert "is not writable" in capsys.readouterr().err
