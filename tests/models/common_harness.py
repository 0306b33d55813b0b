"""transformers' common model tests (`ModelTesterMixin`) for every hf_vrl model class and its transformers
baseline, under one harness: the same mixin, the same flags, the same sizes (transformers' CLIP, ResNet and
ViT tester sizes) and the same inputs for both members of a pair.

Not collected by the default run (no `test_` prefix): `test_transformers_common.py` runs it with pytest in a
child process, `transformers_common_tests` (transformers_tests.py) on its path, and compares the outcomes.
"""

from __future__ import annotations

import unittest
from collections.abc import Callable
from typing import Any

from transformers import (
    AutoModel,
    CLIPConfig,
    CLIPModel,
    CLIPTextConfig,
    CLIPTextModel,
    CLIPTextModelWithProjection,
    CLIPVisionConfig,
    CLIPVisionModel,
    CLIPVisionModelWithProjection,
    ResNetConfig,
    ResNetModel,
    ViTConfig,
    ViTModel,
)
from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES
from transformers_common_tests.test_modeling_common import (
    ModelTesterMixin,
    floats_tensor,
    ids_tensor,
    random_attention_mask,
)

from hf_vrl.models.auto import AUTO_MODELS
from hf_vrl.models.clue import CLUEConfig, CLUEModel
from hf_vrl.models.dcr import DCRConfig, DCRModel
from hf_vrl.models.diffclip import (
    DiffCLIPConfig,
    DiffCLIPModel,
    DiffCLIPTextConfig,
    DiffCLIPTextModel,
    DiffCLIPTextModelWithProjection,
    DiffCLIPVisionConfig,
    DiffCLIPVisionModel,
    DiffCLIPVisionModelWithProjection,
)

# transformers' CLIPVisionModelTester / CLIPTextModelTester / CLIPModelTester, ResNetModelTester and
# ViTModelTester sizes (tests/models/*/test_modeling_*.py)
VISION = dict(
    image_size=30, patch_size=2, num_channels=3, hidden_size=32, projection_dim=32, num_hidden_layers=2,
    num_attention_heads=4, intermediate_size=37, dropout=0.1, attention_dropout=0.1, initializer_range=0.02,
)  # fmt: skip
TEXT = dict(
    vocab_size=99, hidden_size=32, projection_dim=32, num_hidden_layers=2, num_attention_heads=4,
    intermediate_size=37, dropout=0.1, attention_dropout=0.1, max_position_embeddings=512,
    initializer_range=0.02, bos_token_id=0, pad_token_id=1, eos_token_id=2,
)  # fmt: skip
# eos_token_id 2: CLIP's legacy pooling at the highest id, for both towers alike (the common tests change the
# ids, e.g. clamp them to a resized vocabulary, so no id can be counted on; a text without its EOS is pooled
# at position 0 by both, DiffCLIP with a warning)
DUAL_PROJECTION = 64  # CLIPModelTester's top-level projection_dim, beside the towers' 32
RESNET = dict(
    num_channels=3, embedding_size=10, hidden_sizes=[10, 20, 30, 40], depths=[1, 1, 2, 1], hidden_act="relu",
)  # fmt: skip
VIT = dict(
    image_size=30, patch_size=2, num_channels=3, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
    intermediate_size=37, hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
    initializer_range=0.02, encoder_stride=2,
)  # fmt: skip
CLUE_HEADS = dict(
    projection_dim=8, projection_hidden_dim=16, predictor_hidden_dim=16, num_parts=2, text_embed_dim=8,
)  # fmt: skip
VISION_BATCH, TEXT_BATCH, SEQ_LENGTH, RESNET_BATCH, VIT_BATCH = 12, 12, 7, 3, 13


def _pixels(batch: int, size: int) -> dict[str, Any]:
    return {"pixel_values": floats_tensor([batch, 3, size, size])}


def _text(batch: int = TEXT_BATCH) -> dict[str, Any]:
    """Token ids ending in the highest id (where the legacy rule pools), a random mask keeping the last."""
    input_ids = ids_tensor([batch, SEQ_LENGTH], TEXT["vocab_size"] - 1)
    input_ids[:, -1] = TEXT["vocab_size"] - 1
    return {"input_ids": input_ids, "attention_mask": random_attention_mask([batch, SEQ_LENGTH])}


class HarnessTester:
    """What `ModelTesterMixin` asks its `model_tester`: the config and inputs, and the sizes it checks."""

    def __init__(self, parent, config: Callable[[], Any], inputs: Callable[[], dict], **sizes: Any):
        self.parent, self._config, self._inputs = parent, config, inputs
        self.is_training = True
        self.__dict__.update(sizes)

    def get_config(self) -> Any:
        return self._config()

    def prepare_config_and_inputs_for_common(self) -> tuple[Any, dict]:
        return self._config(), self._inputs()


def _case(model_class: type, config: Callable, inputs: Callable, sizes: dict, **flags: Any) -> type:
    """A `ModelTesterMixin` test case of `model_class` (the name pytest reports is the class's)."""

    def setUpClass(cls):  # noqa: N802 (unittest's name)
        _register_base_models()

    def setUp(self):  # noqa: N802
        self.model_tester = HarnessTester(self, config, inputs, **sizes)

    name = f"{model_class.__name__}{flags.pop('suffix', '')}Test"
    body = {"all_model_classes": (model_class,), "setUp": setUp, "__module__": __name__, **flags}
    body["setUpClass"] = classmethod(setUpClass)
    return type(name, (ModelTesterMixin, unittest.TestCase), body)


def _register_base_models() -> None:
    """hf_vrl's base models are AutoModel's (hf_vrl.models registers them), as transformers' own base models
    are: the common tests tell a base model (no loss to train, skipped by test_training) by this table of
    transformers', which the harness's process extends when its tests start."""
    MODEL_MAPPING_NAMES.update(
        {config.model_type: model.__name__ for auto, config, model in AUTO_MODELS if auto is AutoModel}
    )


_patches = (VISION["image_size"] // VISION["patch_size"]) ** 2 + 1
VISION_SIZES = dict(
    batch_size=VISION_BATCH, seq_length=_patches, image_size=VISION["image_size"],
    patch_size=VISION["patch_size"], hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
)  # fmt: skip
TEXT_SIZES = dict(
    batch_size=TEXT_BATCH, seq_length=SEQ_LENGTH, hidden_size=32, num_hidden_layers=2, num_attention_heads=4
)
DUAL = dict(_is_composite=True, test_resize_embeddings=False)
# transformers' switch for models whose image features are no sequence: the common test checks
# last_hidden_state's width against a hidden-size field ResNetConfig does not have (it has hidden_sizes)
CONVOLUTIONAL = dict(has_attentions=False, skip_test_image_features_output_shape=True)
# what the common tests check the attention maps against: a differential tower returns one map A1 − λ·A2 per
# differential head, i.e. per pair of its heads (DiffCLIP §3.2; `output_attentions` in modeling_diffclip.py)
DIFFERENTIAL = {"num_attention_heads": VISION["num_attention_heads"] // 2}


def _dual_inputs() -> dict[str, Any]:
    return {**_text(VISION_BATCH), **_pixels(VISION_BATCH, VISION["image_size"]), "return_loss": False}


def _clue(backbone: Any) -> Callable[[], CLUEConfig]:
    return lambda: CLUEConfig(backbone_config=backbone(), **CLUE_HEADS)


# pairs: (hf_vrl's test case, its baseline's)
PAIRS = {
    "DiffCLIPModel": (
        _case(
            DiffCLIPModel,
            lambda: DiffCLIPConfig(text_config=TEXT, vision_config=VISION, projection_dim=DUAL_PROJECTION),
            _dual_inputs,
            VISION_SIZES,
            **DUAL,
        ),
        _case(
            CLIPModel,
            lambda: CLIPConfig(text_config=TEXT, vision_config=VISION, projection_dim=DUAL_PROJECTION),
            _dual_inputs,
            VISION_SIZES,
            **DUAL,
        ),
    ),
    "DiffCLIPTextModel": (
        _case(DiffCLIPTextModel, lambda: DiffCLIPTextConfig(**TEXT), _text, TEXT_SIZES | DIFFERENTIAL),
        _case(CLIPTextModel, lambda: CLIPTextConfig(**TEXT), _text, TEXT_SIZES),
    ),
    "DiffCLIPTextModelWithProjection": (
        _case(
            DiffCLIPTextModelWithProjection,
            lambda: DiffCLIPTextConfig(**TEXT),
            _text,
            TEXT_SIZES | DIFFERENTIAL,
        ),
        _case(CLIPTextModelWithProjection, lambda: CLIPTextConfig(**TEXT), _text, TEXT_SIZES),
    ),
    "DiffCLIPVisionModel": (
        _case(
            DiffCLIPVisionModel,
            lambda: DiffCLIPVisionConfig(**VISION),
            lambda: _pixels(VISION_BATCH, VISION["image_size"]),
            VISION_SIZES | DIFFERENTIAL,
        ),
        _case(
            CLIPVisionModel,
            lambda: CLIPVisionConfig(**VISION),
            lambda: _pixels(VISION_BATCH, VISION["image_size"]),
            VISION_SIZES,
        ),
    ),
    "DiffCLIPVisionModelWithProjection": (
        _case(
            DiffCLIPVisionModelWithProjection,
            lambda: DiffCLIPVisionConfig(**VISION),
            lambda: _pixels(VISION_BATCH, VISION["image_size"]),
            VISION_SIZES | DIFFERENTIAL,
        ),
        _case(
            CLIPVisionModelWithProjection,
            lambda: CLIPVisionConfig(**VISION),
            lambda: _pixels(VISION_BATCH, VISION["image_size"]),
            VISION_SIZES,
        ),
    ),
    "DCRModel": (
        _case(
            DCRModel,
            lambda: DCRConfig(
                vision_config=CLIPVisionConfig(**VISION), condition_dim=16, num_condition_tokens=3
            ),
            lambda: _pixels(VISION_BATCH, VISION["image_size"]),
            VISION_SIZES,
        ),
        "DiffCLIPVisionModelWithProjection",  # the same baseline: CLIPVisionModelWithProjection
    ),
    "CLUEModel (ResNet)": (
        _case(
            CLUEModel,
            _clue(lambda: ResNetConfig(**RESNET)),
            lambda: _pixels(RESNET_BATCH, 32),
            dict(batch_size=RESNET_BATCH, image_size=32, num_hidden_layers=4),
            suffix="ResNet",
            **CONVOLUTIONAL,
        ),
        _case(
            ResNetModel,
            lambda: ResNetConfig(**RESNET),
            lambda: _pixels(RESNET_BATCH, 32),
            dict(batch_size=RESNET_BATCH, image_size=32, num_hidden_layers=4),
            **CONVOLUTIONAL,
        ),
    ),
    "CLUEModel (ViT)": (
        _case(
            CLUEModel,
            _clue(lambda: ViTConfig(**VIT)),
            lambda: _pixels(VIT_BATCH, VIT["image_size"]),
            {**VISION_SIZES, "batch_size": VIT_BATCH},
            suffix="ViT",
        ),
        _case(
            ViTModel,
            lambda: ViTConfig(**VIT),
            lambda: _pixels(VIT_BATCH, VIT["image_size"]),
            {**VISION_SIZES, "batch_size": VIT_BATCH},
        ),
    ),
}
PAIRS = {
    name: (ours, PAIRS[baseline][1] if isinstance(baseline, str) else baseline)
    for name, (ours, baseline) in PAIRS.items()
}
globals().update({case.__name__: case for pair in PAIRS.values() for case in pair})  # collected by pytest
