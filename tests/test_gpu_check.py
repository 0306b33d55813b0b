"""benchmarks/gpu_check.py, the one prepared GPU check: every part runs end to end on the CPU at toy size
(--device cpu --quick), so the check is ready when a GPU comes; a part that runs out of time is recorded and
the next one still runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECK = Path(__file__).parents[1] / "benchmarks" / "gpu_check.py"
PARTS = [
    "cuda_tests",
    "diffclip_step",
    "dcr_command",
    "dive_command",
    "clue_command",
    "accumulation",
    "dry_runs",
]


def gpu_check(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, str(CHECK), *argv], env=env, capture_output=True, text=True)


def test_a_part_out_of_time_is_recorded_and_the_next_part_still_runs(tmp_path):
    out = tmp_path / "out"
    argv = ["--device", "cpu", "--quick", "--output", str(out), "--work", str(tmp_path / "work")]
    done = gpu_check(*argv, "--parts", "accumulation", "cuda_tests", "--box-s", "1")
    report = json.loads((out / "gpu_check.json").read_text())
    assert done.returncode == 0, done.stderr[-2000:]
    assert [report["parts"][name]["status"] for name in ("accumulation", "cuda_tests")] == ["timeout"] * 2
    assert all((out / part["log"]).is_file() for part in report["parts"].values())
    assert not (tmp_path / "work").exists() or not any((tmp_path / "work").iterdir())


@pytest.mark.slow
def test_the_gpu_check_runs_end_to_end_on_the_cpu(tmp_path):
    out = tmp_path / "out"
    argv = ["--device", "cpu", "--quick", "--steps", "3", "--output", str(out), "--budget-s", "3000"]
    done = gpu_check(*argv)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((out / "gpu_check.json").read_text())
    parts = report["parts"]
    assert {name: parts[name]["status"] for name in PARTS} == dict.fromkeys(PARTS, "ok"), {
        name: part.get("log_tail", "")[-800:] for name, part in parts.items()
    }
    figures = {name: parts[name]["figures"] for name in PARTS}
    assert figures["cuda_tests"]["tests"] > 0 and figures["cuda_tests"]["failures"] == 0
    assert {"clip", "diffclip"} <= set(figures["diffclip_step"]["step"]["time_ms"])
    for name, stages in (("dcr_command", {"stage1", "stage2"}), ("dive_command", {"train"})):
        assert figures[name]["passed"] and set(figures[name]["stages"]) == stages, figures[name]
    assert figures["clue_command"]["passed"]
    for stage in figures["dcr_command"]["stages"].values():
        assert len(stage["step_s"]) == 3 and stage["peak_gb"] > 0
    assert "meets_targets" in figures["dcr_command"]
    assert set(figures["accumulation"]["results"]) == {"one_batch", "whole_batch", "micro_batch"}
    assert figures["dry_runs"]["diffclip-tiny"]["passed"]
    assert sum(path.stat().st_size for path in out.rglob("*") if path.is_file()) < 20 * 2**20  # figures only
