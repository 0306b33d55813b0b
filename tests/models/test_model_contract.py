"""What every model class hf_vrl ships must do as a transformers model: run under accelerate's CPU and disk
offload (weights on `meta` until each module's forward loads them), honour or refuse the output flags
(`return_dict`, `output_hidden_states`, `output_attentions`), initialise every weight a checkpoint lacks by
the model's own rule, and compose its configuration from sub-configs as transformers' configs do."""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from accelerate import cpu_offload
from clue_helpers import TINY_HEADS, TINY_RESNET, TINY_VIT
from test_diffclip_reference import text_batch, tiny_config_kwargs
from transformers import (
    CLIPConfig,
    CLIPTextConfig,
    CLIPVisionConfig,
    PretrainedConfig,
    PreTrainedModel,
    ResNetConfig,
    ResNetModel,
    SiglipVisionConfig,
    SiglipVisionModel,
    ViTConfig,
    ViTModel,
)
from transformers.modeling_outputs import BaseModelOutputWithPooling

import hf_vrl.models
from hf_vrl.methods.dcr.toy import tiny_clip
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


def _pixels(size: int = 16, batch: int = 2) -> dict:
    return {"pixel_values": torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(0))}


def _text() -> dict:
    input_ids, attention_mask = text_batch()
    return {"input_ids": input_ids, "attention_mask": attention_mask}


@dataclass
class Case:
    build: Callable[[], torch.nn.Module]
    inputs: Callable[[], dict]
    has_attentions: bool = True


def _diffclip_config() -> DiffCLIPConfig:
    return DiffCLIPConfig(**tiny_config_kwargs())


def _seeded(build: Callable[[], torch.nn.Module]) -> Callable[[], torch.nn.Module]:
    def seeded():
        with torch.random.fork_rng():
            torch.manual_seed(0)
            model = build()
            # away from the init (lambda, RMSNorm and logit scale at constant values would hide a weight the
            # forward misses)
            with torch.no_grad():
                for parameter in model.parameters():
                    parameter.add_(0.05 * torch.randn_like(parameter))
            return model.eval()

    return seeded


CASES = {
    "diffclip": Case(_seeded(lambda: DiffCLIPModel(_diffclip_config())), lambda: _pixels() | _text()),
    "diffclip-vision": Case(_seeded(lambda: DiffCLIPVisionModel(_diffclip_config().vision_config)), _pixels),
    "diffclip-text": Case(_seeded(lambda: DiffCLIPTextModel(_diffclip_config().text_config)), _text),
    "diffclip-vision-projection": Case(
        _seeded(lambda: DiffCLIPVisionModelWithProjection(_diffclip_config().vision_config)), _pixels
    ),
    "diffclip-text-projection": Case(
        _seeded(lambda: DiffCLIPTextModelWithProjection(_diffclip_config().text_config)), _text
    ),
    "dcr": Case(
        _seeded(lambda: DCRModel.from_clip(tiny_clip(), condition_dim=16, num_condition_tokens=3)), _pixels
    ),
    "dcr-patches": Case(
        _seeded(
            lambda: DCRModel.from_clip(
                tiny_clip(), condition_dim=16, num_condition_tokens=3, condition_mode="cls_patches"
            )
        ),
        _pixels,
    ),
    "dcr-siglip": Case(
        _seeded(
            lambda: DCRModel.from_clip(
                SiglipVisionModel(
                    SiglipVisionConfig(
                        hidden_size=32,
                        intermediate_size=64,
                        num_hidden_layers=2,
                        num_attention_heads=2,
                        image_size=16,
                        patch_size=4,
                    )
                ),
                condition_dim=16,
                condition_mode="cls",
            )
        ),
        _pixels,
    ),
    "clue-resnet": Case(
        _seeded(lambda: CLUEModel(CLUEConfig(backbone_config=dict(TINY_RESNET), num_parts=2, **TINY_HEADS))),
        lambda: _pixels(32),
        has_attentions=False,
    ),
    "clue-vit": Case(
        _seeded(lambda: CLUEModel(CLUEConfig(backbone_config=dict(TINY_VIT), num_parts=2, **TINY_HEADS))),
        _pixels,
    ),
}


def _tensors(output) -> list[torch.Tensor]:
    values = output.values() if hasattr(output, "values") else output
    found = []
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (tuple, list)):
            found.extend(_tensors(value))
    return found


def _assert_same_outputs(actual, expected) -> None:
    actual, expected = _tensors(actual), _tensors(expected)
    assert len(actual) == len(expected) > 0
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=0, atol=0)


@pytest.fixture(scope="module", params=sorted(CASES))
def saved(request, tmp_path_factory):
    """(case, the model, its folder, its outputs)."""
    case = CASES[request.param]
    model = case.build()
    folder = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(folder)
    with torch.no_grad():
        expected = model(**case.inputs())
    return case, model, folder, expected


def _has_torch_multihead_attention(model) -> bool:
    """SigLIP's pooling head is torch's nn.MultiheadAttention, which reads its out_proj's weight without
    calling it: a stock SiglipVisionModel fails under accelerate's offload hooks the same way (upstream)."""
    return any(isinstance(m, torch.nn.MultiheadAttention) for m in model.modules())


def test_disk_offload_through_device_map_gives_the_same_outputs(saved, tmp_path):
    case, model, folder, expected = saved
    if _has_torch_multihead_attention(model):
        pytest.xfail("nn.MultiheadAttention under offload hooks: fails for stock SigLIP towers too")
    size = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    loaded = (
        type(model)
        .from_pretrained(
            folder, device_map="auto", max_memory={"cpu": size // 3}, offload_folder=tmp_path / "offload"
        )
        .eval()
    )
    assert "disk" in set(loaded.hf_device_map.values())
    assert any(p.is_meta for p in loaded.parameters())
    with torch.no_grad():
        _assert_same_outputs(loaded(**case.inputs()), expected)


def test_cpu_offload_gives_the_same_outputs(saved):
    case, model, folder, expected = saved
    if _has_torch_multihead_attention(model):
        pytest.xfail("nn.MultiheadAttention under offload hooks: fails for stock SigLIP towers too")
    loaded = type(model).from_pretrained(folder).eval()
    cpu_offload(loaded, execution_device=torch.device("cpu"))
    assert all(p.is_meta for p in loaded.parameters())
    with torch.no_grad():
        _assert_same_outputs(loaded(**case.inputs()), expected)


def test_fused_qkv_projection_under_offload_loads_the_weights(tmp_path):
    model = CASES["diffclip-vision"].build()
    model.save_pretrained(tmp_path / "model")
    attention = model.encoder.layers[0].self_attn
    hidden = torch.randn(2, 5, attention.embed_dim)
    expected = attention.project_qkv(hidden, fused=True)
    loaded = DiffCLIPVisionModel.from_pretrained(tmp_path / "model").eval()
    cpu_offload(loaded, execution_device=torch.device("cpu"))
    offloaded = loaded.encoder.layers[0].self_attn
    assert offloaded.q_proj.weight.is_meta
    for actual, wanted in zip(offloaded.project_qkv(hidden, fused=True), expected):
        torch.testing.assert_close(actual, wanted)


def _found(output, suffix: str) -> list:
    """The values of `output` (and of the tower outputs it nests) under keys ending in `suffix`."""
    found = []
    for key, value in output.items():
        if key.endswith(suffix):
            found.append(value)
        elif hasattr(value, "items"):
            found.extend(_found(value, suffix))
    return found


def test_return_dict_false_gives_the_tuple(saved):
    case, model, _, expected = saved
    with torch.no_grad():
        output = model(**case.inputs(), return_dict=False)
    assert isinstance(output, tuple)
    _assert_same_outputs(output, expected.to_tuple())


def test_output_hidden_states_are_returned(saved):
    case, model, _, _ = saved
    with torch.no_grad():
        plain = model(**case.inputs())
        output = model(**case.inputs(), output_hidden_states=True)
    hidden = _found(output, "hidden_states")
    assert hidden and all(isinstance(h, tuple) and len(h) > 1 for h in hidden)
    assert not _found(plain, "hidden_states")


def test_output_attentions_are_returned_or_refused(saved):
    case, model, _, _ = saved
    if not case.has_attentions:
        with pytest.raises(ValueError, match="no attention maps"):
            model(**case.inputs(), output_attentions=True)
        return
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            output = model(**case.inputs(), output_attentions=True)
    finally:
        model.set_attn_implementation("sdpa")
    attentions = _found(output, "attentions")
    assert attentions and all(isinstance(a, tuple) and a and a[0] is not None for a in attentions)


def test_every_weight_a_checkpoint_lacks_is_initialised_by_the_models_rule(saved):
    """Loaded from an empty state dict, every tensor follows the rule a freshly built model follows: the same
    constants, and spreads of the same size (CLIP's per-layer stds differ from the generic 0.02 by 3x+)."""
    _, model, _, _ = saved
    config = model.config
    with torch.random.fork_rng():
        torch.manual_seed(1)
        fresh = type(model)(config)
        torch.manual_seed(2)
        loaded = type(model).from_pretrained(None, config=config, state_dict={})
    fresh_tensors = dict(fresh.named_parameters()) | dict(fresh.named_buffers())
    loaded_tensors = dict(loaded.named_parameters()) | dict(loaded.named_buffers())
    assert fresh_tensors.keys() == loaded_tensors.keys()
    for name, wanted in fresh_tensors.items():
        got = loaded_tensors[name].detach()
        wanted = wanted.detach()
        assert torch.isfinite(got.float()).all(), name
        if wanted.numel() == 1 or bool((wanted == wanted.flatten()[0]).all()):
            torch.testing.assert_close(got, wanted, msg=f"{name}: not initialised to its constant")
        elif wanted.numel() >= 64 and wanted.is_floating_point():
            ratio = (got.float().std() / wanted.float().std()).item()
            assert 0.6 < ratio < 1.6, (
                f"{name}: std {got.float().std():.4f}, rule gives {wanted.float().std():.4f}"
            )


def test_diffclip_composes_from_tower_configs_as_clip_does():
    for projection in (256, None):
        text = {"projection_dim": projection} if projection else {}
        clip = CLIPConfig(text_config=CLIPTextConfig(**text))  # accepted by transformers
        config = DiffCLIPConfig(text_config=DiffCLIPTextConfig(**text))
        assert config.projection_dim == config.vision_config.projection_dim == (projection or 512)
        assert clip.text_config.projection_dim == (projection or 512)
    config = DiffCLIPConfig(
        vision_config=DiffCLIPVisionConfig(projection_dim=64), text_config={"hidden_size": 64}
    )
    assert (config.projection_dim, config.text_config.projection_dim) == (64, 64)
    assert DiffCLIPConfig.from_dict(config.to_dict()) == config


def test_diffclip_towers_keep_a_projection_dim_of_their_own_as_clip_does():
    """CLIPConfig takes towers whose projection_dim differs from the joint one (transformers' CLIP tester: 32
    and 64; hf_vrl's tiny-clip preset: 512 and 64): the dual model projects to the top-level width, a
    `*WithProjection` tower to its own, and the values survive a save."""
    towers = {"text_config": {"projection_dim": 512}, "vision_config": {"projection_dim": 512}}
    clip = CLIPConfig(**towers, projection_dim=64)
    config = DiffCLIPConfig(**towers, projection_dim=64)
    for got in (config, DiffCLIPConfig.from_dict(config.to_dict())):
        assert (got.projection_dim, got.text_config.projection_dim, got.vision_config.projection_dim) == (
            clip.projection_dim,
            clip.text_config.projection_dim,
            clip.vision_config.projection_dim,
        )
    config = DiffCLIPConfig(**tiny_config_kwargs(text_config={"projection_dim": 24}))
    assert (config.projection_dim, config.text_config.projection_dim) == (16, 24)
    with torch.no_grad():
        dual = DiffCLIPModel(config).eval()
        assert dual.get_text_features(**_text()).pooler_output.shape[-1] == 16
        tower = DiffCLIPTextModelWithProjection(config.text_config).eval()
        assert tower(**_text()).text_embeds.shape[-1] == 24
    # towers that differ with no joint width given: CLIPConfig's default
    split = {"text_config": {"projection_dim": 8}, "vision_config": {"projection_dim": 16}}
    assert DiffCLIPConfig(**split).projection_dim == CLIPConfig(**split).projection_dim == 512


@pytest.mark.parametrize(
    "build",
    [
        lambda: DCRConfig(
            vision_config=CLIPVisionConfig(hidden_size=32, num_attention_heads=2, projection_dim=24),
            condition_dim=16,
        ),
        lambda: CLUEConfig(
            backbone_config=ResNetConfig(**{k: v for k, v in TINY_RESNET.items() if k != "model_type"})
        ),
        lambda: CLUEConfig(
            backbone_config=ViTConfig(**{k: v for k, v in TINY_VIT.items() if k != "model_type"})
        ),
        lambda: DiffCLIPConfig(text_config=DiffCLIPTextConfig(), vision_config=DiffCLIPVisionConfig()),
    ],
)
def test_configs_compose_from_sub_config_objects_and_round_trip(build):
    config = build()
    assert type(config).from_dict(config.to_dict()).to_dict() == config.to_dict()


HUB_IMPORTS = {"torch", "transformers", "triton"} | set(sys.stdlib_module_names)


@pytest.mark.parametrize(
    "file", sorted(Path(hf_vrl.models.__file__).parent.glob("*/*_*.py")), ids=lambda path: path.name
)
def test_hub_facing_files_import_only_torch_transformers_and_their_siblings(file):
    """What `trust_remote_code` loads: no hf_vrl (not even inside a function), relative imports of sibling
    files only (transformers copies those along; `from .. import` it cannot)."""
    for node in ast.walk(ast.parse(file.read_text())):
        if isinstance(node, ast.Import):
            assert {alias.name.split(".")[0] for alias in node.names} <= HUB_IMPORTS, ast.unparse(node)
        elif isinstance(node, ast.ImportFrom) and node.level:
            assert node.level == 1 and (file.parent / f"{node.module}.py").is_file(), ast.unparse(node)
        elif isinstance(node, ast.ImportFrom):
            assert node.module.split(".")[0] in HUB_IMPORTS, ast.unparse(node)


# what each model's forward gives as the image embedding that get_image_features returns
IMAGE_EMBEDDING = {
    "diffclip": lambda output: output.vision_model_output.pooler_output,
    "dcr": lambda output: output.image_embeds,
    "dcr-siglip": lambda output: output.image_embeds,
    "clue-resnet": lambda output: output.features,
    "clue-vit": lambda output: output.features,
}


@pytest.mark.parametrize("name", sorted(IMAGE_EMBEDDING))
def test_get_image_features_is_one_contract(name):
    """As CLIPModel's in transformers 5: a BaseModelOutputWithPooling whose pooler_output is the embedding,
    the tower's hidden states (and attention maps) when asked, a tuple with return_dict=False."""
    case = CASES[name]
    model = case.build()
    pixels = {"pixel_values": case.inputs()["pixel_values"]}
    with torch.no_grad():
        output = model.get_image_features(**pixels)
        expected = IMAGE_EMBEDDING[name](model(**case.inputs()))
        hidden = model.get_image_features(**pixels, output_hidden_states=True).hidden_states
        as_tuple = model.get_image_features(**pixels, return_dict=False)
    assert isinstance(output, BaseModelOutputWithPooling) and output.hidden_states is None
    torch.testing.assert_close(output.pooler_output, expected, rtol=0, atol=0)
    assert isinstance(hidden, tuple) and len(hidden) > 1
    assert isinstance(as_tuple, tuple)
    _assert_same_outputs(as_tuple, output.to_tuple())


def test_clue_with_a_vit_returns_the_hidden_states_asked_for():
    """output_hidden_states=[0, 2] gives those layers, as ViTModel does (the others None), in one view or in
    several."""
    config = CLUEConfig(backbone_config={**TINY_VIT, "num_hidden_layers": 3}, num_parts=2, **TINY_HEADS)
    model = _seeded(lambda: CLUEModel(config))()
    x = _pixels()
    with torch.no_grad():
        every = model(**x, output_hidden_states=True).hidden_states
        chosen = model(**x, output_hidden_states=[0, 2]).hidden_states
        vit = model.backbone(**x, output_hidden_states=[0, 2]).hidden_states
        features = model.get_image_features(**x, output_hidden_states=[0, 2]).hidden_states
        views = model(pixel_values=torch.stack([x["pixel_values"]] * 2, dim=1), output_hidden_states=[2])
    assert [h is None for h in chosen] == [h is None for h in vit] == [False, True, False, True]
    for index in (0, 2):
        torch.testing.assert_close(chosen[index], every[index], rtol=0, atol=0)
        torch.testing.assert_close(features[index], every[index], rtol=0, atol=0)
    assert views.hidden_states[0] is None and views.hidden_states[2].shape[1] == 2


def test_clue_gradient_checkpointing_and_input_embeddings_are_its_backbones():
    vit, resnet = CASES["clue-vit"].build(), CASES["clue-resnet"].build()
    assert vit.supports_gradient_checkpointing and not resnet.supports_gradient_checkpointing
    # what transformers' common tests read (`model_class.supports_gradient_checkpointing`): False on the class
    # would skip CLUEModel's checkpointing tests, passing them untested
    assert CLUEModel.supports_gradient_checkpointing is True
    assert vit.get_input_embeddings() is vit.backbone.get_input_embeddings()
    assert resnet.get_input_embeddings() is resnet.backbone.embedder.embedder
    assert {*ViTModel._no_split_modules, *ResNetModel._no_split_modules} <= set(CLUEModel._no_split_modules)
    with pytest.raises(ValueError, match="does not support"):
        resnet.gradient_checkpointing_enable()
    gradients = []
    for checkpointing in (False, True):
        model = CASES["clue-vit"].build().train()
        if checkpointing:
            model.gradient_checkpointing_enable()
        model(**_pixels()).embeddings.square().sum().backward()
        gradients.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    assert gradients[0].keys() == gradients[1].keys() and gradients[0]
    for name, gradient in gradients[0].items():
        torch.testing.assert_close(gradients[1][name], gradient, msg=name)


@pytest.mark.parametrize("family", ["clue", "dcr", "diffclip"])
def test_every_model_and_config_class_is_exported_by_hf_vrl_models(family):
    """`from hf_vrl.models import DCRModel` works for each family's configurations and PreTrainedModels."""
    module = getattr(hf_vrl.models, family)
    public = {
        name
        for name in module.__all__
        if isinstance(getattr(module, name), type)
        and issubclass(getattr(module, name), PreTrainedModel | PretrainedConfig)
    }
    assert public and public <= set(hf_vrl.models.__all__)
    for name in public:
        assert getattr(hf_vrl.models, name) is getattr(module, name)
