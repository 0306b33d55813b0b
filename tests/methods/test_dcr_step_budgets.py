"""What each DCR training loop trains (issue 27: `--max-steps 20` ran the toy CLIP, the toy diffusion model
and stage 1 in full): --max-steps is stage 2's length, every other loop has its own budget, --step-limit
bounds them all, and --help says so."""

from __future__ import annotations

import logging

import pytest

from hf_vrl.run import main
from hf_vrl.run.config import resolve
from hf_vrl.run.layout import RunDir
from hf_vrl.run.runner import Run

BUDGET_HELP = {
    "--max-steps": "of its last stage where there are several (dcr: stage 2 or end_to_end",
    "--step-limit": "at most this many optimiser steps in every training loop of the run",
    "--stage1-steps": "(at most --step-limit)",
    "--clip-pretrain-steps": "(at most --step-limit)",
    "--diffusion-pretrain-steps": "(at most --step-limit)",
}


def test_help_says_what_each_step_budget_bounds(capsys):
    with pytest.raises(SystemExit):
        main("dcr", ["--config", "dcr-tiny", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the lines
    for flag, says in BUDGET_HELP.items():
        assert flag in text and says in text, flag


def budgets(tmp_path, **overrides) -> dict[str, int]:
    """The steps each loop of a dcr-tiny run would train, without training."""
    from hf_vrl.methods.dcr.method import DCRRunConfig
    from hf_vrl.presets import load_preset

    config = resolve(DCRRunConfig, load_preset("dcr-tiny"), {"output.output_dir": str(tmp_path), **overrides})
    run = Run(config=config, dir=RunDir(tmp_path))
    return {
        "toy CLIP": run.step_budget(config.model.clip_pretrain_steps),
        "toy diffusion": run.step_budget(config.dcr.diffusion_pretrain_steps),
        "stage1": run.training_arguments("stage1", max_steps=config.dcr.stage1_steps).max_steps,
        "stage2": run.training_arguments("stage2").max_steps,
    }


def test_max_steps_is_stage_2_and_step_limit_bounds_every_loop(tmp_path):
    assert budgets(tmp_path, **{"optim.max_steps": 20}) == {
        "toy CLIP": 150, "toy diffusion": 200, "stage1": 100, "stage2": 20,
    }  # fmt: skip
    limited = budgets(tmp_path, **{"optim.max_steps": 20, "optim.step_limit": 3})
    assert limited == {"toy CLIP": 3, "toy diffusion": 3, "stage1": 3, "stage2": 3}
    assert budgets(tmp_path, **{"optim.step_limit": 500})["toy CLIP"] == 150  # a bound, never a length


def test_dcr_tiny_with_a_step_limit_trains_no_loop_past_it(tmp_path, caplog):
    """dcr-tiny --max-steps 2 --step-limit 2: the toy CLIP, the toy diffusion model and both stages each train
    2 steps (the log and the report say so)."""
    import hf_vrl

    with caplog.at_level(logging.INFO, logger="hf_vrl"):
        report = hf_vrl.train(
            "dcr", config="dcr-tiny", max_steps=2, step_limit=2, train_limit=24, batch_size=4,
            eval_before=False, eval_after=False, figures=False, output_dir=str(tmp_path / "run"),
        )  # fmt: skip
    assert "toy CLIP step 2/2" in caplog.text and "tiny SD step 2/2" in caplog.text
    assert {stage: s["steps"] for stage, s in report["train"]["stages"].items()} == {"stage1": 2, "stage2": 2}
