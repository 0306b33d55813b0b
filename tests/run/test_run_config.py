"""One configuration format and command line for every method: complete validation before anything runs or
is written, both flag spellings, old spellings, presets, --set, --print-config round trips."""

from __future__ import annotations

import json

import pytest

from hf_vrl.cli import main
from hf_vrl.errors import UserError
from hf_vrl.methods.dcr.method import DCRRunConfig
from hf_vrl.methods.diffclip.method import DiffCLIPRunConfig
from hf_vrl.presets import list_presets, load_preset
from hf_vrl.run.config import resolve
from hf_vrl.run.parser import parse_run_args


def parse(cls, *argv):
    return parse_run_args(cls, list(argv)).config


def test_every_shipped_preset_resolves_for_its_method():
    classes = {"diffclip": DiffCLIPRunConfig, "dcr": DCRRunConfig}
    presets = [(name, method) for name, method, _ in list_presets() if method in classes]
    assert len(presets) >= 9
    for name, method in presets:
        config = resolve(classes[method], load_preset(name), source=name)
        assert config.to_dict()["method"] == method


@pytest.mark.parametrize(
    "argv, problem",
    [
        (["--max-steps", "0"], "optim.max_steps: must be >= 1, got 0"),
        (["--batch-size", "0"], "optim.batch_size: must be >= 1"),
        (["--learning-rate", "-1"], "optim.learning_rate: must be >="),
        (["--warmup-ratio", "1"], "optim.warmup_ratio: must lie in [0, 1)"),
        (["--precision", "fp8"], "precision: expected one of"),
        (["--crop-scale", "0.5", "2"], "diffclip.crop_scale must be two numbers"),
        (["--set", "model.architecture.text_config.num_hiden_layers=4"], "did you mean 'num_hidden_layers'"),
        (["--set", "optim.batch_sise=4"], "optim.batch_sise: unknown setting; did you mean 'batch_size'"),
        (
            ["--set", "trainng.learning_rate=1"],
            "trainng: unknown setting; did you mean 'optim'? ('training' in the first",
        ),
        (["--arch", "clip", "--lambda-init", "0.5"], "apply to DiffCLIP only"),
        (
            ["--global-batch-size", "30", "--batch-size", "8", "--accumulation", "micro_batch"],
            "not a multiple of batch_size 8",
        ),
    ],
)
def test_impossible_settings_are_refused_with_what_to_change(argv, problem):
    with pytest.raises(UserError, match=None) as error:
        parse(DiffCLIPRunConfig, *argv)
    assert problem in str(error.value)


def test_every_problem_is_reported_at_once():
    with pytest.raises(UserError) as error:
        parse(
            DiffCLIPRunConfig,
            "--max-steps",
            "-3",
            "--batch-size",
            "0",
            "--set",
            "model.architecture.text_config.hidden_sise=8",
        )
    message = str(error.value)
    assert "3 problem(s)" in message
    assert "max_steps" in message and "batch_size" in message and "hidden_sise" in message


def test_a_preset_with_a_misspelt_section_or_key_is_refused(tmp_path):
    preset = load_preset("diffclip-tiny")
    preset["trainig"] = preset.pop("optim")  # a misspelt section: it used to train with the defaults
    path = tmp_path / "typo.json"
    path.write_text(json.dumps(preset))
    with pytest.raises(UserError, match="trainig: unknown setting; did you mean 'optim'\\?"):
        parse(DiffCLIPRunConfig, "--config", str(path))
    preset = load_preset("diffclip-tiny")
    preset["model"]["architecture"]["text_config"]["num_hiden_layers"] = 12
    path.write_text(json.dumps(preset))
    with pytest.raises(UserError, match="num_hiden_layers"):
        parse(DiffCLIPRunConfig, "--config", str(path))


def test_a_preset_of_another_method_is_refused():
    with pytest.raises(UserError, match="dcr-tiny is a 'dcr' preset, not a 'diffclip' one"):
        parse(DiffCLIPRunConfig, "--config", "dcr-tiny")


def test_refused_configurations_write_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "diffclip", "--output-dir", str(out), "--max-steps", "0"]) == 2
    assert not out.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("hf-vrl: error: diffclip-tiny has 1 problem(s):")
    assert "Traceback" not in "\n".join(err)


def test_both_spellings_and_section_paths_set_the_same_field():
    dashed = parse(DiffCLIPRunConfig, "--batch-size", "4", "--learning-rate", "0.1")
    snake = parse(DiffCLIPRunConfig, "--batch_size", "4", "--learning_rate=0.1")
    path = parse(DiffCLIPRunConfig, "--set", "optim.batch_size=4", "--set", "optim.learning_rate=0.1")
    assert dashed.to_dict() == snake.to_dict() == path.to_dict()
    assert dashed.optim.batch_size == 4 and dashed.optim.learning_rate == 0.1


def test_booleans_lists_and_deep_sets():
    config = parse(
        DiffCLIPRunConfig,
        "--no-figures",
        "--eval-before",
        "false",
        "--crop-scale",
        "0.5",
        "1",
        "--set",
        "model.architecture.text_config.num_hidden_layers=3",
    )
    assert (
        config.eval.figures is False and config.eval.eval_before is False and config.eval.eval_after is True
    )
    assert config.diffclip.crop_scale == [0.5, 1.0]
    assert config.model.architecture["text_config"]["num_hidden_layers"] == 3
    assert (
        config.model.architecture["text_config"]["hidden_size"] == 64
    )  # the rest of the preset's tower stays


def test_old_spellings_still_work_and_say_what_replaced_them(caplog):
    with caplog.at_level("WARNING"):
        config = parse(DiffCLIPRunConfig, "--bf16", "--dataloader-num-workers", "2", "--no-eval")
        dcr = parse_run_args(
            DCRRunConfig,
            ["--stage2_steps", "7", "--max_train_samples", "9", "--mixed_precision", "fp16"],
            {"--stage2-steps": ["--max-steps"], "--max-train-samples": ["--train-limit"]},
        ).config
    assert config.precision == "bf16" and config.data.num_workers == 2
    assert config.eval.eval_before is False and config.eval.eval_after is False
    assert dcr.optim.max_steps == 7 and dcr.data.train_limit == 9 and dcr.precision == "fp16"
    assert "--bf16 is deprecated: use --precision bf16" in caplog.text
    assert "--stage2_steps is deprecated: use --max-steps" in caplog.text


def test_print_config_round_trips_through_a_file(tmp_path, capsys):
    assert main(["train", "dcr", "--print-config", "--batch-size", "3", "--stage1-steps", "5"]) == 0
    printed = capsys.readouterr().out
    (tmp_path / "config.json").write_text(printed)
    again = parse(DCRRunConfig, "--config", str(tmp_path / "config.json"))
    assert again.to_dict() == json.loads(printed)
    assert again.optim.batch_size == 3 and again.dcr.stage1_steps == 5


def test_yaml_configuration_files(tmp_path):
    (tmp_path / "run.yaml").write_text("method: dcr\noptim:\n  batch_size: 5\ndcr:\n  stage: end_to_end\n")
    config = parse(DCRRunConfig, "--config", str(tmp_path / "run.yaml"))
    assert config.optim.batch_size == 5 and config.dcr.stage == "end_to_end"
    assert config.optim.max_steps == 4600  # unspecified settings keep the method's defaults


def test_help_groups_flags_by_section(capsys):
    with pytest.raises(SystemExit):
        main(["train", "dcr", "--help"])
    text = capsys.readouterr().out
    for group in ("run:", "model:", "data:", "optim:", "eval:", "output:", "dcr:"):
        assert f"\n{group}" in text
    assert "dcr-openai-l14-224" in text  # the presets of the method are listed
    assert "--batch-size BATCH_SIZE" in text


def test_python_api_takes_names_and_paths(tmp_path):
    from hf_vrl.run import _flat_overrides

    assert _flat_overrides(DCRRunConfig, {"batch_size": 3, "dcr.stage": "1"}) == {
        "optim.batch_size": 3,
        "dcr.stage": "1",
    }
    with pytest.raises(UserError, match="unknown setting 'batch_sise'"):
        _flat_overrides(DCRRunConfig, {"batch_sise": 3})
