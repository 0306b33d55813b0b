"""Build a DiffCLIP model from a transformers CLIP or from the released DiffCLIP checkpoints.

* `diffclip_from_clip`: copies every CLIP weight into the same-named DiffCLIP leaf (the key map is the
  identity on CLIP's keys; the differential leaves are the only new ones) and initialises the differential
  branch so the converted model starts close to the CLIP (`differential_init="match_clip"`, explained in
  `match_clip_init`), calibrated on real images and captions (`calibration_inputs`); the achieved closeness
  is measured on held-out inputs and attached as `model.conversion_report` (`ConversionReport`).
* `diffclip_from_official_checkpoint`: reads `hammh0a/DiffCLIP_ViTB16_CC3M|CC12M`'s `checkpoint_best.pt` (a
  SLIP training checkpoint) without running pickled code, and maps its timm / OpenAI-style keys to DiffCLIP's;
  `hf_vrl.methods.diffclip.processors.slip_image_processor` reproduces SLIP's evaluation preprocessing.
"""

import argparse
import contextlib
import logging
import math
import os
import pathlib
import pickle
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn
from transformers import CLIPModel

from hf_vrl.contrastive import as_embeddings
from hf_vrl.devices import module_device, module_dtype, to_device
from hf_vrl.errors import UserError
from hf_vrl.methods.diffclip.processors import clip_processors
from hf_vrl.models.diffclip import DiffCLIPConfig, DiffCLIPModel

logger = logging.getLogger(__name__)

DIFFERENTIAL_LEAVES = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2", "diff_norm.weight")
TOWERS = ("text_model", "vision_model")

_CLIP_TEXT_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "max_position_embeddings",
    "hidden_act",
    "layer_norm_eps",
    "attention_dropout",
    "initializer_range",
    "initializer_factor",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
)
_CLIP_VISION_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_channels",
    "image_size",
    "patch_size",
    "hidden_act",
    "layer_norm_eps",
    "attention_dropout",
    "initializer_range",
    "initializer_factor",
)
_TOWER_OVERRIDES = ("lambda_init", "lambda_init_schedule", "lambda_std", "diff_norm_eps", "attention_dropout")
_TOP_OVERRIDES = ("diff_attention_in_text", "projection_dim", "logit_scale_init_value", "initializer_factor")


def build_config(
    config_class: type[DiffCLIPConfig], text: dict, vision: dict, top: dict, overrides: Mapping[str, Any]
) -> DiffCLIPConfig:
    """A DiffCLIP config from tower/top-level field dicts plus user overrides.

    Overrides: `text_config={...}` / `vision_config={...}` update one tower; the differential-attention
    options (`lambda_init`, `lambda_init_schedule`, `lambda_std`, `diff_norm_eps`, `attention_dropout`) apply
    to both towers; `diff_attention_in_text`, `projection_dim`, `logit_scale_init_value`, `initializer_factor`
    are top-level. Anything else is refused.
    """
    text, vision, top = dict(text), dict(vision), dict(top)
    for key, value in overrides.items():
        if key == "text_config":
            text.update(value)
        elif key == "vision_config":
            vision.update(value)
        elif key in _TOWER_OVERRIDES:
            text[key] = vision[key] = value
        elif key in _TOP_OVERRIDES:
            top[key] = value
        else:
            raise TypeError(
                f"Unknown DiffCLIP config override {key!r}: use one of "
                f"{_TOWER_OVERRIDES + _TOP_OVERRIDES}, or "
                "text_config={...} / vision_config={...} for a single tower."
            )
    return config_class(text_config=text, vision_config=vision, **top)


def diffclip_config_from_clip(
    clip_config: Any, config_class: type[DiffCLIPConfig] = DiffCLIPConfig, **overrides: Any
) -> DiffCLIPConfig:
    """The DiffCLIP config with a `CLIPConfig`'s architecture (same shapes, heads, activations)."""
    text = {name: getattr(clip_config.text_config, name) for name in _CLIP_TEXT_FIELDS}
    vision = {name: getattr(clip_config.vision_config, name) for name in _CLIP_VISION_FIELDS}
    top = {
        "projection_dim": clip_config.projection_dim,
        "logit_scale_init_value": clip_config.logit_scale_init_value,
        "initializer_factor": clip_config.initializer_factor,
    }
    return build_config(config_class, text, vision, top, overrides)


def check_shapes(
    source: Mapping[str, torch.Tensor], target: Mapping[str, torch.Tensor], what: str, hint: str = ""
) -> None:
    """Refuse a weight map where a source tensor lacks its DiffCLIP target's shape (nanoGPT style)."""
    for key, tensor in source.items():
        if tensor.shape != target[key].shape:
            raise ValueError(
                f"{key}: {what} shape {tuple(tensor.shape)} != DiffCLIP shape {tuple(target[key].shape)}"
                + (f"; {hint}." if hint else ".")
            )


def differential_keys(model: nn.Module) -> set[str]:
    """State-dict keys of the differential-attention leaves (the only keys a CLIP does not have)."""
    keys = set()
    for tower in TOWERS:
        tower_config = getattr(model, tower).config
        if tower_config.differential_attention:
            for layer in range(tower_config.num_hidden_layers):
                prefix = f"{tower}.encoder.layers.{layer}.self_attn."
                keys.update(prefix + leaf for leaf in DIFFERENTIAL_LEAVES)
    return keys


@torch.no_grad()
def copy_clip_weights(clip: nn.Module, model: nn.Module) -> int:
    """Copy every CLIP tensor into the same-named DiffCLIP tensor; returns how many were copied.

    Checks (nanoGPT `from_pretrained` style) that the DiffCLIP keys are exactly the CLIP keys plus the
    differential leaves, and that every shared tensor has the same shape.
    """
    clip_state = clip.state_dict()
    model_state = model.state_dict()
    new_keys = differential_keys(model)
    missing_in_model = sorted(set(clip_state) - set(model_state))
    unexpected = sorted(set(model_state) - set(clip_state) - new_keys)
    if missing_in_model or unexpected or new_keys & set(clip_state):
        raise ValueError(
            f"CLIP -> DiffCLIP key map mismatch: CLIP keys without a DiffCLIP home {missing_in_model[:5]}, "
            f"DiffCLIP keys without a CLIP source {unexpected[:5]}."
        )
    check_shapes(
        clip_state,
        model_state,
        "CLIP",
        hint="do not override architecture fields (widths, layers, vocabulary) when converting",
    )
    for key, source in clip_state.items():
        model_state[key].copy_(source)
    if len(clip_state) + len(new_keys) != len(model_state):
        raise ValueError("CLIP -> DiffCLIP: key count mismatch after copying.")
    return len(clip_state)


@torch.no_grad()
def set_lambda(attention: nn.Module, target: float) -> None:
    """Set λ_q1, λ_k1, λ_q2, λ_k2 so that λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init is exactly `target`.

    With δ = target − λ_init the dot products are y1 = log(1 + max(δ, 0)) and y2 = log(1 + max(−δ, 0)), so
    exp(y1) − exp(y2) = δ. Each pair is λ_q = c(u1 + u2), λ_k = c(u1 − u2) + y/(2c)·(u1 + u2) for orthonormal
    u1, u2, whose dot product is y: the vectors are non-zero even where y = 0, so all four keep receiving
    gradients, and c = lambda_std·sqrt(d/2) gives them the norm of the random init.
    """
    dim = attention.lambda_q1.numel()
    if dim < 2:
        raise ValueError(f"set_lambda needs head_dim >= 2, got {dim}.")
    ones = torch.ones(dim)
    alternating = torch.tensor([(-1.0) ** i for i in range(dim)])
    alternating = alternating - alternating.mean()
    u1, u2 = ones / ones.norm(), alternating / alternating.norm()
    scale = attention.config.lambda_std * math.sqrt(dim / 2)
    delta = target - attention.lambda_init
    for lambda_q, lambda_k, dot in (
        (attention.lambda_q1, attention.lambda_k1, math.log1p(max(delta, 0.0))),
        (attention.lambda_q2, attention.lambda_k2, math.log1p(max(-delta, 0.0))),
    ):
        lambda_q.copy_(scale * (u1 + u2))
        lambda_k.copy_(scale * (u1 - u2) + dot / (2 * scale) * (u1 + u2))


# --- calibration data --------------------------------------------------------------------------------------

SYNTHETIC = "synthetic"  # `calibration_data` value: the data-free batch (N(0, 1) pixels, random tokens)
CALIBRATION_SAMPLES = 64  # examples per tower; the last quarter is held out for the report
_CALIBRATION_SPLIT = "calibration"  # a shapes-world stream of its own, apart from its train/test splits


def synthetic_calibration_inputs(config: DiffCLIPConfig, batch_size: int = 8, seed: int = 0) -> dict:
    """Data-free calibration batch: N(0, 1) pixels (as CLIP-normalised photos roughly are) and random token
    ids between BOS and a final EOS (where the text embedding is pooled)."""
    generator = torch.Generator().manual_seed(seed)
    vision, text = config.vision_config, config.text_config
    pixels = torch.randn(
        batch_size, vision.num_channels, vision.image_size, vision.image_size, generator=generator
    )
    input_ids = torch.randint(
        0, text.vocab_size, (batch_size, text.max_position_embeddings), generator=generator
    )
    eos = text.eos_token_id[0] if isinstance(text.eos_token_id, list) else text.eos_token_id
    for position, token in ((0, text.bos_token_id), (-1, eos)):
        if token is not None:
            input_ids[:, position] = token
    return {"pixel_values": pixels, "input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}


def _rows(data: Any, image_size: int, num_samples: int) -> tuple[list, list[str] | None, str]:
    """(images, captions or None, description) from a dataset name, a `datasets` dataset or PIL images."""
    from datasets import Dataset, IterableDataset

    from hf_vrl.data import load_dataset_by_name, shapes_dataset

    if data is None:
        data = shapes_dataset(num_samples, image_size=image_size, split=_CALIBRATION_SPLIT)
        name = "the shapes world (hf_vrl.data)"
    elif isinstance(data, str):
        name = repr(data)
        data = load_dataset_by_name(data, "train", limit=num_samples, image_size=image_size)
    else:
        name = f"the given {type(data).__name__}"
    if isinstance(data, (Dataset, IterableDataset)):
        rows = list(data.take(num_samples))
        if not rows or "image" not in rows[0]:
            columns = sorted(rows[0]) if rows else []
            raise UserError(
                f"The calibration dataset has no 'image' column (columns: {columns}): rename the images to "
                "'image' (and the captions to 'caption'), or pass a list of PIL images."
            )
        captions = [row["caption"] for row in rows] if "caption" in rows[0] else None
        return [row["image"] for row in rows], captions, f"{name} ({len(rows)} rows)"
    if isinstance(data, Sequence) and data and all(isinstance(image, Image.Image) for image in data):
        return list(data), None, f"{len(data)} given images"
    raise UserError(
        f"calibration_data must be None (the shapes world), {SYNTHETIC!r}, a dataset name, a `datasets` "
        f"dataset with an 'image' column, a list of PIL images or a dict of tensors; got "
        f"{type(data).__name__}."
    )


def _shapes_captions(num_samples: int) -> list[str]:
    from hf_vrl.data import shapes_dataset

    return shapes_dataset(num_samples, image_size=8, split=_CALIBRATION_SPLIT)["caption"]


def calibration_inputs(
    data: Any,
    config: DiffCLIPConfig,
    image_processor: Any,
    tokenizer: Any,
    num_samples: int = CALIBRATION_SAMPLES,
) -> tuple[dict[str, torch.Tensor], str]:
    """The calibration batch {pixel_values, input_ids, attention_mask} and a description of its source.

    `data`: None (the generated shapes world and its captions at the model's resolution), `SYNTHETIC` (the
    data-free batch), a `hf_vrl.data.load_dataset_by_name` name ("fashion_mnist", "imagefolder:DIR", ...), a
    `datasets` dataset with an `image` and optionally a `caption` column, a list of PIL images, or a dict of
    pre-processed tensors (`pixel_values`, optionally `input_ids` / `attention_mask`). Images go through
    `image_processor`, captions through `tokenizer`; where no captions are given the shapes-world captions are
    used, and without a tokenizer random token ids (with a warning). The towers may get different counts.
    """
    if isinstance(data, str) and data == SYNTHETIC:
        batch = synthetic_calibration_inputs(config, num_samples)
        return (
            batch,
            "synthetic inputs (N(0, 1) pixels, random token ids: the report says nothing of real data)",
        )
    if isinstance(data, Mapping):
        batch, captions = {key: torch.as_tensor(value) for key, value in data.items()}, None
        description = "the given tensors"
        if "pixel_values" not in batch:
            raise UserError("calibration_data as a dict needs 'pixel_values' (pre-processed images).")
    else:
        images, captions, description = _rows(data, config.vision_config.image_size, num_samples)
        batch = {"pixel_values": image_processor(images=images, return_tensors="pt")["pixel_values"]}
    if "input_ids" in batch:
        batch.setdefault("attention_mask", torch.ones_like(batch["input_ids"]))
    elif tokenizer is not None:
        from hf_vrl.data import ImageTextCollator

        if captions is None:
            captions, description = _shapes_captions(num_samples), f"{description}, shapes-world captions"
        max_length = config.text_config.max_position_embeddings
        batch.update(ImageTextCollator(image_processor, tokenizer, max_length=max_length).tokenize(captions))
    else:
        logger.warning(
            "No tokenizer for the calibration captions: the text tower is calibrated on random token ids. "
            "Pass tokenizer= (the CLIP's tokenizer) or the CLIP as a path to calibrate on real captions."
        )
        synthetic = synthetic_calibration_inputs(config, num_samples)
        batch.update({key: synthetic[key] for key in ("input_ids", "attention_mask")})
        description = f"{description}, random token ids"
    size = config.vision_config.image_size
    if tuple(batch["pixel_values"].shape[-2:]) != (size, size):
        raise UserError(
            f"Calibration images are {tuple(batch['pixel_values'].shape[-2:])} px but the CLIP takes "
            f"{size} px: pass the CLIP's image_processor (or pre-processed pixel_values of that size)."
        )
    return batch, description


def split_heldout(batch: Mapping[str, torch.Tensor]) -> tuple[dict, dict]:
    """(calibration, held-out): the last quarter (at least one) of each tower's examples is held out."""
    calibration, heldout = {}, {}
    for key, value in batch.items():
        count = len(value)
        if count < 2:
            raise UserError(
                f"Calibration needs at least 2 examples per tower (one is held out to report the result); "
                f"got {count} for {key!r}. Pass more images or captions."
            )
        cut = count - max(1, count // 4)
        calibration[key], heldout[key] = value[:cut], value[cut:]
    return calibration, heldout


@contextlib.contextmanager
def evaluating(*modules: nn.Module) -> Iterator[None]:
    """Put `modules` in eval mode, with gradients off, and restore their training flags afterwards."""
    flags = [module.training for module in modules]
    try:
        for module in modules:
            module.eval()
        with torch.no_grad():
            yield
    finally:
        for module, flag in zip(modules, flags):
            module.train(flag)


def embed(model: nn.Module, inputs: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(image, text) embeddings of a CLIP-like model, float32 on the CPU; inputs go to the model's device."""
    batch = to_device(inputs, module_device(model), module_dtype(model))
    with evaluating(model):
        image = as_embeddings(model.get_image_features(pixel_values=batch["pixel_values"]))
        text = as_embeddings(
            model.get_text_features(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        )
    return image.float().cpu(), text.float().cpu()


@dataclass(frozen=True)
class ConversionReport:
    """How close a converted DiffCLIP starts to its CLIP: the mean cosine between their image (text)
    embeddings on held-out calibration-like inputs (1 = the same directions)."""

    image_cosine: float
    text_cosine: float
    heldout_images: int
    heldout_texts: int
    calibration: str

    def __str__(self) -> str:
        return (
            f"mean cosine to the CLIP on held-out inputs: image {self.image_cosine:.3f} "
            f"({self.heldout_images} images), text {self.text_cosine:.3f} ({self.heldout_texts} texts); "
            f"calibrated on {self.calibration}"
        )


def conversion_report(
    model: nn.Module, clip: nn.Module, heldout: Mapping[str, torch.Tensor], calibration: str
) -> ConversionReport:
    """Compare `model` with `clip` on the held-out inputs (see `ConversionReport`)."""
    ours, theirs = embed(model, heldout), embed(clip, heldout)
    image, text = (F.cosine_similarity(a, b, dim=-1).mean().item() for a, b in zip(ours, theirs))
    count_images, count_texts = len(heldout["pixel_values"]), len(heldout["input_ids"])
    return ConversionReport(image, text, count_images, count_texts, calibration)


# --- the CLIP -> DiffCLIP initialisation -------------------------------------------------------------------


@torch.no_grad()
def head_pair_scales(clip: nn.Module, inputs: Mapping[str, torch.Tensor], eps: Mapping[str, float]) -> dict:
    """Per-channel least-squares scale of each CLIP layer's head-pair outputs, keyed by attention module name.

    For the 2·head_dim output z of a pair of CLIP heads (2m, 2m+1) at one token, RMSNorm gives z/r with
    r = sqrt(mean(z²) + eps); the scale w′ minimising Σ‖w′⊙z/r − z‖² over tokens and pairs is
    w′_c = Σ z_c²/r / Σ z_c²/r² (a scalar w′ would be the mean of r). Padding tokens are left out. `eps` maps
    each tower to calibrate ("text_model", "vision_model") to its RMSNorm epsilon. The inputs are moved to the
    CLIP's device and dtype.
    """
    inputs = to_device(inputs, module_device(clip), module_dtype(clip))
    scales, handles = {}, []
    valid = {"text_model": inputs["attention_mask"].bool(), "vision_model": None}

    def collect(name: str, tower: str, head_dim: int) -> Callable:
        def hook(module: nn.Module, args: tuple) -> None:
            pairs = args[0].float().unflatten(-1, (-1, 2 * head_dim))
            if valid[tower] is not None:
                pairs = pairs[valid[tower]]
            z = pairs.reshape(-1, 2 * head_dim)
            r = torch.sqrt(z.pow(2).mean(-1, keepdim=True) + eps[tower])
            scales[name] = ((z.pow(2) / r).sum(0) / (z.pow(2) / r.pow(2)).sum(0).clamp_min(1e-12)).cpu()

        return hook

    for tower in eps:
        tower_model = getattr(clip, tower)
        head_dim = tower_model.config.hidden_size // tower_model.config.num_attention_heads
        for name, module in tower_model.named_modules():
            if name.endswith("self_attn"):
                handles.append(
                    module.out_proj.register_forward_pre_hook(collect(f"{tower}.{name}", tower, head_dim))
                )
    try:
        with evaluating(clip):
            if "vision_model" in eps:
                clip.get_image_features(pixel_values=inputs["pixel_values"])
            if "text_model" in eps:
                clip.get_text_features(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
    finally:
        for handle in handles:
            handle.remove()
    return scales


@torch.no_grad()
def match_clip_init(
    model: nn.Module,
    clip: nn.Module,
    calibration_inputs: Mapping[str, torch.Tensor],
    initial_lambda: float = -1.0,
) -> None:
    """Initialise the differential branch of a CLIP-converted DiffCLIP so that it starts close to the CLIP.

    What cannot be matched: a differential head m applies ONE map, A1 − λ·A2, to the value slice of CLIP heads
    2m and 2m+1, where CLIP applied each head's own map to its own half. What is chosen:

    * λ = `initial_lambda` (default −1): the shared map is A_2m + A_2m+1, which after the RMSNorm (scale
      invariant) is their mean, the least-squares compromise when one map must serve both halves (λ = 0 would
      keep A_2m and give head 2m+1's values the wrong map). A naive conversion keeps λ ≈ λ_init = 0.8, i.e.
      A_2m − 0.8 A_2m+1: rows sum to 0.2 and the second map is subtracted; that is what collapses.
    * RMSNorm weight = w′/(1 − λ_init), with w′ the per-channel least-squares scale of the CLIP head-pair
      outputs on `calibration_inputs` (`head_pair_scales`): the RMSNorm otherwise sets every pair output to
      unit RMS, times (1 − λ_init) = 0.2, far from CLIP's scale. Per-token scale differences remain. w′
      follows the activation scale of the calibration inputs, so they should look like the CLIP's data: real
      images and captions (N(0, 1) noise is far from, e.g., mostly white images, and w′ then comes out
      several times too small).
    """
    towers = [getattr(model, tower).config for tower in TOWERS]
    eps = {
        name: config.diff_norm_eps for name, config in zip(TOWERS, towers) if config.differential_attention
    }
    scales = head_pair_scales(clip, calibration_inputs, eps)
    for name, module in model.named_modules():
        if getattr(module, "differential", False):
            set_lambda(module, initial_lambda)
            module.diff_norm.weight.copy_(scales[name] / (1.0 - module.lambda_init))


def diffclip_from_clip(
    clip_model_or_path: Any,
    *,
    model_class: type[DiffCLIPModel] = DiffCLIPModel,
    differential_init: str = "match_clip",
    initial_lambda: float = -1.0,
    calibration_data: Any = None,
    image_processor: Any = None,
    tokenizer: Any = None,
    calibration_samples: int = CALIBRATION_SAMPLES,
    **config_overrides: Any,
) -> DiffCLIPModel:
    """Convert a transformers `CLIPModel` (instance, local path or Hub id) into a float32 DiffCLIP model.

    Every CLIP weight is copied (`copy_clip_weights`). The differential leaves are then initialised by
    `differential_init`: `"match_clip"` (`match_clip_init`) or `"random"` (the DiffCLIP init λ ≈ λ_init,
    RMSNorm weight 1: the naive conversion). "match_clip" calibrates on `calibration_data` (see
    `calibration_inputs`: by default `calibration_samples` generated shapes-world images and captions at the
    CLIP's resolution; `"synthetic"` for the data-free batch; or your own images/dataset, which fit the
    CLIP's domain better), preprocessed with `image_processor` / `tokenizer`, by default those saved with a
    CLIP given as a path. A quarter of the examples is held out: `model.conversion_report`
    (`ConversionReport`, also logged) gives the mean cosine per tower between the DiffCLIP and CLIP
    embeddings on them.
    `config_overrides` go to `build_config`, e.g. `diff_attention_in_text=False` (DiffCLIP†) or
    `lambda_init_schedule="depth"` (DiffCLIP*).
    """
    if differential_init not in ("match_clip", "random"):
        raise ValueError(f"differential_init must be 'match_clip' or 'random', got {differential_init!r}.")
    clip, clip_path = clip_model_or_path, None
    if isinstance(clip, (str, os.PathLike)):
        clip_path, clip = clip, CLIPModel.from_pretrained(clip, dtype=torch.float32)
    if not isinstance(clip, CLIPModel):
        raise TypeError(f"Expected a transformers CLIPModel or a path to one, got {type(clip).__name__}.")
    config = diffclip_config_from_clip(clip.config, model_class.config_class, **config_overrides)
    model = model_class(config)
    copy_clip_weights(clip, model)
    image_processor, tokenizer = clip_processors(
        clip_path, config.vision_config.image_size, image_processor, tokenizer
    )
    batch, description = calibration_inputs(
        calibration_data, config, image_processor, tokenizer, calibration_samples
    )
    calibration, heldout = split_heldout(batch)
    if differential_init == "match_clip":
        match_clip_init(model, clip, calibration, initial_lambda)
    model.conversion_report = conversion_report(model, clip, heldout, description)
    report = model.conversion_report
    if min(report.image_cosine, report.text_cosine) < 0.9:
        logger.warning(
            "DiffCLIP from CLIP (%s init) starts far from the CLIP: %s. Calibrate on images and captions "
            "like the CLIP's data (calibration_data=...), or fine-tune before use.",
            differential_init,
            report,
        )
    else:
        logger.info("DiffCLIP from CLIP (%s init): %s", differential_init, report)
    return model


# --- the released checkpoints -------------------------------------------------------------------------------

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
