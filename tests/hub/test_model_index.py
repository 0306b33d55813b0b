"""The model-index a card records, checked against the model card spec and read back: every headline number
of a report (CLUE's linear probe top-1 and image-image retrieval, DiVE's distribution-shift and transfer
sets, DCR's image pairs) measured on Hub data with a Hub metric survives report -> card -> `ModelCard.load`
with its value, its meaning and the data its report section records; the rest stays on the card's table."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from huggingface_hub import ModelCard, ModelCardData
from transformers.pipelines import SUPPORTED_TASKS

from hf_vrl.hub.data_names import is_hub_id
from hf_vrl.hub.results import HUB_METRICS, METRICS, data_table, eval_results, results_table

HUB = {"dataset": "hf:me/shapes-captions", "split": "test", "n_samples": 40}  # evaluation data on the Hub
LOCAL = {"dataset": "shapes", "split": "test", "n_samples": 40}
MMVP = {"dataset": "/data/MMVP_VLM", "n_samples": 150}  # the official benchmark's folder


def _reports(data: dict, mmvp: dict) -> dict:
    """A report section of each method, every section recording `data` (MMVP sections `mmvp`); DiVE's sets
    their own: Fashion-MNIST (on the Hub), digits and animal_mnist (not)."""
    fashion = {"dataset": "fashion_mnist", "split": "test", "n_samples": 20}
    sets = {"fashion_mnist": fashion, "digits": {**fashion, "dataset": "digits"}}
    return {
        "clue": {
            "linear_probe": {"top1": 0.8125, "C": 1.0, "data": data},
            "retrieval": {"i2i_R@1": 0.5, "i2i_R@5": 0.875, "data": data},
            "granularity": {"ncc_fine": 0.75, "ncc_coarse": 0.9, "cdnv_all": 0.12, "data": data},
        },
        "dive": {
            "zero_shot": {"top1": 0.61, "data": data},
            "ood": {"top1": 0.4, "fashion_mnist": 0.3, "digits": 0.5, "data": sets},
            "transfer": {"top1": 0.25, "animal_mnist": 0.25, "data": {"animal_mnist": LOCAL}},
            "rsa": {"image": 0.8, "text": 0.7, "data": data},
        },
        "dcr": {
            "clustering": {"nmi": 0.3, "acc": 0.4, "ari": 0.2, "data": data},
            "pairs": {"accuracy": 0.6, "statement_accuracy": 0.7, "protocol": "pairs", "data": mmvp},
            "mmvp": {"accuracy": 0.2, "statement_accuracy": 0.55, "protocol": "MMVP-VLM", "data": mmvp},
        },
        "diffclip": {
            "zero_shot": {"top1": 0.5, "top5": 0.9, "mean_per_class_recall": 0.45, "data": data},
            "retrieval": {"i2t_R@1": 0.1, "i2t_R@5": 0.3, "t2i_R@1": 0.2, "t2i_R@5": 0.4, "data": data},
        },
    }


REPORTS = _reports(HUB, MMVP)
NO_HUB_METRIC = {"nmi", "ari", "cdnv_all"}  # report keys whose metric has no Hub id: card table only


def _round_trip(report: dict) -> list:
    results = eval_results({"after": report})
    data = ModelCardData(model_name="model", eval_results=results or None)
    card = ModelCard.from_template(data, template_str="---\n{{ card_data }}\n---\n# model\n")
    with tempfile.TemporaryDirectory() as folder:
        card.save(Path(folder) / "README.md")
        return ModelCard.load(Path(folder) / "README.md").data.eval_results or []


@pytest.mark.parametrize("method", sorted(REPORTS))
def test_every_headline_number_on_hub_data_survives_the_round_trip(method):
    report = REPORTS[method]
    loaded = _round_trip(report)
    values = sorted(r.metric_value for r in loaded)
    on_hub = {"fashion_mnist"}  # DiVE's per-set numbers: only the sets on the Hub are indexed
    expected = [
        value
        for section, numbers in report.items()
        for key, value in numbers.items()
        if isinstance(value, float)
        and key not in {"C", *NO_HUB_METRIC}
        and (section not in ("ood", "transfer") or key in on_hub)
    ]
    assert values == sorted(expected)
    names = [(r.task_name, r.metric_name, r.dataset_type) for r in loaded]
    assert len(set(names)) == len(names)  # no two numbers under one name


@pytest.mark.parametrize("method", sorted(REPORTS))
def test_the_model_index_follows_the_spec(method):
    """Task types are Hub task ids, dataset types Hub dataset ids, metric types Hub metric ids."""
    for result in _round_trip(REPORTS[method]):
        assert result.task_type in SUPPORTED_TASKS, result.task_type
        assert result.metric_type in HUB_METRICS, result.metric_type
        assert is_hub_id(result.dataset_type) and result.dataset_name and result.task_name


@pytest.mark.parametrize("method", sorted(REPORTS))
def test_local_data_stays_out_of_the_index_and_on_the_card_table(method):
    report = _reports(LOCAL, {"dataset": "toy", "n_samples": 36})[method]
    indexed = _round_trip(report)
    assert {r.dataset_type for r in indexed} <= {"zalando-datasets/fashion_mnist"}  # DiVE's set on the Hub
    table = results_table({"after": report})
    for m in METRICS:
        if m.value(report) is not None:
            assert m.format(m.value(report)) in table


def test_dive_sets_and_dcr_pairs_are_recorded_on_their_own_data():
    dive = {(r.dataset_type, r.metric_value) for r in _round_trip(REPORTS["dive"])}
    assert ("zalando-datasets/fashion_mnist", 0.3) in dive
    assert not {"digits", "animal_mnist"} & {name for name, _ in dive}  # not on the Hub
    dcr = {r.metric_value: r.dataset_type for r in _round_trip(REPORTS["dcr"])}
    assert dcr[0.6] == dcr[0.7] == "MMVP/MMVP_VLM" and dcr[0.4] == "me/shapes-captions"
    assert 0.3 not in dcr  # NMI has no Hub metric id


def test_recall_at_k_and_top_k_say_which_k():
    by_key = {(m.section, m.key): m for m in METRICS}
    assert by_key["retrieval", "i2t_R@5"].metric_config == "k=5"
    assert by_key["zero_shot", "top5"].metric_config == "top_k=5"
    loaded = {r.metric_name: r.metric_config for r in _round_trip(REPORTS["diffclip"])}
    assert loaded["Image-text retrieval: image→text R@5"] == "k=5"


def test_a_number_is_indexed_only_with_the_data_its_section_records():
    """No record: the card's table only (never the run's default evaluation set); a record's split, label
    column, classes kept and sample limit go into the entry; transformed images are not the dataset."""
    subset = {**HUB, "classes": ["circle", "square"], "limit": 600, "seed": 0, "labels": "fine_label"}
    report = {
        "zero_shot": {"top1": 0.5, "data": subset},
        "retrieval": {"i2t_R@1": 0.1},  # recorded no data
        "clustering": {"acc": 0.4, "data": {**HUB, "transform": "inverted"}},
    }
    (entry,) = _round_trip(report)
    assert (entry.metric_value, entry.dataset_type, entry.dataset_split) == (
        0.5,
        "me/shapes-captions",
        "test",
    )
    assert entry.dataset_config == "fine_label"
    assert entry.dataset_args == {"classes": ["circle", "square"], "limit": 600, "seed": 0}
    assert entry.dataset_name == "me/shapes-captions"


def test_two_subsets_of_one_split_for_one_task_keep_only_the_first_in_the_index():
    """The model-index writes one dataset per (task, dataset, config, split): DiVE's held-out classes beside
    its fine-tuning classes of the same test split would be filed under the latter, so they stay on the
    table."""
    fashion = {"dataset": "fashion_mnist", "split": "test", "n_samples": 20, "limit": 40, "seed": 0}
    report = {
        "zero_shot": {"top1": 0.61, "data": {**fashion, "classes": ["dress", "coat"]}},
        "transfer": {"held-out classes": 0.2, "data": {"held-out classes": {**fashion, "classes": ["bag"]}}},
    }
    loaded = _round_trip(report)
    assert [(r.metric_value, r.dataset_args["classes"]) for r in loaded] == [(0.61, ["dress", "coat"])]
    assert "held-out classes" in data_table({"after": report})
