"""`hf-vrl demo` and the `hf-vrl` dispatcher."""

import json

import pytest

from hf_vrl import cli, demo


def test_help_lists_every_subcommand(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in (*cli.COMMANDS, "train"):
        assert name in out
    assert cli.main(["train"]) == 0
    out = capsys.readouterr().out
    for method in cli.TRAIN_METHODS:
        assert method in out


def test_unknown_command_and_method_are_refused(capsys):
    with pytest.raises(SystemExit):
        cli.main(["trian"])
    with pytest.raises(SystemExit):
        cli.main(["train", "nope"])
    assert "choose one of" in capsys.readouterr().err


def test_demo_runs_both_dual_encoders_and_writes_a_report(tmp_path, capsys):
    argv = ["--runs", "clip", "diffclip", "--dataset", "shapes", "--steps", "3", "--batch-size", "16"]
    argv += ["--eval-limit", "40", "--train-limit", "64", "--workers", "0", "--output-dir", str(tmp_path)]
    assert demo.main(argv) == 0
    out = capsys.readouterr().out
    assert "zero-shot top-1" in out and "diffclip" in out
    report = json.loads((tmp_path / "demo_report.json").read_text())
    assert report["dataset"] == "shapes"
    for run in ("clip", "diffclip"):
        for stage in ("before", "after"):
            assert 0.0 <= report["results"][run][stage]["zero_shot"]["top1"] <= 1.0
    # training moved the weights: the reports before and after differ
    assert report["results"]["clip"]["before"] != report["results"]["clip"]["after"]


@pytest.mark.slow
def test_demo_clip_reaches_half_zero_shot_on_fashion_mnist(tmp_path):
    """The bar: >= 50% zero-shot on Fashion-MNIST (chance 10%), retrieval and clustering above the start."""
    from hf_vrl.data.offline import load_fashion_mnist

    try:
        load_fashion_mnist("test", limit=1)
    except FileNotFoundError as err:
        pytest.fail(f"Fashion-MNIST is part of the set-up (scripts/setup.sh): {err}")
    assert demo.main(["--runs", "clip", "--output-dir", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "demo_report.json").read_text())["results"]["clip"]
    before, after = result["before"], result["after"]
    assert after["zero_shot"]["top1"] >= 0.5
    assert after["retrieval"]["i2t_R@5"] > before["retrieval"]["i2t_R@5"] + 0.1
    assert after["clustering"]["nmi"] > before["clustering"]["nmi"] + 0.2
