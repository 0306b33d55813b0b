"""Build a DiffCLIP model from a transformers CLIP.

* `diffclip_from_clip`: copies every CLIP weight into the same-named DiffCLIP leaf (the key map is the
  identity on CLIP's keys; the differential leaves are the only new ones) and initialises the differential
  branch so the converted model starts close to the CLIP (`differential_init="match_clip"`, explained in
  `match_clip_init`), calibrated on real images and captions (`calibration_inputs`); the achieved closeness
  is measured on held-out inputs and attached as `model.conversion_report` (`ConversionReport`).
* `hf_vrl.methods.diffclip.official.diffclip_from_official_checkpoint` reads the released checkpoints.
"""

import contextlib
import logging
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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
