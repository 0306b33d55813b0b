"""`hf-vrl train diffclip`: end-to-end runs of both archs on the toy world, reload, resume, presets."""

import io
import json
import shutil
import tarfile

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from transformers import AutoConfig, AutoImageProcessor, AutoModel, AutoTokenizer, TrainingArguments
from transformers.dynamic_module_utils import get_class_from_dynamic_module

from hf_vrl.data.registry import load_dataset_by_name
from hf_vrl.methods.diffclip import train as train_module
from hf_vrl.methods.diffclip.train import (
    RandomResizedCropCollator,
    build_model,
    evaluate_model,
    load_processors,
    main,
    training_arguments,
)
from hf_vrl.presets import load_preset, preset_path
from hf_vrl.trainer import ContrastiveTrainer

# tiny runs: 32 training pairs in batches of 8 (4 steps per epoch), 16 evaluation pairs
COMMON = "--train-limit 32 --batch-size 8 --eval-limit 16 --logging-steps 1 --seed 0".split()
NO_CROP = "--crop-scale 1 1".split()  # a full-area crop of a square image is the image


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One CLIP run (2 steps, with the preset's random crops) and one DiffCLIP run (4 steps, checkpoints at 2
    and 4, its figure drawn next to the CLIP run's), both with eval. The DiffCLIP run keeps whole images so
    that a resumed run can match it exactly (the loader's look-ahead batch shifts crops on resume)."""
    root = tmp_path_factory.mktemp("runs")
    assert main([*COMMON, "--arch", "clip", "--output-dir", str(root / "clip"), "--max-steps", "2"]) == 0
    diffclip = f"--arch diffclip --output-dir {root / 'diffclip'} --max-steps 4 --save-steps 2".split()
    assert main([*COMMON, *NO_CROP, *diffclip, "--compare-with", str(root / "clip")]) == 0
    return root


def _log_losses(output_dir) -> dict[int, float]:
    history = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
    return {entry["step"]: entry["loss"] for entry in history if "loss" in entry}


@pytest.mark.parametrize("arch", ["diffclip", "clip"])
def test_trained_model_reloads_with_its_processors(runs, arch):
    out = runs / arch
    results = json.loads((out / "results.json").read_text())
    assert results["arch"] == arch and results["global_step"] == (4 if arch == "diffclip" else 2)
    assert set(_log_losses(out)) == set(range(1, results["global_step"] + 1))
    assert (out / "eval_before.json").is_file() and (out / "eval_after.json").is_file()
    with Image.open(out / "attention.png") as figure:  # image | CLIP (| DiffCLIP), 250 px panels
        assert figure.size == ((3 if arch == "diffclip" else 2) * 250, 250)

    model = AutoModel.from_pretrained(out, trust_remote_code=True)
    assert type(model).__name__ == {"diffclip": "DiffCLIPModel", "clip": "CLIPModel"}[arch]
    if arch == "diffclip":
        # the folder carries its own code: the class loads from the copied modeling file (as the Hub would)
        auto_map = json.loads((out / "config.json").read_text())["auto_map"]
        remote_class = get_class_from_dynamic_module(auto_map["AutoModel"], str(out))
        assert remote_class.__module__.startswith("transformers_modules")
        remote = remote_class.from_pretrained(out)
        for (name, param), remote_param in zip(model.state_dict().items(), remote.state_dict().values()):
            torch.testing.assert_close(param, remote_param, msg=name)
    # the saved model + tokenizer + processor reproduce the after-training evaluation of the in-memory model
    data = load_dataset_by_name("shapes", split="test", limit=16, image_size=32, seed=0)
    report = evaluate_model(
        model, AutoImageProcessor.from_pretrained(out), AutoTokenizer.from_pretrained(out), data
    )
    assert report["retrieval"] == pytest.approx(results["after"]["retrieval"])
    assert report["zero_shot"] == pytest.approx(results["after"]["zero_shot"])


def test_resume_continues_at_the_checkpoint_step(runs, tmp_path, monkeypatch):
    """Resuming the 4-step run from its step-2 checkpoint trains steps 3-4 only and reproduces them."""
    reference = runs / "diffclip"
    resumed = tmp_path / "resumed"
    shutil.copytree(reference / "checkpoint-2", resumed / "checkpoint-2")
    trained_steps = []
    original_step = ContrastiveTrainer.training_step

    def counting_step(self, *args, **kwargs):
        trained_steps.append(self.state.global_step)
        return original_step(self, *args, **kwargs)

    monkeypatch.setattr(ContrastiveTrainer, "training_step", counting_step)
    argv = [*COMMON, *NO_CROP, *f"--output-dir {resumed} --max-steps 4 --save-steps 2 --no-eval".split()]
    assert main([*argv, "--resume-from-checkpoint"]) == 0
    assert trained_steps == [2, 3]  # the micro-batches of optimizer steps 3 and 4 (global_step before each)
    losses, expected = _log_losses(resumed), _log_losses(reference)
    assert sorted(losses) == [1, 2, 3, 4]  # steps 1-2 come from the checkpoint's state, 3-4 were trained
    for step in (3, 4):
        assert losses[step] == pytest.approx(expected[step], rel=1e-5)
    final = load_file(resumed / "model.safetensors")
    for name, tensor in load_file(reference / "model.safetensors").items():
        torch.testing.assert_close(final[name], tensor, rtol=1e-4, atol=1e-6)


def _vit_clip_param_count(text: dict, vision: dict, projection_dim: int) -> int:
    """CLIP's parameter count written out: embeddings, per-layer attention/MLP/LayerNorms, norms, heads."""

    def layers(width: int, mlp: int, n: int) -> int:
        return n * (4 * (width * width + width) + (width * mlp + mlp) + (mlp * width + width) + 4 * width)

    w, patches = vision["hidden_size"], (vision["image_size"] // vision["patch_size"]) ** 2
    vision_params = (
        3 * vision["patch_size"] ** 2 * w + w + (patches + 1) * w + 2 * w
    )  # conv, cls, pos, pre-LN
    vision_params += layers(w, vision["intermediate_size"], vision["num_hidden_layers"]) + 2 * w  # + post-LN
    t = text["hidden_size"]
    text_params = (text["vocab_size"] + text["max_position_embeddings"]) * t + 2 * t  # embeddings, final LN
    text_params += layers(t, text["intermediate_size"], text["num_hidden_layers"])
    return vision_params + text_params + (w + t) * projection_dim + 1  # projections, logit_scale


def test_b16_preset_parameter_count_on_meta_device():
    preset = load_preset("diffclip-b16")
    with torch.device("meta"):
        clip = build_model("clip", preset)
        diffclip = build_model("diffclip", preset)
    assert all(p.is_meta for p in diffclip.parameters())
    n_clip = sum(p.numel() for p in clip.parameters())
    n_diffclip = sum(p.numel() for p in diffclip.parameters())
    model = preset["model"]
    assert n_clip == _vit_clip_param_count(
        model["text_config"], model["vision_config"], model["projection_dim"]
    )
    assert n_clip == 149_620_737  # openai/clip-vit-base-patch16
    # DiffCLIP adds per layer (both towers) the λ vectors (4 x head_dim) and the RMSNorm weight (2 x head_dim)
    assert n_diffclip - n_clip == 24 * (4 * 64 + 2 * 64)
    assert diffclip.config.vision_config.lambda_init == 0.8 and diffclip.config.diff_attention_in_text


def test_tiny_preset_matches_tiny_clip():
    """Both archs of diffclip-tiny have exactly the sizes of hub_configs/tiny-clip (the demo's CLIP)."""
    reference = AutoConfig.from_pretrained(preset_path("tiny-clip"))
    _, tokenizer = load_processors("tiny-clip", "tiny-clip")
    config = build_model("clip", "diffclip-tiny", tokenizer=tokenizer).config
    assert config.projection_dim == reference.projection_dim
    fields = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "hidden_act")
    for tower in ("text_config", "vision_config"):
        ours, theirs = getattr(config, tower), getattr(reference, tower)
        for field in fields:
            assert getattr(ours, field) == getattr(theirs, field), (tower, field)
    for field in ("vocab_size", "max_position_embeddings", "bos_token_id", "eos_token_id", "pad_token_id"):
        assert getattr(config.text_config, field) == getattr(reference.text_config, field), field
    for field in ("image_size", "patch_size"):
        assert getattr(config.vision_config, field) == getattr(reference.vision_config, field), field


def test_diffclip_ablation_options_reach_the_config():
    preset = load_preset("diffclip-tiny")
    star = build_model("diffclip", preset, lambda_init_schedule="depth").config
    assert star.text_config.lambda_init_for_layer(1) == pytest.approx(0.8 - 0.6 * np.exp(-0.3))
    dagger = build_model("diffclip", preset, diff_attention_in_text=False).config
    assert not dagger.text_config.differential_attention and dagger.vision_config.differential_attention
    with pytest.raises(ValueError, match="only apply to DiffCLIP"):
        build_model("clip", preset, lambda_init=0.5)


def test_b16_recipe_training_arguments(tmp_path, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    args = training_arguments(load_preset("diffclip-b16")["training"], tmp_path)
    recipe = (args.learning_rate, args.weight_decay, args.adam_beta1, args.adam_beta2, args.adam_epsilon)
    assert recipe == (5e-4, 0.5, 0.9, 0.98, 1e-8)
    assert args.warmup_steps == pytest.approx(1 / 40) and args.num_train_epochs == 40
    assert args.gradient_accumulation_steps == 4096 // 256
    assert args.lr_scheduler_type == "cosine_with_min_lr" and args.max_grad_norm == 0
    monkeypatch.setattr(train_module, "_world_size", lambda: 4)  # as under a 4-process launch
    four_processes = training_arguments(load_preset("diffclip-b16")["training"], tmp_path)
    assert four_processes.gradient_accumulation_steps == 4
    explicit = training_arguments(
        {"global_batch_size": 4096}, tmp_path, gradient_accumulation_steps=2, bf16=False
    )
    assert explicit.gradient_accumulation_steps == 2
    with pytest.raises(TypeError, match="TrainingArguments fields"):
        training_arguments({"learning_rat": 1e-3}, tmp_path)


def test_weight_decay_only_on_matrices(tmp_path):
    model = build_model("diffclip", "diffclip-tiny")
    trainer = ContrastiveTrainer(
        model=model, args=TrainingArguments(output_dir=str(tmp_path), weight_decay=0.5, report_to="none")
    )
    decayed = set(trainer.get_decay_parameter_names(model))
    assert "vision_model.encoder.layers.0.self_attn.q_proj.weight" in decayed
    assert "text_model.embeddings.token_embedding.weight" in decayed
    attention = "vision_model.encoder.layers.0.self_attn"
    not_decayed = [
        "logit_scale",
        "vision_model.embeddings.class_embedding",
        f"{attention}.lambda_q1",
        f"{attention}.diff_norm.weight",
        f"{attention}.q_proj.bias",
        "text_model.final_layer_norm.weight",
    ]
    for name in not_decayed:
        assert name not in decayed, name
    groups = trainer.create_optimizer().param_groups
    assert sorted(g["weight_decay"] for g in groups) == [0.0, 0.5]


def test_random_resized_crop_collator():
    seen = []
    collator = RandomResizedCropCollator(lambda rows: seen.extend(rows) or {}, size=20, scale=(1.0, 1.0))
    array = np.random.default_rng(0).integers(0, 255, (40, 40, 3), dtype=np.uint8)
    image = Image.fromarray(array)
    collator([{"image": image, "caption": "a"}])
    # the full-area crop of a square image is the image itself, resized
    assert np.array_equal(np.asarray(seen[0]["image"]), np.asarray(image.resize((20, 20), Image.BILINEAR)))
    assert seen[0]["caption"] == "a"
    collator = RandomResizedCropCollator(lambda rows: seen.extend(rows) or {}, size=16, scale=(0.1, 0.3))
    collator([{"image": Image.fromarray(array[:, :30]), "caption": "b"}])
    assert seen[-1]["image"].size == (16, 16)
    with pytest.raises(ValueError, match="crop scale"):
        RandomResizedCropCollator(lambda rows: rows, size=16, scale=(0.6, 0.5))


def test_streamed_dataset_needs_max_steps(tmp_path):
    shard = tmp_path / "00000.tar"
    with tarfile.open(shard, "w") as tar:
        for key in ("a", "b"):
            buffer = io.BytesIO()
            Image.new("RGB", (32, 32), "red").save(buffer, format="PNG")
            for name, data in ((f"{key}.png", buffer.getvalue()), (f"{key}.txt", b"a red square")):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    with pytest.raises(SystemExit, match="--max-steps"):
        main(["--dataset", f"webdataset:{shard}", "--no-eval", "--output-dir", str(tmp_path / "out")])


def test_help_lists_the_main_options(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for option in "--config --arch --dataset --max-steps --resume-from-checkpoint --eval-dataset".split():
        assert option in text
