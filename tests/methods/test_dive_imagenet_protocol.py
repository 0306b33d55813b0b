"""DiVE as the paper evaluated it (FLYP / WiSE-FT's protocol): OpenAI's ImageNet class names and 80 templates
in the training captions and the evaluation of ImageNet-family targets, each OOD set with its own split and
limit."""

from types import SimpleNamespace

import datasets
import pytest

from hf_vrl import eval_inputs
from hf_vrl.data.imagenet_classes import IMAGENET_WNIDS
from hf_vrl.data.prompts import CAPTION_TEMPLATES, IMAGENET_TEMPLATES
from hf_vrl.errors import UserError
from hf_vrl.methods.dive.evaluate import load_evaluation_sets
from hf_vrl.methods.dive.method import DiVEMethod
from hf_vrl.methods.dive.settings import DiVESettings


def test_each_ood_set_reads_its_own_split_and_limit(monkeypatch):
    calls = {}

    def load(name, *, split, limit=None, image_size=None, seed=0):
        calls[name] = (split, limit)
        return name

    monkeypatch.setattr(eval_inputs, "load_eval_dataset", load)
    settings = DiVESettings(
        ood_datasets=["imagenet-v2", "imagenet-r", "imagenet-sketch"],
        ood_splits={"imagenet-v2": "train", "imagenet-r": "test"},
        ood_limits={"imagenet-r": 30, "imagenet-sketch": None},
        zero_shot_datasets=["shapes"],
    )
    load_evaluation_sets(settings, split="validation", limit=7)
    assert calls == {
        "imagenet-v2": ("train", 7),
        "imagenet-r": ("test", 30),
        "imagenet-sketch": ("validation", None),
        "shapes": ("validation", 7),
    }


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"ood_splits": {"objectnet": "test"}}, r"ood_splits: \['objectnet'\] are not in ood_datasets"),
        ({"ood_datasets": ["imagenet-r"], "ood_limits": {"imagenet-r": 0}}, "limit must be an integer >= 1"),
        ({"ood_datasets": ["imagenet-r"], "ood_splits": {"imagenet-r": ""}}, "must be a split name"),
    ],
)
def test_per_set_settings_are_checked(values, message):
    with pytest.raises(UserError, match=message):
        DiVESettings(**values)


def method(dataset, templates=None):
    return SimpleNamespace(
        settings=SimpleNamespace(templates=templates),
        config=SimpleNamespace(data=SimpleNamespace(dataset=dataset)),
    )


def rows(names):
    features = datasets.Features({"label": datasets.ClassLabel(names=names)})
    return datasets.Dataset.from_dict({"label": [0]}, features=features)


def test_imagenet_targets_train_on_openai_names_and_templates():
    imagenet = method("hf:ILSVRC/imagenet-1k")
    assert DiVEMethod._templates(imagenet) == list(IMAGENET_TEMPLATES)
    wnid_folders = rows(list(IMAGENET_WNIDS))
    names = DiVEMethod._class_names(imagenet, wnid_folders)
    assert names[:2] == ["tench", "goldfish"] and len(names) == 1000
    other = method("fashion_mnist")
    assert DiVEMethod._templates(other) == list(CAPTION_TEMPLATES)
    assert DiVEMethod._class_names(other, rows(["cat", "dog"])) == ["cat", "dog"]
    assert DiVEMethod._templates(method("imagenet", templates=["a {}."])) == ["a {}."]
