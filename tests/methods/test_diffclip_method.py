"""`hf-vrl train diffclip` on the shared run design: both archs end to end, reload, the figure, the recipe's
settings, the augmentation."""

import json

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import (
    AutoImageProcessor,
    AutoModel,
    AutoTokenizer,
    CLIPConfig,
    CLIPModel,
    TrainingArguments,
)
from transformers.dynamic_module_utils import get_class_from_dynamic_module

import hf_vrl
from hf_vrl.data.registry import load_dataset_by_name
from hf_vrl.errors import UserError
from hf_vrl.evaluation import evaluate_clip
from hf_vrl.methods.diffclip.augment import RandomResizedCropCollator
from hf_vrl.methods.diffclip.build import build_model, load_processors
from hf_vrl.methods.diffclip.method import DiffCLIPRunConfig
from hf_vrl.presets import load_preset, preset_path
from hf_vrl.run.config import resolve
from hf_vrl.run.layout import RunDir
from hf_vrl.run.runner import Run
from hf_vrl.trainer import ContrastiveTrainer

TINY = dict(train_limit=32, batch_size=8, eval_limit=16, logging_steps=1, seed=0)


def architecture(preset="diffclip-tiny"):
    return load_preset(preset)["model"]["architecture"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A 2-step CLIP run and a 4-step DiffCLIP run (checkpoints at 2 and 4), both evaluated; the DiffCLIP
    figure draws the CLIP run beside it."""
    root = tmp_path_factory.mktemp("runs")
    clip = hf_vrl.train("diffclip", arch="clip", output_dir=str(root / "clip"), max_steps=2, **TINY)
    diffclip = hf_vrl.train(
        "diffclip", output_dir=str(root / "diffclip"), max_steps=4, save_steps=2,
        compare_with=str(root / "clip" / "final"), **TINY,
    )  # fmt: skip
    return root, {"clip": clip, "diffclip": diffclip}


@pytest.mark.parametrize("arch", ["diffclip", "clip"])
def test_the_common_layout_and_report(runs, arch):
    root, reports = runs
    out, report = root / arch, runs[1][arch]
    assert json.loads((out / "report.json").read_text()) == report
    assert report["method"] == "diffclip" and report["config"]["model"]["arch"] == arch
    assert report["train"]["steps"] == (4 if arch == "diffclip" else 2) and report["train"]["skipped"] == {}
    assert set(report["before"]) >= {"zero_shot", "retrieval"} and set(report["after"]) >= {
        "zero_shot",
        "retrieval",
    }
    recorded = json.loads((out / "config.json").read_text())
    assert recorded.pop("launch") == {"processes": 1, "fsdp": False}  # what a resume is checked against
    assert recorded == report["config"]
    if arch == "diffclip":
        with Image.open(
            out / "figures" / "attention.png"
        ) as figure:  # image | CLIP | DiffCLIP, 250 px panels
            assert figure.size == (3 * 250, 250)


@pytest.mark.parametrize("arch", ["diffclip", "clip"])
def test_final_reloads_with_its_processors_and_reproduces_the_evaluation(runs, arch):
    root, reports = runs
    final = root / arch / "final"
    model = AutoModel.from_pretrained(final, trust_remote_code=True)
    assert type(model).__name__ == "DiffCLIPModel"
    assert model.config.vision_config.differential_attention == (arch == "diffclip")
    auto_map = json.loads((final / "config.json").read_text())["auto_map"]
    remote_class = get_class_from_dynamic_module(auto_map["AutoModel"], str(final))
    assert remote_class.__module__.startswith("transformers_modules")  # the folder carries its own code
    data = load_dataset_by_name("shapes", split="test", limit=16, image_size=32, seed=0)
    processor, tokenizer = AutoImageProcessor.from_pretrained(final), AutoTokenizer.from_pretrained(final)
    report = evaluate_clip(model, processor, tokenizer, data, tasks=("zero_shot", "retrieval"))
    used = {"dataset": "shapes", "split": "test", "n_samples": 16, "limit": 16, "seed": 0}  # the data above
    used |= {"drawn": "generated", "texts": "generated"}
    for task in ("retrieval", "zero_shot"):
        recorded = dict(reports[arch]["after"][task])
        assert recorded.pop("data") == used  # what the card's model-index reads
        assert report[task] == pytest.approx(recorded)


def _param_count(text: dict, vision: dict, projection_dim: int, pre_layernorm: bool) -> int:
    """CLIP's parameter count written out: embeddings, per-layer attention/MLP/LayerNorms, norms, heads."""

    def layers(width: int, mlp: int, n: int) -> int:
        return n * (4 * (width * width + width) + (width * mlp + mlp) + (mlp * width + width) + 4 * width)

    w, patches = vision["hidden_size"], (vision["image_size"] // vision["patch_size"]) ** 2
    vision_params = (
        3 * vision["patch_size"] ** 2 * w + w + (patches + 1) * w + (2 * w if pre_layernorm else 0)
    )
    vision_params += layers(w, vision["intermediate_size"], vision["num_hidden_layers"]) + 2 * w  # + post-LN
    t = text["hidden_size"]
    text_params = (text["vocab_size"] + text["max_position_embeddings"]) * t + 2 * t  # embeddings, final LN
    text_params += layers(t, text["intermediate_size"], text["num_hidden_layers"])
    return vision_params + text_params + (w + t) * projection_dim + 1  # projections, logit_scale


def test_b16_preset_is_the_released_architecture():
    """Both archs of diffclip-b16 are the release's network: a timm ViT-B/16 (no pre-LayerNorm, exact GELU);
    the OpenAI-style tower, one --set away, has openai/clip-vit-base-patch16's parameter count."""
    arch = architecture("diffclip-b16")
    with torch.device("meta"):
        clip, diffclip = build_model(arch, "clip"), build_model(arch, "diffclip")
        openai_style = {**arch, "vision_config": {**arch["vision_config"], "pre_layernorm": True}}
        n_openai = sum(p.numel() for p in build_model(openai_style, "clip").parameters())
    for model in (clip, diffclip):
        vision = model.config.vision_config
        assert vision.hidden_act == "gelu" and not vision.pre_layernorm
        assert isinstance(model.vision_model.pre_layrnorm, torch.nn.Identity)
    n_clip = sum(p.numel() for p in clip.parameters())
    assert n_clip == _param_count(arch["text_config"], arch["vision_config"], arch["projection_dim"], False)
    assert n_openai == 149_620_737  # openai/clip-vit-base-patch16
    # DiffCLIP adds per layer (both towers) the λ vectors (4 x head_dim) and the RMSNorm weight (2 x head_dim)
    assert sum(p.numel() for p in diffclip.parameters()) - n_clip == 24 * (4 * 64 + 2 * 64)


def test_the_clip_baseline_is_clip():
    """arch=clip on an OpenAI-style architecture computes exactly what transformers' CLIPModel does."""
    tokenizer = AutoTokenizer.from_pretrained(preset_path("tiny-clip"))
    ours = build_model(
        {**architecture(), "vision_config": {**architecture()["vision_config"]}}, "clip", tokenizer=tokenizer
    ).eval()
    reference = CLIPModel(CLIPConfig.from_pretrained(preset_path("tiny-clip"))).eval()
    missing, unexpected = ours.load_state_dict(reference.state_dict(), strict=False)
    assert not missing and not unexpected
    pixels = torch.randn(2, 3, 32, 32)
    ids = tokenizer(["a red circle", "a blue square"], padding=True, return_tensors="pt")
    with torch.no_grad():
        a, b = ours(pixel_values=pixels, **ids), reference(pixel_values=pixels, **ids)
    torch.testing.assert_close(a.logits_per_image, b.logits_per_image)


def test_tiny_preset_matches_tiny_clip():
    """Both archs of diffclip-tiny have exactly the sizes of hub_configs/tiny-clip."""
    reference = CLIPConfig.from_pretrained(preset_path("tiny-clip"))
    _, tokenizer = load_processors("tiny-clip", "tiny-clip")
    config = build_model(architecture(), "clip", tokenizer=tokenizer).config
    assert config.projection_dim == reference.projection_dim
    fields = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "hidden_act")
    for tower in ("text_config", "vision_config"):
        for field in fields:
            assert getattr(getattr(config, tower), field) == getattr(getattr(reference, tower), field), (
                tower,
                field,
            )
    for field in ("vocab_size", "max_position_embeddings", "bos_token_id", "eos_token_id", "pad_token_id"):
        assert getattr(config.text_config, field) == getattr(reference.text_config, field), field


def test_diffclip_ablation_options_reach_the_config():
    star = build_model(architecture(), "diffclip", lambda_init_schedule="depth").config
    assert star.text_config.lambda_init_for_layer(1) == pytest.approx(0.8 - 0.6 * np.exp(-0.3))
    dagger = build_model(architecture(), "diffclip", diff_attention_in_text=False).config
    assert not dagger.text_config.differential_attention and dagger.vision_config.differential_attention
    with pytest.raises(UserError, match="only apply to DiffCLIP"):
        build_model(architecture(), "clip", lambda_init=0.5)


@pytest.mark.parametrize("processes, accumulation", [(1, 16), (4, 4)])
def test_b16_recipe_training_arguments(tmp_path, processes, accumulation):
    config = resolve(DiffCLIPRunConfig, load_preset("diffclip-b16"), {"output.output_dir": str(tmp_path)})
    run = Run(config=config, dir=RunDir(tmp_path), world_size=processes)
    args = run.training_arguments("train")
    recipe = (args.learning_rate, args.weight_decay, args.adam_beta1, args.adam_beta2, args.adam_epsilon)
    assert recipe == (5e-4, 0.5, 0.9, 0.98, 1e-8)
    assert args.warmup_steps == pytest.approx(1 / 40) and args.num_train_epochs == 40
    # 4096 = 256 x processes x accumulation, one loss over the step (whole-batch accumulation, GradCache)
    assert args.per_device_train_batch_size == 256 and args.gradient_accumulation_steps == accumulation
    assert args.accumulation == "whole_batch"
    assert args.lr_scheduler_type == "cosine_with_min_lr" and args.lr_scheduler_kwargs == {"min_lr": 1e-5}
    assert args.max_grad_norm == 0 and args.dataloader_drop_last and not args.remove_unused_columns


def test_warm_up_starts_from_warmup_start_lr(tmp_path):
    """SLIP's warm-up: linear from 1e-6 to the peak, then the schedule (here constant) unchanged."""
    model = torch.nn.Linear(2, 2)
    args = TrainingArguments(
        output_dir=str(tmp_path),
        learning_rate=1e-3,
        warmup_steps=4,
        lr_scheduler_type="constant_with_warmup",
        report_to="none",
        use_cpu=True,
    )
    trainer = ContrastiveTrainer(model=model, args=args, warmup_start_lr=1e-6)
    trainer.create_optimizer_and_scheduler(num_training_steps=10)
    lrs = []
    for _ in range(6):
        lrs.append(trainer.optimizer.param_groups[0]["lr"])
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
    expected = [1e-6 + (1e-3 - 1e-6) * step / 4 for step in range(4)] + [1e-3, 1e-3]
    assert lrs == pytest.approx(expected)


def test_weight_decay_only_on_matrices(tmp_path):
    model = build_model(architecture(), "diffclip")
    trainer = ContrastiveTrainer(
        model=model, args=TrainingArguments(output_dir=str(tmp_path), weight_decay=0.5, report_to="none")
    )
    decayed = set(trainer.get_decay_parameter_names(model))
    assert "vision_model.encoder.layers.0.self_attn.q_proj.weight" in decayed
    assert "text_model.embeddings.token_embedding.weight" in decayed
    attention = "vision_model.encoder.layers.0.self_attn"
    for name in (
        "logit_scale",
        f"{attention}.lambda_q1",
        f"{attention}.diff_norm.weight",
        f"{attention}.q_proj.bias",
    ):
        assert name not in decayed, name


def test_crops_are_a_function_of_the_sample_seed():
    seen = []
    array = np.random.default_rng(0).integers(0, 255, (40, 40, 3), dtype=np.uint8)
    image = Image.fromarray(array)
    collator = RandomResizedCropCollator(lambda rows: seen.extend(rows) or {}, size=16, scale=(0.1, 0.5))
    rows = [{"image": image, "caption": "a", "sample_seed": seed} for seed in (1, 1, 2)]
    torch.manual_seed(0)
    collator(rows)
    torch.manual_seed(99)  # the global RNG plays no part
    collator(rows[:1])
    crops = [np.asarray(row["image"]) for row in seen]
    assert np.array_equal(crops[0], crops[1]) and np.array_equal(crops[0], crops[3])
    assert not np.array_equal(crops[0], crops[2])
    full = RandomResizedCropCollator(lambda rows: seen.extend(rows) or {}, size=20, scale=(1.0, 1.0))
    full([{"image": image, "caption": "a"}])  # the full-area crop of a square image is the image
    assert np.array_equal(np.asarray(seen[-1]["image"]), np.asarray(image.resize((20, 20), Image.BILINEAR)))
    with pytest.raises(ValueError, match="crop scale"):
        RandomResizedCropCollator(lambda rows: rows, size=16, scale=(0.6, 0.5))
