"""examples/run_dcr.py: with no arguments the colour-blind miniature (DCR and its reconstruction-only
baseline), the tiny preset one flag away."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).parents[2] / "examples" / "run_dcr.py"


def example():
    spec = importlib.util.spec_from_file_location("run_dcr", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fake_report(config, colour: float) -> dict:
    section = {"clustering": {"nmi": 0.129}, "pairs": {"accuracy": 0.4, "per_category": {"colour": colour}}}
    return {"config": config.to_dict(), "before": section, "after": section | {"mmvp": {"accuracy": 0.2}}}


def test_the_default_runs_the_miniature_with_its_baseline(tmp_path, capsys, monkeypatch):
    """No arguments: the demo's DCR part (configurations resolved for real, training replaced) and a table
    with the reconstruction-only column, then the one-line reading."""
    import hf_vrl.run.runner

    ran = []

    def execute(method_class, config, resume):
        ran.append(config)
        return _fake_report(config, 0.3 + 0.1 * len(ran))

    monkeypatch.setattr(hf_vrl.run.runner, "execute", execute)
    assert example().main(["--output-dir", str(tmp_path)]) == 0
    contrastive, baseline = ran
    assert contrastive.model.clip_blind_to == ["colour"] and contrastive.dcr.objective == "dcr"
    assert contrastive.data.dataset == "shapes" and contrastive.optim.learning_rate == 1e-3
    assert contrastive.output.output_dir == str(tmp_path / "dcr")
    assert baseline.dcr.objective == "reconstruction"
    assert baseline.model.clip == str(tmp_path / "dcr" / "inputs" / "base-clip")
    assert baseline.dcr.diffusion == str(tmp_path / "dcr" / "inputs" / "tiny-sd")
    assert baseline.output.output_dir == str(tmp_path / "reconstruction")
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("metric"))
    assert re.split(r"\s{2,}", header.strip()) == [
        "metric",
        "dcr before",
        "dcr after",
        "reconstruction before",
        "reconstruction after",
    ]
    assert "pairs.per_category.colour" in out
    assert "DCR: shape clustering NMI 12.9 → 12.9, colour pairs 40.0 → 40.0" in out
    assert "reconstruction only: shape clustering NMI 12.9 → 12.9, colour pairs 50.0 → 50.0" in out


def test_the_tiny_preset_is_one_flag_away(capsys):
    assert example().main(["--preset", "dcr-tiny", "--max-steps", "7", "--print-config"]) == 0
    config = json.loads(capsys.readouterr().out)
    assert config["optim"]["max_steps"] == 7 and config["model"]["clip_blind_to"] == []
    assert config["output"]["output_dir"] == "runs/dcr-tiny"


def test_help_describes_the_miniature(capsys):
    with pytest.raises(SystemExit):
        example().main(["--help"])
    assert "reconstruction-only baseline" in capsys.readouterr().out
