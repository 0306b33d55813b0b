"""Training logs as transformers users have them: `--report-to` / `--logging-dir` (TrainingArguments' names)
send the loss and each loss term of the method to TensorBoard; a logger that is unknown or not installed is
refused before the run writes anything."""

from __future__ import annotations

import json

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from transformers.integrations import get_available_reporting_integrations
from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

import hf_vrl
from hf_vrl.errors import UserError
from hf_vrl.run.report import metric_numbers

# dive-tiny shrunk: a tiny CLIP pre-trained for 3 steps, then 3 DiVE steps logged one by one
TINY = dict(
    pretrain_steps=3, pretrain_data={"digits": 32, "shapes": 32}, pretrain_batch_size=16, train_limit=80,
    batch_size=8, max_steps=3, save_steps=3, logging_steps=1, val_size=0, reference_limit=16,
    reference_dataset=["digits", "shapes"], eval_before=False, eval_after=False, figures=False,
)  # fmt: skip


def _scalars(folder) -> dict[str, list[float]]:
    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: [e.value for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_tensorboard_holds_the_loss_terms_the_trainer_logged(tmp_path):
    out = tmp_path / "run"
    hf_vrl.train("dive", output_dir=str(out), report_to=["tensorboard"], **TINY)
    scalars = _scalars(out / "logs" / "tensorboard" / "train")
    state = json.loads((out / "checkpoints" / "train" / "checkpoint-3" / "trainer_state.json").read_text())
    logged = [entry for entry in state["log_history"] if "loss" in entry]
    assert len(logged) == 3
    for term in ("loss", "avl", "pvl", "learning_rate"):  # the objective and DiVE's two terms (Eq. 9)
        assert scalars[f"train/{term}"] == pytest.approx([entry[term] for entry in logged], rel=1e-6)


def test_logging_dir_moves_the_event_files(tmp_path):
    out, logs = tmp_path / "run", tmp_path / "tb"
    hf_vrl.train("dive", output_dir=str(out), report_to=["tensorboard"], logging_dir=str(logs), **TINY)
    assert "train/avl" in _scalars(logs / "train")
    assert not (out / "logs" / "tensorboard").exists()


def test_no_logger_writes_nothing(tmp_path):
    out = tmp_path / "run"
    hf_vrl.train("dive", output_dir=str(out), **TINY)  # report_to defaults to none, as in transformers 5
    assert not (out / "logs" / "tensorboard").exists()


def test_an_unknown_or_missing_logger_is_refused_before_the_run_writes(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(UserError, match="unknown logger 'tensorbord'; choose from: all, none, "):
        hf_vrl.train("dive", output_dir=str(out), report_to=["tensorbord"], **TINY)
    missing = [name for name in INTEGRATION_TO_CALLBACK if name not in get_available_reporting_integrations()]
    with pytest.raises(UserError, match=f"--report-to {missing[0]}: it is not installed here"):
        hf_vrl.train("dive", output_dir=str(out), report_to=[missing[0]], **TINY)
    with pytest.raises(UserError, match="'all' and 'none' stand alone"):
        hf_vrl.train("dive", output_dir=str(out), report_to=["none", "tensorboard"], **TINY)
    assert not out.exists()


def test_the_evaluation_goes_to_the_loggers_as_the_trainers_does(tmp_path):
    """Every number of the report's before / after sections as `eval/<task>.<metric>` in TensorBoard (the
    Trainer's `eval_` prefix), at step 0 and at the last step, beside the stage's training scalars."""
    out = tmp_path / "run"
    report = hf_vrl.train(
        "diffclip", output_dir=str(out), max_steps=2, train_limit=16, batch_size=8, eval_limit=8,
        logging_steps=1, report_to=["tensorboard"], figures=False,
    )  # fmt: skip
    events = EventAccumulator(str(out / "logs" / "tensorboard" / "train"))
    events.Reload()
    scalars = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert "train/loss" in scalars
    before, after = metric_numbers(report["before"]), metric_numbers(report["after"])
    assert {tag for tag in scalars if tag.startswith("eval/")} == {f"eval/{name}" for name in after}
    assert {"zero_shot.top1", "retrieval.i2t_R@1"} <= set(after)
    assert not [name for name in after if ".data." in name]  # the data records are not metrics
    for name, value in after.items():
        steps, values = zip(*scalars[f"eval/{name}"])
        assert steps == (0, 2) and values == pytest.approx([before[name], value])
