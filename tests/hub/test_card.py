"""Model cards built from real runs: metadata as the Hub expects it, the model-index from the run's
report.json, the hyperparameters from its config.json, no local paths; every method's template renders."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from huggingface_hub import ModelCard

import hf_vrl
from hf_vrl.hub import build_model_card, remote_code_transformers
from hf_vrl.hub.data_names import describe_dataset, describe_mmvp
from hf_vrl.hub.methods import METHOD_CARDS
from hf_vrl.hub.results import METRICS, PER_DATASET, TASK_NAMES, index_names


def _reload(card) -> ModelCard:
    """The card as the Hub reads README.md back (`ModelCard.load` of the saved file: YAML header parsed into
    card data)."""
    with tempfile.TemporaryDirectory() as folder:
        card.save(Path(folder) / "README.md")
        return ModelCard.load(Path(folder) / "README.md")


def _section_data(report, result) -> list[tuple[str, dict, str | None]]:
    """(section, data record, label column of the metric) of every report number `result` may be: the card's
    metrics under its model-index names, and each set of the sections scored on several (DiVE's ood /
    transfer), whose value it is."""
    after, found = report["after"], []
    for m in METRICS:
        if index_names(m) == (result.task_name, result.metric_name) and m.value(after) is not None:
            found.append((m.section, after[m.section].get("data"), m.labels))
    for section, (task_type, task_name) in PER_DATASET.items():
        if (TASK_NAMES[task_type], f"{task_name}: top-1 accuracy") == (result.task_name, result.metric_name):
            records = after.get(section, {}).get("data", {})
            found += [
                (section, records.get(name), None)
                for name, v in after[section].items()
                if v == result.metric_value
            ]
    return found


def _hub_data(section: str, record: dict) -> str | None:
    name = (describe_mmvp if section in ("mmvp", "pairs") else describe_dataset)(record["dataset"])
    return name.hub_id if name else None


def _index(card) -> dict[tuple[str, str], float]:
    return {(r.task_name, r.metric_name): r.metric_value for r in card.data.eval_results or []}


@pytest.mark.parametrize("run_name", ["diffclip_run", "dcr_run", "dive_run", "clue_run"])
def test_each_model_index_entry_is_the_data_its_report_section_records(request, run_name):
    """For every method: each entry's dataset (Hub id, split, label column as config, classes kept and sample
    limit as args) is the data the report says that number was measured on, never the run's default
    evaluation set; every number measured on unchanged Hub data is there; the rest only on the card's
    table."""
    run = request.getfixturevalue(run_name)
    report = json.loads((run / "report.json").read_text())
    card = _reload(build_model_card(run, "me/model"))
    entries = card.data.eval_results or []
    assert bool(entries) == (run_name != "clue_run")  # CLUE's run was scored on the shapes world only
    for result in entries:
        (section, record, labels), *others = _section_data(report, result)
        assert not others, result
        assert record is not None and "transform" not in record, result
        assert result.dataset_type == _hub_data(section, record)
        assert result.dataset_split == record.get("split")
        assert result.dataset_config == record.get("labels", labels)
        limits = {key: record[key] for key in ("classes", "limit", "drawn", "seed") if key in record}
        assert result.dataset_args == (limits or None)
    on_hub = {
        index_names(m)
        for m in METRICS
        if m.indexed and m.value(report["after"]) is not None
        and "transform" not in (record := report["after"][m.section].get("data", {"dataset": None}))
        and record["dataset"] and _hub_data(m.section, record)
        and not (m.captions and record.get("texts"))  # captions hf_vrl wrote are not the dataset's
    }  # fmt: skip
    assert on_hub <= set(_index(card))
    for m in METRICS:
        value = m.value(report["after"])
        if value is not None:
            assert m.format(value) in card.text
    assert card.data.model_name == ("model" if entries else None)


def test_dive_records_each_number_on_its_own_data(dive_run):
    """The issue's case: RSA measured on a local set stays off the index (not filed under the ID set); the ID
    zero-shot top-1 on 5 of 10 classes of a limited test split says so; the synthetic shifts are not
    Fashion-MNIST."""
    report = json.loads((dive_run / "report.json").read_text())
    config = json.loads((dive_run / "config.json").read_text())
    after = report["after"]
    assert after["rsa"]["data"]["dataset"] == config["dive"]["rsa_dataset"] == "shapes"
    assert after["rsa"]["data"]["n_samples"] == config["dive"]["rsa_limit"]
    entries = _reload(build_model_card(dive_run, "me/dive")).data.eval_results
    assert not [r for r in entries if r.metric_name.startswith("RSA")]
    zero_shot = next(r for r in entries if r.metric_name == "Zero-shot classification: top-1 accuracy")
    names = ["t-shirt/top", "pullover", "dress", "coat", "shirt"]  # classes 0, 2, 3, 4, 6
    assert (zero_shot.dataset_type, zero_shot.dataset_split) == ("zalando-datasets/fashion_mnist", "test")
    limit = config["eval"]["eval_limit"]
    assert zero_shot.dataset_args == {"classes": names, "limit": limit, "drawn": "seeded subset", "seed": 0}
    assert zero_shot.metric_value == round(after["zero_shot"]["top1"], 4)
    # the held-out classes: the same task, dataset and split as the ID entry, which the index's format would
    # file under the ID classes: the card's table and data table only
    held_out = after["transfer"]["data"]["held-out classes"]
    assert held_out["classes"] == ["trouser", "sandal", "sneaker", "bag", "ankle boot"]
    assert not [r for r in entries if r.metric_name.endswith("transfer datasets: top-1 accuracy")]
    text = build_model_card(dive_run, "me/dive").text
    assert "| transfer: held-out classes | Fashion-MNIST (test split; 5 classes: trouser, sandal" in text
    assert {name for name, record in after["ood"]["data"].items() if "transform" in record} == set(
        config["dive"]["ood_shifts"]
    )
    assert not [r for r in entries if "distribution shifts" in r.metric_name]


def test_diffclip_card(diffclip_run):
    config = json.loads((diffclip_run / "config.json").read_text())
    report = json.loads((diffclip_run / "report.json").read_text())
    card = build_model_card(diffclip_run, "me/diffclip-tiny")
    data, text = card.data, card.text
    assert (data.library_name, data.pipeline_tag, data.license) == (
        "transformers", "zero-shot-image-classification", "apache-2.0",
    )  # fmt: skip
    assert data.base_model is None and data.datasets is None  # from scratch, on the generated world
    assert {"hf_vrl", "diffclip", "custom_code"} <= set(data.tags)
    assert "DiffAttn(X) = (softmax(Q₁K₁ᵀ/√d) − λ · softmax(Q₂K₂ᵀ/√d)) V" in text
    assert 'AutoModel.from_pretrained("me/diffclip-tiny", trust_remote_code=True)' in text
    assert "on `transformers>=4.57,<6`, without hf_vrl" in text and "toy-world model" in text
    # hyperparameters from config.json, results from report.json
    batch = f"| batch | micro-batches of up to {config['optim']['batch_size']} per device (the loss over the"
    assert batch in text
    assert f"| learning rate | {config['optim']['learning_rate']:g} peak, cosine," in text
    top1 = [100 * report[stage]["zero_shot"]["top1"] for stage in ("before", "after")]
    assert f"| Zero-shot classification | top-1 accuracy | {top1[0]:.1f} % | {top1[1]:.1f} % |" in text
    assert "![figures/attention.png](figures/attention.png)" in text
    assert "`hf-vrl train diffclip --config run/config.json` repeats the run" in text


def test_the_supported_transformers_versions_are_read_from_the_package(monkeypatch):
    from hf_vrl.models.diffclip import configuration_diffclip

    assert remote_code_transformers() == ">=4.57,<6"  # the models' MINIMUM_TRANSFORMERS, hf_vrl's <6
    monkeypatch.setattr(configuration_diffclip, "MINIMUM_TRANSFORMERS", (5, 2))
    assert remote_code_transformers() == ">=5.2,<6"


@pytest.mark.parametrize("run_name", ["diffclip_run", "dcr_run"])
def test_the_card_renders_to_html_with_its_tables(request, run_name):
    """Broken Markdown tables (a stray `|`, a missing separator row) render as paragraphs, not tables."""
    markdown = pytest.importorskip("markdown")
    text = build_model_card(request.getfixturevalue(run_name), "me/model").text
    # the Hub (CommonMark) renders Markdown between <details> lines; python-markdown leaves it raw: drop them
    html = markdown.markdown(
        re.sub(r"^</?(details|summary)>.*$", "", text, flags=re.M), extensions=["tables", "fenced_code"]
    )
    tables = re.findall(r"^\|.*\|$\n\|[ :|-]+\|$", text, re.M)  # header + separator: one per table
    assert len(tables) >= 3 and html.count("<table>") == len(tables)
    assert "|" not in re.sub(r"<table>.*?</table>|<pre>.*?</pre>|<code>.*?</code>", "", html, flags=re.S)


def test_dcr_cards(dcr_run):
    config = json.loads((dcr_run / "config.json").read_text())
    report = json.loads((dcr_run / "report.json").read_text())
    final = build_model_card(dcr_run, "me/dcr")
    assert "custom_code" not in final.data.tags and "trust_remote_code" not in final.text
    assert 'model = CLIPModel.from_pretrained("me/dcr")' in final.text
    assert f"projector h_ω trained for {config['dcr']['stage1_steps']} steps" in final.text
    assert f"LoRA adapters (rank {config['dcr']['lora_r']}, α {config['dcr']['lora_alpha']})" in final.text
    pairs = [100 * report[stage]["mmvp"]["accuracy"] for stage in ("before", "after")]
    assert f"| MMVP pairs | pair accuracy | {pairs[0]:.1f} % | {pairs[1]:.1f} % |" in final.text
    tower = build_model_card(dcr_run, "me/dcr-tower", what="vision-tower")
    assert tower.data.pipeline_tag == "image-feature-extraction"
    assert 'model = CLIPVisionModel.from_pretrained("me/dcr-tower")' in tower.text
    dcr_model = build_model_card(dcr_run, "me/dcr-model", what="dcr-model")
    assert 'AutoModel.from_pretrained("me/dcr-model", trust_remote_code=True)' in dcr_model.text
    assert ".image_embeds" in dcr_model.text and "custom_code" in dcr_model.data.tags


@pytest.mark.parametrize("run_name", ["diffclip_run", "dcr_run"])
def test_local_paths_never_reach_the_card(request, run_name):
    run = request.getfixturevalue(run_name)
    text = str(build_model_card(run, "me/model"))
    assert str(run.parent) not in text and "/tmp" not in text
    if run_name == "dcr_run":  # the base CLIP and the diffusion model were local folders: named, not located
        assert "a local checkpoint (`clip`)" in text and "| `dcr.diffusion` | …/sd |" in text
        assert "repeats the run once its local paths (shortened to `…/<name>`) point to your copies" in text


@pytest.mark.parametrize(
    ("base", "license"),
    [("openai/clip-vit-large-patch14", "mit"), ("facebook/metaclip-b32-400m", "cc-by-nc-4.0")],
)
def test_a_hub_base_model_goes_into_the_metadata_with_its_license(dcr_run, tmp_path, base, license):
    run = shutil.copytree(dcr_run, tmp_path / "run", ignore=shutil.ignore_patterns("checkpoints", "inputs"))
    config = json.loads((run / "config.json").read_text())
    config["model"]["clip"] = base
    (run / "config.json").write_text(json.dumps(config))
    card = _reload(build_model_card(run, "me/dcr"))
    assert (card.data.base_model, card.data.license) == (base, license)
    assert f"from [`{base}`](https://huggingface.co/{base})" in card.text


def test_a_clip_baseline_without_evaluation(tmp_path):
    """`--arch clip`: the card says it is the baseline; a run that evaluated nothing has no model-index."""
    out = tmp_path / "clip"
    hf_vrl.train(
        "diffclip", arch="clip", output_dir=str(out), max_steps=1, train_limit=8, batch_size=8,
        eval_before=False, eval_after=False, figures=False,
    )  # fmt: skip
    card = _reload(build_model_card(out, "me/clip-baseline"))
    assert (
        "The **CLIP baseline** of [DiffCLIP]" in card.text
        and "| differential attention | no | no |" in card.text
    )
    assert card.data.eval_results is None and "The run did not evaluate the model." in card.text
    assert "model_name" not in card.data.to_dict() and "\nmodel_name:" not in str(card)  # no Hub field


@pytest.mark.parametrize("run_name", ["diffclip_run", "dcr_run", "dive_run", "clue_run"])
def test_cards_have_the_sections_of_the_hubs_template_from_the_run(request, run_name):
    """Intended uses and out-of-scope use, limitations (toy data, a miniature's budget) and training compute
    (per stage: optimiser steps, time, hardware) as the report records them."""
    run = request.getfixturevalue(run_name)
    report = json.loads((run / "report.json").read_text())
    text = build_model_card(run, "me/model").text
    headings = re.findall(r"^#+ (.+)$", text, flags=re.M)
    assert headings.index("Uses") < headings.index("How to use") < headings.index("Training compute")
    assert headings.index("Training compute") < headings.index("Evaluation") < headings.index("Limitations")
    assert "Out of scope:" in text and "- Decisions about people" in text
    stages = report["train"]["stages"]
    for name, stage in stages.items():
        assert stage["hardware"].startswith("CPU (")  # recorded at training time
        assert f"| {name} | {stage['steps']} | " in text and f" | {stage['hardware']} |" in text
    assert "- Toy data: a miniature of the paper's experiment" in text  # every fixture trains on toy data
    assert f"- Its training budget: {report['train']['steps']} optimiser steps" in text


@pytest.mark.parametrize("run_name", ["diffclip_run", "dcr_run", "dive_run", "clue_run"])
def test_every_method_card_renders_for_each_model_of_its_run(request, run_name):
    """A real tiny run of each method: every model it exports gets a complete card with its results."""
    run = request.getfixturevalue(run_name)
    method = json.loads((run / "config.json").read_text())["method"]
    assert method in METHOD_CARDS
    results = _index(_reload(build_model_card(run, "me/model")))  # the run's (test above)
    exports = sorted(p.name for p in (run / "exports").iterdir()) if (run / "exports").is_dir() else []
    for what in ("final", *exports):
        card = _reload(build_model_card(run, "me/model", what=what))
        assert method in card.data.tags and card.data.library_name == "transformers"
        assert card.data.license == "apache-2.0" and card.data.pipeline_tag
        assert _index(card) == results
        assert not re.search(r"{{|{%|None\b|Undefined", card.text), card.text
        assert card.text.startswith("\n# model\n")
