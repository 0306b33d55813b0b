"""CLUESettings: the paper's defaults, a help text per field, complete validation with UserError."""

from __future__ import annotations

import dataclasses

import pytest
from clue_helpers import tiny_settings

from hf_vrl.errors import UserError
from hf_vrl.methods.clue.settings import CLUESettings


def test_defaults_are_the_papers():
    s = CLUESettings()
    assert s.backbone == "microsoft/resnet-50" and s.image_size == 224  # ResNet-50, ImageNet weights
    assert (s.num_parts, s.alpha, s.beta, s.gamma) == (3, 1.0, 1.0, 1.0)  # K = 3; Eq. 8 weights 1
    assert (s.momentum, s.momentum_schedule) == (0.999, "constant")  # §5.1.1
    assert (s.temperature, s.sinkhorn_epsilon, s.sinkhorn_iterations) == (0.4, 0.05, 3)  # ReSA
    assert (s.projection_hidden_dim, s.projection_dim, s.targets) == (2048, 512, "sinkhorn")


def test_every_field_has_help():
    for f in dataclasses.fields(CLUESettings):
        assert f.metadata.get("help"), f.name


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"targets": "soft"}, "targets"),
        ({"momentum_schedule": "linear"}, "momentum_schedule"),
        ({"temperature": 0.0}, "temperature"),
        ({"sinkhorn_iterations": 0}, "sinkhorn_iterations"),
        ({"momentum": 1.2}, "momentum"),
        ({"beta": -1.0}, "beta"),
        ({"alpha": 0.0, "beta": 0.0, "gamma": 0.0}, "no term"),
        ({"num_parts": 0}, "num_parts"),
        ({"gamma": 1.0, "text_source": ""}, "text_source"),
        ({"backbone": "microsoft/resnet-50"}, "exactly one"),
        ({"backbone_config": {"model_type": "swin"}}, "model_type"),
        ({"augment": {"crop_size": 3}}, "unknown keys"),
        ({"augment": {"blur_prob": 2.0}}, "blur_prob"),
    ],
)
def test_impossible_settings_raise_user_errors(overrides, match):
    with pytest.raises(UserError, match=match):
        tiny_settings(**overrides)


def test_switching_terms_off_is_valid():
    assert tiny_settings(num_parts=0, beta=0.0).beta == 0.0
    assert tiny_settings(gamma=0.0, text_source="").uses_text is False
    assert tiny_settings(targets="identity", beta=0.0, gamma=0.0).targets == "identity"


def test_views_take_the_image_size_and_overrides():
    views = tiny_settings(image_size=24, augment={"crop_scale": [0.5, 1.0], "solarize_prob": 0.0}).views()
    assert views.size == 24 and views.crop_scale == (0.5, 1.0) and views.solarize_prob == 0.0
    assert views.blur_prob == 0.5  # ReSA's default where not overridden
