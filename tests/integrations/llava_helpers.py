"""Tiny LLaVA pieces built from configs: the toy tokenizer with an `<image>` token, a 2-layer Llama, vision
towers of the families hf_vrl exports (CLIP as DCR / DiVE export, DiffCLIP, ViT as CLUE's backbone,
SigLIP)."""

from __future__ import annotations

import torch
from transformers import (
    AutoTokenizer,
    CLIPImageProcessorPil,
    CLIPVisionConfig,
    CLIPVisionModel,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
    SiglipVisionConfig,
    SiglipVisionModel,
    ViTConfig,
    ViTModel,
)

from hf_vrl.methods.dcr.toy import tiny_clip
from hf_vrl.models.diffclip import DiffCLIPVisionConfig, DiffCLIPVisionModel
from hf_vrl.presets import preset_path

IMAGE_TOKEN = "<image>"
IMAGE_SIZE, PATCH = 16, 4  # tiny_clip's tower: a 4x4 patch grid + CLS -> 16 image tokens with "default"


def toy_tokenizer():
    """The project's toy CLIP tokenizer plus LLaVA's `<image>` token (id 725)."""
    tokenizer = AutoTokenizer.from_pretrained(preset_path("tiny-clip"))
    tokenizer.add_tokens([IMAGE_TOKEN], special_tokens=True)
    return tokenizer


def tower_kwargs(**overrides) -> dict:
    """tiny_clip's vision tower shape: 2 layers, 32 wide, 16 px images in 4 px patches."""
    base = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    return base | dict(image_size=IMAGE_SIZE, patch_size=PATCH) | overrides


def _seeded(build, seed: int):
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return build().eval()


def clip_tower(seed: int = 1, **overrides) -> CLIPVisionModel:
    return _seeded(lambda: CLIPVisionModel(CLIPVisionConfig(**tower_kwargs(**overrides))), seed)


def diffclip_tower(seed: int = 2, **overrides) -> DiffCLIPVisionModel:
    return _seeded(lambda: DiffCLIPVisionModel(DiffCLIPVisionConfig(**tower_kwargs(**overrides))), seed)


def vit_tower(seed: int = 3, **overrides) -> ViTModel:
    return _seeded(lambda: ViTModel(ViTConfig(**tower_kwargs(**overrides))), seed)


def siglip_tower(seed: int = 4, **overrides) -> SiglipVisionModel:
    return _seeded(lambda: SiglipVisionModel(SiglipVisionConfig(**tower_kwargs(**overrides))), seed)


def tiny_llava(tokenizer, *, seed: int = 0, max_positions: int = 64) -> LlavaForConditionalGeneration:
    """A LLaVA around tiny_clip's vision tower and a 2-layer, 32-wide Llama over the toy vocabulary."""
    text = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config = LlavaConfig(
        vision_config=tiny_clip(image_size=IMAGE_SIZE).config.vision_config,
        text_config=text,
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        image_seq_length=(IMAGE_SIZE // PATCH) ** 2,
    )
    return _seeded(lambda: LlavaForConditionalGeneration(config), seed)


def tiny_processor(tokenizer) -> LlavaProcessor:
    image_processor = CLIPImageProcessorPil(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    )
    return LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=PATCH,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
    )
