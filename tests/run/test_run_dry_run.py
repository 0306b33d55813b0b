"""`--dry-run` (hf_vrl.run.dry_run) and what it is built from: the real-size configurations (their published
sizes, the CLIP-format tokenizer), the configuration a dry run trains for every paper preset, the memory
prediction, the command line; and (slow) the dry run of the cheapest paper presets end to end."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hf_vrl.cli import main
from hf_vrl.run.batch import BatchPlan
from hf_vrl.run.dry_run import (
    DryRunOptions,
    Measured,
    dry_run_config,
    paper_presets,
    predict_memory,
    preset_config,
)
from hf_vrl.run.real_models import CLIP_VOCAB_SIZE, catalogue, clip_format_tokenizer, parameter_counts

ROOT = Path(__file__).parents[2]
# every paper preset and the settings naming the models it starts from (hand-written from hub_configs/)
SD = "Manojb/stable-diffusion-2-1-base"
B16 = "openai/clip-vit-base-patch16"
PAPER_MODELS = {
    "dcr-openai-l14-224": {"model.clip": "openai/clip-vit-large-patch14", "dcr.diffusion": SD},
    "dcr-openai-l14-336": {"model.clip": "openai/clip-vit-large-patch14-336", "dcr.diffusion": SD},
    "dcr-metaclip-l14": {"model.clip": "facebook/metaclip-l14-fullcc2.5b", "dcr.diffusion": SD},
    "dcr-metaclip-h14": {"model.clip": "facebook/metaclip-h14-fullcc2.5b", "dcr.diffusion": SD},
    "dcr-siglip-so400m-224": {"model.clip": "google/siglip-so400m-patch14-224", "dcr.diffusion": SD},
    "dcr-siglip-so400m-384": {"model.clip": "google/siglip-so400m-patch14-384", "dcr.diffusion": SD},
    "diffclip-b16": {"model.tokenizer": B16, "model.image_processor": B16},
    "dive-b16": {"model.pretrained": B16},
    "dive-l14": {"model.pretrained": "openai/clip-vit-large-patch14"},
    "dive-iwildcam-b16": {"model.pretrained": B16},
    "dive-fmow-b16": {"model.pretrained": B16},
    "clue-r50": {"model.backbone": "microsoft/resnet-50", "model.text_encoder": B16},
    "clue-vitb16": {"model.backbone": "google/vit-base-patch16-224", "model.text_encoder": B16},
}
# published sizes, from the model pages (parameters) or the size of the float32 weight files / 4 bytes
PUBLISHED = {
    "openai/clip-vit-large-patch14": {".": 428e6},
    "openai/clip-vit-large-patch14-336": {".": 428e6},
    B16: {".": 150e6},
    "facebook/metaclip-l14-fullcc2.5b": {".": 1_710_661_442 / 4},
    "facebook/metaclip-h14-fullcc2.5b": {".": 986e6},
    "google/siglip-so400m-patch14-224": {".": 877e6},
    "google/siglip-so400m-patch14-384": {".": 878e6},
    "microsoft/resnet-50": {".": 25.6e6},
    "google/vit-base-patch16-224": {".": 86.6e6},
    SD: {"unet": 3.46e9 / 4, "vae": 335e6 / 4, "text_encoder": 1.36e9 / 4},
}


def test_the_paper_presets_are_every_non_tiny_preset_and_each_model_they_name_has_a_real_size_config():
    assert sorted(paper_presets()) == sorted(PAPER_MODELS)
    known = catalogue()
    for preset, models in PAPER_MODELS.items():
        config = preset_config(preset)[1]
        for path, repo in models.items():
            section, _, name = path.partition(".")
            assert getattr(getattr(config, section), name) == repo, (preset, path)
            assert repo in known, repo


def test_every_real_configuration_builds_to_its_published_size():
    assert set(catalogue()) == set(PUBLISHED)
    for repo, sizes in PUBLISHED.items():
        counts = parameter_counts(repo)
        assert set(counts) == set(sizes), repo
        for folder, published in sizes.items():
            assert counts[folder] == pytest.approx(published, rel=0.005), (repo, folder, counts[folder])


def test_the_clip_format_tokenizer_has_clips_size_and_special_ids(tmp_path):
    from transformers import AutoTokenizer

    clip_format_tokenizer(tmp_path / "clip")
    clip_format_tokenizer(tmp_path / "sd", pad_token="!")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "clip")
    assert len(tokenizer) == CLIP_VOCAB_SIZE == 49408
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (49406, 49407, 49407)
    ids = tokenizer("A photo of a cat.", padding="max_length", max_length=77)["input_ids"]
    assert ids[0] == 49406 and ids[-1] == 49407 and len(ids) == 77 and max(ids) == 49407
    vocab = json.loads((tmp_path / "clip" / "vocab.json").read_text())
    assert vocab["!"] == 0 and vocab["!</w>"] == 256 and len(vocab) == 49408  # OpenAI's byte layout
    assert (tmp_path / "clip" / "merges.txt").read_text().startswith("#version: 0.2\n")
    assert AutoTokenizer.from_pretrained(tmp_path / "sd").pad_token_id == 0  # SD 2's tokenizer pads with "!"


def test_a_dry_run_trains_the_preset_with_real_size_models_generated_data_and_a_small_batch(tmp_path):
    home = tmp_path / "real-size"
    options = DryRunOptions(home=home)
    for preset, models in PAPER_MODELS.items():
        config = preset_config(preset)[1]
        dry = dry_run_config(config, options)
        for path, repo in models.items():
            section, _, name = path.partition(".")
            assert getattr(getattr(dry, section), name) == str(home / repo.replace("/", "--"))
        assert (dry.data.dataset, dry.eval.eval_dataset, dry.output.push_to_hub) == ("shapes", None, False)
        assert not (dry.eval.eval_before or dry.eval.eval_after or dry.eval.figures)
        plan = dry.batch_plan(1)
        assert (plan.micro_batch, plan.global_batch, dry.optim.max_steps) == (2, 4, 2)
        assert dry.batch_plan(2).accumulation_steps == 1
        layout = {
            *dry.layout_identity(plan),
            *config.layout_identity(config.batch_plan(1)),
        }  # the batch, above
        changed = {
            key for key, value in dry.identity().items() if config.identity().get(key) != value
        } - layout
        allowed = {
            "data.dataset", "data.split", "data.train_limit", "optim.batch_size", "optim.global_batch_size",
            "optim.max_steps", "dcr.stage1_steps", "dive.reference_dataset", "dive.reference_batch_size",
            "dive.ood_datasets", "model.text_source", *models,
            *config.measured_settings(),  # no evaluation
        }  # fmt: skip
        assert changed <= allowed, (preset, changed - allowed)  # precision, optimiser, method settings kept
    dcr = dry_run_config(preset_config("dcr-openai-l14-224")[1], options)
    assert (dcr.dcr.stage1_steps, dcr.precision, dcr.dcr.diffusion_dtype) == (2, "bf16", "bfloat16")
    dive = dry_run_config(preset_config("dive-l14")[1], options)
    assert (dive.dive.reference_dataset, dive.dive.reference_batch_size, dive.dive.ood_datasets) == (
        "shapes",
        None,
        [],
    )
    assert dry_run_config(preset_config("clue-r50")[1], options).model.text_source == "caption"
    assert not home.exists()  # the configuration names the folders; nothing is built for it


def record(stage: str, step: int, static: int, grads: int, peak: int, optimizer: int, data: int) -> dict:
    return {
        "stage": stage, "step": step, "rank": 0, "device": "cpu", "step_s": 1.0, "static_bytes": static,
        "grad_bytes": grads, "step_peak_bytes": peak, "optimizer_peak_bytes": optimizer, "data_bytes": data,
        "data_samples": data // 2**20,
    }  # fmt: skip


def measured(micro_batch: int, steps: int = 1, optimizer: int = 50) -> Measured:
    """Records of a run at `micro_batch` whose activations are 100 + 3 b + 2 b^2 MiB (a fixed part, one
    growing with b, one with b^2 as DCR's grid), with 1 MiB of data per sample, static 100 MiB, gradients
    10 MiB, the optimiser step `optimizer` MiB above them."""
    mib, b = 2**20, micro_batch
    peak = (10 + 100 + 3 * b + 2 * b * b + b) * mib
    records = [
        record("train", s, 100 * mib, 10 * mib, peak, optimizer * mib, b * mib) for s in range(1, steps + 1)
    ]
    return Measured(
        records, BatchPlan(micro_batch=b, processes=1, accumulation_steps=1, accumulation="micro_batch")
    )


def test_the_memory_prediction_fits_the_activations_of_the_micro_batches_measured():
    """At micro-batch 16 with a device batch of 16, DCR's fit (a b^2 term) gives 100 + 10 + max(100 + 3*16 +
    2*256 + 16, 50) = 786 MiB from three micro-batches; the fit of every other method is the least-squares
    line through (1, 105), (2, 114), (3, 127): 93.33 + 11 b, 269.33 MiB of activations at 16, 395.33 MiB in
    all."""
    preset = BatchPlan(micro_batch=16, processes=1, accumulation_steps=16, accumulation="micro_batch")
    three = [measured(2, steps=2), measured(1), measured(3)]
    prediction = predict_memory(three, preset, square=True)
    stage = prediction["stages"]["train"]
    assert stage["activations_gib"] * 1024 == pytest.approx(100 + 3 * 16 + 2 * 256, abs=0.1)  # 4 places
    assert stage["data_gib"] * 1024 == pytest.approx(16, abs=0.1)
    assert prediction["predicted_gib"] * 1024 == pytest.approx(786, abs=0.1)
    assert stage["fit"] == "c + k1 b + k2 b^2" and stage["micro_batches"] == [2, 1, 3]
    line = predict_memory(three, preset)["stages"]["train"]
    assert line["fit"] == "c + k1 b" and line["predicted_gib"] * 1024 == pytest.approx(395.33, abs=0.1)
    two = predict_memory(three[:2], preset, square=True)["stages"]["train"]  # b^2 needs three sizes
    assert two["fit"] == "c + k1 b" and two["activations_gib"] * 1024 == pytest.approx(96 + 9 * 16, abs=0.1)
    # under whole_batch too one micro-batch reaches the device at a time: data of 16 samples, not of 64
    whole = BatchPlan(micro_batch=16, processes=1, accumulation_steps=4, accumulation="whole_batch")
    assert predict_memory(three, whole, square=True)["predicted_gib"] * 1024 == pytest.approx(786, abs=0.1)
    # an optimiser step above the activations is the peak
    big = predict_memory([measured(2, 2, optimizer=5000), measured(1), measured(3)], preset)["predicted_gib"]
    assert big * 1024 == pytest.approx(110 + 5000, abs=0.1)


def test_only_dcrs_grid_of_unet_passes_grows_with_the_square_of_the_batch():
    from hf_vrl.run.dry_run import grows_with_square

    assert grows_with_square(preset_config("dcr-openai-l14-224")[1])
    assert not grows_with_square(preset_config("dcr-openai-l14-224", {"dcr.num_negatives": 4})[1])
    assert not grows_with_square(preset_config("dcr-openai-l14-224", {"dcr.objective": "reconstruction"})[1])
    for preset in ("clue-vitb16", "dive-b16", "diffclip-b16"):
        assert not grows_with_square(preset_config(preset)[1])


def test_print_config_of_a_dry_run_shows_what_it_trains_and_builds_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_VRL_REAL_SIZE_HOME", str(tmp_path / "home"))
    code = main(["train", "dcr", "--config", "dcr-openai-l14-224", "--dry-run", "--print-config"])
    out, err = capsys.readouterr()
    shown = json.loads(out)
    assert code == 0 and shown["model"]["clip"] == str(tmp_path / "home" / "openai--clip-vit-large-patch14")
    assert shown["data"]["dataset"] == "shapes" and shown["optim"]["batch_size"] == 2
    assert "2 per process and micro-batch x 2 micro-batches (micro_batch accumulation)" in err
    assert not (tmp_path / "home").exists()


def test_what_ran_is_checked_against_what_print_config_shows(tmp_path):
    """A run's config.json and logged batch layout must be --print-config's for its command line: a run whose
    configuration differs in one setting, or whose log shows another layout, does not match."""
    from hf_vrl.run.dry_run import _Runner, _write_config
    from hf_vrl.run.layout import Launch, RunDir
    from hf_vrl.run.parser import parse_run_args

    method_class, config = preset_config("diffclip-tiny")
    dry = dry_run_config(config, DryRunOptions(home=tmp_path))
    config_file = _write_config(dry, tmp_path / "config.json")
    run, logs = tmp_path / "one-process", tmp_path / "logs"
    run.mkdir()
    logs.mkdir()
    shown = parse_run_args(
        method_class.config_class, ["--config", str(config_file), "--output-dir", str(run)]
    )
    plan = shown.config.batch_plan(1)
    (logs / "one-process.log").write_text(
        "diffclip run in ...\n" + plan.describe(dry.loss_terms(plan)) + "\n"
    )
    RunDir(run).record_config(shown.config, Launch(1))  # as the run writes it
    ran = json.loads((run / "config.json").read_text())
    runner = _Runner(method_class, tmp_path, {})
    launched_on_two = ran | {"launch": {"processes": 2, "fsdp": False}}
    for changed, expected in ((ran, True), (ran | {"seed": 1}, False), (launched_on_two, False)):
        (run / "config.json").write_text(json.dumps(changed))
        assert runner.matches_print_config("one-process", config_file, 1) is expected
    (run / "config.json").write_text(json.dumps(ran))
    assert not runner.matches_print_config("one-process", config_file, 2)  # the log shows one process


def test_a_dry_run_refuses_a_folder_it_did_not_make_a_resume_and_a_launcher(tmp_path, capsys, monkeypatch):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text("{}")
    code = main(["train", "clue", "--config", "clue-r50", "--dry-run", "--output-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "is not a dry run's folder" in err and (tmp_path / "run" / "config.json").is_file()
    code = main(["train", "clue", "--config", "clue-r50", "--dry-run", "--resume", "--output-dir", "x"])
    assert code == 2 and "drop --resume" in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "2")
    code = main(["train", "clue", "--config", "clue-r50", "--dry-run", "--output-dir", str(tmp_path / "x")])
    assert code == 2 and "without torchrun" in capsys.readouterr().err


# -- end to end: the cheapest paper presets at their real size -----------------------------------------------


def test_the_load_back_takes_final_and_every_export(tmp_path):
    """DCR writes exports/vision-tower and exports/dcr-model beside final/, outside the report's outputs."""
    from hf_vrl.run.dry_run import _saved_folders

    for folder in ("final", "exports/dcr-model", "exports/vision-tower"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "config.json").write_text("{}")
    (tmp_path / "exports" / "figures").mkdir()  # no model
    (tmp_path / "report.json").write_text(json.dumps({"outputs": {"final": str(tmp_path / "final")}}))
    found = [path.relative_to(tmp_path).as_posix() for path in _saved_folders(tmp_path)]
    assert found == ["final", "exports/dcr-model", "exports/vision-tower"]


@pytest.mark.slow
def test_the_cheapest_paper_preset_dry_runs_at_its_real_size(tmp_path):
    """clue-r50, the cheapest paper preset by the dry runs' wall time (benchmarks/results/dry_runs.json: about
    9 minutes on the shared 2-core machine, the ViT-B/16 DiffCLIP and DiVE presets 17 to 22; the benchmark
    runs every preset)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_VRL_REAL_SIZE_HOME": str(tmp_path / "home")}
    out = tmp_path / "dry"
    command = [sys.executable, "-m", "hf_vrl.cli", "train", "clue", "--config", "clue-r50", "--dry-run"]
    done = subprocess.run([*command, "--output-dir", str(out)], env=env, capture_output=True, text=True)
    report = json.loads((out / "dry_run.json").read_text())
    assert done.returncode == 0 and report["passed"], (report.get("problems"), done.stdout[-2000:])
    assert report["models"]["model.backbone"]["parameters"] == {".": 25_557_032}  # ResNet-50
    assert report["models"]["model.text_encoder"]["parameters"] == {".": 149_620_737}  # CLIP ViT-B/16
    one = report["runs"]["one_process"]
    assert one["killed"]["returncode"] == -9 and one["killed_after_checkpoint"]
    assert one["matches_print_config"] and report["runs"]["2-processes"]["matches_print_config"]
    assert report["steps"]["one-process"]["train"]["steps"] == [1, 2]  # step 1 before the kill, 2 after
    assert report["steps"]["2-processes"]["train"]["steps"] == [1, 2]
    found = list(report["load_back"].values())  # final/ (remote code), exports/backbone (stock ResNetModel)
    assert [f["class"] for f in found] == ["CLUEModel", "ResNetModel"]
    assert report["prediction"]["micro_batch"] == 128  # the preset's
    prediction = report["prediction"]["stages"]["train"]
    assert prediction["predicted_gib"] > prediction["static_gib"] > 0


def test_the_probe_starts_a_run_through_the_run_package_not_the_cli(tmp_path):
    """`python -m hf_vrl.run.probe -- <method> ...` calls `hf_vrl.run.main`: the CLI (which imports the run
    package, which imports the dry run, which launches the probe) is never imported."""
    script = (
        "import sys\n"
        "from hf_vrl.run import probe\n"
        f"code = probe.main(['--record', {str(tmp_path / 'steps.jsonl')!r}, '--', 'dcr', '--print-config'])\n"
        "sys.exit(10 + code if 'hf_vrl.cli' in sys.modules else code)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["dcr"]["objective"] == "dcr"


def _absolute_paths(value) -> list[str]:
    """Every string (key or value) of a JSON tree that names an absolute folder of a machine."""
    if isinstance(value, dict):
        return [
            found for key, item in value.items() for found in _absolute_paths(key) + _absolute_paths(item)
        ]
    if isinstance(value, list):
        return [found for item in value for found in _absolute_paths(item)]
    return (
        [value]
        if isinstance(value, str) and re.search(r"(^|[\s\"'(])/(tmp|home|root|work|Users)/", value)
        else []
    )


def test_the_shared_dry_run_results_hold_no_folder_of_the_machine_that_made_them(tmp_path):
    """benchmarks/results/dry_runs.json, and what its writer keeps of a report (`portable`): run folders
    relative to the dry run's, the real-size folders under `<real-size home>`, in keys, values, messages."""
    results = json.loads((ROOT / "benchmarks" / "results" / "dry_runs.json").read_text())
    assert _absolute_paths(results) == []
    from hf_vrl.run.dry_run import portable

    out, home = tmp_path / "work" / "dcr-tiny", tmp_path / "real"
    report = {
        "models": {"model.clip": {"repo_id": "a/b", "folder": f"{home}/a--b"}},
        "load_back": {f"{out}/one-process/final": {"error": f"OSError: {out}/one-process/final/x missing"}},
        "problems": [f'load back: {{"{out}/one-process/final": 1}}'],
        "options": {"home": str(home), "steps": 2},
    }
    assert _absolute_paths(report) != []
    shared = portable(report, out, home)
    assert _absolute_paths(shared) == []
    assert shared["models"]["model.clip"]["folder"] == "<real-size home>/a--b"
    assert shared["load_back"] == {"one-process/final": {"error": "OSError: one-process/final/x missing"}}
    assert shared["options"] == {"home": "<real-size home>", "steps": 2}


def test_the_summary_says_why_a_dry_runs_cpu_steps_are_slow(tmp_path):
    """Each stage's CPU time beside its wall clock; one line each when other load shares the machine and when
    a bf16 preset runs on a CPU without native bf16; neither on a quiet machine that has it."""
    from hf_vrl.run.dry_run import summary

    steps = {"train": {"steps": [1, 2], "step_s": [48.7, 40.0], "cpu_s": [7.0, 6.9], "host_peak_gib": 1.3}}
    report = {
        "preset": "clue-r50", "method": "clue", "passed": True, "wall_s": 500.0, "problems": [],
        "steps": {"one-process": steps}, "runs": {}, "micro_batch": 2, "precision": "bf16",
        "machine": {"cores": 2, "load_average_at_start": [7.7, 7.1, 5.0], "native_bf16": False},
    }  # fmt: skip
    text = summary(report, tmp_path)
    assert "48.7, 40.0 s per step (7.0, 6.9 s of CPU) at micro-batch 2" in text
    assert "load average was 7.7 on 2 cores" in text and "no native bf16" in text
    quiet = report | {"machine": {"cores": 2, "load_average_at_start": [0.5, 0.4, 0.3], "native_bf16": True}}
    assert "load average" not in summary(quiet, tmp_path) and "bf16" not in summary(quiet, tmp_path)


def test_the_shared_results_give_every_paper_presets_dry_run_wall_time():
    results = json.loads((ROOT / "benchmarks" / "results" / "dry_runs.json").read_text())
    walls = results["dry_run_wall_s"]
    assert set(walls) == set(results["presets"]) == set(PAPER_MODELS)
    assert all(walls[name]["wall_s"] == results["presets"][name]["wall_s"] > 0 for name in walls)
