"""`hf-vrl push` of a model folder hf_vrl saved outside a run: `hf-vrl convert diffclip` -> push (the
autospec'd Hub) -> every loading line of the card, the zero-shot pipeline and AutoProcessor run where hf_vrl
cannot be imported; the card tells what was converted, how close it came, and (released checkpoints) the
authors' figures, marked as theirs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from test_load_back import RUN_LINES, run_in_fresh_process
from transformers import AutoTokenizer, CLIPImageProcessorPil

from hf_vrl import cli
from hf_vrl.errors import UserError
from hf_vrl.hub import publish
from hf_vrl.methods.dcr.toy import tiny_clip
from hf_vrl.presets import preset_path


def _clip_folder(path):
    tokenizer = AutoTokenizer.from_pretrained(preset_path("tiny-clip"))
    tiny_clip(image_size=16, vocab_size=len(tokenizer)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    CLIPImageProcessorPil(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16}).save_pretrained(
        path
    )
    return path


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("convert")
    clip = _clip_folder(root / "clip")
    out = root / "diffclip"
    argv = ["convert", "diffclip", "--clip", str(clip), "--output", str(out), "--calibration", "synthetic"]
    assert cli.main(argv) == 0
    return out


def test_convert_records_what_it_converted(converted):
    record = json.loads((converted / "conversion.json").read_text())
    assert record["method"] == "diffclip" and record["source"]["kind"] == "transformers CLIP"
    assert record["base_model"] is None  # a local CLIP: no Hub id to name
    closeness = record["closeness"]
    assert 0.5 < closeness["image_cosine"] <= 1.0 and closeness["calibration"].startswith("synthetic inputs")


def test_a_converted_model_is_pushed_and_loads_back_without_hf_vrl(
    converted, hub, hub_client, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    assert cli.main(["push", str(converted), "me/diffclip-converted"]) == 0
    assert "uploaded to me/diffclip-converted" in capsys.readouterr().out
    repo = hub.repo("me/diffclip-converted")
    assert {"model.safetensors", "modeling_diffclip.py", "conversion.json", "README.md"} <= hub.files(
        "me/diffclip-converted"
    )
    assert str(converted.parent) not in (repo / "conversion.json").read_text()  # no local path goes up
    card = ModelCard.load(repo / "README.md")
    record = json.loads((converted / "conversion.json").read_text())
    assert f"{record['closeness']['image_cosine']:.3f}" in card.text
    assert "## Results reported by the authors" not in card.text  # a CLIP conversion has none
    assert card.data.pipeline_tag == "zero-shot-image-classification" and "custom_code" in card.data.tags
    assert "@article{hammoud2025diffclip" in card.text

    repos = json.dumps({"me/diffclip-converted": str(repo)})
    done = run_in_fresh_process(RUN_LINES, [repos, "me/diffclip-converted"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "lines.json").read_text())
    assert results["hf_vrl imported"] is False
    loaded = sorted(results["lines"].values())  # the image processor on whichever backend is installed
    assert loaded[0] in ("CLIPImageProcessor", "CLIPImageProcessorPil") and loaded[1:] == [
        "CLIPTokenizer",
        "DiffCLIPModel",
    ]
    assert results["pipeline"]["model"] == "DiffCLIPModel" and results["processor"] == "CLIPProcessor"
    assert sum(score["score"] for score in results["pipeline"]["scores"]) == pytest.approx(1.0, abs=1e-5)


def test_a_released_checkpoint_card_carries_the_authors_figures_as_theirs(tmp_path, hub, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "models"))  # the released-checkpoint double
    from test_diffclip_convert import official_state_dict, slip_checkpoint

    path = tmp_path / "models--hammh0a--DiffCLIP_ViTB16_CC12M" / "checkpoint_best.pt"
    path.parent.mkdir()
    torch.save(slip_checkpoint(official_state_dict()), path)
    out = tmp_path / "diffclip"
    assert cli.main(["convert", "diffclip", "--official", str(path), "--output", str(out)]) == 0
    card = publish(out, "me/diffclip-cc12m", api=hub.api).card
    assert card.data.base_model == "hammh0a/DiffCLIP_ViTB16_CC12M"
    authors = card.text.split("## Results reported by the authors", 1)[1]
    assert "not measured by hf_vrl" in authors and "pre-trained on CC12M" in authors
    assert (
        "| zero-shot ImageNet top-1 | 33.8 |" in authors
        and "| text retrieval R@5, MSCOCO | 55.5 |" in authors
    )
    assert card.data.eval_results is None  # the authors' figures are not this model's model-index
    assert "\nmodel_name:" not in str(card)  # not a Hub metadata field: the model-index's, with results


def test_only_what_hf_vrl_saved_is_pushed_as_a_model_folder(converted, tmp_path, hub, diffclip_run):
    plain = tmp_path / "clip"
    _clip_folder(plain)
    with pytest.raises(UserError, match="was not saved by hf_vrl"):
        publish(plain, "me/x", api=hub.api)
    with pytest.raises(UserError, match="it has no exports"):
        publish(converted, "me/x", what="vision-tower", api=hub.api)
    with pytest.raises(UserError, match="give the run folder around it"):
        publish(diffclip_run / "final", "me/x", api=hub.api)
    assert hub.calls == []
