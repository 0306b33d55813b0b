"""The run folder's rules: a run folder belongs to one configuration; writes are atomic; only complete
checkpoints are resumed from."""

from __future__ import annotations

import json

import pytest
import torch

from hf_vrl.errors import UserError
from hf_vrl.methods.diffclip.method import DiffCLIPRunConfig
from hf_vrl.presets import load_preset
from hf_vrl.run.config import SAMPLES_PER_STEP, resolve
from hf_vrl.run.layout import OutputDir, RunDir, atomic_dir, atomic_write_json, last_complete_checkpoint


def config(**overrides):
    return resolve(DiffCLIPRunConfig, load_preset("diffclip-tiny"), overrides)


def saved_step(run, step=2):
    """A complete checkpoint of a folder hf_vrl made: the run saved trained work (a folder without one is not
    a run yet)."""
    folder = run.checkpoints("train") / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text("{}")
    run.mark()


def recorded(tmp_path, cfg):
    run = RunDir(tmp_path / "run")
    run.mark()
    atomic_write_json(run.config_file, cfg.to_dict())
    saved_step(run)
    return run


def test_a_folder_whose_run_never_saved_a_step_is_not_a_run(tmp_path):
    run = RunDir(tmp_path / "run")
    run.mark()
    atomic_write_json(run.config_file, config(seed=5).to_dict())
    (run.checkpoints("train") / ".staging" / "checkpoint-2").mkdir(parents=True)
    (run.checkpoints("train") / "checkpoint-4").mkdir()  # incomplete
    assert not run.holds_run()
    assert run.open(config(), resume=None) is False  # a new run takes it over
    assert run.open(config(), resume="auto") is False  # other settings: taken over, not refused
    assert run.open(config(seed=5), resume="auto") is True  # the same settings continue it


def test_a_new_run_refuses_a_folder_that_holds_one(tmp_path):
    run = recorded(tmp_path, config())
    with pytest.raises(UserError, match="already holds a run: continue it with --resume"):
        run.open(config(), resume=None)


def test_resume_auto_starts_fresh_where_there_is_no_run(tmp_path):
    assert RunDir(tmp_path / "empty").open(config(), resume="auto") is False
    with pytest.raises(UserError, match="holds no run to resume"):
        RunDir(tmp_path / "empty").open(
            config(), resume=str(tmp_path / "empty/checkpoints/train/checkpoint-2")
        )


def test_resume_refuses_another_configuration_and_names_the_difference(tmp_path):
    run = recorded(tmp_path, config())
    assert run.open(config(), resume="auto") is True
    with pytest.raises(UserError) as error:
        run.open(config(**{"seed": 1, "optim.batch_size": 16}), resume="auto")
    message = str(error.value)
    assert f"{SAMPLES_PER_STEP}: 64 there, 16 now" in message and "seed: 0 there, 1 now" in message


def test_resume_accepts_changes_that_do_not_define_the_run(tmp_path):
    run = recorded(tmp_path, config())
    changed = config(
        **{"output.logging_steps": 1, "data.num_workers": 2, "eval.eval_before": False, "compile": "off"}
    )
    assert run.open(changed, resume="auto") is True


def test_checkpoints_without_a_recorded_configuration_are_not_adopted(tmp_path):
    run = RunDir(tmp_path / "run")
    saved_step(run)
    with pytest.raises(UserError, match="no config.json"):
        run.open(config(), resume="auto")


def test_a_run_of_another_method_is_not_resumed(tmp_path):
    run = RunDir(tmp_path / "run")
    atomic_write_json(run.config_file, {"method": "dcr"})
    saved_step(run)
    with pytest.raises(UserError, match="holds a 'dcr' run"):
        run.open(config(), resume="auto")


def test_only_complete_checkpoints_are_resumed_from(tmp_path):
    """Checkpoints of an earlier release: no checkpoint.json, judged by the files they hold (the Trainer's
    state, the optimiser's and the schedule's)."""
    folder = tmp_path / "checkpoints"
    for step, complete in ((2, True), (4, True), (6, False)):
        (folder / f"checkpoint-{step}").mkdir(parents=True)
        if complete:
            (folder / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
            for name in ("optimizer.pt", "scheduler.pt"):
                torch.save({}, folder / f"checkpoint-{step}" / name)
    (folder / ".staging" / "checkpoint-8").mkdir(parents=True)
    (folder / "checkpoint-10-old").mkdir()
    assert last_complete_checkpoint(folder) == folder / "checkpoint-4"
    assert last_complete_checkpoint(tmp_path / "missing") is None


def test_atomic_dir_is_all_or_nothing(tmp_path):
    target = tmp_path / "final"
    with pytest.raises(RuntimeError):
        with atomic_dir(target) as folder:
            (folder / "model.safetensors").write_text("half")
            raise RuntimeError("killed while saving")
    assert not target.exists() and list(tmp_path.iterdir()) == []
    with atomic_dir(target) as folder:
        (folder / "model.safetensors").write_text("whole")
    assert (target / "model.safetensors").read_text() == "whole"
    with atomic_dir(target) as folder:  # replaces a previous result in one rename
        (folder / "config.json").write_text("{}")
    assert sorted(p.name for p in target.iterdir()) == ["config.json"]


def test_atomic_write_json_replaces_the_file(tmp_path):
    path = tmp_path / "report.json"
    atomic_write_json(path, {"a": 1})
    atomic_write_json(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2} and [p.name for p in tmp_path.iterdir()] == [
        "report.json"
    ]


def test_a_resume_may_change_what_only_takes_memory(tmp_path):
    """Under whole_batch accumulation the micro-batch is memory only (issue 27): a resume after an
    out-of-memory error may halve it; under micro_batch accumulation it is what the loss sees."""
    run = recorded(tmp_path, config(**{"optim.global_batch_size": 64}))
    assert run.open(config(**{"optim.global_batch_size": 64, "optim.batch_size": 32}), resume="auto")
    plain = recorded(tmp_path / "plain", config(**{"optim.batch_size": 64}))
    assert plain.open(config(**{"optim.batch_size": 32, "optim.gradient_accumulation_steps": 2}), "auto")
    with pytest.raises(UserError, match=f"{SAMPLES_PER_STEP}: 64 there, 32 now"):  # half the step
        plain.open(config(**{"optim.batch_size": 32}), resume="auto")
    micro = {"optim.accumulation": "micro_batch", "optim.global_batch_size": 64}
    exact = recorded(tmp_path / "micro", config(**micro))
    seen = r"samples per loss evaluation \(a micro-batch of every process\): 64 there, 32 now"
    with pytest.raises(UserError, match=seen):
        exact.open(config(**micro, **{"optim.batch_size": 32}), resume="auto")


def test_dcr_recomputation_and_unet_chunks_are_memory_settings(tmp_path):
    from hf_vrl.methods.dcr.method import DCRRunConfig

    dcr = resolve(DCRRunConfig, load_preset("dcr-tiny"))
    run = recorded(tmp_path, dcr)
    lean = resolve(
        DCRRunConfig,
        load_preset("dcr-tiny"),
        {"dcr.gradient_checkpointing": "chunks", "dcr.unet_chunk_size": 2},
    )
    assert run.open(lean, resume="auto") is True


def test_loader_workers_define_a_streamed_run(tmp_path):
    """Each loader worker reads its own shards of a stream, so the stream's order follows their count: a
    resume with another --num-workers on streamed data is refused (map-style data: accepted, above)."""
    shards = {"data.dataset": "webdataset:/data/cc3m/{00000..00003}.tar", "optim.max_steps": 10}
    run = recorded(tmp_path, config(**shards))
    with pytest.raises(UserError, match="data.num_workers: 0 there, 2 now"):
        run.open(config(**shards, **{"data.num_workers": 2}), resume="auto")


def test_only_folders_hf_vrl_made_are_written(tmp_path):
    foreign = tmp_path / "mine"
    for name in ("figures", "logs", "exports"):
        (foreign / name).mkdir(parents=True)
    (foreign / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(UserError, match="is not empty and is not a folder hf_vrl wrote"):
        RunDir(foreign).check_writable()
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="is a file"):
        RunDir(tmp_path / "file").check_writable()
    for ours in (tmp_path / "new", tmp_path / "empty"):
        ours.mkdir(exist_ok=ours.name == "new")
        RunDir(ours).check_writable()
    copied = tmp_path / "copied"  # a folder holding a copy of a run's config.json: not taken for a run
    for name in ("figures", "logs", "exports", "checkpoints"):
        (copied / name).mkdir(parents=True)
    atomic_write_json(copied / "config.json", config().to_dict())
    with pytest.raises(UserError, match="is not empty and is not a folder hf_vrl wrote"):
        RunDir(copied).check_writable()
    marked = tmp_path / "marked"  # a run of hf_vrl before markers named their command: train's
    marked.mkdir()
    (marked / ".hf-vrl-run").write_text('{"hf_vrl": "0.1.0"}')
    (marked / "config.json").write_text("{}")
    RunDir(marked).check_writable()


def test_a_takeover_keeps_inputs_only_when_they_were_made_by_the_same_run(tmp_path):
    """inputs/ of a run that never saved a step is reused by a command that defines the same run (its
    recorded config.json), rebuilt by any other (issue 29: a DiVE run's 5-step toy CLIP was reused by the
    corrected 30-step command)."""
    run = RunDir(tmp_path / "run")
    atomic_write_json(run.config_file, config(seed=5).to_dict())
    (run.inputs / "pretrained").mkdir(parents=True)
    run.clear_unstarted(config(seed=5, **{"output.logging_steps": 1}))
    assert (run.inputs / "pretrained").is_dir() and not run.config_file.exists()
    atomic_write_json(run.config_file, config(seed=5).to_dict())
    run.clear_unstarted(config(seed=6))
    assert not run.inputs.exists()


def test_what_hf_vrl_writes_keeps_only_an_auto_map_whose_code_is_beside_it(tmp_path):
    """issue 37: save_pretrained carried a pretrained folder's auto_map (code elsewhere) into final/."""
    with atomic_dir(tmp_path / "final") as folder:
        (folder / "modeling_own.py").write_text("")
        auto_map = {
            "AutoConfig": "modeling_own.C",
            "AutoModel": "other/repo--modeling_x.M",
            "AutoX": "gone.X",
        }
        (folder / "config.json").write_text(json.dumps({"model_type": "clip", "auto_map": auto_map}))
        (folder / "sub").mkdir()
        (folder / "sub" / "tokenizer_config.json").write_text(
            json.dumps({"auto_map": {"AutoTokenizer": ["a.T", None]}})
        )
    assert json.loads((tmp_path / "final/config.json").read_text())["auto_map"] == {
        "AutoConfig": "modeling_own.C"
    }
    assert "auto_map" not in json.loads((tmp_path / "final/sub/tokenizer_config.json").read_text())


def test_a_command_writes_its_folder_all_at_once_and_a_failure_leaves_it_as_it_was(tmp_path):
    output = OutputDir(tmp_path / "out", "convert")
    with output.claim(), output.staged(replace=True) as folder:
        (folder / "a.txt").write_text("first")
        (folder / "b.txt").write_text("first")
    with pytest.raises(RuntimeError), output.claim(), output.staged(replace=True) as folder:
        (folder / "a.txt").write_text("second")
        raise RuntimeError("killed")
    assert (tmp_path / "out/a.txt").read_text() == "first"
    OutputDir(tmp_path / "out" / "eval", "llava-eval").claim().release()  # another command's, inside
    with output.claim(), output.staged(replace=True) as folder:
        (folder / "a.txt").write_text("third")
    kept = sorted(p.name for p in (tmp_path / "out").iterdir() if not p.name.startswith("."))
    assert kept == ["a.txt", "eval"]  # b.txt (its own) replaced, the other command's folder kept
    with pytest.raises(UserError, match="is a folder `hf-vrl convert` wrote"):
        OutputDir(tmp_path / "out", "eval").check()
