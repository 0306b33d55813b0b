"""`hf-vrl demo` and the `hf-vrl` dispatcher."""

import json

import pytest

from hf_vrl import cli, demo
from hf_vrl.run import METHODS
from hf_vrl.run.report import compare_table


def test_help_lists_every_subcommand_and_method(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in (*cli.COMMANDS, "train"):
        assert name in out
    assert cli.main(["train"]) == 0
    out = capsys.readouterr().out
    for method in METHODS:
        assert method in out


def test_unknown_command_and_method_are_refused(capsys):
    with pytest.raises(SystemExit):
        cli.main(["trian"])
    assert cli.main(["train", "nope"]) == 2
    assert "unknown method 'nope'; choose one of" in capsys.readouterr().err


def test_demo_parts_leave_runs_in_the_common_layout(tmp_path, capsys):
    argv = ["--runs", "clip", "diffclip", "--dataset", "shapes", "--steps", "3", "--batch-size", "16"]
    argv += ["--eval-limit", "40", "--train-limit", "64", "--workers", "0", "--output-dir", str(tmp_path)]
    assert demo.main(argv) == 0
    out = capsys.readouterr().out
    assert "zero_shot.top1" in out and "diffclip after" in out and "clip: a 2-layer CLIP" in out
    summary = json.loads((tmp_path / "demo_report.json").read_text())
    for part in ("clip", "diffclip"):
        report = json.loads((tmp_path / part / "report.json").read_text())
        assert summary["reports"][part] == report
        assert (tmp_path / part / "final" / "model.safetensors").is_file()
        for stage in ("before", "after"):
            assert 0.0 <= report[stage]["zero_shot"]["top1"] <= 1.0
    # training moved the weights: the reports before and after differ
    assert summary["reports"]["clip"]["before"] != summary["reports"]["clip"]["after"]
    # a second demo reuses the finished parts (and their reports)
    assert demo.main(argv) == 0
    assert json.loads((tmp_path / "demo_report.json").read_text())["reports"] == summary["reports"]


@pytest.mark.slow
def test_demo_clip_reaches_half_zero_shot_on_fashion_mnist(tmp_path):
    """The bar: >= 50% zero-shot on Fashion-MNIST (chance 10%), clustering well above the start."""
    from hf_vrl.data.offline import load_fashion_mnist

    try:
        load_fashion_mnist("test", limit=1)
    except FileNotFoundError as err:
        pytest.fail(f"Fashion-MNIST is part of the set-up (scripts/setup.sh): {err}")
    assert demo.main(["--runs", "clip", "--output-dir", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "clip" / "report.json").read_text())
    before, after = report["before"], report["after"]
    assert after["zero_shot"]["top1"] >= 0.5
    assert after["clustering"]["nmi"] > before["clustering"]["nmi"] + 0.2


@pytest.mark.slow
def test_demo_dcr_runs_dcr_and_the_reconstruction_baseline_from_the_same_inputs(tmp_path, capsys):
    """Both runs start from the same colour-blind CLIP and diffusion model: equal 'before' sections; the
    table shows the claim's metrics (whichever way they fall)."""
    assert demo.main(["--runs", "dcr", "--output-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "pairs.per_category.colour" in out and "reconstruction after" in out
    contrastive, baseline = (
        json.loads((tmp_path / "dcr" / run / "report.json").read_text()) for run in ("dcr", "reconstruction")
    )
    assert contrastive["config"]["model"]["clip_blind_to"] == ["colour"]
    assert baseline["config"]["dcr"]["objective"] == "reconstruction"
    assert baseline["config"]["model"]["clip"] == str(tmp_path / "dcr" / "dcr" / "inputs" / "base-clip")
    assert contrastive["before"] == baseline["before"]
    for run in ("dcr", "reconstruction"):
        assert (tmp_path / "dcr" / run / "final" / "model.safetensors").is_file()
    assert contrastive["after"] != baseline["after"]


def test_demo_clue_full_run_shows_the_common_start_as_its_before(tmp_path, monkeypatch):
    """The full run starts from the InfoNCE run's backbone and skips its own evaluation before training: its
    "before" column is the baseline's, not missing."""
    import argparse

    from hf_vrl.methods.clue import miniature

    calls = []

    def fake_rung(name, output_dir, **settings):
        calls.append((name, settings))
        before = {"retrieval": {"i2i_R@1": 0.25}} if settings.get("eval_before", True) else None
        return {"before": before, "after": {"retrieval": {"i2i_R@1": 0.5 if name == "+ text" else 0.3}}}

    monkeypatch.setattr(miniature, "train_rung", fake_rung)
    reports = demo.clue(argparse.Namespace(seed=0), tmp_path)
    assert [name for name, _ in calls] == ["InfoNCE", "+ text"]
    assert calls[1][1]["backbone"] == str(tmp_path / "InfoNCE" / "inputs" / "backbone")
    assert (
        reports["clue full"]["before"]
        == reports["clue InfoNCE"]["before"]
        == {"retrieval": {"i2i_R@1": 0.25}}
    )
    table = compare_table(reports, ("retrieval.i2i_R@1",))
    assert table.splitlines()[-1].split() == ["retrieval.i2i_R@1", "25.0", "30.0", "25.0", "50.0"]


@pytest.mark.slow
def test_demo_clue_full_objective_beats_its_infonce_baseline(tmp_path, capsys):
    """CLUE's claim in miniature (clue-tiny, seed 0): the full Eq. 8 gives better fine-grained retrieval and
    linear probe than InfoNCE from the same start; the part resumes instead of training again."""
    assert demo.main(["--runs", "clue", "--output-dir", str(tmp_path)]) == 0
    assert "clue full after" in capsys.readouterr().out
    reports = json.loads((tmp_path / "demo_report.json").read_text())["reports"]
    baseline, full = reports["clue InfoNCE"]["after"], reports["clue full"]["after"]
    assert full["retrieval"]["i2i_R@1"] > baseline["retrieval"]["i2i_R@1"]
    assert full["linear_probe"]["top1"] > baseline["linear_probe"]["top1"]
    stamp = (tmp_path / "clue" / "full" / "final" / "model.safetensors").stat().st_mtime_ns
    assert demo.main(["--runs", "clue", "--output-dir", str(tmp_path)]) == 0
    assert (tmp_path / "clue" / "full" / "final" / "model.safetensors").stat().st_mtime_ns == stamp
