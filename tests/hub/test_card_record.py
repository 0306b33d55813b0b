"""Cards say only what ran: every number a card prints is read from the run's record (`report.json`: the steps
each stage and each in-run pre-training really ran, the data each number was measured on and how its samples
were drawn), a claim about an effect comes with the measured before → after or says "not shown in this run",
and no folder hf_vrl writes keeps a machine-local value."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from test_push_model_folder import _clip_folder

import hf_vrl
from hf_vrl import cli
from hf_vrl.data.registry import how_drawn
from hf_vrl.eval_inputs import data_record
from hf_vrl.hub import build_model_card
from hf_vrl.hub.record import NOT_SHOWN, effect
from hf_vrl.hub.results import METRICS, data_table, eval_results, samples_text
from hf_vrl.run.report import log_evaluation, metric_numbers
from hf_vrl.trainer import VRLTrainingArguments


@pytest.fixture(scope="module")
def dcr_limited(tmp_path_factory) -> Path:
    """dcr-tiny (a toy CLIP of 150 steps, a tiny diffusion model of 200, stages of 100) under --step-limit 3,
    stage 1 set to 2 steps, on a seeded subset of the training rows, logged to TensorBoard."""
    out = tmp_path_factory.mktemp("dcr-limited") / "run"
    hf_vrl.train(
        "dcr", output_dir=str(out), step_limit=3, stage1_steps=2, train_limit=48, eval_limit=40, batch_size=4,
        report_to=["tensorboard"], logging_steps=1,
    )  # fmt: skip
    return out


@pytest.fixture(scope="module")
def clue_limited(tmp_path_factory) -> Path:
    """clue-tiny (a backbone first trained on shape labels, a toy text encoder) under --step-limit 2."""
    out = tmp_path_factory.mktemp("clue-limited") / "run"
    hf_vrl.train(
        "clue", output_dir=str(out), step_limit=2, train_limit=48, batch_size=16, eval_limit=32,
        part_map_images=2,
    )  # fmt: skip
    return out


def _report(run: Path) -> dict:
    return json.loads((run / "report.json").read_text())


def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.:;])\s+|\n", text) if s.strip()]


def test_the_card_of_a_step_limited_run_says_the_numbers_its_record_holds(dcr_limited):
    """The issue's done-when: `--step-limit`, in-run pre-training and a subset; each sentence that gives a
    count of steps, samples or pairs, or a before → after, gives the record's."""
    report, config = _report(dcr_limited), json.loads((dcr_limited / "config.json").read_text())
    text = build_model_card(dcr_limited, "me/dcr").text
    stages, inputs, train = report["train"]["stages"], report["inputs"], report["train"]
    assert {name: s["steps"] for name, s in stages.items()} == {"stage1": 2, "stage2": 3}
    assert {name: r["steps"] for name, r in inputs.items()} == {"base-clip": 3, "tiny-sd": 3}
    assert config["model"]["clip_pretrain_steps"] == 150 and config["dcr"]["stage1_steps"] == 2
    assert re.search(r"h_ω trained for (\d+) steps", text)[1] == str(stages["stage1"]["steps"])
    assert re.search(r"on the encoder for (\d+) steps", text)[1] == str(stages["stage2"]["steps"])
    assert re.search(r"first trained there itself \((\d+) steps", text)[1] == str(
        inputs["base-clip"]["steps"]
    )
    for name, record in inputs.items():
        bullet = re.search(rf"- `{name}`: .*?, trained for (\d+) steps with (.*)", text)
        assert bullet[1] == str(record["steps"]) and record["labels"] in bullet[2]
        row = re.search(rf"\| in-run pre-training: {name} \| (\d+) \|", text)
        assert row[1] == str(record["steps"])  # training compute holds the pre-trainings
    for name, stage in stages.items():
        assert re.search(rf"\| {name} \| (\d+) \|", text)[1] == str(stage["steps"])
    recorded_steps = {str(s["steps"]) for s in stages.values()} | {str(r["steps"]) for r in inputs.values()}
    recorded_steps |= {str(train["steps"]), str(sum(r["steps"] for r in inputs.values()))}  # the totals
    for sentence in _sentences(text):  # no step count the run did not run (150, 200, 100 are configured)
        for count in re.findall(r"(?<![\w.=])(\d+) steps", sentence):
            assert count in recorded_steps or "warm-up" in sentence, sentence
    assert (
        "| step limit | --step-limit 3: every training loop (stages and in-run pre-trainings) ran at most 3"
        in text
    )
    budget = re.search(r"Its training budget: (\d+) optimiser steps.*?pre-trainings of (\d+) steps", text)
    assert budget.groups() == (str(train["steps"]), str(sum(r["steps"] for r in inputs.values())))
    # the data: the training rows and how they were drawn; the pairs the P-ability was scored on
    data = train["data"]
    assert data["n_samples"] == 48 and data["drawn"] == "generated"
    assert f"(train split, {data['n_samples']} samples, generated (seed 0))" in text
    assert not re.search(r"first [\d,]+ samples", text)
    pairs = report["after"]["pairs"]
    categories = len(pairs["per_category"])
    assert f"{pairs['n_pairs']} pairs in {categories} categories" in text
    assert f"steps of {100 / pairs['n_pairs']:.1f} points" in text and "150 pairs" not in text
    # every before → after the card prints is the record's
    before, after = report["before"], report["after"]
    checked = 0
    for m in METRICS:
        pattern = re.escape(f"{m.task_name}, {m.name}: ") + r"(-?[\d.]+ %) → (-?[\d.]+ %)"
        for first, last in re.findall(pattern, text):
            assert (first, last) == (m.format(m.value(before)), m.format(m.value(after)))
            checked += 1
    assert checked == len(re.findall(r"%\s*→", text)) == 3  # every before → after printed is checked


def test_a_claim_is_printed_only_with_the_before_and_after_that_support_it():
    """DCR's "better fine-grained perception" over pairs 60 → 60 and fine NMI 49.5 → 43.0: not shown."""
    flat = {"pairs": {"accuracy": 0.6}, "clustering_fine": {"nmi": 0.495}}
    worse = {"pairs": {"accuracy": 0.6}, "clustering_fine": {"nmi": 0.43}}
    metrics = [("pairs", "accuracy"), ("clustering_fine", "nmi")]
    said = effect({"before": flat, "after": worse}, "Better perception", metrics)
    assert said.startswith(f"Better perception: {NOT_SHOWN} (")
    assert "60.0 % → 60.0 %" in said and "49.5 % → 43.0 %" in said
    better = {"pairs": {"accuracy": 0.7}, "clustering_fine": {"nmi": 0.5}}
    said = effect({"before": flat, "after": better}, "Better perception", metrics)
    assert said.startswith("Better perception, as this run measured it (") and NOT_SHOWN not in said
    assert NOT_SHOWN in effect({"after": better}, "Better perception", metrics)


def test_the_dcr_card_makes_no_claim_its_numbers_do_not_show(dcr_limited):
    report = _report(dcr_limited)
    text = build_model_card(dcr_limited, "me/dcr").text
    claim = next(s for s in text.splitlines() if s.startswith("Better fine-grained perception"))
    rose = [
        report["after"][section][key] > report["before"][section][key]
        for section, key in (("pairs", "accuracy"), ("mmvp", "accuracy"), ("clustering_fine", "nmi"))
    ]
    assert (NOT_SHOWN in claim) == (not all(rose))
    assert "An image encoder with better fine-grained perception" not in text


def test_clue_says_its_backbone_first_learnt_from_labels(clue_limited):
    """CLUE's objective uses no labels, but the run's backbone was first trained on shape labels: the card
    says so, from the record, and does not call the model label-free."""
    report = _report(clue_limited)
    backbone = report["inputs"]["backbone"]
    assert backbone["labels"].startswith("shape labels") and backbone["steps"] == 2
    assert report["inputs"]["text_encoder"]["labels"] == "captions"
    text = build_model_card(clue_limited, "me/clue").text
    assert "(no labels)" not in text
    assert "The model as a\nwhole is not label-free: the run first trained `backbone` on shape labels" in text
    assert re.search(r"\| in-run pre-training: backbone \| 2 \|", text)
    assert re.search(r"\| in-run pre-training: text_encoder \| 2 \|", text)


def _json_values(folder: Path):
    for path in folder.rglob("*.json"):
        yield path, json.loads(path.read_text())


def _local_values(value, found=None, key=None):
    found = [] if found is None else found
    if isinstance(value, dict):
        for k, v in value.items():
            _local_values(v, found, k)
    elif isinstance(value, list):
        for v in value:
            _local_values(v, found, key)
    elif key in ("is_local", "local_files_only", "cache_dir") or (
        key in ("_name_or_path", "name_or_path")
        and isinstance(value, str)
        and ("/" in value or "\\" in value)
    ):
        found.append((key, value))
    return found


def test_no_folder_a_run_writes_keeps_a_machine_local_value(dcr_limited, clue_limited):
    """final/ and exports/: no `is_local` / `local_files_only` in tokenizer_config.json, no
    `_name_or_path: runs/clue/inputs/backbone`."""
    for run in (dcr_limited, clue_limited):
        folders = [run / "final", *(p for p in (run / "exports").iterdir() if p.is_dir())]
        assert (run / "final" / "config.json").is_file()
        for folder in folders:
            for path, data in _json_values(folder):
                assert not _local_values(data), (path, _local_values(data))
                assert str(run) not in path.read_text(), path
    assert (dcr_limited / "final" / "tokenizer_config.json").is_file()


def test_a_converted_folder_has_the_cards_sections_and_nothing_machine_local(tmp_path):
    clip = _clip_folder(tmp_path / "clip")
    out = tmp_path / "diffclip"
    argv = ["convert", "diffclip", "--clip", str(clip), "--output", str(out), "--calibration", "synthetic"]
    assert cli.main(argv) == 0
    for path, data in _json_values(out):
        assert not _local_values(data), path
        assert str(tmp_path) not in path.read_text(), path
    text = build_model_card(out, "me/converted").text
    for heading in ("## Uses", "Out of scope:", "## How to use", "## Training compute", "## Limitations"):
        assert heading in text
    assert "no optimiser step" in text and "not a trained DiffCLIP" in text


def test_how_samples_were_drawn_is_recorded():
    """A seeded random subset, a generated set and the first rows of a stream are told apart; a limit larger
    than the split is the whole split."""
    assert how_drawn("fashion_mnist", 500, 500) == "seeded subset"
    assert how_drawn("fashion_mnist", 10000, None) == "whole split"
    assert how_drawn("digits", 360, 500) == "whole split"
    assert how_drawn("shapes", 50, 50) == "generated"
    assert how_drawn("csv:/data/pairs/*.csv", 100, 100) == "stream start"
    assert how_drawn("cc3m:/data/cc3m", 100, 100) == "stream start"
    rows = list(range(20))
    record = data_record("fashion_mnist", "test", rows, limit=20, seed=3)
    assert (record["drawn"], record["seed"], record["texts"]) == ("seeded subset", 3, "templates")
    streamed = data_record("parquet:/data/x/*.parquet", "train", rows, limit=20, seed=3)
    assert streamed["drawn"] == "stream start" and "seed" not in streamed


def test_a_streamed_evaluation_is_carded_as_the_first_rows():
    """The card's data table says "the first rows of the stream" for a stream's record and "a seeded random
    subset" for a map-style one, never "first N samples" of a subset."""
    stream = {"dataset": "csv:/d/*.csv", "n_samples": 9, "drawn": "stream start", "limit": 9}
    subset = {
        "dataset": "fashion_mnist",
        "split": "test",
        "n_samples": 9,
        "drawn": "seeded subset",
        "seed": 0,
    }
    report = {
        "after": {"clustering": {"nmi": 0.1, "data": stream}, "linear_probe": {"top1": 0.5, "data": subset}}
    }
    table = data_table(report)
    assert "9 samples, the first rows of the stream, in its order" in table
    assert "9 samples, a seeded random subset (seed 0)" in table
    shuffled = {"drawn": "shuffled stream start", "limit": 64, "shuffle_buffer": 1000, "seed": 1}
    assert (
        samples_text(shuffled)
        == "64 samples, the first rows of the stream through a shuffle buffer of 1000 (seed 1)"
    )


def test_retrieval_on_captions_hf_vrl_wrote_is_not_filed_under_the_dataset(diffclip_run):
    """Fashion-MNIST has no captions: retrieval scored on hf_vrl's template captions stays off the
    model-index (zero-shot on its class names stays in); retrieval on a Hub set's own captions is indexed."""
    report = _report(diffclip_run)
    assert report["after"]["retrieval"]["data"]["texts"] == "templates"
    names = {(r.dataset_type, r.metric_name) for r in eval_results(report)}
    assert not [n for n in names if "retrieval" in n[1].lower()]
    assert any("Zero-shot" in metric for _, metric in names)
    own = {"dataset": "hf:me/captioned", "split": "test", "n_samples": 9}
    indexed = eval_results({"after": {"retrieval": {"i2t_R@1": 0.5, "data": own}}})
    assert [r.dataset_type for r in indexed] == ["me/captioned"]


def test_dcr_logs_before_and_after_under_one_tag_in_one_folder(dcr_limited):
    """Before at step 0 and after at the last step, both in the last stage's folder under `eval/...`; the
    first stage's folder holds none."""
    report = _report(dcr_limited)
    logs = dcr_limited / "logs" / "tensorboard"
    events = EventAccumulator(str(logs / "stage2"))
    events.Reload()
    scalars = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    after = metric_numbers(report["after"])
    last = report["train"]["stages"]["stage2"]["steps"]
    for name in ("pairs.accuracy", "clustering_fine.nmi"):
        assert [step for step, _ in scalars[f"eval/{name}"]] == [0, last]
        assert scalars[f"eval/{name}"][-1][1] == pytest.approx(after[name])
    first = EventAccumulator(str(logs / "stage1"))
    first.Reload()
    assert not [tag for tag in first.Tags()["scalars"] if tag.startswith("eval/")]


def test_logger_tags_have_no_spaces(tmp_path):
    """DiVE's `transfer.held-out classes` reaches TensorBoard as `eval/transfer.held-out_classes`."""
    args = VRLTrainingArguments(
        output_dir=str(tmp_path / "out"),
        report_to=["tensorboard"],
        logging_dir=str(tmp_path / "tb"),
        use_cpu=True,
    )
    numbers = {"transfer": {"held-out classes": 0.5, "top1": 0.4}}
    log_evaluation({"before": numbers, "after": numbers}, args, 3)
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert "eval/transfer.held-out_classes" in tags and not [t for t in tags if " " in t]


def _saved(folder: Path, captions: bool) -> str:
    from datasets import ClassLabel, Dataset, Features, Value
    from datasets import Image as ImageFeature
    from PIL import Image

    columns = {"image": [Image.new("RGB", (8, 8), (40 * i, 0, 0)) for i in range(4)], "label": [0, 1, 0, 1]}
    features = {"image": ImageFeature(), "label": ClassLabel(names=["cat", "dog"])}
    if captions:
        columns["caption"], features["caption"] = ["a cat", "a dog", "one cat", "one dog"], Value("string")
    Dataset.from_dict(columns, features=Features(features)).save_to_disk(str(folder))
    return f"hf:{folder}"


@pytest.mark.parametrize("streaming", [False, True])
def test_captions_hf_vrl_wrote_for_a_set_without_any_are_recorded(tmp_path, streaming):
    """A Hub-format set with labels and no caption column gets hf_vrl's class-name captions: its records say
    so (`texts`), so its image-text retrieval never reaches the model-index; a set with captions does not."""
    from hf_vrl.data.registry import load_dataset_by_name
    from hf_vrl.run.data import materialise

    for captions, texts in ((False, "templates"), (True, None)):
        name = _saved(tmp_path / f"set-{captions}", captions)
        rows = materialise(load_dataset_by_name(name, split="train", streaming=streaming), 4, "evaluation")
        assert data_record(name, "train", rows).get("texts") == texts
