"""Issue 37: a resume reproduces or refuses, a run that turns non-finite stops and says so, and what used to
fail late or with a traceback is one line before the first write. In-process `hf-vrl` calls."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_run_refusals import listing

from hf_vrl.cli import main
from hf_vrl.presets import load_preset


def refused(argv: list[str], root: Path, capsys) -> str:
    """Run `hf-vrl argv` in `root`; assert it failed in at most three lines and wrote nothing; the lines."""
    before = listing(root)
    capsys.readouterr()
    cwd = os.getcwd()
    os.chdir(root)
    try:
        code = main(argv)
    finally:
        os.chdir(cwd)
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("[transformers]")]
    assert code == 2 and 1 <= len(err) <= 3, err
    assert listing(root) == before
    return "\n".join(err)


def _deep(levels: int) -> dict:
    nested: dict = {}
    for _ in range(levels):
        nested = {"a": nested}
    return nested


@pytest.fixture(scope="module")
def configs(tmp_path_factory) -> Path:
    """Configuration files a user may get wrong: nested 3,000 levels (JSON, YAML), Latin-1, no model."""
    root = tmp_path_factory.mktemp("configs")
    (root / "deep.json").write_text('{"a": ' * 3000 + "{}" + "}" * 3000)
    (root / "deep.yaml").write_text("a: " + "[" * 3000 + "]" * 3000 + "\n")
    (root / "latin1.json").write_bytes('{"description": "caf\u00e9"}'.encode("latin-1"))
    preset = load_preset("diffclip-tiny")
    del preset["model"]
    (root / "no-model.json").write_text(json.dumps(preset))
    return root


SHORT = ["--max-steps", "1", "--train-limit", "64"]
CONFIG_CASES = {
    "deep json": (["--config", "deep.json"], "deep.json nests its settings more than 32 levels deep"),
    "deep yaml": (["--config", "deep.yaml"], "deep.yaml nests its settings more than 32 levels deep"),
    "deep --set": (
        ["--set", f"model.architecture.text_config.x={json.dumps(_deep(40))}"],
        "--set model.architecture.text_config.x: its value nests more than 32 levels deep",
    ),
    "not utf-8": (["--config", "latin1.json"], "latin1.json is not UTF-8 text"),
    "no model section": (
        ["--config", "no-model.json", *SHORT],
        "--image-processor tiny-clip makes 32 px images, but the architecture takes 224 px",
    ),
    "seed too large": (["--seed", str(2**32), *SHORT], "seed: must lie in [0, 4294967295], got 4294967296"),
    "seed negative": (["--seed", "-1", *SHORT], "seed: must lie in [0, 4294967295], got -1"),
    "infinite learning rate": (
        ["--learning-rate", "inf", *SHORT],
        "optim.learning_rate: must be a finite number, got inf",
    ),
    "infinite weight decay": (
        ["--weight-decay", "inf", *SHORT],
        "optim.weight_decay: must be a finite number, got inf",
    ),
    "negative hidden size": (
        ["--set", "model.architecture.vision_config.hidden_size=-8", *SHORT],
        "model.architecture.vision_config.hidden_size: must be >= 1, got -8",
    ),
    "empty output folder": (
        ["--set", "output.output_dir=", *SHORT],
        "output.output_dir: must name a folder, got an empty value",
    ),
}


@pytest.mark.parametrize("case", CONFIG_CASES)
def test_a_configuration_mistake_is_one_line_before_anything_is_written(configs, capsys, case):
    """Each of these was a traceback (3,000 lines for the nesting), an error about --dataset (--seed -1), a
    failure after the run folder was written (seed, inf, hidden size, no model section), or a run written
    to runs/diffclip (the empty output folder)."""
    argv, expected = CONFIG_CASES[case]
    output = [] if "output.output_dir=" in argv else ["--output-dir", "run"]
    message = refused(["train", "diffclip", *argv, *output], configs, capsys)
    assert expected in message, message


def test_crop_scale_none_disables_cropping_as_documented():
    """`--crop-scale none` (its --help: "none disables cropping") was refused as a list of floats."""
    from hf_vrl.methods.diffclip.method import DiffCLIPRunConfig
    from hf_vrl.run.parser import parse_run_args

    parsed = parse_run_args(DiffCLIPRunConfig, ["--crop-scale", "0.5", "1", "--crop-scale", "none"])
    assert parsed.config.diffclip.crop_scale is None
    assert parse_run_args(DiffCLIPRunConfig, ["--crop-scale", "0.5", "1"]).config.diffclip.crop_scale == [
        0.5,
        1.0,
    ]


def test_a_loss_that_turns_non_finite_stops_the_run_and_keeps_the_last_finite_checkpoint(tmp_path, capsys):
    """`--learning-rate 1e10` wrote NaN checkpoints, rotated the finite ones away, wrote a NaN final/, then a
    traceback (issue 37). Now the run stops at the step whose loss is NaN, in one line naming the checkpoint
    it keeps; every checkpoint left is finite, and there is no final/."""
    from safetensors.torch import load_file

    out = tmp_path / "run"
    argv = ["train", "diffclip", "--learning-rate", "1e10", "--max-steps", "8", "--save-steps", "1"]
    argv += ["--train-limit", "64", "--batch-size", "16", "--no-eval-before", "--no-eval-after"]
    capsys.readouterr()
    assert main([*argv, "--no-figures", "--output-dir", str(out)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("hf-vrl")]
    assert len(err) == 1 and "the loss turned NaN at step" in err[0], err
    kept = sorted((out / "checkpoints/train").glob("checkpoint-*"))
    assert kept and f"{kept[-1]} is the last checkpoint, kept" in err[0]
    assert int(err[0].split("at step ")[1].split(":")[0]) == int(kept[-1].name.split("-")[1]) + 1
    for checkpoint in kept:
        weights = load_file(checkpoint / "model.safetensors")
        assert all(tensor.isfinite().all() for tensor in weights.values()), checkpoint
    assert not (out / "final").exists()


TINY_RUN = ["train", "diffclip", "--max-steps", "2", "--save-steps", "2", "--train-limit", "64"]
TINY_RUN += ["--batch-size", "16", "--no-eval-before", "--no-eval-after", "--no-figures"]


def trained(root: Path, name: str, *argv: str) -> Path:
    """A finished tiny DiffCLIP run in `root`/`name` (checkpoint-2 and final/)."""
    assert main([*TINY_RUN, *argv, "--output-dir", str(root / name)]) == 0
    return root / name


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Two finished runs of the same architecture and data: seed 0 and seed 1."""
    root = tmp_path_factory.mktemp("runs")
    trained(root, "seed0")
    trained(root, "seed1", "--seed", "1")
    return root


def test_a_resume_with_other_evaluation_settings_is_refused(runs, capsys):
    """A resume with another --eval-dataset or --eval-limit was accepted: "before" measured on shapes,
    "after" on digits, the card labelling both as digits (issue 37)."""
    resume = [*TINY_RUN, "--output-dir", "seed0", "--resume"]
    message = refused([*resume, "--eval-dataset", "digits"], runs, capsys)
    assert "was started with other settings (eval.eval_dataset: 'shapes' there, 'digits' now)" in message
    message = refused([*resume, "--eval-limit", "5"], runs, capsys)
    assert "eval.eval_limit:" in message and "5 now" in message


def test_a_checkpoint_of_another_run_is_not_resumed(runs, tmp_path, capsys):
    """The seed-1 run's checkpoint moved into the seed-0 run (same architecture) was resumed silently, its
    result 0.79 away from the seed-0 run's (issue 37); each checkpoint names the run that wrote it."""
    import shutil

    out = tmp_path / "seed0"
    shutil.copytree(runs / "seed0", out)
    shutil.rmtree(out / "final")
    shutil.rmtree(out / "checkpoints/train/checkpoint-2")
    shutil.copytree(runs / "seed1/checkpoints/train/checkpoint-2", out / "checkpoints/train/checkpoint-2")
    message = refused([*TINY_RUN, "--output-dir", "seed0", "--resume"], tmp_path, capsys)
    assert "checkpoint-2 was written by another run (seed: 1 there, 0 now)" in message


def test_data_edited_between_a_run_and_its_resume_is_refused(tmp_path, capsys):
    """Images edited or deleted between a run and its resume were not noticed (issue 37): the run records
    the names, sizes and times of the files a map-style source reads, and a resume compares them."""
    from PIL import Image

    images = tmp_path / "images" / "train"
    images.mkdir(parents=True)
    for i in range(64):
        Image.new("RGB", (32, 32), (4 * i, 255 - 4 * i, 0)).save(images / f"{i}.png")
    (images / "metadata.csv").write_text(
        "file_name,caption\n" + "".join(f"{i}.png,red {i}\n" for i in range(64))
    )
    data = ["--dataset", f"imagefolder:{tmp_path / 'images'}"]
    out = trained(tmp_path, "run", *data)
    recorded = json.loads((out / "config.json").read_text())["data_files"]["--dataset"]
    assert recorded["files"] == 65 and len(recorded["sha256"]) == 64
    resume = [*TINY_RUN, *data, "--output-dir", "run", "--resume"]
    assert main([*resume[:-3], "--output-dir", str(out), "--resume"]) == 0  # unchanged: the run stands
    Image.new("RGB", (32, 32), (0, 0, 255)).save(images / "7.png")
    message = refused(resume, tmp_path, capsys)
    assert "the files of --dataset changed since" in message and "65 files" in message
    (images / "8.png").unlink()
    assert "64 files" in refused(resume, tmp_path, capsys)


NOBODY = 65534


@pytest.fixture
def unprivileged(tmp_path_factory):
    """A folder this test's user owns, and a context in which the user is not root (root writes anywhere:
    the test drops to `nobody` for the call, as a user's run would be), for permission checks."""
    import contextlib
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="hf-vrl-perm-"))
    root.chmod(0o755)

    @contextlib.contextmanager
    def as_user():
        if os.geteuid() != 0:
            yield
            return
        for parent, dirs, files in os.walk(root):
            for name in [*dirs, *files, "."]:
                os.chown(Path(parent, name), NOBODY, NOBODY)
        os.setegid(NOBODY)
        os.seteuid(NOBODY)
        try:
            yield
        finally:
            os.seteuid(0)
            os.setegid(0)

    yield root, as_user
    for parent, dirs, _ in os.walk(root):
        for name in dirs:
            Path(parent, name).chmod(0o755)
    shutil.rmtree(root)


@pytest.mark.parametrize("read_only", ["parent", "parent/run", "parent/run/checkpoints"])
def test_a_read_only_folder_is_refused_before_training(unprivileged, capsys, read_only):
    """A read-only checkpoints/, parent or run folder was a traceback, the run folder's after 16 steps of
    training (issue 37); now one line before anything is written."""
    root, as_user = unprivileged
    (root / "parent/run/checkpoints").mkdir(parents=True)
    (root / "parent/run/.hf-vrl-run").write_text("{}")
    (root / "a-file").write_text("x")
    target = root / ("parent/new-run" if read_only == "parent" else "parent/run")
    argv = ["train", "diffclip", *SHORT, "--output-dir"]
    assert "is a file" in refused([*argv, str(root / "a-file")], root, capsys)  # imports what comes next
    with as_user():
        (root / read_only).chmod(0o555)
        message = refused([*argv, str(target)], root, capsys)
    assert f"{root / read_only} is not writable here" in message, message


def test_an_image_without_read_permission_is_skipped_and_counted(unprivileged):
    """An image this user may not read was a traceback (issue 37: PermissionError raised again while the
    first was judged); it is skipped and counted as "unreadable_image", as a damaged image is."""
    from datasets import Dataset
    from datasets import Image as ImageFeature
    from PIL import Image

    from hf_vrl.data.generic import _without_bad_images
    from hf_vrl.data.images import SampleFilter

    root, as_user = unprivileged
    paths = [str(root / f"{i}.png") for i in range(3)]
    for i, path in enumerate(paths):
        Image.new("RGB", (16, 16), (80 * i, 0, 0)).save(path)
    rows = Dataset.from_dict({"image": paths}).cast_column("image", ImageFeature(decode=False))
    skips = SampleFilter("images")
    with as_user():
        Path(paths[1]).chmod(0o000)
        with pytest.warns(UserWarning, match="unreadable_image"):
            kept = _without_bad_images(rows, "image", skips)
    assert [row["image"]["path"] for row in kept] == [paths[0], paths[2]]
    assert dict(skips.counts) == {"unreadable_image": 1}


def test_eval_reports_the_images_it_skipped(tmp_path, capsys):
    """`hf-vrl eval` skipped a damaged image without a word in its report (issue 37); the report counts the
    skipped samples of each split by kind, as a run's report does, and the summary prints them."""
    import torch
    from PIL import Image
    from transformers import AutoConfig, AutoImageProcessor, AutoTokenizer, CLIPModel

    from hf_vrl.presets import HUB_CONFIGS

    torch.manual_seed(0)
    model = tmp_path / "clip"
    CLIPModel(AutoConfig.from_pretrained(HUB_CONFIGS / "tiny-clip")).save_pretrained(model)
    AutoImageProcessor.from_pretrained(HUB_CONFIGS / "tiny-clip").save_pretrained(model)
    AutoTokenizer.from_pretrained(HUB_CONFIGS / "tiny-clip").save_pretrained(model)
    for name, colour in (("circle", (200, 0, 0)), ("square", (0, 0, 200))):
        for i in range(3):
            (tmp_path / "images/test" / name).mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (16, 16), colour).save(tmp_path / "images/test" / name / f"{i}.png")
    (tmp_path / "images/test/square/2.png").write_bytes(b"not an image at all")
    argv = ["eval", "--model", str(model), "--dataset", f"imagefolder:{tmp_path / 'images'}"]
    argv += ["--tasks", "zero_shot", "--no-figures", "--output-dir", str(tmp_path / "out")]
    capsys.readouterr()
    assert main(argv) == 0
    report = json.loads((tmp_path / "out/report.json").read_text())
    assert report["skipped_samples"] == {"test": {"corrupt_image": 1}}
    assert "skipped samples (test): corrupt_image 1" in capsys.readouterr().out


def test_a_deeply_nested_mapping_given_to_train_is_one_error(tmp_path):
    """`hf_vrl.run.train` with a mapping setting nested 3,000 levels was a RecursionError; it is refused as
    a file nested so deep is, before anything is written."""
    from hf_vrl.errors import UserError
    from hf_vrl.run import train

    preset = load_preset("diffclip-tiny")
    preset["model"]["image_processor_kwargs"] = _deep(3000)
    with pytest.raises(UserError, match="the given configuration nests its settings more than 32 levels"):
        train("diffclip", preset, output_dir=str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()
