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
    "dcr_presets",
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
    assert set(figures["dcr_presets"]) == {"dcr-tiny"} and figures["dcr_presets"]["dcr-tiny"]["passed"]
    for name, stages in (("dcr_command", {"stage1", "stage2"}), ("dive_command", {"train"})):
        assert figures[name]["passed"] and set(figures[name]["stages"]) == stages, figures[name]
    assert figures["clue_command"]["passed"]
    for stage in figures["dcr_command"]["stages"].values():
        assert len(stage["step_s"]) == 3 and stage["peak_gb"] > 0
    assert "meets_targets" in figures["dcr_command"]
    assert set(figures["accumulation"]["results"]) == {"one_batch", "whole_batch", "micro_batch"}
    assert figures["dry_runs"]["diffclip-tiny"]["passed"]
    assert sum(path.stat().st_size for path in out.rglob("*") if path.is_file()) < 20 * 2**20  # figures only


def test_each_dcr_runs_measured_peak_is_set_beside_its_predicted_one():
    """gpu_check.json's dcr_prediction_vs_measured: per DCR preset run (dcr_command and dcr_presets) and
    stage, the measured and predicted peaks and their ratio; runs without a prediction (the tiny preset)
    are left out."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", CHECK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    stage = {"peak_gb": 30.0, "peak_kind": "CUDA allocated", "predicted_gb": 25.0}
    parts = {
        "dcr_command": {"figures": {"preset": "dcr-openai-l14-224", "stages": {"stage2": stage}}},
        "dcr_presets": {
            "figures": {
                "dcr-openai-l14-336": {"preset": "dcr-openai-l14-336", "stages": {"stage1": stage}},
                "dcr-tiny": {"preset": "dcr-tiny", "stages": {"stage1": {"peak_gb": 1.0, "peak_kind": "x"}}},
            }
        },
    }
    found = module._prediction_vs_measured(parts)
    assert set(found) == {"dcr-openai-l14-224", "dcr-openai-l14-336"}
    assert found["dcr-openai-l14-336"]["stage1"] == {
        "measured_gb": 30.0,
        "measured_kind": "CUDA allocated",
        "predicted_gb": 25.0,
        "measured_over_predicted": 1.2,
    }
