"""Enhanced vision towers in transformers' LLaVA (`LlavaForConditionalGeneration`).

LLaVA builds its tower with `AutoModel.from_config(config.vision_config)`, calls it with
`output_hidden_states=<vision_feature_layer>` and reads `hidden_states[layer]` (embeddings first, so -2 is
the penultimate block); the `"default"` strategy drops the first (CLS) token, `"full"` keeps it. The
projector (`linear_1` -> act -> `linear_2`) takes `hidden_size × number of feature layers` wide features, and
the processor writes `(image_size / patch_size)² + CLS − (1 if "default")` image tokens per image. A tower
fits a LLaVA when it gives the projector's width and the number of image tokens the language model was
trained on; `check_vision_tower` measures both (a forward pass on the meta device: no compute, any size, any
device) and `swap_vision_tower` refuses a tower that does not fit unless asked to realign (then
`hf-vrl llava-align` relearns the projector).

`save_llava` writes a folder that loads with plain transformers 4.x and 5.x: LLaVA's original key layout (the
one llava-hf checkpoints use), with CLIP / SigLIP tower keys nested under `vision_model.` as their 4.x classes
are (transformers 5 reads that too); for a remote-code tower (DiffCLIP) its code files and an `auto_map`, so
`AutoModelForImageTextToText.from_pretrained(dir, trust_remote_code=True)` works without hf_vrl.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from transformers import (
    AutoConfig,
    AutoModel,
    AutoProcessor,
    LlavaForConditionalGeneration,
    LlavaProcessor,
    PreTrainedModel,
)
from transformers.dynamic_module_utils import custom_object_save
from transformers.models.auto.modeling_auto import MODEL_MAPPING
from transformers.models.llava.modeling_llava import LlavaMultiModalProjector

from hf_vrl.data import processors
from hf_vrl.devices import module_device, module_dtype
from hf_vrl.errors import UserError
from hf_vrl.hub.publish import portable_files

__all__ = [
    "TowerFit",
    "TowerGeometry",
    "as_vision_tower",
    "check_llava",
    "check_vision_tower",
    "llava_processor_for",
    "load_image_processor",
    "load_llava",
    "load_llava_processor",
    "load_vision_tower",
    "save_llava",
    "swap_vision_tower",
    "tower_geometry",
]

# Towers whose transformers 4.x class nests its modules under this attribute; 5.x flattens them but still
# reads the nested keys, so writing them keeps a saved LLaVA loadable by both (checked with 4.57.6 and 5.23:
# equal logits; without the prefix 4.57 initialises the tower at random, with a warning only).
LEGACY_TOWER_PREFIX = {"CLIPVisionModel": "vision_model.", "SiglipVisionModel": "vision_model."}
REMOTE_MODULE = "llava_remote_tower"
REMOTE_CODE = '''"""LLaVA whose vision tower is remote code, written by hf_vrl (`save_llava`).

Importing this module registers the tower, {config_class} ({config_module}.py) and {model_class}
({model_module}.py), with transformers' Auto classes; the classes below are then transformers' own LLaVA.
Load with `AutoModelForImageTextToText.from_pretrained(<folder>, trust_remote_code=True)`.
"""

from transformers import AutoConfig, AutoModel, LlavaConfig, LlavaForConditionalGeneration
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from .{config_module} import {config_class}
from .{model_module} import {model_class}
{other_modules}
if {config_class}.model_type not in CONFIG_MAPPING:  # an installed hf_vrl has registered its own classes
    AutoConfig.register({config_class}.model_type, {config_class})
AutoModel.register({config_class}, {model_class}, exist_ok=True)


class LlavaRemoteTowerConfig(LlavaConfig):
    """transformers' LlavaConfig (the `auto_map` entry that imports this module)."""


class LlavaRemoteTowerForConditionalGeneration(LlavaForConditionalGeneration):
    """transformers' LlavaForConditionalGeneration."""

    config_class = LlavaRemoteTowerConfig


try:  # transformers 5 finds LLaVA's checkpoint key renames by class name; 4.x inherits them with the class
    from transformers.conversion_mapping import (
        get_checkpoint_conversion_mapping,
        register_checkpoint_conversion_mapping,
    )
except ImportError:
    pass
else:
    register_checkpoint_conversion_mapping(
        LlavaRemoteTowerForConditionalGeneration.__name__,
        get_checkpoint_conversion_mapping("llava"),
        overwrite=True,
    )
'''


@dataclass(frozen=True)
class TowerGeometry:
    """What LLaVA's projector and image tokens see of a vision tower."""

    image_size: int
    patch_size: int
    feature_width: int  # width of the projector's input: hidden size × number of feature layers
    # tokens before the patches (1: CLS, 0: SigLIP): the processor's num_additional_image_tokens
    extra_tokens: int
    image_tokens: int  # image tokens per image after the feature-selection strategy

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size

    def describe(self) -> str:
        return (
            f"{self.image_tokens} image tokens ({self.grid}x{self.grid} patches of {self.patch_size} px "
            f"at {self.image_size} px)"
        )


@dataclass(frozen=True)
class TowerFit:
    """A tower measured against a LLaVA: `problems` need the projector relearned, `notes` are handled by the
    swap and the processor."""

    expected: TowerGeometry  # the LLaVA's current tower: what the language model was trained on
    tower: TowerGeometry
    projector_width: int

    @property
    def problems(self) -> list[str]:
        found = []
        if self.needs_new_projector:
            found.append(
                f"hidden width: the projector takes {self.projector_width}-wide features, "
                f"the tower gives {self.tower.feature_width}"
            )
        if self.tower.image_tokens != self.expected.image_tokens:
            found.append(
                f"patch grid: the language model was trained on {self.expected.describe()}, "
                f"the tower gives {self.tower.describe()}"
            )
        return found

    @property
    def notes(self) -> list[str]:
        if self.tower.image_size == self.expected.image_size:
            return []
        return [
            f"image size: the tower takes {self.tower.image_size} px images "
            f"(the LLaVA's took {self.expected.image_size} px); the processor resizes accordingly"
        ]

    @property
    def needs_new_projector(self) -> bool:
        return self.tower.feature_width != self.projector_width


def as_vision_tower(model: Any) -> PreTrainedModel:
    """The vision tower LLaVA would build from `model`: the model itself, or the tower inside a dual encoder
    (`CLIPModel`, `DiffCLIPModel`, `SiglipModel`) or a model with a head (`vision_model` / `base_model`)."""
    candidates = (model, getattr(model, "vision_model", None), getattr(model, "base_model", None))
    for candidate in candidates:
        if isinstance(candidate, PreTrainedModel) and _is_auto_tower(candidate):
            return candidate
    raise UserError(
        f"{type(model).__name__} is not a vision tower LLaVA can use: pass a vision encoder "
        "(CLIPVisionModel, SiglipVisionModel, ViTModel, DiffCLIPVisionModel) or a dual encoder holding one."
    )


def _is_auto_tower(model: PreTrainedModel) -> bool:
    """An image encoder that `AutoModel.from_config(model.config)` rebuilds as the same class (or remote code
    that ships with its files), as LLaVA does when it loads."""
    if model.main_input_name != "pixel_values" or hasattr(model.config, "vision_config"):
        return False
    try:
        return MODEL_MAPPING[type(model.config)] is type(model)
    except KeyError:
        return type(model).is_remote_code()


def load_vision_tower(name_or_path: str | Path) -> PreTrainedModel:
    """Load a vision tower from a folder or Hub id: a tower checkpoint (DCR / DiVE export, DiffCLIP vision
    model, ViT backbone) or a dual encoder (CLIPModel, DiffCLIPModel), of which the vision tower is taken."""
    import hf_vrl.models  # noqa: F401 - registers hf_vrl's model types with the Auto classes

    try:
        config = AutoConfig.from_pretrained(name_or_path)
    except (OSError, ValueError) as error:
        raise UserError(
            f"--vision {name_or_path}: not a transformers model folder or Hub id ({error})"
        ) from error
    vision_config = getattr(config, "vision_config", None)
    if vision_config is None:
        return as_vision_tower(AutoModel.from_pretrained(name_or_path))
    try:
        tower_class = MODEL_MAPPING[type(vision_config)]
    except KeyError:
        raise UserError(
            f"--vision {name_or_path}: its vision_config ({vision_config.model_type}) has no transformers "
            "model class; export the vision tower on its own and pass that folder."
        ) from None
    return as_vision_tower(tower_class.from_pretrained(name_or_path))


def tower_geometry(
    tower: PreTrainedModel,
    vision_feature_layer: int | list[int] = -2,
    vision_feature_select_strategy: str = "default",
) -> TowerGeometry:
    """Measure a tower the way LLaVA uses it: a forward pass of a meta-device copy (shapes only) with
    `output_hidden_states=vision_feature_layer`, which also checks that the tower follows LLaVA's contract."""
    config = tower.config
    image_size, patch_size = getattr(config, "image_size", None), getattr(config, "patch_size", None)
    if not isinstance(image_size, int) or not isinstance(patch_size, int):
        raise UserError(
            f"{type(tower).__name__} has no square image_size / patch_size in its config: LLaVA needs a "
            "ViT-style tower with one patch grid."
        )
    layers = [vision_feature_layer] if isinstance(vision_feature_layer, int) else list(vision_feature_layer)
    num_states = config.num_hidden_layers + 1
    if any(not -num_states <= layer < num_states for layer in layers):
        raise UserError(
            f"vision_feature_layer {vision_feature_layer} is not a hidden state of this "
            f"{config.num_hidden_layers}-layer tower (indices -{num_states}..{num_states - 1}, embeddings "
            "first); choose one, e.g. -2."
        )
    states = _probe_hidden_states(tower, vision_feature_layer)
    if states is None or len(states) != num_states:
        raise UserError(
            f"{type(tower).__name__} does not return LLaVA's hidden states (the embeddings, then one per "
            "layer) for output_hidden_states; it cannot be a LLaVA vision tower."
        )
    tokens, width = states[layers[0]].shape[1:]
    extra_tokens = tokens - (image_size // patch_size) ** 2
    if vision_feature_select_strategy == "default" and extra_tokens == 0:
        raise UserError(
            f"{type(tower).__name__} has no CLS token, so the 'default' feature selection would drop a "
            "patch: use vision_feature_select_strategy='full' (--vision-feature-select-strategy full)."
        )
    dropped = 1 if vision_feature_select_strategy == "default" else 0
    return TowerGeometry(image_size, patch_size, width * len(layers), extra_tokens, tokens - dropped)


def _probe_hidden_states(tower: PreTrainedModel, vision_feature_layer: int | list[int]) -> tuple | None:
    config = copy.deepcopy(tower.config)
    with torch.device("meta"):
        probe = type(tower)(config)
        size = (1, getattr(config, "num_channels", 3), config.image_size, config.image_size)
        outputs = probe(torch.empty(size), output_hidden_states=vision_feature_layer, return_dict=True)
    return outputs.hidden_states


def check_vision_tower(
    llava_model: LlavaForConditionalGeneration,
    vision_model: Any,
    *,
    vision_feature_layer: int | list[int] | None = None,
    vision_feature_select_strategy: str | None = None,
) -> TowerFit:
    """Measure `vision_model` (a tower or a model holding one) against the LLaVA's projector and image-token
    count; `vision_feature_layer` / `vision_feature_select_strategy` default to the LLaVA's."""
    config = llava_model.config
    tower = as_vision_tower(vision_model)
    layer = config.vision_feature_layer if vision_feature_layer is None else vision_feature_layer
    strategy = vision_feature_select_strategy or config.vision_feature_select_strategy
    expected = tower_geometry(
        llava_model.model.vision_tower, config.vision_feature_layer, config.vision_feature_select_strategy
    )
    fit = TowerFit(
        expected,
        tower_geometry(tower, layer, strategy),
        llava_model.model.multi_modal_projector.linear_1.in_features,
    )
    context = getattr(config.get_text_config(), "max_position_embeddings", None)
    if context is not None and fit.tower.image_tokens >= context:
        raise UserError(
            f"the tower gives {fit.tower.describe()}, more than the language model's {context} positions "
            "hold: use a tower with a coarser grid (larger patches or smaller images)."
        )
    return fit


def swap_vision_tower(
    llava_model: LlavaForConditionalGeneration,
    vision_model: Any,
    *,
    realign: bool = False,
    vision_feature_layer: int | list[int] | None = None,
    vision_feature_select_strategy: str | None = None,
) -> TowerFit:
    """Put the vision tower of `vision_model` into `llava_model` in place; returns how the tower fits.

    The tower is cast to the device and dtype of the tower it replaces, and the config follows it
    (`vision_config`, `image_seq_length`, the feature layer and strategy when given). A tower whose width or
    patch grid does not fit raises `UserError` naming each mismatch, unless `realign=True`: then a tower of
    another width gets a freshly initialised projector, and the projector must be trained
    (`hf_vrl.integrations.llava_align.align_projector`, `hf-vrl llava-align`).
    """
    fit = check_vision_tower(
        llava_model,
        vision_model,
        vision_feature_layer=vision_feature_layer,
        vision_feature_select_strategy=vision_feature_select_strategy,
    )
    if fit.problems and not realign:
        raise UserError(
            "the vision tower does not fit this LLaVA: "
            + "; ".join(fit.problems)
            + ". Relearn the projector: `hf-vrl llava-align --llava <llava> --vision <tower> --output <dir>`."
        )
    old_tower = llava_model.model.vision_tower
    dtype = module_dtype(old_tower)
    tower = as_vision_tower(vision_model).to(device=module_device(old_tower), dtype=dtype)
    tower.config.dtype = dtype
    config = llava_model.config
    config.vision_config = tower.config
    config.image_seq_length = fit.tower.image_tokens
    if vision_feature_layer is not None:
        config.vision_feature_layer = vision_feature_layer
    if vision_feature_select_strategy is not None:
        config.vision_feature_select_strategy = vision_feature_select_strategy
    llava_model.model.vision_tower = tower
    # transformers 5 records the key renames it applied when loading the LLaVA and reverts them on save; those
    # of the old tower would now rename the new one's keys. Without a record, saving derives them from the
    # modules in place, as for a model built from its config.
    llava_model._weight_conversions = None
    if fit.needs_new_projector:
        _replace_projector(llava_model)
    return fit


def _replace_projector(llava_model: LlavaForConditionalGeneration) -> None:
    """A freshly initialised projector for the current config, where the old one lived."""
    old = llava_model.model.multi_modal_projector
    projector = LlavaMultiModalProjector(llava_model.config)
    projector.apply(llava_model._init_weights)
    llava_model.model.multi_modal_projector = projector.to(device=module_device(old), dtype=module_dtype(old))


def llava_processor_for(
    llava_model: LlavaForConditionalGeneration, processor: LlavaProcessor, image_processor: Any = None
) -> LlavaProcessor:
    """`processor` made to write the swapped tower's image-token count (its patch size, CLS tokens and the
    feature-selection strategy), with `image_processor` (the tower's own, e.g. from its export folder) or the
    LLaVA's resized to the tower's image size; the same tokenizer."""
    config = llava_model.config
    tower = llava_model.model.vision_tower
    geometry = tower_geometry(tower, config.vision_feature_layer, config.vision_feature_select_strategy)
    if image_processor is None:
        image_processor = _resized(processor.image_processor, geometry.image_size)
    _check_image_size(image_processor, geometry.image_size)
    return LlavaProcessor(
        image_processor=image_processor,
        tokenizer=processor.tokenizer,
        patch_size=geometry.patch_size,
        vision_feature_select_strategy=config.vision_feature_select_strategy,
        chat_template=processor.chat_template,
        image_token=processor.image_token,
        num_additional_image_tokens=geometry.extra_tokens,
    )


def _resized(image_processor: Any, image_size: int) -> Any:
    """`image_processor` producing `image_size` square images (shortest-edge resize + centre crop, or a
    plain resize, whichever it uses)."""
    settings = image_processor.to_dict()
    square = {"height": image_size, "width": image_size}
    size = settings.get("size") or {}
    settings["size"] = {"shortest_edge": image_size} if "shortest_edge" in size else square
    if settings.get("crop_size"):
        settings["crop_size"] = square
    return type(image_processor).from_dict(settings)


def _check_image_size(image_processor: Any, image_size: int) -> None:
    image = Image.new("RGB", (image_size + 7, image_size + 3))
    shape = tuple(image_processor(images=image, return_tensors="pt")["pixel_values"].shape[-2:])
    if shape != (image_size, image_size):
        raise UserError(
            f"the image processor gives {shape[0]}x{shape[1]} images but the tower takes "
            f"{image_size}x{image_size}: set its size / crop_size to the tower's image_size."
        )


def check_llava(name_or_path: str | Path) -> None:
    """Refuse a folder or Hub id that holds no `LlavaForConditionalGeneration` (reads its config only)."""
    import hf_vrl.models  # noqa: F401 - a saved LLaVA may hold one of hf_vrl's towers

    try:
        config = AutoConfig.from_pretrained(name_or_path)
    except (OSError, ValueError) as error:
        raise UserError(
            f"--llava {name_or_path}: not a transformers model folder or Hub id ({error})"
        ) from error
    if config.model_type != "llava":
        raise UserError(
            f"--llava {name_or_path} is a {config.model_type!r} model; give a LlavaForConditionalGeneration "
            "checkpoint (model_type 'llava', e.g. llava-hf/llava-1.5-7b-hf)."
        )


def load_llava(
    name_or_path: str | Path, *, dtype: str | torch.dtype = "auto"
) -> LlavaForConditionalGeneration:
    """Load a `LlavaForConditionalGeneration` (folder or Hub id) in `dtype` ("auto": the checkpoint's)."""
    check_llava(name_or_path)
    return LlavaForConditionalGeneration.from_pretrained(name_or_path, dtype=dtype)


def load_llava_processor(name_or_path: str | Path) -> LlavaProcessor | None:
    """The LLaVA's processor, or None where the checkpoint has none."""
    try:
        processor = AutoProcessor.from_pretrained(name_or_path)
    except (OSError, ValueError):
        return None
    return processor if isinstance(processor, LlavaProcessor) else None


def load_image_processor(name_or_path: str | Path) -> Any:
    """The image processor saved with a vision tower, or None where it has none."""
    try:
        return processors.load_image_processor(name_or_path)
    except (OSError, ValueError):
        return None


def save_llava(
    llava_model: LlavaForConditionalGeneration,
    output_dir: str | Path,
    processor: LlavaProcessor | None = None,
) -> Path:
    """Save a LLaVA (and its processor) so that plain transformers loads it: tower keys in the layout both
    4.x and 5.x read, and a remote-code tower's files with an `auto_map` for `trust_remote_code=True`."""
    output_dir = Path(output_dir)
    tower = llava_model.model.vision_tower
    llava_model.save_pretrained(output_dir, state_dict=_cross_version_state_dict(llava_model))
    _set_auto_map(output_dir, _write_remote_code(tower, output_dir) if type(tower).is_remote_code() else None)
    if processor is not None:
        processor.save_pretrained(output_dir)
    portable_files(output_dir)  # loads with transformers 4.57 too: no TokenizersBackend, no machine state
    return output_dir


def save_vision_tower(tower: PreTrainedModel, folder: str | Path) -> None:
    """Save a vision tower in the layout every supported transformers reads: a stock CLIP / SigLIP tower's
    keys under `vision_model.` (transformers >= 5.17 writes them without, which 4.x and 5.0 load as missing
    weights: a randomly initialised tower), any other as it saves itself."""
    prefix = LEGACY_TOWER_PREFIX.get(type(tower).__name__, "")
    state = {
        key if key.startswith(prefix) else prefix + key: value.contiguous()
        for key, value in tower.state_dict().items()
    }
    tower.save_pretrained(folder, state_dict=state)


def _cross_version_state_dict(llava_model: LlavaForConditionalGeneration) -> dict[str, torch.Tensor]:
    prefix = LEGACY_TOWER_PREFIX.get(type(llava_model.model.vision_tower).__name__, "")
    tower_keys = "model.vision_tower."
    return {
        key.replace(tower_keys, tower_keys + prefix, 1) if key.startswith(tower_keys) else key: value
        for key, value in llava_model.state_dict().items()
    }


def _write_remote_code(tower: PreTrainedModel, output_dir: Path) -> dict[str, str]:
    """The tower's code files and the module that registers them; returns the `auto_map` that imports it.
    The module imports every code file directly (the model file's own relative imports too, e.g. DiffCLIP's
    `differential_attention.py`): transformers 4.x copies a local folder's remote code one import deep."""
    written = custom_object_save(tower, output_dir) + custom_object_save(tower.config, output_dir)
    names = {
        "config_module": type(tower.config).__module__.rsplit(".", 1)[-1],
        "config_class": type(tower.config).__name__,
        "model_module": type(tower).__module__.rsplit(".", 1)[-1],
        "model_class": type(tower).__name__,
    }
    others = sorted({Path(file).stem for file in written} - {names["config_module"], names["model_module"]})
    names["other_modules"] = "".join(f"from .{module} import __name__ as _{module}\n" for module in others)
    (output_dir / f"{REMOTE_MODULE}.py").write_text(REMOTE_CODE.format(**names))
    return {
        "AutoConfig": f"{REMOTE_MODULE}.LlavaRemoteTowerConfig",
        "AutoModelForImageTextToText": f"{REMOTE_MODULE}.LlavaRemoteTowerForConditionalGeneration",
    }


def _set_auto_map(output_dir: Path, auto_map: dict[str, str] | None) -> None:
    """Write `auto_map` into the saved config, or drop one a LLaVA loaded from a remote-tower folder carried
    over to a tower that needs none."""
    path = output_dir / "config.json"
    config = json.loads(path.read_text())
    if auto_map is None and "auto_map" not in config:
        return
    config.pop("auto_map", None)
    if auto_map is not None:
        config["auto_map"] = auto_map
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
