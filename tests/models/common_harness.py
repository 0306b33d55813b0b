"""transformers' common model tests (`ModelTesterMixin`) for every hf_vrl model class and its transformers
baseline, under one harness: the same mixin, the same flags, the same sizes (transformers' CLIP, ResNet and
ViT tester sizes) and the same inputs for both members of a pair.

Each family runs as transformers' own suite runs its baseline (tests/models/<family>/test_modeling_<family>.py
of CLIP, ViT, ResNet): the tester's sizes (ViT's `num_masks` / `mask_length`), CLIPModel's
`additional_model_inputs`, and the overrides and skips those suites make (`CLIPModelSuite`, `NoInputsEmbeds`,
`PatchEmbeddings`, `CLIPTowerTraining`, `ResNetSuite`), the same for both members of a pair.

A test that passes without building the class under test (a `continue` for a base model, a class that says it
lacks a feature) tested nothing: each test's record (`HARNESS_RECORD`, a JSON-lines file) says whether it
built one, and `test_transformers_common.py` counts such a pass as "vacuous", not as a pass.

Not collected by the default run (no `test_` prefix): `test_transformers_common.py` runs it with pytest in a
child process, `transformers_common_tests` (transformers_tests.py) on its path, and compares the outcomes.
"""

from __future__ import annotations

import json
import os
import unittest
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
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
    PreTrainedModel,
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


BUILT: set[type] = set()  # the PreTrainedModel classes built during the current test
_post_init = PreTrainedModel.post_init


def _recording_post_init(self: PreTrainedModel) -> None:
    """`PreTrainedModel.post_init` (the end of every model's __init__), noting the class built."""
    BUILT.add(type(self))
    _post_init(self)


def _record(case: unittest.TestCase, model_class: type) -> None:
    """One line of HARNESS_RECORD: the test, and whether it built `model_class`."""
    path = os.environ.get("HARNESS_RECORD")
    if path:
        line = {"case": type(case).__name__, "test": case._testMethodName, "built": model_class in BUILT}
        with open(path, "a") as record:
            record.write(json.dumps(line) + "\n")


def _case(model_class: type, config: Callable, inputs: Callable, sizes: dict, **flags: Any) -> type:
    """A `ModelTesterMixin` test case of `model_class` (the name pytest reports is the class's), with the
    overrides of `flags["suite"]` (transformers' own suite of the family) before the mixin's."""

    def setUpClass(cls):  # noqa: N802 (unittest's name)
        _register_base_models()
        PreTrainedModel.post_init = _recording_post_init

    def setUp(self):  # noqa: N802
        self.model_tester = HarnessTester(self, config, inputs, **sizes)
        BUILT.clear()

    def tearDown(self):  # noqa: N802
        _record(self, model_class)

    name = f"{model_class.__name__}{flags.pop('suffix', '')}Test"
    bases = (*flags.pop("suites", ()), ModelTesterMixin, unittest.TestCase)
    body = {"all_model_classes": (model_class,), "setUp": setUp, "tearDown": tearDown, "__module__": __name__}
    body |= {**flags, "setUpClass": classmethod(setUpClass)}
    return type(name, bases, body)


class NoInputsEmbeds:
    """transformers' CLIP and ViT suites: the towers take no inputs_embeds."""

    @unittest.skip(reason="the tower does not use inputs_embeds (transformers' CLIP / ViT suites)")
    def test_inputs_embeds(self):
        pass


class PatchEmbeddings:
    """transformers' CLIPVisionModelTest / ViTModelTest: input embeddings that are a module (a patch
    embedding, not an nn.Embedding), no token embeddings to resize."""

    test_resize_embeddings = False

    def test_model_get_set_embeddings(self):
        config, _ = self.model_tester.prepare_config_and_inputs_for_common()
        for model_class in self.all_model_classes:
            model = model_class(config)
            self.assertIsInstance(model.get_input_embeddings(), nn.Module)
            output = model.get_output_embeddings()
            self.assertTrue(output is None or isinstance(output, nn.Linear))


class CLIPTowerTraining:
    """transformers' CLIPVisionModelTest / CLIPTextModelTest skip the training tests: a tower has no loss."""

    @unittest.skip(reason="a CLIP tower has no loss to train (transformers' CLIP suites skip it)")
    def test_training(self):
        pass

    @unittest.skip(reason="a CLIP tower has no loss to train (transformers' CLIP suites skip it)")
    def test_training_gradient_checkpointing(self):
        pass

    @unittest.skip(reason="a CLIP tower has no loss to train (transformers' CLIP suites skip it)")
    def test_training_gradient_checkpointing_use_reentrant_false(self):
        pass

    @unittest.skip(reason="a CLIP tower has no loss to train (transformers' CLIP suites skip it)")
    def test_training_gradient_checkpointing_use_reentrant_true(self):
        pass


class ResNetSuite:
    """What transformers' ResNetModelTest overrides: a convolutional backbone has no embeddings to get, set or
    feed (nor resize)."""

    test_resize_embeddings = False

    @unittest.skip(reason="ResNet does not use inputs_embeds")
    def test_inputs_embeds(self):
        pass

    @unittest.skip(reason="ResNet does not support input and output embeddings")
    def test_model_get_set_embeddings(self):
        pass

    def test_hidden_states_output(self):
        """ResNetModelTest's: the stem's feature map and one per stage, the stem's a quarter of the image."""
        config, inputs = self.model_tester.prepare_config_and_inputs_for_common()
        for model_class in self.all_model_classes:
            model = model_class(config).eval()
            with torch.no_grad():
                hidden = model(**inputs, output_hidden_states=True).hidden_states
            self.assertEqual(len(hidden), self.model_tester.num_stages + 1)
            self.assertListEqual(list(hidden[0].shape[-2:]), [self.model_tester.image_size // 4] * 2)


class CLIPModelSuite:
    """What transformers' CLIPModelTest gives a dual encoder: pixel_values beside the main input (input_ids)
    in the eager-vs-SDPA tests, and the per-tower tests skipped (each tower has its own case)."""

    additional_model_inputs = ["pixel_values"]

    @unittest.skip(reason="Hidden_states is tested in individual model tests")
    def test_hidden_states_output(self):
        pass

    @unittest.skip(reason="Inputs_embeds is tested in individual model tests")
    def test_inputs_embeds(self):
        pass

    @unittest.skip(reason="Retain_grad is tested in individual model tests")
    def test_retain_grad_hidden_states_attentions(self):
        pass

    @unittest.skip(reason="CLIPModel does not have input/output embeddings")
    def test_model_get_set_embeddings(self):
        pass

    @unittest.skip(reason="Attentions are tested in individual model tests (test_attention_outputs = False)")
    def test_attention_outputs(self):
        pass


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
# ViTModelTester's mask sizes (mask_ratio 0.5): the eager-vs-SDPA tests build ViT's bool_masked_pos from them
VIT_SIZES = {
    **VISION_SIZES,
    "batch_size": VIT_BATCH,
    "num_masks": int(0.5 * _patches),
    "mask_length": _patches - 1,
}
TEXT_SIZES = dict(
    batch_size=TEXT_BATCH, seq_length=SEQ_LENGTH, hidden_size=32, num_hidden_layers=2, num_attention_heads=4
)
DUAL = dict(_is_composite=True, test_resize_embeddings=False, suites=(CLIPModelSuite,))
TEXT_TOWER = dict(suites=(NoInputsEmbeds, CLIPTowerTraining))
VISION_TOWER = dict(suites=(NoInputsEmbeds, PatchEmbeddings, CLIPTowerTraining))
VIT_TOWER = dict(suites=(NoInputsEmbeds, PatchEmbeddings))
# transformers' switch for models whose image features are no sequence: the common test checks
# last_hidden_state's width against a hidden-size field ResNetConfig does not have (it has hidden_sizes)
CONVOLUTIONAL = dict(has_attentions=False, skip_test_image_features_output_shape=True)
# what the common tests check the attention maps against: a differential tower returns one map A1 − λ·A2 per
# differential head, i.e. per pair of its heads (DiffCLIP §3.2; `output_attentions` in modeling_diffclip.py)
DIFFERENTIAL = {"num_attention_heads": VISION["num_attention_heads"] // 2}


def _dual_inputs() -> dict[str, Any]:
    return {**_text(VISION_BATCH), **_pixels(VISION_BATCH, VISION["image_size"]), "return_loss": False}


# ResNetModelTester's num_stages; expected_num_hidden_layers (the stem's feature map and one per stage): what
# the mixin's image-feature tests read where a tester has no num_hidden_layers
_stages = len(RESNET["hidden_sizes"])
RESNET_SIZES = dict(
    batch_size=RESNET_BATCH, image_size=32, num_stages=_stages, expected_num_hidden_layers=_stages + 1
)


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
        _case(
            DiffCLIPTextModel,
            lambda: DiffCLIPTextConfig(**TEXT),
            _text,
            TEXT_SIZES | DIFFERENTIAL,
            **TEXT_TOWER,
        ),
        _case(CLIPTextModel, lambda: CLIPTextConfig(**TEXT), _text, TEXT_SIZES, **TEXT_TOWER),
    ),
    "DiffCLIPTextModelWithProjection": (
        _case(
            DiffCLIPTextModelWithProjection,
            lambda: DiffCLIPTextConfig(**TEXT),
            _text,
            TEXT_SIZES | DIFFERENTIAL,
            **TEXT_TOWER,
        ),
        _case(CLIPTextModelWithProjection, lambda: CLIPTextConfig(**TEXT), _text, TEXT_SIZES, **TEXT_TOWER),
    ),
    "DiffCLIPVisionModel": (
        _case(
            DiffCLIPVisionModel,
            lambda: DiffCLIPVisionConfig(**VISION),
            lambda: _pixels(VISION_BATCH, VISION["image_size"]),
            VISION_SIZES | DIFFERENTIAL,
            **VISION_TOWER,
        ),
        _case(
            CLIPVisionModel,
            lambda: CLIPVisionConfig(**VISION),
            lambda: _pixels(VISION_BATCH, VISION["image_size"]),
            VISION_SIZES,
            **VISION_TOWER,
        ),
    ),
    "DiffCLIPVisionModelWithProjection": (
        _case(
            DiffCLIPVisionModelWithProjection,
            lambda: DiffCLIPVisionConfig(**VISION),
            lambda: _pixels(VISION_BATCH, VISION["image_size"]),
            VISION_SIZES | DIFFERENTIAL,
            **VISION_TOWER,
        ),
        _case(
            CLIPVisionModelWithProjection,
            lambda: CLIPVisionConfig(**VISION),
            lambda: _pixels(VISION_BATCH, VISION["image_size"]),
            VISION_SIZES,
            **VISION_TOWER,
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
            **VISION_TOWER,
        ),
        "DiffCLIPVisionModelWithProjection",  # the same baseline: CLIPVisionModelWithProjection
    ),
    "CLUEModel (ResNet)": (
        _case(
            CLUEModel,
            _clue(lambda: ResNetConfig(**RESNET)),
            lambda: _pixels(RESNET_BATCH, 32),
            RESNET_SIZES,
            suffix="ResNet",
            **CONVOLUTIONAL,
            suites=(ResNetSuite,),
        ),
        _case(
            ResNetModel,
            lambda: ResNetConfig(**RESNET),
            lambda: _pixels(RESNET_BATCH, 32),
            RESNET_SIZES,
            **CONVOLUTIONAL,
            suites=(ResNetSuite,),
        ),
    ),
    "CLUEModel (ViT)": (
        _case(
            CLUEModel,
            _clue(lambda: ViTConfig(**VIT)),
            lambda: _pixels(VIT_BATCH, VIT["image_size"]),
            VIT_SIZES,
            suffix="ViT",
            **VIT_TOWER,
        ),
        _case(
            ViTModel,
            lambda: ViTConfig(**VIT),
            lambda: _pixels(VIT_BATCH, VIT["image_size"]),
            VIT_SIZES,
            **VIT_TOWER,
        ),
    ),
}
PAIRS = {
    name: (ours, PAIRS[baseline][1] if isinstance(baseline, str) else baseline)
    for name, (ours, baseline) in PAIRS.items()
}
globals().update({case.__name__: case for pair in PAIRS.values() for case in pair})  # collected by pytest
