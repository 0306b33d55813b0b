"""DiffCLIP conversion: from a transformers CLIP, and from the released (SLIP-style) DiffCLIP checkpoints."""

import argparse
import copy
import logging
import math
import os
import pathlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from datasets import Dataset
from PIL import Image
from test_diffclip_reference import text_batch, tiny_config_kwargs
from transformers import AutoImageProcessor, CLIPConfig, CLIPImageProcessor, CLIPModel

from hf_vrl.contrastive import clip_contrastive_loss
from hf_vrl.data import ImageTextCollator, load_toy_tokenizer, shapes_dataset
from hf_vrl.errors import UserError
from hf_vrl.methods import diffclip
from hf_vrl.methods.diffclip.convert import (
    SYNTHETIC,
    calibration_inputs,
    diffclip_config_from_clip,
    diffclip_from_clip,
    set_lambda,
)
from hf_vrl.methods.diffclip.official import diffclip_config_from_official, load_official_checkpoint
from hf_vrl.methods.diffclip.processors import slip_image_processor
from hf_vrl.trainer import in_batch_accuracy

WIDTH, HEADS, LAYERS, PATCH, IMAGE, VOCAB, CONTEXT, PROJECTION = 32, 4, 2, 4, 16, 40, 16, 16


@pytest.fixture(scope="module")
def clip() -> CLIPModel:
    """A tiny random CLIP with peaked maps (scaled queries) and value biases, as trained CLIPs have."""
    torch.manual_seed(0)
    model = CLIPModel(CLIPConfig(**tiny_config_kwargs())).eval()
    with torch.no_grad():
        for name, module in model.named_modules():
            if name.endswith("self_attn"):
                module.q_proj.weight.mul_(4.0)
                module.v_proj.bias.normal_(0, 0.5)
    return model


def embeddings(model, pixel_values, input_ids, attention_mask):
    with torch.no_grad():
        image = model.get_image_features(pixel_values=pixel_values).pooler_output
        text = model.get_text_features(input_ids=input_ids, attention_mask=attention_mask).pooler_output
    return image, text


def test_from_clip_copies_every_weight_and_starts_close_to_clip(clip):
    # This random CLIP is evaluated on N(0, 1) pixels, which the data-free calibration matches.
    model = diffclip.from_clip(clip, calibration_data=SYNTHETIC).eval()
    naive = diffclip_from_clip(clip, differential_init="random", calibration_data=SYNTHETIC).eval()
    clip_state, model_state = clip.state_dict(), model.state_dict()
    assert len(model_state) == len(clip_state) + 2 * LAYERS * 5
    for key, tensor in clip_state.items():
        assert torch.equal(model_state[key], tensor), key
    for attention in (layer.self_attn for layer in model.vision_model.encoder.layers):
        assert attention.lambda_full().item() == pytest.approx(-1.0, abs=1e-6)
        assert (attention.diff_norm.weight > 0).all()

    pixel_values = torch.randn(8, 3, IMAGE, IMAGE, generator=torch.Generator().manual_seed(1))
    input_ids, attention_mask = text_batch(seed=1)
    reference = embeddings(clip, pixel_values, input_ids, attention_mask)
    converted = embeddings(model, pixel_values, input_ids, attention_mask)
    naive_out = embeddings(naive, pixel_values, input_ids, attention_mask)
    for ours, theirs, original in zip(converted, naive_out, reference):
        similarity = F.cosine_similarity(ours, original, dim=-1).mean().item()
        naive_similarity = F.cosine_similarity(theirs, original, dim=-1).mean().item()
        assert similarity > 0.95 and 1 - similarity < 0.25 * (1 - naive_similarity), (
            similarity,
            naive_similarity,
        )


def test_from_clip_dagger_keeps_the_text_tower_exact_and_accepts_a_path(clip, tmp_path):
    clip.save_pretrained(tmp_path)
    calibration = {"pixel_values": torch.randn(4, 3, IMAGE, IMAGE), "input_ids": text_batch()[0]}
    model = diffclip.from_clip(
        str(tmp_path),
        diff_attention_in_text=False,
        lambda_init_schedule="depth",
        calibration_data=calibration,
    )
    assert not model.config.diff_attention_in_text
    assert model.config.vision_config.lambda_init_schedule == "depth"
    assert model.vision_model.encoder.layers[0].self_attn.lambda_init == pytest.approx(0.2)
    input_ids, attention_mask = text_batch()
    with torch.no_grad():
        ours = model.get_text_features(input_ids=input_ids, attention_mask=attention_mask).pooler_output
        theirs = clip.get_text_features(input_ids=input_ids, attention_mask=attention_mask).pooler_output
    torch.testing.assert_close(ours, theirs)


def test_from_clip_refuses_bad_overrides(clip):
    with pytest.raises(ValueError, match="do not override architecture fields"):
        diffclip_from_clip(clip, text_config={"intermediate_size": 48}, differential_init="random")
    with pytest.raises(TypeError, match="Unknown DiffCLIP config override 'lambda'"):
        diffclip_from_clip(clip, **{"lambda": 0.5})
    with pytest.raises(ValueError, match="differential_init"):
        diffclip_from_clip(clip, differential_init="zeros")
    with pytest.raises(TypeError, match="Expected a transformers CLIPModel"):
        diffclip_from_clip(torch.nn.Linear(2, 2))


def tiny_processor(size: int = IMAGE) -> CLIPImageProcessor:
    return CLIPImageProcessor(size={"shortest_edge": size}, crop_size={"height": size, "width": size})


def test_conversion_report_is_the_mean_cosine_on_the_heldout_quarter(clip, device, caplog):
    pixel_values = torch.randn(8, 3, IMAGE, IMAGE, generator=torch.Generator().manual_seed(3))
    input_ids, attention_mask = text_batch(batch_size=8, length=CONTEXT, seed=3)
    calibration = {"pixel_values": pixel_values, "input_ids": input_ids, "attention_mask": attention_mask}
    on_device = copy.deepcopy(clip).to(device)
    with caplog.at_level(logging.INFO, logger="hf_vrl.methods.diffclip.convert"):
        model = diffclip_from_clip(on_device, calibration_data=calibration)
    report = model.conversion_report
    assert (report.heldout_images, report.heldout_texts) == (2, 2)  # the last quarter of 8
    cosines = {"image": [], "text": []}
    for i in (6, 7):  # one example at a time, each model on its own device
        ours = embeddings(model, pixel_values[i : i + 1], input_ids[i : i + 1], attention_mask[i : i + 1])
        theirs = embeddings(
            on_device, *(t[i : i + 1].to(device) for t in (pixel_values, input_ids, attention_mask))
        )
        for name, a, b in zip(cosines, ours, theirs):
            a, b = a[0], b[0].cpu()
            cosines[name].append(float(a @ b / (a.norm() * b.norm())))
    assert report.image_cosine == pytest.approx(sum(cosines["image"]) / 2, abs=1e-4)
    assert report.text_cosine == pytest.approx(sum(cosines["text"]) / 2, abs=1e-4)
    assert len(set(cosines["image"])) == 2  # distinct per example: the held-out ones are told apart
    assert f"image {report.image_cosine:.3f}" in caplog.text and "the given tensors" in caplog.text


def test_calibration_inputs_from_images_datasets_and_names(clip, caplog):
    config = diffclip_config_from_clip(clip.config)
    processor, tokenizer = tiny_processor(), load_toy_tokenizer()
    default, description = calibration_inputs(None, config, processor, tokenizer, num_samples=8)
    assert default["pixel_values"].shape == (8, 3, IMAGE, IMAGE) and "shapes world" in description
    assert default["pixel_values"].mean() > 1.0  # mostly white canvases, far from N(0, 1)
    captions = tokenizer.batch_decode(default["input_ids"], skip_special_tokens=True)
    assert all(
        any(shape in caption for shape in ("circle", "square", "triang", "star", "cross"))
        for caption in captions
    )

    images = [Image.new("RGB", (20, 24), colour) for colour in ("red", "blue", "green")]
    own = ["a red square", "a blue square", "a green square"]
    dataset = Dataset.from_dict({"image": images, "caption": own})
    batch, description = calibration_inputs(dataset, config, processor, tokenizer)
    torch.testing.assert_close(
        batch["pixel_values"], processor(images=images, return_tensors="pt")["pixel_values"]
    )
    assert tokenizer.batch_decode(batch["input_ids"], skip_special_tokens=True) == own
    assert "Dataset (3 rows)" in description
    batch, description = calibration_inputs(images, config, processor, tokenizer, num_samples=5)
    assert len(batch["pixel_values"]) == 3 and len(batch["input_ids"]) == 5
    assert description == "3 given images, shapes-world captions"

    batch, description = calibration_inputs("digits", config, processor, tokenizer, num_samples=6)
    assert batch["pixel_values"].shape == (6, 3, IMAGE, IMAGE) and description == "'digits' (6 rows)"

    synthetic, description = calibration_inputs(SYNTHETIC, config, processor, tokenizer, num_samples=6)
    assert abs(synthetic["pixel_values"].mean()) < 0.1 and "synthetic" in description
    with caplog.at_level(logging.WARNING):
        batch, description = calibration_inputs(images, config, processor, None)
    assert "No tokenizer" in caplog.text and description.endswith("random token ids")
    assert (batch["input_ids"][:, 0] == 1).all() and (batch["input_ids"][:, -1] == 3).all()  # BOS, EOS


def test_calibration_mistakes_are_user_errors(clip):
    config = diffclip_config_from_clip(clip.config)
    processor, tokenizer = tiny_processor(), load_toy_tokenizer()
    images = [Image.new("RGB", (16, 16), "red")] * 2
    with pytest.raises(UserError, match="no 'image' column"):
        calibration_inputs(Dataset.from_dict({"picture": images}), config, processor, tokenizer)
    with pytest.raises(UserError, match=r"\(32, 32\) px but the CLIP takes 16 px"):
        calibration_inputs(images, config, tiny_processor(32), tokenizer)
    with pytest.raises(UserError, match="calibration_data must be"):
        calibration_inputs(42, config, processor, tokenizer)
    with pytest.raises(UserError, match="at least 2 examples"):
        diffclip_from_clip(clip, calibration_data=images[:1], image_processor=processor, tokenizer=tokenizer)


# --- a CLIP trained for real: the toy world, tiny sizes, a few seconds -----------------------------------

# tiny-clip's tower sizes (64 wide, 4 heads, 32 px in 4 px patches), trained to in-batch accuracy ~0.3.
TOY_IMAGE, TOY_WIDTH, TOY_HEADS, TOY_STEPS, TOY_BATCH, TOY_LR, TOY_SEED = 32, 64, 4, 150, 64, 2e-3, 1


@pytest.fixture(scope="module")
def trained_clip(tmp_path_factory) -> pathlib.Path:
    """A 2-layer CLIP trained with the CLIP loss on the shapes world, saved with processor and tokenizer."""
    tokenizer, processor = load_toy_tokenizer(), tiny_processor(TOY_IMAGE)
    tower = {"hidden_size": TOY_WIDTH, "intermediate_size": 4 * TOY_WIDTH, "num_hidden_layers": 2}
    config = CLIPConfig(
        text_config={**tower, "num_attention_heads": TOY_HEADS, "vocab_size": len(tokenizer)}
        | {"max_position_embeddings": 24, "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2},
        vision_config={**tower, "num_attention_heads": TOY_HEADS, "image_size": TOY_IMAGE, "patch_size": 4},
        projection_dim=32,
    )
    torch.manual_seed(TOY_SEED)
    clip = CLIPModel(config)
    collator = ImageTextCollator(processor, tokenizer, max_length=24)
    data = shapes_dataset(2048, image_size=TOY_IMAGE)
    batches = [collator(list(data.select(range(i, i + TOY_BATCH)))) for i in range(0, len(data), TOY_BATCH)]
    decay = [param for param in clip.parameters() if param.ndim >= 2]
    rest = [param for param in clip.parameters() if param.ndim < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=TOY_LR)

    def warmup_cosine(step: int) -> float:
        return min(1.0, (step + 1) / 10) * 0.5 * (1 + math.cos(math.pi * step / TOY_STEPS))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine)
    for step in range(TOY_STEPS):
        batch = batches[step % len(batches)]
        out = clip(**{key: batch[key] for key in ("pixel_values", "input_ids", "attention_mask")})
        clip_contrastive_loss(out.image_embeds, out.text_embeds, clip.logit_scale.exp()).backward()
        optimizer.step(), schedule.step(), optimizer.zero_grad()
    path = tmp_path_factory.mktemp("trained-clip")
    for part in (clip, processor, tokenizer):
        part.save_pretrained(path)
    return path


def closeness(model, clip, batch) -> tuple[float, float, float]:
    """(image cosine, text cosine) to the CLIP and in-batch image-to-text accuracy (batches of TOY_BATCH)."""
    ours, theirs = (embeddings(m, *batch) for m in (model, clip))
    image, text = (F.cosine_similarity(a, b, dim=-1).mean().item() for a, b in zip(ours, theirs))
    accuracy = torch.cat(
        [in_batch_accuracy(*(t[i : i + TOY_BATCH] for t in ours)) for i in range(0, len(ours[0]), TOY_BATCH)]
    )
    return image, text, accuracy.mean().item()


def test_from_clip_starts_close_to_a_trained_clip_where_data_free_calibration_does_not(trained_clip):
    clip = CLIPModel.from_pretrained(trained_clip).eval()
    collator = ImageTextCollator(tiny_processor(TOY_IMAGE), load_toy_tokenizer(), max_length=24)
    test = collator(list(shapes_dataset(256, image_size=TOY_IMAGE, split="test")))
    batch = [test[key] for key in ("pixel_values", "input_ids", "attention_mask")]
    clip_accuracy = closeness(clip, clip, batch)[2]
    # By path: its own processor and tokenizer; by default calibrated on the shapes world.
    converted = diffclip.from_clip(str(trained_clip)).eval()
    data_free = diffclip.from_clip(str(trained_clip), calibration_data=SYNTHETIC).eval()
    image, text, accuracy = closeness(converted, clip, batch)
    free_image, free_text, free_accuracy = closeness(data_free, clip, batch)
    print(
        f"CLIP in-batch accuracy {clip_accuracy:.3f}; shapes-world calibration: cosine image {image:.3f} "
        f"text {text:.3f}, accuracy {accuracy:.3f}; data-free: cosine image {free_image:.3f} text "
        f"{free_text:.3f}, accuracy {free_accuracy:.3f}; report: {converted.conversion_report}"
    )
    assert clip_accuracy > 10 / TOY_BATCH  # trained: clearly better than chance (1 / TOY_BATCH)
    assert image > 0.9 and text > 0.95 and accuracy > 0.5 * clip_accuracy
    assert free_image < image - 0.2 and free_accuracy < 0.5 * accuracy
    report = converted.conversion_report
    assert report.image_cosine > 0.9 and report.text_cosine > 0.95 and "shapes world" in report.calibration


@pytest.mark.parametrize("target", [-1.0, 0.0, 0.8, 1.3])
def test_set_lambda_hits_the_target_with_nonzero_vectors(target):
    clip = CLIPModel(CLIPConfig(**tiny_config_kwargs()))
    model = diffclip.from_clip(clip, differential_init="random", calibration_data=SYNTHETIC)
    attention = model.text_model.encoder.layers[1].self_attn
    set_lambda(attention, target)
    assert attention.lambda_full().item() == pytest.approx(target, abs=1e-6)
    for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
        assert getattr(attention, name).norm() > 0.1
    attention.lambda_full().backward()
    assert all(getattr(attention, name).grad.norm() > 0 for name in ("lambda_q1", "lambda_k2"))


# --- released checkpoints: a generated file in the SLIP / timm / OpenAI layout ---------------------------


def official_state_dict(
    seed: int = 0, text_width: int = WIDTH, plain_text: bool = False
) -> dict[str, torch.Tensor]:
    """Random weights under the released DiffCLIP key names (timm ViT, OpenAI text, raw projections).

    `plain_text`: SLIP's plain text blocks (`nn.MultiheadAttention`: fused `in_proj_weight` / `in_proj_bias`,
    `out_proj`, no λ), as a DiffCLIP† trained with SLIP's code has them."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, std=0.2):
        return torch.randn(*shape, generator=g) * std

    state = {
        "visual.patch_embed.proj.weight": rand(WIDTH, 3, PATCH, PATCH),
        "visual.patch_embed.proj.bias": rand(WIDTH),
        "visual.cls_token": rand(1, 1, WIDTH),
        "visual.pos_embed": rand(1, (IMAGE // PATCH) ** 2 + 1, WIDTH),
        "visual.norm.weight": 1 + rand(WIDTH),
        "visual.norm.bias": rand(WIDTH),
        "image_projection": rand(WIDTH, PROJECTION),
        "token_embedding.weight": rand(VOCAB, text_width),
        "positional_embedding": rand(CONTEXT, text_width),
        "ln_final.weight": 1 + rand(text_width),
        "ln_final.bias": rand(text_width),
        "text_projection": rand(text_width, PROJECTION),
        "logit_scale": torch.tensor(math.log(1 / 0.07)),
    }
    blocks = {
        "visual.blocks": ("norm1", "norm2", "mlp.fc1", "mlp.fc2", WIDTH, False),
        "transformer.resblocks": ("ln_1", "ln_2", "mlp.c_fc", "mlp.c_proj", text_width, plain_text),
    }
    for prefix, (norm1, norm2, fc1, fc2, width, plain) in blocks.items():
        head_dim = width // HEADS
        for i in range(LAYERS):
            block = f"{prefix}.{i}."
            if plain:
                state[f"{block}attn.in_proj_weight"] = rand(3 * width, width, std=0.4)
                state[f"{block}attn.in_proj_bias"] = rand(3 * width)
            projections = ("out_proj",) if plain else ("q_proj", "k_proj", "v_proj", "out_proj")
            for proj in projections:
                state[f"{block}attn.{proj}.weight"] = rand(width, width, std=0.4)
                state[f"{block}attn.{proj}.bias"] = rand(width)
            if not plain:
                for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
                    state[f"{block}attn.{name}"] = rand(head_dim, std=0.3)
                state[f"{block}attn.diff_norm.weight"] = 1 + rand(2 * head_dim)
            for norm in (norm1, norm2):
                state[f"{block}{norm}.weight"], state[f"{block}{norm}.bias"] = 1 + rand(width), rand(width)
            state[f"{block}{fc1}.weight"], state[f"{block}{fc1}.bias"] = (
                rand(2 * width, width),
                rand(2 * width),
            )
            state[f"{block}{fc2}.weight"], state[f"{block}{fc2}.bias"] = rand(width, 2 * width), rand(width)
    return state


def slip_checkpoint(state: dict) -> dict:
    """The SLIP training-checkpoint wrapper, with the non-tensor objects such files really hold."""
    args = argparse.Namespace(
        model="DiffCLIP_VITB16",
        lr=5e-4,
        wd=np.float64(0.5),
        seed=np.int64(0),
        output_dir=pathlib.PosixPath("/out"),
    )
    return {
        "state_dict": {f"module.{key}": value for key, value in state.items()},
        "optimizer": {"state": {}, "param_groups": [{"lr": 5e-4, "betas": (0.9, 0.98), "params": [0, 1]}]},
        "scaler": {"scale": 65536.0, "growth_factor": 2.0},
        "args": args,
        "epoch": 39,
        "best_acc1": np.float64(14.4),
    }


def released_attention(x, state, prefix, lambda_init=0.8, mask=None):
    """The released DiffAttention math, batched: paired heads, shared λ, RMSNorm · (1 − λ_init)."""
    batch, tokens, width = x.shape
    head_dim = width // HEADS
    q = F.linear(x, state[f"{prefix}q_proj.weight"], state[f"{prefix}q_proj.bias"])
    k = F.linear(x, state[f"{prefix}k_proj.weight"], state[f"{prefix}k_proj.bias"])
    v = F.linear(x, state[f"{prefix}v_proj.weight"], state[f"{prefix}v_proj.bias"])
    q = q.view(batch, tokens, HEADS, head_dim).transpose(1, 2) * head_dim**-0.5
    k = k.view(batch, tokens, HEADS, head_dim).transpose(1, 2)
    v = v.view(batch, tokens, HEADS // 2, 2 * head_dim).transpose(1, 2)
    scores = q @ k.transpose(-1, -2) + (0 if mask is None else mask)
    maps = torch.softmax(scores, dim=-1).view(batch, HEADS // 2, 2, tokens, tokens)
    lam = (
        torch.exp(torch.sum(state[f"{prefix}lambda_q1"] * state[f"{prefix}lambda_k1"]))
        - torch.exp(torch.sum(state[f"{prefix}lambda_q2"] * state[f"{prefix}lambda_k2"]))
        + lambda_init
    )
    out = (maps[:, :, 0] - lam * maps[:, :, 1]) @ v
    out = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + 1e-5) * state[f"{prefix}diff_norm.weight"]
    out = (out * (1 - lambda_init)).transpose(1, 2).reshape(batch, tokens, width)
    return F.linear(out, state[f"{prefix}out_proj.weight"], state[f"{prefix}out_proj.bias"])


def slip_attention(x, state, prefix, mask):
    """SLIP's plain text attention: its ResidualAttentionBlock's `nn.MultiheadAttention` (sequence first)."""
    attention = torch.nn.MultiheadAttention(x.shape[-1], HEADS)
    names = ("in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias")
    attention.load_state_dict({name: state[prefix + name] for name in names})
    with torch.no_grad():
        out = attention(*(x.transpose(0, 1),) * 3, need_weights=False, attn_mask=mask)[0]
    return out.transpose(0, 1)


def released_features(state, pixel_values, input_ids):
    """SLIP's encode_image / encode_text with the released towers (timm ViT: no pre-norm, GELU)."""

    def ln(x, name):
        return F.layer_norm(x, x.shape[-1:], state[f"{name}.weight"], state[f"{name}.bias"], eps=1e-5)

    def mlp(x, fc1, fc2, act):
        return F.linear(
            act(F.linear(x, state[f"{fc1}.weight"], state[f"{fc1}.bias"])),
            state[f"{fc2}.weight"],
            state[f"{fc2}.bias"],
        )

    x = F.conv2d(
        pixel_values,
        state["visual.patch_embed.proj.weight"],
        state["visual.patch_embed.proj.bias"],
        stride=PATCH,
    )
    x = (
        torch.cat([state["visual.cls_token"].expand(len(x), -1, -1), x.flatten(2).transpose(1, 2)], 1)
        + state["visual.pos_embed"]
    )
    for i in range(LAYERS):
        block = f"visual.blocks.{i}."
        x = x + released_attention(ln(x, block + "norm1"), state, block + "attn.")
        x = x + mlp(ln(x, block + "norm2"), block + "mlp.fc1", block + "mlp.fc2", F.gelu)
    image = ln(x, "visual.norm")[:, 0] @ state["image_projection"]

    tokens = input_ids.shape[1]
    x = state["token_embedding.weight"][input_ids] + state["positional_embedding"][:tokens]
    causal = torch.triu(torch.full((tokens, tokens), float("-inf")), diagonal=1)
    for i in range(LAYERS):
        block = f"transformer.resblocks.{i}."
        plain = f"{block}attn.in_proj_weight" in state
        attention = slip_attention if plain else released_attention
        x = x + attention(ln(x, block + "ln_1"), state, block + "attn.", mask=causal)
        x = x + mlp(
            ln(x, block + "ln_2"),
            block + "mlp.c_fc",
            block + "mlp.c_proj",
            lambda t: t * torch.sigmoid(1.702 * t),
        )
    x = ln(x, "ln_final")
    text = x[torch.arange(len(x)), input_ids.argmax(-1)] @ state["text_projection"]
    return image, text


def released_inputs(seed: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """Two images and two texts (BOS = VOCAB-2 ... EOS = VOCAB-1, the highest id, then padding 0)."""
    g = torch.Generator().manual_seed(seed)
    pixel_values = torch.randn(2, 3, IMAGE, IMAGE, generator=g)
    input_ids = torch.randint(3, VOCAB - 2, (2, 10), generator=g)
    input_ids[:, 0], input_ids[0, 9], input_ids[1, 6], input_ids[1, 7:] = VOCAB - 2, VOCAB - 1, VOCAB - 1, 0
    return pixel_values, input_ids


def assert_matches_released_math(model, state):
    pixel_values, input_ids = released_inputs()
    expected_image, expected_text = released_features(state, pixel_values, input_ids)
    with torch.no_grad():
        image = model.get_image_features(pixel_values=pixel_values).pooler_output
        text = model.get_text_features(
            input_ids=input_ids, attention_mask=(input_ids > 0).long()
        ).pooler_output
    torch.testing.assert_close(image, expected_image, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(text, expected_text, atol=1e-5, rtol=1e-4)


def test_official_checkpoint_loads_safely_and_matches_the_released_math(tmp_path):
    state = official_state_dict()
    path = tmp_path / "checkpoint_best.pt"
    torch.save(slip_checkpoint(state), path)
    model = diffclip.from_official_checkpoint(path).eval()
    config = model.config
    assert (config.vision_config.hidden_act, config.text_config.hidden_act) == ("gelu", "quick_gelu")
    assert not config.vision_config.pre_layernorm and config.text_config.eos_token_id == VOCAB - 1
    assert config.vision_config.num_attention_heads == HEADS and config.vision_config.image_size == IMAGE
    assert all(layer.self_attn.lambda_init == 0.8 for layer in model.text_model.encoder.layers)
    assert_matches_released_math(model, state)
    torch.testing.assert_close(model.logit_scale, state["logit_scale"])


def test_slip_plain_text_blocks_map_fused_in_proj_to_q_k_v(tmp_path):
    # A DiffCLIP† trained with SLIP's code: differential vision, SLIP's nn.MultiheadAttention text blocks.
    state = official_state_dict(plain_text=True)
    path = tmp_path / "dagger.pt"
    torch.save(slip_checkpoint(state), path)
    with pytest.raises(UserError, match=r"32 wide.*text_config=\{'num_attention_heads': H\}"):
        diffclip.from_official_checkpoint(path)  # narrow: the head count cannot be read off
    model = diffclip.from_official_checkpoint(path, text_config={"num_attention_heads": HEADS}).eval()
    assert not model.config.text_config.differential_attention
    assert model.config.vision_config.differential_attention
    attention = model.text_model.encoder.layers[1].self_attn
    q, k, v = state["transformer.resblocks.1.attn.in_proj_weight"].chunk(3)
    assert torch.equal(attention.q_proj.weight, q) and torch.equal(attention.v_proj.weight, v)
    assert torch.equal(
        attention.k_proj.bias, state["transformer.resblocks.1.attn.in_proj_bias"][WIDTH:-WIDTH]
    )
    assert_matches_released_math(model, state)


def test_plain_text_heads_are_openai_64_wide_and_fused_shapes_are_checked(tmp_path):
    state = official_state_dict(text_width=128, plain_text=True)
    assert diffclip_config_from_official(state).text_config.num_attention_heads == 2
    config = diffclip_config_from_official(state, text_config={"num_attention_heads": HEADS})
    assert config.text_config.num_attention_heads == HEADS
    state["transformer.resblocks.0.attn.in_proj_weight"] = torch.zeros(3 * 128 + 3, 128)
    torch.save(slip_checkpoint(state), tmp_path / "bad.pt")
    with pytest.raises(ValueError, match=r"layers.0.self_attn.q_proj.weight: checkpoint shape \(129, 128\)"):
        diffclip.from_official_checkpoint(tmp_path / "bad.pt")


def test_official_checkpoint_with_unknown_or_missing_keys_is_refused(tmp_path):
    state = official_state_dict()
    state["visual.head.weight"] = torch.zeros(3, WIDTH)
    del state["ln_final.bias"]
    torch.save(slip_checkpoint(state), tmp_path / "ckpt.pt")
    with pytest.raises(
        ValueError, match=r"missing keys \['ln_final.bias'\], unknown keys \['visual.head.weight'\]"
    ):
        diffclip.from_official_checkpoint(tmp_path / "ckpt.pt")


class Exploit:
    """Unpickling this would run a shell command."""

    def __init__(self, marker: pathlib.Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_pickle_with_a_code_global_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "pwned"
    checkpoint = slip_checkpoint(official_state_dict())
    checkpoint["args"] = Exploit(marker)
    torch.save(checkpoint, tmp_path / "evil.pt")
    with pytest.raises(ValueError, match=r"Refusing to load .*(posix|os)\.system"):
        load_official_checkpoint(tmp_path / "evil.pt")
    assert not marker.exists()


def test_checkpoint_pickled_with_numpy_1_names_loads(tmp_path):
    # The released files were written with numpy 1.x, whose scalars pickle as numpy.core.multiarray.scalar.
    import zipfile

    torch.save(slip_checkpoint(official_state_dict()), tmp_path / "numpy2.pt")
    with (
        zipfile.ZipFile(tmp_path / "numpy2.pt") as source,
        zipfile.ZipFile(tmp_path / "numpy1.pt", "w") as target,
    ):
        for item in source.infolist():
            data = source.read(item.filename)
            if item.filename.endswith("data.pkl"):
                assert b"numpy._core.multiarray" in data
                data = data.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
            target.writestr(item, data)
    checkpoint = load_official_checkpoint(tmp_path / "numpy1.pt")
    assert checkpoint["best_acc1"] == 14.4 and checkpoint["args"].wd == 0.5
    assert checkpoint["args"].output_dir == pathlib.PosixPath("/out")


# --- SLIP's evaluation preprocessing ---------------------------------------------------------------------


def slip_val_transform(image: Image.Image, size: int = 224) -> torch.Tensor:
    """SLIP's `val_transform` written out: torchvision's Resize(size) (shorter side, bilinear on the PIL
    image) and CenterCrop(size) (offsets rounded), ToTensor, Normalize with ImageNet mean/std."""
    width, height = image.size
    short, long = min(width, height), max(width, height)
    new_long = int(size * long / short)
    new_width, new_height = (size, new_long) if width <= height else (new_long, size)
    image = image.resize((new_width, new_height), Image.BILINEAR)
    top, left = int(round((new_height - size) / 2.0)), int(round((new_width - size) / 2.0))
    image = image.crop((left, top, left + size, top + size))
    pixels = torch.tensor(np.asarray(image), dtype=torch.float32).permute(2, 0, 1) / 255
    mean, std = torch.tensor([0.485, 0.456, 0.406]), torch.tensor([0.229, 0.224, 0.225])
    return (pixels - mean[:, None, None]) / std[:, None, None]


def test_slip_image_processor_reproduces_slips_evaluation_preprocessing(tmp_path):
    rng = np.random.default_rng(0)
    # portrait 300x400 -> 224x298, landscape 500x333 -> 336x224: the crop margins are even (see the docstring)
    images = [
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in ((300, 400), (500, 333))
    ]
    processor = slip_image_processor()
    processor.save_pretrained(tmp_path)
    reloaded = AutoImageProcessor.from_pretrained(tmp_path, backend="pil")
    expected = torch.stack([slip_val_transform(image) for image in images])
    for candidate in (processor, reloaded):
        pixel_values = candidate(images=images, return_tensors="pt")["pixel_values"]
        torch.testing.assert_close(pixel_values, expected, atol=1e-5, rtol=0)
    # AutoImageProcessor's default backend is torchvision where it is installed: its resize rounds the
    # resampled pixels differently, by at most one grey level
    default = AutoImageProcessor.from_pretrained(tmp_path)(images=images, return_tensors="pt")["pixel_values"]
    one_grey_level = 1.01 / 255 / min(processor.image_std)
    torch.testing.assert_close(default, expected, atol=one_grey_level, rtol=0)
    clip_default = CLIPImageProcessor()(images=images, return_tensors="pt")["pixel_values"]
    assert (clip_default - expected).abs().mean() > 0.05  # bicubic, OpenAI mean/std: not SLIP's
