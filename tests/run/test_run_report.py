"""`hf-vrl compare`: runs side by side from their report.json, with the same metric names for every method."""

from __future__ import annotations

import json
import os

import pytest
from PIL import Image

from hf_vrl.cli import main
from hf_vrl.errors import UserError
from hf_vrl.run.report import compare_table, load_report, metric_rows
from hf_vrl.run.report import main as compare


def write(folder, report):
    folder.mkdir(parents=True)
    (folder / "report.json").write_text(json.dumps(report))
    return folder


CLIP = {
    "method": "diffclip",
    "before": {
        "zero_shot": {"top1": 0.1, "n_templates": 80, "protocol": "clip_benchmark"},
        "clustering": {"nmi": 0.2},
    },
    "after": {"zero_shot": {"top1": 0.75, "n_templates": 80}, "clustering": {"nmi": 0.65}},
}
DCR = {
    "method": "dcr",
    "before": {"clustering": {"nmi": 0.3}, "mmvp": {"accuracy": 0.1}},
    "after": {"mmvp": {"accuracy": 0.2}},
}


def test_metric_rows_keep_headline_metrics_and_drop_sizes():
    assert metric_rows({"a": CLIP, "b": DCR}) == ["zero_shot.top1", "clustering.nmi", "mmvp.accuracy"]
    assert metric_rows({"a": CLIP}, ["clustering.nmi", "nope.x"]) == ["clustering.nmi"]


def test_compare_table_shows_every_run_and_stage():
    lines = compare_table({"clip": CLIP, "dcr": DCR}).splitlines()
    assert lines[0].split() == ["metric", "clip", "before", "clip", "after", "dcr", "before", "dcr", "after"]
    cells = {line.split()[0]: line.split()[1:] for line in lines[1:]}
    assert cells["zero_shot.top1"] == ["10.0", "75.0", "-", "-"]
    assert cells["mmvp.accuracy"] == ["-", "-", "10.0", "20.0"]


def test_the_command_prints_and_plots(tmp_path, capsys):
    a, b = write(tmp_path / "runs" / "clip", CLIP), write(tmp_path / "runs" / "dcr", DCR)
    assert main(["compare", str(a), str(b / "report.json"), "--plot", str(tmp_path / "cmp.png")]) == 0
    out = capsys.readouterr().out
    assert "clip after" in out.replace("  ", " ") or "clip" in out
    assert "75.0" in out and "20.0" in out
    with Image.open(tmp_path / "cmp.png") as image:
        assert image.size[0] > 100


def test_a_folder_without_a_report_is_named(tmp_path):
    with pytest.raises(UserError, match="has no report.json"):
        load_report(tmp_path)


def test_a_plot_replaces_only_a_plot_compare_wrote(tmp_path):
    """--plot onto a run's report.json (or any file compare did not write, or into a folder another command
    made) is refused in one line and leaves the file as it was; compare's own plot is replaced (issue 37)."""
    run = write(tmp_path / "runs" / "clip", CLIP)
    report = (run / "report.json").read_bytes()
    with pytest.raises(UserError, match="exists and is not a plot `hf-vrl compare` wrote"):
        compare([str(run), "--plot", str(run / "report.json")])
    assert (run / "report.json").read_bytes() == report
    Image.new("RGB", (4, 4)).save(tmp_path / "photo.png")  # a PNG, but not compare's
    with pytest.raises(UserError, match="is not a plot `hf-vrl compare` wrote"):
        compare([str(run), "--plot", str(tmp_path / "photo.png")])
    (run / ".hf-vrl-run").write_text('{"command": "train"}')
    with pytest.raises(UserError, match="inside .*clip, a folder another hf-vrl command made"):
        compare([str(run), "--plot", str(run / "figures" / "cmp.png")])
    assert not (run / "figures").exists()
    plot = tmp_path / "cmp.png"
    for _ in range(2):  # a second comparison replaces the first one's plot
        assert compare([str(run), "--plot", str(plot)]) == 0
    assert oct(plot.stat().st_mode & 0o777) == oct(0o666 & ~umask())


def test_a_damaged_report_is_one_line(tmp_path):
    for content in ("{", "", "[1, 2]", "\xff"):
        (tmp_path / "report.json").write_bytes(content.encode("latin-1"))
        with pytest.raises(UserError, match="report"):
            compare([str(tmp_path)])


def umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
