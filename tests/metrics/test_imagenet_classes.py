"""ImageNet-family evaluation: OpenAI's curated class names and 80 templates by default, ImageNet-R / -A on
their 200-class subsets, V2 and Sketch on all 1000 (WiSE-FT / FLYP's OOD protocol)."""

import datasets
import numpy as np
import pytest
import torch
from PIL import Image

from hf_vrl import evaluation
from hf_vrl.data import benchmarks, prompts
from hf_vrl.data.imagenet_classes import (
    IMAGENET_A_WNIDS,
    IMAGENET_CLASSNAMES,
    IMAGENET_R_WNIDS,
    IMAGENET_WNIDS,
)


def test_the_shipped_class_data():
    assert len(IMAGENET_WNIDS) == len(set(IMAGENET_WNIDS)) == 1000 and list(IMAGENET_WNIDS) == sorted(
        IMAGENET_WNIDS
    )
    assert len(IMAGENET_CLASSNAMES) == 1000
    # OpenAI's curation (not WordNet's first lemma): spot checks against openai/CLIP's notebook
    assert IMAGENET_CLASSNAMES[:3] == ("tench", "goldfish", "great white shark")
    assert (IMAGENET_CLASSNAMES[134], IMAGENET_CLASSNAMES[517]) == ("crane bird", "construction crane")
    assert IMAGENET_CLASSNAMES[-1] == "toilet paper"
    for subset in (IMAGENET_R_WNIDS, IMAGENET_A_WNIDS):
        assert len(subset) == len(set(subset)) == 200 and set(subset) <= set(IMAGENET_WNIDS)
        assert list(subset) == sorted(subset)  # label order: the class folders, sorted
    assert "n01443537" in IMAGENET_R_WNIDS and "n01440764" not in IMAGENET_A_WNIDS


def test_family_names_and_defaults():
    family = prompts.imagenet_family
    assert (
        family("imagenet") == family("ImageNet-1k") == family("imagenet:hf:ILSVRC/imagenet-1k") == "imagenet"
    )
    assert family("imagefolder:/data/imagenet-sketch") is None  # a path's name says nothing (issue 34)
    assert family("imagenet-sketch:/data/x") == "imagenet-sketch" and family("imagenetv2") == "imagenet-v2"
    assert family("imagenet-r") == "imagenet-r" and family("imagenet_a") == "imagenet-a"
    assert family("objectnet") == "objectnet" and family("cifar10") is None and family(None) is None
    assert prompts.imagenet_class_names("imagenet-r")[0] == "goldfish"
    assert len(prompts.imagenet_class_names("imagenet-sketch")) == 1000
    for name in ("imagenet", "imagenet-v2", "imagenet-sketch", "imagenet-r", "imagenet-a", "objectnet"):
        assert prompts.zero_shot_templates(name) == list(prompts.IMAGENET_TEMPLATES)
    openai = benchmarks.openai_class_names
    assert openai("imagenet-v2", [str(i) for i in (0, 1, 10)]) == ["tench", "goldfish", "brambling"]
    assert openai("imagefolder:/x", ["n01443537", "n01440764"]) == ["goldfish", "tench"]  # wnid folders
    assert openai("imagenet-a", [f"c{i}" for i in range(200)]) == prompts.imagenet_class_names("imagenet-a")
    assert openai("cifar10", ["cat", "dog"]) is None and openai("imagenet", ["cat", "dog"]) is None


class WordCLIP(torch.nn.Module):
    """Images embed as one-hot of their red value (the class index), texts as the index of the class name."""

    def __init__(self, names):
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))
        self.names = names

    def get_image_features(self, pixel_values):
        return torch.nn.functional.one_hot(pixel_values[:, 0, 0, 0].long(), len(self.names)).float()

    def get_text_features(self, input_ids, attention_mask=None):
        return torch.nn.functional.one_hot(input_ids[:, 0], len(self.names)).float()


class Tokenizer:
    def __init__(self, names):
        self.names, self.seen = names, []

    def __call__(self, texts, **kwargs):
        self.seen += list(texts)
        ids = [
            next((i for i, n in enumerate(self.names) if f" {n}." in t or f" {n}," in t), 0) for t in texts
        ]
        return {"input_ids": torch.tensor(ids)[:, None]}


def processor(images, return_tensors="pt"):
    arrays = [torch.tensor(np.asarray(im), dtype=torch.float32).permute(2, 0, 1) for im in images]
    return {"pixel_values": torch.stack(arrays)}


def dataset(labels, names, colour_of):
    """Uniform 8x8 images (ObjectNet's 2-pixel border crop keeps their colour) of the colours of `labels`."""
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=names)})
    images = [Image.new("RGB", (8, 8), (colour_of(y), 0, 0)) for y in labels]
    return datasets.Dataset.from_dict({"image": images, "label": labels}, features=features)


def test_imagenet_r_with_1000_labels_is_scored_on_its_200_classes():
    """A 1000-class labelling: the classifier has the 200 ImageNet-R classes (OpenAI's names), labels are
    renumbered; the image of subset class j is embedded as class j, so every image is right."""
    subset = prompts.imagenet_class_names("imagenet-r")
    positions = [IMAGENET_WNIDS.index(w) for w in IMAGENET_R_WNIDS[:4]]
    ds = dataset(positions, list(IMAGENET_WNIDS), lambda y: positions.index(y))
    tok = Tokenizer(subset)
    report = evaluation.evaluate_clip(
        WordCLIP(subset), processor, tok, ds, tasks=("zero_shot",), dataset_name="imagenet-r"
    )["zero_shot"]
    assert report["class_names"] == "openai:imagenet-r" and report["templates"] == "openai:imagenet"
    assert report["top1"] == 1.0 and report["n_templates"] == 80
    assert len(tok.seen) == 200 * 80 and tok.seen[0] == "a bad photo of a goldfish."
    with pytest.raises(Exception, match="outside the 200 classes"):
        bad = dataset([0], list(IMAGENET_WNIDS), lambda y: 0)  # tench is not an ImageNet-R class
        evaluation.evaluate_clip(
            WordCLIP(subset), processor, tok, bad, tasks=("zero_shot",), dataset_name="imagenet-r"
        )


def test_wnid_folders_get_openai_names():
    """ImageNet-Sketch as an image folder: its classes are WordNet ids; prompts use OpenAI's names."""
    wnids = list(IMAGENET_WNIDS[:3])
    names = list(IMAGENET_CLASSNAMES[:3])
    tok = Tokenizer(names)
    ds = dataset([0, 1, 2], wnids, lambda y: y)
    report = evaluation.evaluate_clip(
        WordCLIP(names), processor, tok, ds, tasks=("zero_shot",), dataset_name="imagefolder:/d/sketch"
    )["zero_shot"]
    assert report["class_names"] == "openai:imagenet" and report["top1"] == 1.0
    assert "a bad photo of a tench." in tok.seen and not any("n01440764" in t for t in tok.seen)


def test_objectnet_is_scored_on_its_113_mapped_folders():
    """ObjectNet's class folders: the classifier is ImageNet's (OpenAI's names), each mapped folder's logit
    is the maximum over its ImageNet classes, unmapped folders are not scored (WiSE-FT / FLYP)."""
    from hf_vrl.data.imagenet_classes import OBJECTNET_FOLDER_TO_IMAGENET

    assert len(OBJECTNET_FOLDER_TO_IMAGENET) == 113
    assert [IMAGENET_CLASSNAMES[i] for i in OBJECTNET_FOLDER_TO_IMAGENET["alarm_clock"]] == [
        "analog clock",
        "digital clock",
    ]
    folders = ["alarm_clock", "air_freshener", "banana"]  # air_freshener maps to no ImageNet class
    names = list(IMAGENET_CLASSNAMES)
    # images embed as the ImageNet class index: "digital clock" (an alarm clock), "banana", an air freshener
    # embedded as "banana" (not scored)
    colour = {0: IMAGENET_CLASSNAMES.index("digital clock"), 1: 0, 2: IMAGENET_CLASSNAMES.index("banana")}
    ds = dataset([0, 2, 1], folders, lambda y: colour[y] % 256)
    tok = Tokenizer(names)
    model = WordCLIP(names)
    model.get_image_features = lambda pixel_values: torch.nn.functional.one_hot(
        torch.tensor([colour[0], colour[2], colour[2]]), 1000
    ).float()
    report = evaluation.evaluate_clip(
        model, processor, tok, ds, tasks=("zero_shot",), dataset_name="objectnet:/d/objectnet"
    )["zero_shot"]
    assert report["class_names"] == "openai:objectnet" and report["n_scored"] == 2
    assert report["top1"] == 1.0  # "digital clock" counts for the alarm-clock folder
    with pytest.raises(Exception, match="needs protocol clip_benchmark"):
        evaluation.evaluate_clip(
            model, processor, tok, ds, tasks=("zero_shot",), dataset_name="objectnet", protocol="hf_vrl"
        )
