"""`hf-vrl train clue` on the shared run design: a tiny run end to end (layout, report, final/, the backbone
export, Fig. 6, Fig. 9), the momentum branch in final/, and user errors."""

import json

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from transformers import AutoModel

import hf_vrl
from hf_vrl.data.registry import load_dataset_by_name
from hf_vrl.errors import UserError
from hf_vrl.methods.clue.evaluate import evaluate_clue
from hf_vrl.methods.clue.method import CLUERunConfig
from hf_vrl.presets import load_preset
from hf_vrl.run.config import resolve

TINY = dict(
    train_limit=32, batch_size=8, max_steps=3, save_steps=3, eval_limit=24, logging_steps=1,
    backbone_pretrain_steps=2, text_encoder_pretrain_steps=2, part_map_images=2, seed=0,
)  # fmt: skip
METRICS = ("linear_probe.top1", "retrieval.i2i_R@1", "retrieval.i2i_R@5", "granularity.ncc_fine")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("clue") / "run"
    return out, hf_vrl.train("clue", output_dir=str(out), **TINY)


def _metric(section: dict, path: str) -> float:
    task, name = path.split(".")
    return section[task][name]


def test_the_common_layout_and_report(run):
    out, report = run
    assert json.loads((out / "report.json").read_text()) == report
    recorded = json.loads((out / "config.json").read_text())
    assert recorded.pop("launch") == {"processes": 1, "fsdp": False}  # what a resume is checked against
    assert recorded == report["config"]
    assert report["method"] == "clue" and report["train"]["steps"] == 3 and report["train"]["skipped"] == {}
    for stage in ("before", "after"):
        assert all(0 <= _metric(report[stage], m) <= 1 for m in METRICS)
    assert report["before"] != report["after"]
    assert (out / "inputs" / "backbone" / "config.json").is_file()  # the toy pretraining, built once
    assert (out / "inputs" / "text_encoder" / "model.safetensors").is_file()  # the trained toy text encoder
    assert report["config"]["model"]["text_source"] == "pixel_describer"  # never the label-naming captions
    assert report["after"]["granularity_split"] == "train"  # the paper's §3: measured on the training set
    with Image.open(out / "figures" / "part_maps.png") as figure:  # 2 rows x (image + 3 clusters)
        assert 1.5 < figure.size[0] / figure.size[1] < 2.5
    assert report["outputs"]["gradcam"] == str(out / "figures" / "gradcam.png")
    with Image.open(out / "figures" / "gradcam.png") as figure:  # Fig. 9: 2 rows x (image, start, CLUE)
        assert 1.0 < figure.size[0] / figure.size[1] < 2.0


def test_final_loads_with_remote_code_and_reproduces_the_evaluation(run):
    out, report = run
    model = AutoModel.from_pretrained(out / "final", trust_remote_code=True)
    assert type(model).__name__ == "CLUEModel" and model.config.text_embed_dim is not None
    from transformers import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(out / "final")
    test = load_dataset_by_name("shapes", split="test", limit=24, seed=0, image_size=32)
    train = load_dataset_by_name("shapes", split="train", limit=32, seed=0, image_size=32)  # the run's rows
    again = evaluate_clue(model, processor, test, train, tasks=("retrieval", "granularity"))
    recorded = dict(report["after"]["retrieval"])
    assert recorded.pop("data") == {  # the test rows above; granularity on the training rows
        "dataset": "shapes", "split": "test", "n_samples": 24, "limit": 24, "seed": 0, "labels": "fine_label",
        "drawn": "generated", "texts": "generated",
    }  # fmt: skip
    assert again["retrieval"] == recorded
    assert again["granularity"]["ncc_fine"] == report["after"]["granularity"]["ncc_fine"]
    granularity = {
        "dataset": "shapes",
        "split": "train",
        "n_samples": 32,
        "limit": 32,
        "seed": 0,
        "drawn": "generated",
        "texts": "generated",
    }
    assert report["after"]["granularity"]["data"] == granularity


def test_the_momentum_branch_is_saved_and_has_moved(run):
    out, _ = run
    final = load_file(out / "final" / "model.safetensors")
    start = load_file(out / "inputs" / "backbone" / "model.safetensors")
    key = "embedder.embedder.convolution.weight"
    online, momentum = final[f"backbone.{key}"], final[f"momentum_backbone.{key}"]
    assert not torch.equal(online, momentum) and not torch.equal(momentum, start[key])
    # m = 0.999: the momentum copy moved a thousandth of the way towards the online weights per step
    assert (momentum - start[key]).abs().max() < (online - start[key]).abs().max()


def test_the_backbone_export_is_a_stock_resnet_with_the_online_weights(run):
    out, _ = run
    backbone = AutoModel.from_pretrained(out / "exports" / "backbone")
    assert type(backbone).__name__ == "ResNetModel"
    final = load_file(out / "final" / "model.safetensors")
    exported = backbone.state_dict()
    assert all(torch.equal(exported[k], final[f"backbone.{k}"]) for k in exported)


def test_the_presets_resolve_and_say_what_differs_from_the_paper():
    for name in ("clue-tiny", "clue-r50"):
        preset = load_preset(name)
        assert preset["notes"] and preset["description"]
        resolve(CLUERunConfig, preset, source=name)
    r50 = resolve(CLUERunConfig, load_preset("clue-r50"))
    assert r50.model.backbone == "microsoft/resnet-50" and r50.optim.optimizer == "sgd"
    assert r50.optim.learning_rate == pytest.approx(0.05 * r50.optim.global_batch_size / 256)
    assert (r50.clue.num_parts, r50.clue.momentum, r50.clue.temperature) == (3, 0.999, 0.4)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"temperature": 0}, "clue.temperature must be > 0"),
        ({"backbone": "microsoft/resnet-50"}, "set exactly one of model.backbone"),
        ({"dataset": "digits"}, "backbone_pretrain_steps needs the toy world"),
        ({"beta": 1.0, "num_parts": 0}, "num_parts >= 1"),
        ({"dataset": "digits", "backbone_pretrain_steps": 0}, "pixel_describer describes the toy world"),
        ({"text_encoder_pretrain_steps": 5, "text_encoder": "openai/clip-vit-base-patch16"}, "config-only"),
        ({"dataset": "cub:/nowhere/CUB_200_2011", "text_source": "caption"}, "label supervision"),
    ],
)
def test_user_errors_say_what_to_change(tmp_path, overrides, message):
    with pytest.raises(UserError, match=message):
        hf_vrl.train("clue", output_dir=str(tmp_path / "run"), **overrides)
    assert not (tmp_path / "run").exists()


def test_cub_captions_are_refused_for_the_text_term(tmp_path):
    """CUB's caption column is a class-name template: as the text term's source it is the label itself. A
    bare CUB folder is recognised too; with gamma = 0 (no text term) or a descriptions file it is accepted."""
    root = tmp_path / "CUB_200_2011"
    root.mkdir()
    for name in ("images.txt", "image_class_labels.txt", "train_test_split.txt", "classes.txt"):
        (root / name).write_text("")
    config = resolve(CLUERunConfig, load_preset("clue-r50"))
    config.model.text_source = "caption"
    for dataset in (f"cub:{root}", str(root)):
        config.data.dataset = dataset
        problems = config._text_problems()
        assert len(problems) == 1 and "label supervision" in problems[0] and "describe" in problems[0]
    for dataset in ("aircraft:/data/fgvc-aircraft-2013b", "cars:/data/stanford_cars"):
        config.data.dataset = dataset
        assert "label supervision" in config._text_problems()[0]
    config.clue.gamma = 0.0
    assert config._text_problems() == []
    config.clue.gamma, config.model.text_source = 1.0, "data/cub200_descriptions.json"
    assert config._text_problems() == []
