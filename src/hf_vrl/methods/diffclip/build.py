"""DiffCLIP and its CLIP baseline built from a preset's architecture, and their processors.

`arch="diffclip"` is DiffCLIP (differential attention in both towers, or the ablations DiffCLIP* and DiffCLIP†
through `lambda_init_schedule` / `diff_attention_in_text`). `arch="clip"` is the same network with CLIP's
plain attention in both towers — the paper's baseline (DiffCLIP §4.1 trains both with SLIP's code) — built as
a `DiffCLIPModel` with `differential_attention=False`, because transformers' `CLIPModel` cannot express the
released timm-style vision tower (no pre-LayerNorm, exact GELU). For an OpenAI-style architecture its forward
is CLIPModel's (`hf_vrl.methods.diffclip.from_clip` converts either way).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformers import PreTrainedModel

from hf_vrl.data.processors import load_image_processor
from hf_vrl.errors import UserError

__all__ = ["ARCHS", "architecture_problems", "build_model", "load_processors", "model_config"]

ARCHS = ("diffclip", "clip")
# DiffCLIP-only options that the plain-attention baseline drops
_DIFF_OPTIONS = ("lambda_init", "lambda_init_schedule", "diff_attention_in_text")


def _known_keys(config_class: type) -> set[str]:
    """The settings a transformers config class understands: its defaults' keys and attributes."""
    default = config_class()
    return set(default.to_dict()) | set(vars(default))


def architecture_problems(architecture: Mapping[str, Any]) -> list[str]:
    """Unknown keys of a DiffCLIP architecture (top level and both towers), with the nearest known name."""
    import difflib

    from hf_vrl.models.diffclip import DiffCLIPConfig, DiffCLIPTextConfig, DiffCLIPVisionConfig

    problems = []
    scopes = [("", architecture, DiffCLIPConfig)]
    scopes += [
        (f"{tower}.", architecture.get(tower) or {}, cls)
        for tower, cls in (
            ("text_config", DiffCLIPTextConfig),
            ("vision_config", DiffCLIPVisionConfig),
        )
    ]
    for prefix, values, cls in scopes:
        if not isinstance(values, Mapping):
            problems.append(f"model.architecture.{prefix.rstrip('.')}: expected a mapping, got {values!r}")
            continue
        known = _known_keys(cls)
        for key in values:
            if key not in known:
                close = difflib.get_close_matches(key, sorted(known), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                problems.append(f"model.architecture.{prefix}{key}: unknown {cls.__name__} setting{hint}")
            elif _is_count(key) and isinstance(values[key], int) and values[key] < 1:
                problems.append(f"model.architecture.{prefix}{key}: must be >= 1, got {values[key]}")
    return problems


def _is_count(key: str) -> bool:
    """Whether an architecture setting is a size or a count (hidden_size, projection_dim, num_heads...)."""
    return key.endswith(("_size", "_dim")) or key.startswith("num_")


def _special_token_ids(tokenizer: Any, vocab_size: int) -> dict[str, int]:
    """bos / eos / pad ids of the tokenizer (the text tower pools at the first EOS), checked against vocab."""
    if len(tokenizer) > vocab_size:
        raise UserError(
            f"the tokenizer has {len(tokenizer)} tokens but text_config.vocab_size is {vocab_size}; raise "
            "vocab_size or use the tokenizer the preset was made for"
        )
    ids = {name: getattr(tokenizer, name, None) for name in ("bos_token_id", "eos_token_id", "pad_token_id")}
    return {name: value for name, value in ids.items() if value is not None}


def model_config(
    architecture: Mapping[str, Any], arch: str = "diffclip", *, tokenizer: Any = None, **diff_options: Any
) -> Any:
    """The `DiffCLIPConfig` of an architecture mapping (the preset's `model.architecture`).

    `diff_options` (`lambda_init`, `lambda_init_schedule`, `diff_attention_in_text`; None = the
    architecture's) override it for DiffCLIP; `arch="clip"` turns differential attention off in both towers
    and refuses them. With a `tokenizer`, the text tower's bos / eos / pad ids are taken from it.
    """
    from hf_vrl.models.diffclip import DiffCLIPConfig

    if arch not in ARCHS:
        raise UserError(f"unknown arch {arch!r}; choose one of {ARCHS}")
    section = dict(architecture)
    text = dict(section.pop("text_config", None) or {})
    vision = dict(section.pop("vision_config", None) or {})
    given = {key: value for key, value in diff_options.items() if value is not None}
    if arch == "clip":
        if given:
            raise UserError(f"{sorted(given)} only apply to DiffCLIP; drop them for the CLIP baseline")
        for key in _DIFF_OPTIONS:
            section.pop(key, None)
            text.pop(key, None)
            vision.pop(key, None)
        text["differential_attention"] = vision["differential_attention"] = False
    else:
        section.update(given)
    if tokenizer is not None:
        text.update(_special_token_ids(tokenizer, text.get("vocab_size", 49408)))
    try:
        return DiffCLIPConfig(text_config=text, vision_config=vision, **section)
    except (ValueError, TypeError) as error:
        raise UserError(f"model.architecture: {error}") from None


def build_model(
    architecture: Mapping[str, Any], arch: str = "diffclip", *, tokenizer: Any = None, **diff_options: Any
) -> PreTrainedModel:
    """A freshly initialised `DiffCLIPModel` (DiffCLIP or its plain-attention CLIP baseline).

    Build on the meta device (`with torch.device("meta"): build_model(...)`) to count parameters for free.
    """
    from hf_vrl.models.diffclip import DiffCLIPModel

    return DiffCLIPModel(model_config(architecture, arch, tokenizer=tokenizer, **diff_options))


def load_processors(
    tokenizer: str, image_processor: str, image_processor_kwargs: Mapping[str, Any] | None = None
) -> tuple[Any, Any]:
    """(image_processor, tokenizer) from preset folders in hub_configs/ (e.g. "tiny-clip"), local folders or
    Hub ids; `image_processor_kwargs` override processor attributes (diffclip-b16: SLIP's ImageNet
    mean/std)."""
    from transformers import AutoTokenizer

    from hf_vrl.presets import preset_path

    def resolve(name: str) -> str:
        try:
            return str(preset_path(name))
        except FileNotFoundError:
            return name

    try:
        processor = load_image_processor(resolve(image_processor), **dict(image_processor_kwargs or {}))
        return processor, AutoTokenizer.from_pretrained(resolve(tokenizer))
    except OSError as error:
        raise UserError(
            f"could not load the tokenizer {tokenizer!r} / image processor {image_processor!r}: offline, "
            "give --tokenizer / --image-processor a local folder (e.g. tiny-clip, or a saved "
            "openai/clip-vit-base-patch16)"
        ) from error
