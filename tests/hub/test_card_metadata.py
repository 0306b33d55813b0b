"""Card metadata the Hub reads: the zero-shot widget of CLIP-like models, `base_model` of a CLUE run started
from a Hub backbone, `datasets` naming training data only (DCR's MMVP pairs are evaluation data), and no
empty "Scoring:" line."""

from __future__ import annotations

import json
import shutil

from hf_vrl.hub import build_model_card


def test_clip_like_cards_carry_a_zero_shot_widget_and_vision_cards_none(diffclip_run, dcr_run, clue_run):
    for run in (diffclip_run, dcr_run):
        widget = getattr(build_model_card(run, "me/model").data, "widget", None)
        assert widget and widget[0]["src"].startswith("https://") and "," in widget[0]["candidate_labels"]
    assert getattr(build_model_card(clue_run, "me/model").data, "widget", None) is None
    assert getattr(build_model_card(dcr_run, "me/model", what="vision-tower").data, "widget", None) is None


def test_a_clue_run_from_a_hub_backbone_names_it_as_base_model(clue_run, tmp_path):
    run = shutil.copytree(clue_run, tmp_path / "run", ignore=shutil.ignore_patterns("checkpoints"))
    config = json.loads((run / "config.json").read_text())
    config["model"]["backbone"] = "microsoft/resnet-50"
    (run / "config.json").write_text(json.dumps(config))
    card = build_model_card(run, "me/clue")
    assert card.data.base_model == "microsoft/resnet-50"
    assert "[`microsoft/resnet-50`](https://huggingface.co/microsoft/resnet-50)" in card.text


def test_evaluation_data_is_not_listed_as_training_data(dcr_run, tmp_path):
    run = shutil.copytree(dcr_run, tmp_path / "run", ignore=shutil.ignore_patterns("checkpoints"))
    config, report = (json.loads((run / name).read_text()) for name in ("config.json", "report.json"))
    config["dcr"]["mmvp"] = str(tmp_path / "MMVP_VLM")  # the official benchmark, scored after training
    for section in ("mmvp", "pairs"):
        report["after"][section]["data"] = {"dataset": config["dcr"]["mmvp"], "n_samples": 150}
    (run / "config.json").write_text(json.dumps(config))
    (run / "report.json").write_text(json.dumps(report))
    card = build_model_card(run, "me/dcr")
    assert "MMVP/MMVP_VLM" not in (card.data.datasets or [])
    assert "MMVP/MMVP_VLM" in {r.dataset_type for r in card.data.eval_results}


def test_no_card_has_an_empty_scoring_line(diffclip_run, dcr_run, dive_run, clue_run):
    for run in (diffclip_run, dcr_run, dive_run, clue_run):
        assert "Scoring: ." not in build_model_card(run, "me/model").text


def test_dive_names_its_zero_shot_score_in_distribution(dive_run):
    text = build_model_card(dive_run, "me/dive").text
    assert "Zero-shot classification is in-distribution\naccuracy" in text


def test_every_card_of_every_run_follows_the_model_index_spec(diffclip_run, dcr_run, dive_run, clue_run):
    from huggingface_hub import ModelCard
    from transformers.pipelines import SUPPORTED_TASKS

    from hf_vrl.hub.data_names import is_hub_id
    from hf_vrl.hub.results import HUB_METRICS

    for run in (diffclip_run, dcr_run, dive_run, clue_run):
        card = build_model_card(run, "me/model")
        loaded = ModelCard(str(card)).data
        assert loaded.pipeline_tag in SUPPORTED_TASKS
        for result in loaded.eval_results or []:
            assert result.task_type in SUPPORTED_TASKS, result.task_type
            assert result.metric_type in HUB_METRICS
            assert is_hub_id(result.dataset_type), result.dataset_type
