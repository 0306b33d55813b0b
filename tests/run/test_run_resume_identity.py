"""Issue 37, second round: what a reported number is measured on defines the run (a method's own evaluation
sets too), a finished stage or final/ of another run is refused as its checkpoints are, a take-over keeps
another command's output, and a YAML configuration cannot expand without bound."""

from __future__ import annotations

import json
import shutil

import pytest
from test_run_honest import TINY_RUN, refused, trained, unprivileged  # noqa: F401 (a fixture)

from hf_vrl.errors import UserError
from hf_vrl.methods.clue.method import CLUERunConfig
from hf_vrl.methods.dcr.method import DCRRunConfig
from hf_vrl.methods.diffclip.method import DiffCLIPRunConfig
from hf_vrl.methods.dive.method import DiVERunConfig
from hf_vrl.presets import load_preset
from hf_vrl.run.config import resolve
from hf_vrl.run.layout import OutputDir, RunDir, atomic_write_json, write_checkpoint_manifest


def config(cls, **overrides):
    return resolve(cls, load_preset(cls.preset), overrides)


def recorded(tmp_path, cfg) -> RunDir:
    """A run folder of `cfg` that saved a step (a complete checkpoint)."""
    run = RunDir(tmp_path / "run")
    run.mark()
    atomic_write_json(run.config_file, cfg.to_dict())
    checkpoint = run.checkpoints("train") / "checkpoint-2"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text("{}")
    return run


MEASURED_CASES = {
    "dive RSA set": (DiVERunConfig, {"dive.rsa_dataset": "shapes"}),
    "dive RSA limit": (DiVERunConfig, {"dive.rsa_limit": 50}),
    "dive OOD sets": (DiVERunConfig, {"dive.ood_datasets": ["digits"]}),
    "dive OOD split": (DiVERunConfig, {"dive.ood_datasets": ["digits"], "dive.ood_splits": {"digits": "x"}}),
    "dive OOD limit": (DiVERunConfig, {"dive.ood_datasets": ["digits"], "dive.ood_limits": {"digits": 5}}),
    "dive shifts": (DiVERunConfig, {"dive.ood_shifts": ["inverted"]}),
    "dive transfer sets": (DiVERunConfig, {"dive.zero_shot_datasets": ["digits"]}),
    "dive transfer prompts": (DiVERunConfig, {"dive.transfer_templates": "dataset"}),
    "dive macro F1": (DiVERunConfig, {"dive.macro_f1": True}),
    "dive reference set": (DiVERunConfig, {"dive.reference_dataset": "digits"}),
    "dcr MMVP pairs": (DCRRunConfig, {"dcr.mmvp": "/data/mmvp-vlm"}),
    "clue granularity split": (CLUERunConfig, {"clue.granularity_split": "test"}),
    "clue probe strengths": (CLUERunConfig, {"clue.probe_cs": [1.0]}),
    "clue label column": (CLUERunConfig, {"clue.eval_label_column": "label"}),
}


@pytest.mark.parametrize("case", MEASURED_CASES)
def test_a_resume_that_changes_what_a_number_is_measured_on_is_refused(tmp_path, case):
    """DiVE's RSA set, OOD sets with their splits and limits, transfer sets, DCR's MMVP pairs and CLUE's
    probe settings were memory-only settings: a resume that changed them measured "after" on other data
    than "before" (issue 37, as --eval-dataset was)."""
    cls, overrides = MEASURED_CASES[case]
    run = recorded(tmp_path, config(cls))
    changed = config(cls, **overrides)
    with pytest.raises(UserError, match="was started with other settings") as refusal:
        run.open(changed, resume="auto")
    message = str(refusal.value)
    assert len(message.splitlines()) == 1 and list(overrides)[-1] + ":" in message
    if case != "dive reference set":  # the reference set trains the model; the others are measured on
        assert "what its before and after are measured on" in message
    assert run.open(config(cls), resume="auto") is True  # the same settings resume


def test_which_settings_are_measured_on_is_declared_with_each_setting():
    """`MEASURED` marks the settings a reported number is measured on; the resume names them, and what is
    only watched (logging, figures) or memory (chunks, workers) still does not define the run."""
    dive = config(DiVERunConfig)
    assert {"eval.eval_dataset", "eval.eval_limit", "dive.rsa_dataset", "dive.ood_limits"} <= set(
        dive.measured_settings()
    )
    assert "dive.reference_dataset" in dive.identity()  # the reference set trains the model
    identity = config(CLUERunConfig).identity()
    assert "clue.probe_cs" in identity and "clue.part_map_images" not in identity
    assert "output.logging_steps" not in identity and "eval.figures" not in identity
    assert "dcr.unet_chunk_size" not in config(DCRRunConfig).identity()


def diffclip(**overrides):
    return config(DiffCLIPRunConfig, **overrides)


@pytest.mark.parametrize("result", ["checkpoints/stage1/done", "final"])
def test_a_finished_stage_or_final_of_another_run_is_refused(tmp_path, result):
    """A done/ or final/ of another run (other seed) in the folder was loaded as this run's result, its
    stage never trained again (issue 37, as a checkpoint of another run was); it names its run now, and an
    earlier release's, which names none, is taken as before."""
    run = recorded(tmp_path, diffclip())
    folder = run.root / result
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"")
    assert run.open(diffclip(), resume="auto") is True  # an earlier release's: no record, taken
    write_checkpoint_manifest(folder, diffclip().identity(1))
    assert run.open(diffclip(), resume="auto") is True  # this run's
    write_checkpoint_manifest(folder, diffclip(seed=1).identity(1))
    with pytest.raises(UserError) as refusal:
        run.open(diffclip(), resume="auto")
    message = str(refusal.value)
    assert f"{folder} was written by another run (seed: 1 there, 0 now)" in message
    assert len(message.splitlines()) == 1


def test_a_run_names_itself_in_its_final_folder_and_a_foreign_final_is_refused(tmp_path, capsys):
    """The real run records its identity in final/checkpoint.json beside the files; seed 1's final/ copied
    into seed 0's finished run was taken as its result (a report of one model, the weights of another)."""
    seed0, seed1 = trained(tmp_path, "seed0"), trained(tmp_path, "seed1", "--seed", "1")
    manifest = json.loads((seed0 / "final/checkpoint.json").read_text())
    assert manifest["run"]["seed"] == 0 and "model.safetensors" in manifest["files"]
    shutil.rmtree(seed0 / "final")
    shutil.copytree(seed1 / "final", seed0 / "final")
    message = refused([*TINY_RUN, "--output-dir", "seed0", "--resume"], tmp_path, capsys)
    assert "seed0/final was written by another run (seed: 1 there, 0 now)" in message


@pytest.mark.parametrize("inside", ["exports/eval", "figures/eval/zero-shot", "logs/eval"])
def test_a_take_over_refuses_to_clear_another_commands_output(tmp_path, inside):
    """A folder whose run never saved a step was taken over by deleting its logs/, checkpoints/, figures/,
    exports/ and inputs/ whole, an `hf-vrl eval --output-dir <run>/exports/eval` inside them too; now the
    take-over is refused in one line before anything is written (the run would later write its own
    exports and figures there), and goes ahead once that output is moved out."""
    run = RunDir(tmp_path / "run")
    run.mark()
    atomic_write_json(run.config_file, diffclip(seed=5).to_dict())
    evaluation = OutputDir(run.root / inside, "eval")
    evaluation.root.mkdir(parents=True)
    evaluation.mark()
    (evaluation.root / "report.json").write_text("{}")
    before = sorted(str(p) for p in run.root.rglob("*"))
    for resume in (None, "auto"):
        with pytest.raises(UserError) as refusal:
            run.open(diffclip(), resume=resume)
        message = str(refusal.value)
        assert len(message.splitlines()) == 1
        assert f"{evaluation.root} holds what `hf-vrl eval` wrote" in message and "move it out" in message
    assert sorted(str(p) for p in run.root.rglob("*")) == before
    assert run.open(diffclip(seed=5), resume="auto") is True  # its own run continues: nothing is cleared
    shutil.move(run.root / inside.split("/")[0], tmp_path / "moved")
    assert run.open(diffclip(), resume=None) is False
    run.clear_unstarted(diffclip())
    assert (tmp_path / "moved").is_dir() and not run.config_file.exists()


@pytest.mark.parametrize("read_only", ["out", "parent"])
def test_eval_refuses_a_read_only_output_folder_in_one_line(unprivileged, capsys, read_only):  # noqa: F811
    """`hf-vrl eval --output-dir` read-only (or under a read-only parent) was a traceback after the whole
    evaluation (issue 37); the check, untested as root, ran with the real user's rights: as `nobody` it let
    the folder through. It refuses, before any model or data is read, in one line."""
    root, as_user = unprivileged
    (root / "out").mkdir()
    (root / "parent").mkdir()
    target = root / ("out" if read_only == "out" else "parent/new")
    argv = ["eval", "--model", str(root / "no-model"), "--dataset", "shapes", "--output-dir", str(target)]
    with as_user():
        (root / read_only).chmod(0o555)
        message = refused(argv, root, capsys)
    assert f"--output-dir {target}: {root / read_only} is not writable" in message, message


def _laughs(levels: int) -> str:
    """A YAML "billion laughs": each level a list of ten aliases of the one before (10**levels values)."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_a_yaml_configuration_of_nested_aliases_is_refused_in_one_line(tmp_path, capsys):
    """Nested aliases load as shared lists in no time, but every reader of the settings (the nesting check,
    validation, config.json) walked them expanded: 10**6 values took seconds before a wrong complaint,
    10**9 never ended. Reading now counts the values with aliases expanded and stops past 100,000."""
    from hf_vrl.run.config import load_config_file

    for levels in (6, 9):
        (tmp_path / f"laughs{levels}.yaml").write_text(_laughs(levels))
        message = refused(["train", "diffclip", "--config", f"laughs{levels}.yaml"], tmp_path, capsys)
        assert f"laughs{levels}.yaml holds more than 100,000 values once its YAML aliases" in message
    (tmp_path / "anchors.yaml").write_text("optim: &o {learning_rate: 0.001}\nseed: 3\n")
    assert load_config_file(tmp_path / "anchors.yaml") == {"optim": {"learning_rate": 0.001}, "seed": 3}
    (tmp_path / "small.yaml").write_text(_laughs(4))  # 10**4 values: within the bound, read
    assert len(load_config_file(tmp_path / "small.yaml")["l3"]) == 10
