"""The `hf-vrl` command itself: a top-level help that imports no method (nor torch, nor transformers), no
command that prints transformers' torchvision fallback warning, and every flag in either spelling."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from hf_vrl.integrations.llava_align import _build_parser as llava_align_parser
from hf_vrl.integrations.llava_export import _build_parser as export_llava_parser
from hf_vrl.run.parser import dashed_flags

HELP_IMPORTS = """
import sys
from pathlib import Path
from hf_vrl.cli import main
main(["--help"])
print("HEAVY", sorted(m for m in ("torch", "transformers", "hf_vrl.methods") if m in sys.modules))
"""


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300)


def test_the_top_level_help_imports_nothing_heavy():
    done = _run("-c", HELP_IMPORTS)
    assert done.returncode == 0, done.stderr
    assert "train one method: diffclip, dcr, dive, clue" in done.stdout
    assert "HEAVY []" in done.stdout


@pytest.mark.parametrize(
    "command",
    [["train", "diffclip", "--help"], ["eval", "--help"], ["push", "--help"], ["convert", "--help"]],
)
def test_no_command_prints_the_torchvision_fallback_warning(command):
    done = _run("-m", "hf_vrl.cli", *command)
    assert done.returncode == 0, done.stderr
    assert "requires torchvision" not in done.stderr


def test_the_image_processor_backend_is_explicit():
    done = _run("-c", "import hf_vrl.methods.diffclip.convert, hf_vrl.methods.diffclip.processors")
    assert done.returncode == 0 and "requires torchvision" not in done.stderr, done.stderr


def test_dashed_flags_rewrites_names_not_values():
    argv = ["--output_dir=/a_b", "--num_train_epochs", "2", "--prompt", "<image>_x", "-v", "pos_arg"]
    assert dashed_flags(argv) == [
        "--output-dir=/a_b",
        "--num-train-epochs",
        "2",
        "--prompt",
        "<image>_x",
        "-v",
        "pos_arg",
    ]


def test_llava_commands_take_trains_flag_names_in_either_spelling():
    argv = ["--llava", "L", "--output_dir", "O", "--num_train_epochs", "2", "--precision", "bf16"]
    argv += ["--num-workers", "3", "--train_limit", "500", "--report-to", "tensorboard", "--logging_dir", "T"]
    options = llava_align_parser().parse_args(dashed_flags(argv))
    assert (options.output, options.epochs, options.mixed_precision) == ("O", 2.0, "bf16")
    assert (options.dataloader_num_workers, options.max_train_samples) == (3, 500)
    assert (options.report_to, options.logging_dir) == (["tensorboard"], "T")
    old = llava_align_parser().parse_args(
        ["--llava", "L", "--output", "O", "--epochs", "2", "--mixed-precision", "bf16"]
    )
    assert (old.output, old.epochs, old.mixed_precision) == ("O", 2.0, "bf16")  # the earlier names still work
    export = export_llava_parser().parse_args(
        dashed_flags(["--llava", "L", "--vision", "V", "--output_dir", "O"])
    )
    assert export.output == "O"


class _RunsCode:
    """A pickle that would run a shell command when loaded (what a malicious checkpoint holds)."""

    def __init__(self, sentinel):
        self.sentinel = sentinel

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.sentinel}",))


def test_convert_refuses_a_pickle_that_runs_code_in_one_line(tmp_path, capsys):
    import torch

    from hf_vrl.cli import main

    checkpoint, sentinel = tmp_path / "checkpoint_best.pt", tmp_path / "ran"
    torch.save({"state_dict": {"w": torch.zeros(1)}, "args": _RunsCode(sentinel)}, checkpoint)
    code = main(["convert", "diffclip", "--official", str(checkpoint), "--output-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 2 and "--official: Refusing to load" in err[0]
    assert "the pickle references posix.system" in err[0]
    assert not sentinel.exists() and not (tmp_path / "out").exists()


def test_convert_names_the_tokenizer_argument(tmp_path, capsys):
    """--tokenizer takes a preset folder as the other commands do; one that is nowhere is named as given."""
    from hf_vrl.cli import main
    from hf_vrl.methods.diffclip.convert_cli import _tokenizer

    assert len(_tokenizer("tiny-clip")) == 725
    code = main(
        [
            "convert",
            "diffclip",
            "--clip",
            "tiny-clip",
            "--tokenizer",
            "/no/tok",
            "--output-dir",
            str(tmp_path),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 2 and err[0].startswith("hf-vrl: error: --tokenizer /no/tok:")


ROOT = Path(__file__).parents[1]
MODEL_FLAG = re.compile(
    r"""(--vision|--model|--pretrained|--text-model|load_vision_tower\()"""
    r"""[ ="']+(?:[\w ()-]+=)?(runs/[\w./-]*\w)"""
)
TOWER_FLAGS = ("--vision", "load_vision_tower(")


def _documents() -> list[Path]:
    return [
        ROOT / "README.md",
        *sorted((ROOT / "examples").glob("*.py")),
        *sorted((ROOT / "src").rglob("*.py")),
    ]


def _written_model_folders() -> set[str]:
    """What a run folder holds that a model flag can load: final/ and each exports/<name>/ a method writes."""
    exports = set()
    for source in (ROOT / "src" / "hf_vrl" / "methods").rglob("*.py"):
        exports |= set(re.findall(r"""\.exports\s*/\s*"([\w-]+)\"""", source.read_text()))
    return {"final"} | {f"exports/{name}" for name in exports}


def test_documented_model_paths_are_the_folders_runs_write():
    """`--vision runs/dcr/vision-tower` names no folder (runs write exports/vision-tower); a run folder is no
    tower: each model path in the README, examples and docstrings is a run's final/ or exports/<name>/ (or
    a folder a LLaVA command wrote)."""
    folders, wrong = _written_model_folders(), []
    assert "exports/vision-tower" in folders
    for document in _documents():
        for flag, path in MODEL_FLAG.findall(document.read_text()):
            in_a_run = any(path.endswith(f"/{folder}") for folder in folders)
            if not in_a_run and (
                flag in TOWER_FLAGS or path.count("/") > 1
            ):  # a bare runs/<x>: a LLaVA folder
                wrong.append(f"{document.relative_to(ROOT)}: {flag} {path}")
    assert not wrong
