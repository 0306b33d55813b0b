"""The cross-entropy baselines (vanilla FT, LP-FT): the loss, the zero-shot head, which stage trains what, the
head's class indexing and a tiny LP-FT run end to end; the ObjectNet border crop."""

from __future__ import annotations

import ast
import copy
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from dive_helpers import random_tiny_clip_world
from PIL import Image
from transformers import CLIPModel

import hf_vrl
from hf_vrl.errors import UserError
from hf_vrl.evaluation import encode_images
from hf_vrl.methods.dive.data import FLYPCollator
from hf_vrl.methods.dive.evaluate import (
    ClassifySettings,
    _head_rows,
    border_crop,
    classify,
    evaluate_dive,
    text_classifier,
)
from hf_vrl.methods.dive.head import (
    HEAD_FILE,
    HeadClassifier,
    HeadTrainer,
    load_head,
    save_head,
    set_trainable,
    zero_shot_head,
)
from hf_vrl.methods.dive.method import DiVERunConfig
from hf_vrl.methods.dive.settings import DiVESettings
from hf_vrl.presets import load_preset
from hf_vrl.run.config import resolve
from hf_vrl.trainer import VRLTrainingArguments

TEMPLATES = ["a photo of a {}.", "a drawing of a {}."]


@pytest.fixture(scope="module")
def toy_world():
    return random_tiny_clip_world()


def classifier(toy_world) -> HeadClassifier:
    clip, _, tokenizer, data = toy_world
    names = data.features["label"].names
    clip = copy.deepcopy(clip)
    return HeadClassifier(clip, zero_shot_head(clip, tokenizer, names, TEMPLATES), names)


def head_trainer(tmp_path, model, toy_world, steps=2) -> HeadTrainer:
    _, image_processor, tokenizer, data = toy_world
    args = VRLTrainingArguments(
        output_dir=str(tmp_path), max_steps=steps, per_device_train_batch_size=8, learning_rate=1e-2,
        use_cpu=True, report_to="none", remove_unused_columns=False, save_strategy="no", logging_steps=1,
        disable_tqdm=True,
    )  # fmt: skip
    collator = FLYPCollator(image_processor, tokenizer, data.features["label"].names, TEMPLATES)
    return HeadTrainer(model=model, args=args, train_dataset=data, data_collator=collator)


def test_the_head_starts_as_the_zero_shot_classifier(toy_world):
    clip, image_processor, tokenizer, data = toy_world
    model = classifier(toy_world)
    names = data.features["label"].names
    text = text_classifier(clip, tokenizer, names, TEMPLATES)  # [D, C], unit columns
    torch.testing.assert_close(model.head.weight, clip.logit_scale.exp().item() * text.T)
    zero_shot = classify(clip, image_processor, tokenizer, data, TEMPLATES)
    head = classify(model, image_processor, tokenizer, data, TEMPLATES)
    assert head["zero_shot.top1"] == zero_shot["zero_shot.top1"]  # step 0: FT accuracy = zero-shot accuracy
    assert head["zero_shot.top5"] == zero_shot["zero_shot.top5"]


def test_the_loss_is_plain_cross_entropy(tmp_path, toy_world):
    model = classifier(toy_world)
    trainer = head_trainer(tmp_path, model, toy_world)
    batch = trainer.data_collator([toy_world[3][i] for i in range(6)])
    loss = trainer.compute_loss(model, batch)
    with torch.no_grad():
        features = model.encoder.get_image_features(pixel_values=batch["pixel_values"])
        features = getattr(features, "pooler_output", features)
        logits = (features / features.norm(dim=-1, keepdim=True)) @ model.head.weight.T
        labels = batch["class_labels"]
        reference = (logits.logsumexp(dim=1) - logits[torch.arange(6), labels]).mean()
    torch.testing.assert_close(loss.detach(), reference)
    torch.testing.assert_close(F.cross_entropy(model(batch["pixel_values"]), labels), reference)


def test_linear_probing_trains_only_the_head_and_fine_tuning_the_image_tower(tmp_path, toy_world):
    model = classifier(toy_world)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    set_trainable(model, encoder=False)
    head_trainer(tmp_path / "lp", model, toy_world).train()
    assert all(p.grad is None or not p.grad.any() for p in model.encoder.parameters())
    for name, value in model.encoder.state_dict().items():
        assert torch.equal(value, start[f"encoder.{name}"]), name
    assert not torch.equal(model.head.weight, start["head.weight"])

    set_trainable(model, encoder=True)
    probed = {k: v.clone() for k, v in model.state_dict().items()}
    head_trainer(tmp_path / "ft", model, toy_world).train()
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, probed[k])}
    assert any(k.startswith("encoder.vision_model.") for k in changed) and "head.weight" in changed
    assert not any(k.startswith(("encoder.text_model.", "encoder.logit_scale")) for k in changed)


def test_the_head_is_saved_beside_a_plain_clip(tmp_path, toy_world):
    model = classifier(toy_world)
    model.encoder.save_pretrained(tmp_path)
    save_head(model, tmp_path)
    loaded = load_head(CLIPModel.from_pretrained(tmp_path), tmp_path)
    torch.testing.assert_close(loaded.head.weight, model.head.weight)
    assert loaded.class_names == model.class_names and (tmp_path / HEAD_FILE).is_file()


def test_the_head_is_indexed_by_class():
    from hf_vrl.data.imagenet_classes import IMAGENET_CLASSNAMES, IMAGENET_WNIDS
    from hf_vrl.data.prompts import imagenet_class_wnids

    names = list(IMAGENET_CLASSNAMES)
    assert _head_rows(names, names, "objectnet") == list(range(1000))  # ObjectNet projects the 1000 rows
    rows = _head_rows(names, ["r"] * 200, "imagenet-r:/data/x")  # by its key, not a path (issue 34)
    assert rows == [IMAGENET_WNIDS.index(w) for w in imagenet_class_wnids("imagenet-r")]
    assert _head_rows(["cat", "dog", "cow"], ["cow", "cat"], "toy") == [2, 0]
    with pytest.raises(UserError, match="no class"):
        _head_rows(["cat", "dog"], ["horse"], "toy")


def test_objectnet_border_crop():
    image = Image.new("RGB", (12, 9), (255, 0, 0))  # a red frame 2 pixels wide around a blue inside
    image.paste((0, 0, 255), (2, 2, 10, 7))
    cropped = border_crop(image, 2)
    assert cropped.size == (8, 5)
    assert cropped.getcolors() == [(40, (0, 0, 255))]
    assert border_crop(image, 0) is image
    assert DiVESettings().objectnet_border == 2


def test_objectnet_images_are_cropped_before_preprocessing(toy_world, monkeypatch):
    from datasets import ClassLabel, Dataset, Features
    from datasets import Image as ImageFeature

    from hf_vrl.methods.dive import evaluate as module

    clip, image_processor, tokenizer, _ = toy_world
    images = [Image.new("RGB", (20, 20), (200, 10 * i, 0)) for i in range(3)]
    for im in images:
        im.paste((0, 0, 255), (3, 3, 17, 17))
    features = Features({"image": ImageFeature(), "label": ClassLabel(names=["Air freshener", "x"])})
    data = Dataset.from_dict({"image": images, "label": [0, 0, 1]}, features=features)
    seen = []

    def spy(model, processor, column, **kwargs):
        seen.extend(column[0 : len(column)])
        return encode_images(model, processor, column, **kwargs)

    monkeypatch.setattr(module, "encode_images", spy)
    classify(clip, image_processor, tokenizer, data, None, "objectnet", ClassifySettings(objectnet_border=3))
    assert [im.size for im in seen] == [(14, 14)] * 3
    assert all(im.getcolors() == [(196, (0, 0, 255))] for im in seen)
    seen.clear()
    classify(clip, image_processor, tokenizer, data, None, "toy", ClassifySettings(objectnet_border=3))
    assert [im.size for im in seen] == [(20, 20)] * 3  # other sets are left whole


def test_a_head_classifier_is_evaluated_with_its_head_and_its_encoder(toy_world):
    clip, image_processor, tokenizer, data = toy_world
    model = classifier(toy_world)
    with torch.no_grad():
        model.head.weight.mul_(-1)  # a head that disagrees with zero-shot
    report = evaluate_dive(
        model, image_processor, tokenizer, id_dataset=data, transfer_datasets={"same": data},
        templates=TEMPLATES,
    )  # fmt: skip
    zero_shot = classify(clip, image_processor, tokenizer, data, TEMPLATES)["zero_shot.top1"]
    assert (
        report["id"]["zero_shot.top1"] == classify(model, image_processor, tokenizer, data)["zero_shot.top1"]
    )
    assert report["id"]["zero_shot.top1"] != zero_shot
    assert report["transfer"]["same"]["zero_shot.top1"] == pytest.approx(
        evaluate_dive(clip, image_processor, tokenizer, transfer_datasets={"same": data})["transfer"]["same"][
            "zero_shot.top1"
        ]
    )


# -- configuration and a tiny run ---------------------------------------------------------------------------


def test_lp_ft_has_two_stages_and_refuses_wise_ft():
    values = load_preset("dive-tiny")
    config = resolve(DiVERunConfig, values | {"dive": values["dive"] | {"objective": "lp_ft", "lp_steps": 3}})
    assert config.dive.trains_head and config.dive.lp_steps == 3
    with pytest.raises(UserError, match="trains a classifier"):
        resolve(DiVERunConfig, values | {"dive": values["dive"] | {"objective": "ft", "wise_ft": True}})


TINY = dict(
    pretrain_steps=3, pretrain_data={"fashion_mnist": 32, "shapes": 32}, pretrain_batch_size=16,
    train_limit=80, batch_size=8, max_steps=3, warmup_steps=1, save_steps=3, logging_steps=1, eval_limit=30,
    val_size=8, rsa_limit=8, zero_shot_datasets=["shapes"], rsa_dataset="shapes", ood_shifts=["inverted"],
)  # fmt: skip


def test_lp_ft_end_to_end(tmp_path):
    out = tmp_path / "run"
    report = hf_vrl.train("dive", output_dir=str(out), objective="lp_ft", lp_steps=2, macro_f1=True, **TINY)
    assert set(report["train"]["stages"]) == {"linear_probe", "train"}
    assert report["train"]["steps"] == 5
    probe = out / "checkpoints/linear_probe"
    assert any(probe.glob("checkpoint-*")) and (out / "final" / HEAD_FILE).is_file()
    for section in ("before", "after"):
        assert set(report[section]) == {"zero_shot", "ood", "transfer", "rsa"}
        assert set(report[section]["zero_shot"]) == {"top1", "macro_f1", "data"}  # data: what was scored
        assert set(report[section]["ood"]) == {"top1", "inverted", "macro_f1", "inverted.macro_f1", "data"}
    final = CLIPModel.from_pretrained(out / "final")  # a plain CLIP; the head beside it
    pretrained = CLIPModel.from_pretrained(out / "inputs/pretrained")
    for (name, a), b in zip(final.state_dict().items(), pretrained.state_dict().values()):
        if name.startswith(("text_model.", "text_projection", "logit_scale")):
            assert torch.equal(a, b), name  # the text side never trains
    assert json.loads((out / "report.json").read_text()) == report


def test_the_head_module_imports_nothing_of_the_evaluation_that_builds_on_it():
    """evaluate.py imports head.py (HeadClassifier, text_classifier); head.py imports nothing of evaluate.py,
    not even inside a function: no import circle."""
    from hf_vrl.methods.dive import evaluate, head

    def imported(module) -> set[str]:
        tree = ast.parse(Path(module.__file__).read_text())
        return {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}

    assert "hf_vrl.methods.dive.head" in imported(evaluate)
    assert "hf_vrl.methods.dive.evaluate" not in imported(head)
