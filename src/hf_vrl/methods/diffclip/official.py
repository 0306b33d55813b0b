"""Load the released DiffCLIP checkpoints (`hammh0a/DiffCLIP_ViTB16_CC3M|CC12M`'s `checkpoint_best.pt`, a
SLIP training checkpoint) into a `DiffCLIPModel`: unpickled without running code
(`load_official_checkpoint`), the config read off the tensor shapes (`diffclip_config_from_official`), and
its timm / OpenAI-style keys mapped to DiffCLIP's (`official_to_diffclip_state_dict`).
`hf_vrl.methods.diffclip.processors.slip_image_processor` reproduces SLIP's evaluation preprocessing.
Conversion from a transformers CLIP is `convert.diffclip_from_clip`.
"""

import argparse
import math
import os
import pathlib
import pickle
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import torch

from hf_vrl.errors import UserError
from hf_vrl.methods.diffclip.convert import DIFFERENTIAL_LEAVES, build_config, check_shapes
from hf_vrl.models.diffclip import DiffCLIPConfig, DiffCLIPModel

_NUMPY_CORE = getattr(np, "_core", None) or np.core  # numpy >= 2 / 1.x
_SAFE_GLOBALS = [
    argparse.Namespace,
    (pathlib.PosixPath, "pathlib.PosixPath"),
    (pathlib.WindowsPath, "pathlib.WindowsPath"),
    (pathlib.PurePosixPath, "pathlib.PurePosixPath"),
    (pathlib.PureWindowsPath, "pathlib.PureWindowsPath"),
    np.dtype,
    np.ndarray,
    (_NUMPY_CORE.multiarray.scalar, "numpy._core.multiarray.scalar"),
    (_NUMPY_CORE.multiarray.scalar, "numpy.core.multiarray.scalar"),
    (_NUMPY_CORE.multiarray._reconstruct, "numpy._core.multiarray._reconstruct"),
    (_NUMPY_CORE.multiarray._reconstruct, "numpy.core.multiarray._reconstruct"),
    *(getattr(np.dtypes, name) for name in np.dtypes.__all__),  # dtype classes, rebuilt from pickled dtypes
]


def load_official_checkpoint(path: str | os.PathLike) -> dict:
    """Unpickle a SLIP-style checkpoint with `torch.load(weights_only=True)` and an explicit allow-list.

    Allowed beyond tensors and plain containers: `argparse.Namespace` (the training args), pathlib paths,
    numpy scalars, arrays and dtypes. Any other global (a function or class the pickle would call) is refused,
    so loading never runs code from the file. An empty, truncated or damaged file is a ValueError too.
    """
    damaged = ValueError(
        f"{os.fspath(path)} is not a readable PyTorch checkpoint (empty, truncated or damaged): give the "
        "checkpoint_best.pt of a released DiffCLIP, downloaded again"
    )
    try:
        with torch.serialization.safe_globals(_SAFE_GLOBALS):
            return torch.load(path, map_location="cpu", weights_only=True)
    except (EOFError, RuntimeError):  # torch's zip reader on a cut file; the unpickler on an empty one
        raise damaged from None
    except pickle.UnpicklingError as error:
        found = re.search(r"GLOBAL (\S+)|but got <class '([^']+)'>", str(error))
        if found is None:  # no global named: not a pickle of objects, but bytes that are not one
            raise damaged from None
        culprit = next(group for group in found.groups() if group)
        raise ValueError(
            f"Refusing to load {os.fspath(path)}: the pickle references {culprit}, which is not a plain "
            "data type (allowed: tensors, argparse.Namespace, pathlib paths, numpy scalars/arrays/dtypes). "
            "Loading it could run arbitrary code; only if you trust the file, re-save its 'state_dict' as "
            "safetensors elsewhere."
        ) from error


def official_state_dict(checkpoint: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The weights of a SLIP-style checkpoint (its 'state_dict' or the mapping itself), `module.` stripped."""
    state = checkpoint.get("state_dict", checkpoint)
    if not all(isinstance(value, torch.Tensor) for value in state.values()):
        raise ValueError("Expected a SLIP checkpoint with a 'state_dict' of tensors (or a plain state dict).")
    return {key.removeprefix("module."): value for key, value in state.items()}


def _count_blocks(state: Mapping[str, torch.Tensor], prefix: str) -> int:
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.")
    return len({int(m.group(1)) for key in state if (m := pattern.match(key))})


OPENAI_HEAD_DIM = 64  # OpenAI's and SLIP's text transformers: heads = width / 64
_TEXT_BLOCK = "transformer.resblocks.0.attn."


def _text_heads(state: Mapping[str, torch.Tensor], width: int, overrides: Mapping[str, Any]) -> int:
    """Heads of the released text tower: width / λ size (head_dim) in differential blocks. Plain blocks
    (SLIP's `nn.MultiheadAttention`, fused `in_proj_weight`) do not show the head count: the override
    `text_config={"num_attention_heads": H}`, else OpenAI/SLIP's 64-wide heads."""
    given = (overrides.get("text_config") or {}).get("num_attention_heads")
    if given is not None:
        return given
    text_lambda = state.get(_TEXT_BLOCK + "lambda_q1")
    if text_lambda is not None:
        return width // text_lambda.shape[0]
    if width % OPENAI_HEAD_DIM:
        raise UserError(
            f"The checkpoint's text tower ({width} wide, plain attention) does not show its head count and "
            f"is not a multiple of OpenAI/SLIP's {OPENAI_HEAD_DIM}-wide heads: pass "
            "text_config={'num_attention_heads': H} (SLIP's transformer_heads)."
        )
    return width // OPENAI_HEAD_DIM


def diffclip_config_from_official(
    state: Mapping[str, torch.Tensor], config_class: type[DiffCLIPConfig] = DiffCLIPConfig, **overrides: Any
) -> DiffCLIPConfig:
    """The config of a released DiffCLIP, read off the tensor shapes.

    Vision: a timm ViT (no pre-LayerNorm, exact GELU, LayerNorm eps 1e-5 as the released DiffBlocks use).
    Text: the OpenAI/SLIP transformer (QuickGELU, causal, EOS = the last vocabulary id, which `argmax` pooling
    relies on), differential where the checkpoint has λ vectors, else SLIP's plain blocks. Heads = width /
    head_dim, with head_dim the λ-vector size (`_text_heads` without λ). λ_init is 0.8 in every layer, as
    released; override to load a DiffCLIP* checkpoint.
    """
    if "visual.blocks.0.attn.lambda_q1" not in state:
        raise UserError(
            "The checkpoint's vision tower has no differential attention (no visual.blocks.*.attn.lambda_q1):"
            " it is not a released DiffCLIP (SLIP's plain CLIP baselines are not supported)."
        )
    width = state["visual.cls_token"].shape[-1]
    patch = state["visual.patch_embed.proj.weight"].shape[-1]
    grid = math.isqrt(state["visual.pos_embed"].shape[1] - 1)
    vision = {
        "hidden_size": width,
        "intermediate_size": state["visual.blocks.0.mlp.fc1.weight"].shape[0],
        "num_hidden_layers": _count_blocks(state, "visual.blocks."),
        "num_attention_heads": width // state["visual.blocks.0.attn.lambda_q1"].shape[0],
        "num_channels": state["visual.patch_embed.proj.weight"].shape[1],
        "image_size": grid * patch,
        "patch_size": patch,
        "hidden_act": "gelu",
        "layer_norm_eps": 1e-5,
        "pre_layernorm": False,
    }
    vocab_size, text_width = state["token_embedding.weight"].shape
    text = {
        "vocab_size": vocab_size,
        "hidden_size": text_width,
        "intermediate_size": state["transformer.resblocks.0.mlp.c_fc.weight"].shape[0],
        "num_hidden_layers": _count_blocks(state, "transformer.resblocks."),
        "num_attention_heads": _text_heads(state, text_width, overrides),
        "max_position_embeddings": state["positional_embedding"].shape[0],
        "hidden_act": "quick_gelu",
        "layer_norm_eps": 1e-5,
        "pad_token_id": 0,
        "bos_token_id": vocab_size - 2,
        "eos_token_id": vocab_size - 1,
        "differential_attention": _TEXT_BLOCK + "lambda_q1" in state,
    }
    top = {"projection_dim": state["image_projection"].shape[1]}
    return build_config(config_class, text, vision, top, overrides)


class Source(NamedTuple):
    """Where a DiffCLIP tensor comes from in a released state dict: `key`, or its `chunk`-th third (rows of a
    fused q/k/v projection)."""

    key: str
    chunk: int | None = None


def _attention_sources(theirs: str, fused: bool, differential: bool) -> dict[str, Source]:
    """DiffCLIP attention leaf -> source in block `theirs`: split q/k/v projections, or the q/k/v thirds of
    SLIP's fused `nn.MultiheadAttention` (`in_proj_weight` / `in_proj_bias`); plus the λ leaves."""
    sources = {}
    for index, proj in enumerate("qkv"):
        for kind in ("weight", "bias"):
            ours = f"{proj}_proj.{kind}"
            fused_source = Source(f"{theirs}attn.in_proj_{kind}", index)
            sources[ours] = fused_source if fused else Source(f"{theirs}attn.{ours}")
    for leaf in ("out_proj.weight", "out_proj.bias") + (DIFFERENTIAL_LEAVES if differential else ()):
        sources[leaf] = Source(f"{theirs}attn.{leaf}")
    return sources


def _official_key_map(config: DiffCLIPConfig, fused_text: bool = False) -> dict[str, Source]:
    """DiffCLIP key -> released source for every DiffCLIP tensor (reshapes are applied afterwards).
    `fused_text`: the text blocks are SLIP's plain ones with a fused `in_proj_weight`."""
    key_map = {
        ours: Source(theirs)
        for ours, theirs in {
            "vision_model.embeddings.patch_embedding.weight": "visual.patch_embed.proj.weight",
            "vision_model.embeddings.class_embedding": "visual.cls_token",
            "vision_model.embeddings.position_embedding.weight": "visual.pos_embed",
            "vision_model.post_layernorm.weight": "visual.norm.weight",
            "vision_model.post_layernorm.bias": "visual.norm.bias",
            "visual_projection.weight": "image_projection",
            "text_model.embeddings.token_embedding.weight": "token_embedding.weight",
            "text_model.embeddings.position_embedding.weight": "positional_embedding",
            "text_model.final_layer_norm.weight": "ln_final.weight",
            "text_model.final_layer_norm.bias": "ln_final.bias",
            "text_projection.weight": "text_projection",
            "logit_scale": "logit_scale",
        }.items()
    }
    towers = {
        "vision_model": (
            "visual.blocks",
            "norm1",
            "norm2",
            "mlp.fc1",
            "mlp.fc2",
            config.vision_config,
            False,
        ),
        "text_model": (
            "transformer.resblocks",
            "ln_1",
            "ln_2",
            "mlp.c_fc",
            "mlp.c_proj",
            config.text_config,
            fused_text,
        ),
    }
    for tower, (blocks, norm1, norm2, fc1, fc2, tower_config, fused) in towers.items():
        for i in range(tower_config.num_hidden_layers):
            ours, theirs = f"{tower}.encoder.layers.{i}.", f"{blocks}.{i}."
            attention = _attention_sources(theirs, fused, tower_config.differential_attention)
            key_map.update({f"{ours}self_attn.{leaf}": source for leaf, source in attention.items()})
            for our_name, their_name in (
                ("layer_norm1", norm1),
                ("layer_norm2", norm2),
                ("mlp.fc1", fc1),
                ("mlp.fc2", fc2),
            ):
                for kind in ("weight", "bias"):
                    key_map[f"{ours}{our_name}.{kind}"] = Source(f"{theirs}{their_name}.{kind}")
    return key_map


def _is_causal_mask(tensor: torch.Tensor) -> bool:
    """True for an additive causal mask (0 on and below the diagonal), a buffer OpenAI-style code keeps."""
    if tensor.ndim != 2 or tensor.shape[0] != tensor.shape[1]:
        return False
    upper = torch.triu(torch.ones_like(tensor, dtype=torch.bool), diagonal=1)
    return bool((tensor[~upper] == 0).all() and (tensor[upper] < -1e4).all())


def _take(state: Mapping[str, torch.Tensor], source: Source) -> torch.Tensor:
    tensor = state[source.key]
    return tensor if source.chunk is None else tensor.chunk(3, dim=0)[source.chunk]


def official_to_diffclip_state_dict(
    state: Mapping[str, torch.Tensor], config: DiffCLIPConfig
) -> dict[str, torch.Tensor]:
    """Map a released state dict to DiffCLIP keys; refuses unused or missing keys.

    Reshapes: projections are raw `x @ W` parameters (transposed into `nn.Linear` weights); `cls_token` and
    `pos_embed` lose their batch dims; timm's patch-embedding bias (absent in CLIP) is folded into the patch
    position embeddings, which is exact because both are added to every patch token; SLIP's fused text
    `in_proj_weight` / `in_proj_bias` are split into their q, k, v thirds (`nn.MultiheadAttention`'s order).
    """
    key_map = _official_key_map(config, fused_text=_TEXT_BLOCK + "in_proj_weight" in state)
    ignored = {key for key, value in state.items() if key.endswith("attn_mask") and _is_causal_mask(value)}
    sources = {source.key for source in key_map.values()}
    used = sources | {"visual.patch_embed.proj.bias"} | ignored
    missing = sorted(key for key in sources if key not in state)
    unused = sorted(set(state) - used)
    if missing or unused:
        raise ValueError(
            f"Official checkpoint layout mismatch: missing keys {missing[:8]}, unknown keys {unused[:8]}."
        )
    converted = {ours: _take(state, source) for ours, source in key_map.items()}
    converted["visual_projection.weight"] = converted["visual_projection.weight"].t()
    converted["text_projection.weight"] = converted["text_projection.weight"].t()
    converted["vision_model.embeddings.class_embedding"] = converted[
        "vision_model.embeddings.class_embedding"
    ].flatten()
    position = converted["vision_model.embeddings.position_embedding.weight"].squeeze(0).clone()
    if "visual.patch_embed.proj.bias" in state:
        position[1:] += state["visual.patch_embed.proj.bias"]
    converted["vision_model.embeddings.position_embedding.weight"] = position
    return converted


def diffclip_from_official_checkpoint(
    path: str | os.PathLike, *, model_class: type[DiffCLIPModel] = DiffCLIPModel, **config_overrides: Any
) -> DiffCLIPModel:
    """Load a released DiffCLIP `checkpoint_best.pt` (e.g. `hammh0a/DiffCLIP_ViTB16_CC12M`).

    Safe unpickling (`load_official_checkpoint`), config from the shapes (`diffclip_config_from_official`),
    explicit key map with count and shape checks (`official_to_diffclip_state_dict`). A plain (SLIP) text
    tower narrower than, or not a multiple of, 64 needs `text_config={"num_attention_heads": H}`. Evaluate
    with SLIP's preprocessing (`slip_image_processor`: 224 px, bilinear, ImageNet mean/std); text with the
    OpenAI BPE tokenizer, 77 tokens. Save the result with `save_pretrained` to get safetensors.
    """
    state = official_state_dict(load_official_checkpoint(path))
    config = diffclip_config_from_official(state, model_class.config_class, **config_overrides)
    model = model_class(config)
    converted = official_to_diffclip_state_dict(state, config)
    expected = model.state_dict()
    if set(converted) != set(expected):
        raise ValueError(
            f"Key count mismatch: {len(converted)} converted vs {len(expected)} DiffCLIP tensors "
            f"(missing {sorted(set(expected) - set(converted))[:5]})."
        )
    check_shapes(converted, expected, "checkpoint")
    model.load_state_dict(converted, strict=True)
    return model
