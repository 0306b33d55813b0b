"""DiffCLIP loading: remote code in a fresh interpreter without hf_vrl, Auto classes, the pipeline."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image
from remote_code import remote_load
from test_diffclip_reference import text_batch, tiny_config_kwargs
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForZeroShotImageClassification,
    CLIPImageProcessorPil,
    PreTrainedTokenizerFast,
    pipeline,
)

import hf_vrl.models  # noqa: F401 - registers the Auto classes
from hf_vrl.devices import module_device, module_dtype, to_device
from hf_vrl.models.diffclip import DiffCLIPConfig, DiffCLIPModel, DiffCLIPVisionConfig, DiffCLIPVisionModel


def tiny_model(**overrides) -> DiffCLIPModel:
    torch.manual_seed(0)
    return DiffCLIPModel(DiffCLIPConfig(**tiny_config_kwargs(**overrides))).eval()


def test_save_then_fresh_process_remote_code_load_is_identical(tmp_path):
    model = tiny_model(diff_attention_in_text=False, vision_config={"lambda_init_schedule": "depth"})
    model_dir = tmp_path / "model"
    model.save_pretrained(model_dir)
    code = {"configuration_diffclip.py", "modeling_diffclip.py", "differential_attention.py"}
    assert {"config.json", "model.safetensors", *code} <= set(os.listdir(model_dir))
    config = json.loads((model_dir / "config.json").read_text())
    assert config["auto_map"] == {
        "AutoConfig": "configuration_diffclip.DiffCLIPConfig",
        "AutoModel": "modeling_diffclip.DiffCLIPModel",
        "AutoModelForZeroShotImageClassification": "modeling_diffclip.DiffCLIPModel",  # the pipeline's class
    }
    assert config["model_type"] == "diffclip" and config["text_config"]["model_type"] == "diffclip_text_model"

    input_ids, attention_mask = text_batch()
    inputs = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "pixel_values": torch.randn(3, 3, 16, 16),
    }
    with torch.no_grad():
        expected = model(**inputs)
    loaded = remote_load(model_dir, inputs, tmp_path / "child")
    assert loaded["cls"] == "DiffCLIPModel"
    # exact comparison across processes: both split reductions over the same number of threads
    assert loaded["threads"] == (torch.get_num_threads(), torch.get_num_interop_threads())
    for name in ("logits_per_image", "logits_per_text", "image_embeds", "text_embeds"):
        torch.testing.assert_close(loaded["outputs"][name], expected[name], rtol=0, atol=0, msg=name)


def test_remote_code_refuses_transformers_older_than_supported(tmp_path):
    tiny_model().save_pretrained(tmp_path / "model")
    script = (
        "import sys, transformers\n"
        "transformers.__version__ = '4.56.2'  # the newest release before the supported range\n"
        "from transformers import AutoModel\n"
        "AutoModel.from_pretrained(sys.argv[1], trust_remote_code=True)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "model")], env=env, capture_output=True, text=True
    )
    assert done.returncode != 0
    assert "needs transformers>=4.57, found 4.56.2" in done.stderr


def test_registered_auto_classes_resolve_without_remote_code(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path / "full")
    assert type(AutoModel.from_pretrained(tmp_path / "full")) is DiffCLIPModel
    assert type(AutoModelForZeroShotImageClassification.from_pretrained(tmp_path / "full")) is DiffCLIPModel
    assert type(AutoConfig.from_pretrained(tmp_path / "full")) is DiffCLIPConfig

    tower, info = DiffCLIPVisionModel.from_pretrained(tmp_path / "full", output_loading_info=True)
    assert not info["missing_keys"] and all(not key.startswith("vision") for key in info["unexpected_keys"])
    pixel_values = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(
            tower(pixel_values=pixel_values).pooler_output,
            model.vision_model(pixel_values=pixel_values).pooler_output,
        )

    vision = DiffCLIPVisionModel(DiffCLIPVisionConfig(**tiny_config_kwargs()["vision_config"]))
    vision.save_pretrained(tmp_path / "vision")
    auto_map = json.loads((tmp_path / "vision" / "config.json").read_text())["auto_map"]
    assert auto_map["AutoModel"] == "modeling_diffclip.DiffCLIPVisionModel"
    reloaded = AutoModel.from_pretrained(tmp_path / "vision")
    assert type(reloaded) is DiffCLIPVisionModel
    torch.testing.assert_close(reloaded.state_dict(), vision.state_dict())


@pytest.fixture
def toy_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over a tiny vocabulary; PAD = 0, BOS = 1, EOS = 3 (as `tiny_config_kwargs`)."""
    words = ["<pad>", "<bos>", "<unk>", "<eos>", "this", "is", "a", "photo", "of", "cat", "dog", "car", "."]
    backend = Tokenizer(models.WordLevel({word: i for i, word in enumerate(words)}, unk_token="<unk>"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(
        single="<bos> $A <eos>", special_tokens=[("<bos>", 1), ("<eos>", 3)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )


def test_zero_shot_image_classification_pipeline(tmp_path, toy_tokenizer, device):
    """The pipeline on `device` (it moves the model there); the by-hand check builds its inputs on the CPU
    and moves them to the model's device, as every caller of a moved model must."""
    model = tiny_model()
    image_processor = CLIPImageProcessorPil(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16})
    image = Image.fromarray((np.random.default_rng(0).random((20, 24, 3)) * 255).astype("uint8"))
    labels = ["cat", "dog", "car"]
    classifier = pipeline(
        "zero-shot-image-classification",
        model=model,
        image_processor=image_processor,
        tokenizer=toy_tokenizer,
        device=device,
    )
    assert module_device(model).type == device.type
    result = classifier(image, candidate_labels=labels)
    assert sorted(r["label"] for r in result) == sorted(labels)
    assert sum(r["score"] for r in result) == pytest.approx(1.0)

    pixel_values = image_processor(images=[image], return_tensors="pt")["pixel_values"]
    texts = toy_tokenizer(
        [f"This is a photo of {label}." for label in labels], padding=True, return_tensors="pt"
    )
    inputs = to_device({"pixel_values": pixel_values, **texts}, module_device(model), module_dtype(model))
    with torch.no_grad():
        probs = model(**inputs).logits_per_image.softmax(-1)[0]
    # float32 rounding of the embeddings, amplified by the logit scale, differs between CPU kernels by ~1e-4
    assert {r["label"]: r["score"] for r in result} == pytest.approx(
        dict(zip(labels, probs.tolist())), abs=1e-3
    )

    model.save_pretrained(tmp_path)
    image_processor.save_pretrained(tmp_path)
    toy_tokenizer.save_pretrained(tmp_path)
    from_dir = pipeline("zero-shot-image-classification", model=str(tmp_path), device=device)
    assert type(from_dir.model) is DiffCLIPModel
    scores = {r["label"]: r["score"] for r in from_dir(image, candidate_labels=labels)}
    # from a folder the pipeline's image processor is AutoImageProcessor's: torchvision where installed, whose
    # resize is within one grey level of PIL's (1e-4 in probability here)
    assert scores == pytest.approx({r["label"]: r["score"] for r in result}, abs=1e-3)


def test_hf_vrl_eval_loads_a_saved_diffclip_without_remote_code(tmp_path):
    """hf_vrl's installed classes serve a saved DiffCLIP: `hf-vrl eval`, in a fresh process that has not
    imported hf_vrl.models yet, needs no --trust-remote-code."""
    from hf_vrl.methods.diffclip.build import build_model, load_processors
    from hf_vrl.presets import load_preset

    image_processor, tokenizer = load_processors("tiny-clip", "tiny-clip")
    model_dir = tmp_path / "diffclip"
    architecture = load_preset("diffclip-tiny")["model"]["architecture"]
    build_model(architecture, "diffclip", tokenizer=tokenizer).save_pretrained(model_dir)
    image_processor.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    out = tmp_path / "eval"
    argv = ["--model", str(model_dir), "--dataset", "shapes", "--limit", "24", "--tasks", "zero_shot"]
    argv += ["--output-dir", str(out), "--no-figures"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    done = subprocess.run(
        [sys.executable, "-m", "hf_vrl.cli", "eval", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert 0.0 <= report["zero_shot"]["top1"] <= 1.0 and report["n_samples"] == 24
