"""DiffCLIP modeling: configs, λ, attention against the reference loop, eager == SDPA, CLIP compatibility."""

import math

import pytest
import torch
import transformers
from test_diffclip_reference import reference_differential_attention, text_batch, tiny_config_kwargs
from transformers import CLIPConfig, CLIPModel, CLIPTextConfig, CLIPTextModel
from transformers.modeling_outputs import BaseModelOutputWithPooling

from hf_vrl.models.diffclip import (
    DiffCLIPConfig,
    DiffCLIPModel,
    DiffCLIPTextConfig,
    DiffCLIPVisionConfig,
    DiffCLIPVisionModelWithProjection,
)
from hf_vrl.models.diffclip.modeling_diffclip import DiffCLIPAttention


def make_model(attn_implementation: str = "sdpa", seed: int = 0, **overrides) -> DiffCLIPModel:
    """A tiny DiffCLIP with λ away from λ_init and non-trivial RMSNorm weights, in eval mode."""
    torch.manual_seed(seed)
    config = DiffCLIPConfig(**tiny_config_kwargs(**overrides))
    model = DiffCLIPModel(config).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, DiffCLIPAttention) and module.differential:
                for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
                    getattr(module, name).normal_(0, 0.4)
                module.diff_norm.weight.uniform_(0.5, 1.5)
                module.q_proj.weight.mul_(3.0)  # peaked maps, so A1 and A2 differ
    model.set_attn_implementation(attn_implementation)
    return model


def attention_weights(attention: DiffCLIPAttention) -> dict[str, torch.Tensor]:
    return {name: tensor.detach() for name, tensor in attention.state_dict().items()}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"text_config": {"num_attention_heads": 3, "hidden_size": 33}}, "must be even"),
        ({"vision_config": {"num_attention_heads": 4, "hidden_size": 30}}, "multiple of num_attention_heads"),
        ({"vision_config": {"lambda_init_schedule": "cosine"}}, "Unknown lambda_init_schedule"),
        ({"text_config": {"lambda_init": 1.0}}, r"lambda_init must lie in \[0, 1\)"),
        ({"vision_config": {"image_size": 18}}, "multiple of patch_size"),
        ({"text_config": {"differential_attention": True}, "diff_attention_in_text": False}, "set only one"),
    ],
)
def test_refused_configs_say_what_to_change(kwargs, message):
    with pytest.raises(Exception, match=message):
        DiffCLIPConfig(**tiny_config_kwargs(**kwargs))


def test_top_level_values_reach_both_towers_and_contradictions_are_refused():
    # a tower's own projection_dim may differ (as in CLIPConfig): test_model_contract.py
    assert (
        DiffCLIPConfig(projection_dim=16, text_config=DiffCLIPTextConfig(projection_dim=8)).projection_dim
        == 16
    )
    with pytest.raises(ValueError, match="vision_config.lambda_init=0.5 contradicts"):
        DiffCLIPConfig(lambda_init=0.7, vision_config={"lambda_init": 0.5})
    text_config = {"hidden_size": 64}
    config = DiffCLIPConfig(projection_dim=24, lambda_init_schedule="depth", text_config=text_config)
    assert config.text_config.projection_dim == config.vision_config.projection_dim == 24
    assert config.text_config.lambda_init_schedule == config.vision_config.lambda_init_schedule == "depth"
    assert text_config == {"hidden_size": 64}  # the caller's dict is not modified
    assert DiffCLIPConfig.from_dict(config.to_dict()).vision_config.lambda_init_schedule == "depth"


def test_odd_head_count_is_fine_without_differential_attention():
    config = DiffCLIPConfig(
        **tiny_config_kwargs(text_config={"num_attention_heads": 1}, diff_attention_in_text=False)
    )
    assert config.text_config.num_attention_heads == 1 and not config.diff_attention_in_text


def test_lambda_init_schedules_and_lambda_formula():
    model = make_model(
        text_config={"lambda_init_schedule": "depth", "num_hidden_layers": 3},
        vision_config={"lambda_init": 0.5},
    )
    text_layers = model.text_model.encoder.layers
    # DiffCLIP*: 0.8 - 0.6 exp(-0.3 l) with 0-based l: 0.2 in the first layer.
    assert [layer.self_attn.lambda_init for layer in text_layers] == pytest.approx(
        [0.2, 0.8 - 0.6 * math.exp(-0.3), 0.8 - 0.6 * math.exp(-0.6)]
    )
    assert all(layer.self_attn.lambda_init == 0.5 for layer in model.vision_model.encoder.layers)
    attention = text_layers[1].self_attn
    w = attention_weights(attention)
    expected = (
        math.exp(float(w["lambda_q1"] @ w["lambda_k1"]))
        - math.exp(float(w["lambda_q2"] @ w["lambda_k2"]))
        + attention.lambda_init
    )
    assert attention.lambda_full().dtype == torch.float32
    assert attention.lambda_full().item() == pytest.approx(expected, rel=1e-5)


def test_lambda_vectors_are_initialised_from_lambda_std():
    torch.manual_seed(0)
    config = DiffCLIPVisionConfig(
        hidden_size=256, intermediate_size=32, num_attention_heads=2, num_hidden_layers=2, lambda_std=0.3
    )
    model = DiffCLIPVisionModelWithProjection(config)
    vectors = torch.cat([p.detach().flatten() for n, p in model.named_parameters() if "lambda_" in n])
    assert vectors.numel() == 2 * 4 * 128
    assert 0.25 < vectors.std().item() < 0.35 and abs(vectors.mean().item()) < 0.05
    norms = [p for n, p in model.named_parameters() if "diff_norm" in n]
    assert all(torch.equal(p, torch.ones_like(p)) for p in norms)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("masked", [False, True])
def test_attention_equals_reference_loop(implementation, masked):
    model = make_model(implementation)
    attention = model.text_model.encoder.layers[0].self_attn
    x = torch.randn(2, 6, 32)
    mask = torch.triu(torch.full((6, 6), -1e9), diagonal=1) if masked else torch.zeros(6, 6)
    with torch.no_grad():
        out, _ = attention(x, attention_mask=mask[None, None].expand(2, 1, 6, 6) if masked else None)
    weights = attention_weights(attention)
    for row in range(2):
        expected = reference_differential_attention(
            x[row], weights, num_heads=4, lambda_init=attention.lambda_init, mask=mask
        )
        torch.testing.assert_close(out[row], expected, atol=1e-5, rtol=1e-4)


def test_eager_equals_sdpa_outputs_and_gradients():
    """Outputs element by element; each parameter's gradient as a tensor, by the relative error of its norm:
    float32 summation orders differ between the paths, and elements that are zero in exact arithmetic (the
    key biases', which softmax cancels) are rounding noise that an element-wise tolerance trips on for some
    inputs. Measured over 40 input draws: at most 1.2e-4, against a bound of 1e-3."""
    input_ids, attention_mask = text_batch()
    pixel_values = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    results = {}
    for implementation in ("eager", "sdpa"):
        model = make_model(implementation)
        out = model(
            input_ids=input_ids, attention_mask=attention_mask, pixel_values=pixel_values, return_loss=True
        )
        out.loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results[implementation] = (out, grads)
    (eager, eager_grads), (sdpa, sdpa_grads) = results["eager"], results["sdpa"]
    torch.testing.assert_close(eager.logits_per_image, sdpa.logits_per_image, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(eager.text_embeds, sdpa.text_embeds, atol=1e-6, rtol=1e-5)
    assert eager_grads.keys() == sdpa_grads.keys()
    assert any("lambda_q2" in name for name in eager_grads)
    for name, grad in eager_grads.items():
        error = (grad - sdpa_grads[name]).norm().item()
        assert error <= 1e-3 * grad.norm().item() + 1e-5, (name, error, grad.norm().item())


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_padding_after_eos_leaves_text_embedding_unchanged(implementation):
    model = make_model(implementation)
    input_ids, attention_mask = text_batch()
    with torch.no_grad():
        padded = model.get_text_features(input_ids=input_ids, attention_mask=attention_mask).pooler_output
        alone = model.get_text_features(input_ids=input_ids[2:, :5]).pooler_output
    torch.testing.assert_close(padded[2:], alone, atol=1e-5, rtol=1e-5)


def test_a_text_without_eos_is_pooled_at_its_first_token_as_clip_does(caplog):
    """CLIPTextTransformer pools at argmax(ids == eos), position 0 where there is none; DiffCLIP does the same
    (so a converted CLIP keeps its numbers) and says so once."""
    model = make_model("sdpa")
    input_ids, _ = text_batch()
    cut = input_ids[2:, :4]  # its EOS cut off
    transformers.utils.logging.warning_once.cache_clear()  # said once per process: an earlier test may have
    with torch.no_grad(), caplog.at_level("WARNING"):
        out = model.text_model(input_ids=cut)
    torch.testing.assert_close(out.pooler_output, out.last_hidden_state[:, 0], rtol=0, atol=0)
    assert "no EOS token (id 3)" in caplog.text


def test_output_attentions_are_the_differential_maps():
    model = make_model("eager")
    pixel_values = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        out = model.vision_model(pixel_values=pixel_values, output_attentions=True, output_hidden_states=True)
    assert len(out.attentions) == 2 and out.attentions[0].shape == (2, 2, 17, 17)
    attention = model.vision_model.encoder.layers[0].self_attn
    lam = attention.lambda_full().item()
    torch.testing.assert_close(
        out.attentions[0].sum(-1), torch.full((2, 2, 17), 1.0 - lam), atol=1e-5, rtol=1e-5
    )
    x = model.vision_model.encoder.layers[0].layer_norm1(out.hidden_states[0])[0]
    w = attention_weights(attention)
    q, k = x @ w["q_proj.weight"].T + w["q_proj.bias"], x @ w["k_proj.weight"].T + w["k_proj.bias"]
    for m in range(2):
        a1, a2 = (
            torch.softmax(q[:, h * 8 : h * 8 + 8] @ k[:, h * 8 : h * 8 + 8].T / math.sqrt(8), -1)
            for h in (2 * m, 2 * m + 1)
        )
        torch.testing.assert_close(out.attentions[0][0, m], a1 - lam * a2, atol=1e-5, rtol=1e-4)


def test_diffclip_dagger_text_tower_is_plain_clip():
    model = make_model(diff_attention_in_text=False)
    assert not any("lambda" in name or "diff_norm" in name for name, _ in model.text_model.named_parameters())
    assert model.vision_model.encoder.layers[0].self_attn.differential
    clip_text = CLIPTextModel(CLIPTextConfig(**tiny_config_kwargs()["text_config"])).eval()
    clip_text.load_state_dict(model.text_model.state_dict(), strict=True)
    input_ids, attention_mask = text_batch()
    with torch.no_grad():
        ours = model.text_model(input_ids=input_ids, attention_mask=attention_mask)
        theirs = clip_text(input_ids=input_ids, attention_mask=attention_mask)
    torch.testing.assert_close(ours.last_hidden_state, theirs.last_hidden_state, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ours.pooler_output, theirs.pooler_output, atol=1e-6, rtol=1e-5)


def test_clip_checkpoint_loads_with_only_differential_leaves_missing(tmp_path):
    kwargs = tiny_config_kwargs()
    clip = CLIPModel(CLIPConfig(**kwargs))
    clip.save_pretrained(tmp_path)
    model, info = DiffCLIPModel.from_pretrained(
        tmp_path, config=DiffCLIPConfig(**kwargs), output_loading_info=True, dtype=torch.float32
    )
    expected_missing = {
        f"{tower}.encoder.layers.{i}.self_attn.{leaf}"
        for tower in ("text_model", "vision_model")
        for i in range(2)
        for leaf in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2", "diff_norm.weight")
    }
    assert set(info["missing_keys"]) == expected_missing
    assert not info["unexpected_keys"] and not info["mismatched_keys"]
    attention = model.vision_model.encoder.layers[1].self_attn
    torch.testing.assert_close(
        attention.q_proj.weight, clip.vision_model.encoder.layers[1].self_attn.q_proj.weight
    )
    lambdas = torch.cat([attention.lambda_q1, attention.lambda_k2]).detach()
    assert torch.isfinite(lambdas).all() and 0 < lambdas.abs().max() < 1.0  # N(0, 0.1), not meta garbage
    assert torch.equal(attention.diff_norm.weight, torch.ones(16))


def test_gradient_checkpointing_matches_plain_backward():
    input_ids, attention_mask = text_batch()
    pixel_values = torch.randn(3, 3, 16, 16)
    grads = []
    for checkpointing in (False, True):
        model = make_model("sdpa")
        model.train()
        if checkpointing:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            assert all(layer.gradient_checkpointing for layer in model.vision_model.encoder.layers)
        out = model(
            input_ids=input_ids, attention_mask=attention_mask, pixel_values=pixel_values, return_loss=True
        )
        out.loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, atol=1e-6, rtol=1e-5, msg=name)
    assert grads[1]["vision_model.encoder.layers.0.self_attn.lambda_k1"].abs().sum() > 0


def test_bfloat16_forward_is_close_to_float32():
    model = make_model("sdpa")
    pixel_values = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        reference = model.get_image_features(pixel_values=pixel_values).pooler_output
        low = model.to(torch.bfloat16).get_image_features(pixel_values=pixel_values.bfloat16()).pooler_output
    assert low.dtype == torch.bfloat16
    assert torch.nn.functional.cosine_similarity(low.float(), reference, dim=-1).min() > 0.99


def test_outputs_follow_clip_conventions():
    model = make_model("sdpa")
    input_ids, attention_mask = text_batch()
    pixel_values = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        image = model.get_image_features(pixel_values=pixel_values)
        text = model.get_text_features(input_ids=input_ids, attention_mask=attention_mask)
        out = model(
            input_ids=input_ids, attention_mask=attention_mask, pixel_values=pixel_values, return_loss=True
        )
        as_tuple = model(
            input_ids=input_ids, attention_mask=attention_mask, pixel_values=pixel_values, return_dict=False
        )
    assert isinstance(image, BaseModelOutputWithPooling) and image.pooler_output.shape == (3, 16)
    normalise = torch.nn.functional.normalize
    torch.testing.assert_close(out.image_embeds, normalise(image.pooler_output, dim=-1))
    logits = (
        model.logit_scale.exp()
        * normalise(image.pooler_output, dim=-1)
        @ normalise(text.pooler_output, dim=-1).T
    )
    torch.testing.assert_close(out.logits_per_image, logits)
    torch.testing.assert_close(out.logits_per_text, logits.T)
    labels = torch.arange(3)
    ce = torch.nn.functional.cross_entropy
    torch.testing.assert_close(out.loss, (ce(logits, labels) + ce(logits.T, labels)) / 2)
    torch.testing.assert_close(as_tuple[0], out.logits_per_image)
    with pytest.raises(ValueError, match="as many texts as images"):
        model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            pixel_values=pixel_values[:2],
            return_loss=True,
        )

    vision = DiffCLIPVisionModelWithProjection(model.config.vision_config).eval()
    vision.vision_model.load_state_dict(model.vision_model.state_dict())
    vision.visual_projection.load_state_dict(model.visual_projection.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(vision(pixel_values=pixel_values).image_embeds, image.pooler_output)


def test_configs_compare_by_value_and_round_trip():
    small = DiffCLIPTextConfig(hidden_size=32, num_attention_heads=4)
    assert small != DiffCLIPTextConfig(hidden_size=64, num_attention_heads=4)
    assert small == DiffCLIPTextConfig.from_dict(small.to_dict())
    config = DiffCLIPConfig(**tiny_config_kwargs(initializer_style="release"))
    assert config == DiffCLIPConfig.from_dict(config.to_dict())
    assert config != DiffCLIPConfig(**tiny_config_kwargs())
    assert config.text_config.initializer_style == config.vision_config.initializer_style == "release"


def test_release_initialisation_follows_the_released_rules():
    """initializer_style="release": the released DiffCLIP's rule per parameter group (diff_clip.py's
    `initialize_parameters` for the text tower; timm's ViT embeddings and PyTorch's layer defaults for the
    vision tower)."""
    torch.manual_seed(0)
    tower = {"hidden_size": 256, "intermediate_size": 1024, "num_attention_heads": 4}
    config = DiffCLIPConfig(
        initializer_style="release",
        projection_dim=64,
        text_config={**tower, "num_hidden_layers": 8, "vocab_size": 1000, "max_position_embeddings": 77},
        vision_config={**tower, "num_hidden_layers": 2, "image_size": 64, "patch_size": 8},
    )
    model = DiffCLIPModel(config)
    params = dict(model.named_parameters())

    def group(tower_name: str, suffix: str) -> torch.Tensor:
        return torch.cat(
            [
                p.detach().flatten()
                for n, p in params.items()
                if n.startswith(tower_name) and n.endswith(suffix)
            ]
        )

    def assert_normal(values: torch.Tensor, std: float) -> None:
        assert abs(values.mean().item()) < 0.05 * std + 3 * std / values.numel() ** 0.5
        assert values.std().item() == pytest.approx(std, rel=0.05)

    def assert_uniform(values: torch.Tensor, bound: float) -> None:
        assert values.abs().max().item() <= bound
        assert values.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.1)

    width, layers = 256, 8
    attn_std, proj_std, fc_std = width**-0.5, width**-0.5 * (2 * layers) ** -0.5, (2 * width) ** -0.5
    assert_normal(group("text_model.embeddings.token", "weight"), 0.02)
    assert_normal(group("text_model.embeddings.position", "weight"), 0.01)
    for name in ("q_proj.weight", "k_proj.weight", "v_proj.weight"):
        assert_normal(group("text_model", name), attn_std)
    assert_normal(group("text_model", "out_proj.weight"), proj_std)
    assert_normal(group("text_model", "fc1.weight"), fc_std)
    assert_normal(group("text_model", "fc2.weight"), proj_std)
    for name in ("q_proj.bias", "k_proj.bias", "v_proj.bias", "out_proj.bias", "fc1.bias"):
        assert_uniform(group("text_model", name), width**-0.5)  # PyTorch's default, fan_in = width
    assert_uniform(group("text_model", "fc2.bias"), 1024**-0.5)

    class_token = params["vision_model.embeddings.class_embedding"].detach()
    assert class_token.abs().max().item() < 1e-5 and class_token.abs().max().item() > 0
    assert_normal(group("vision_model.embeddings.position", "weight"), 0.02)
    assert_uniform(group("vision_model.embeddings.patch", "weight"), (3 * 8 * 8) ** -0.5)
    for name in ("q_proj", "k_proj", "v_proj", "out_proj", "fc1"):
        assert_uniform(group("vision_model", f"{name}.weight"), width**-0.5)
        assert_uniform(group("vision_model", f"{name}.bias"), width**-0.5)
    assert_uniform(group("vision_model", "fc2.weight"), 1024**-0.5)

    assert_normal(group("", "lambda_q1"), 0.1)
    assert all(
        params[n].eq(1).all() for n in params if n.endswith(("diff_norm.weight", "layer_norm1.weight"))
    )
    assert all(params[n].eq(0).all() for n in params if n.endswith("layer_norm2.bias"))
    assert_normal(params["visual_projection.weight"].detach().flatten(), width**-0.5)
    assert_normal(params["text_projection.weight"].detach().flatten(), width**-0.5)


def test_clip_initialisation_reaches_layers_of_parameterless_modules():
    """CLIP's rule for the MLP and a plain (DiffCLIP†) attention, modules that own no parameter themselves."""
    torch.manual_seed(0)
    tower = {"hidden_size": 256, "intermediate_size": 1024, "num_attention_heads": 4, "num_hidden_layers": 8}
    config = DiffCLIPConfig(
        text_config={**tower, "differential_attention": False, "vocab_size": 100},
        vision_config={**tower, "image_size": 32, "patch_size": 8},
    )
    model = DiffCLIPModel(config)
    for tower_model in (model.text_model, model.vision_model):
        layers = tower_model.encoder.layers
        fc1 = torch.cat([layer.mlp.fc1.weight.detach().flatten() for layer in layers])
        q_proj = torch.cat([layer.self_attn.q_proj.weight.detach().flatten() for layer in layers])
        assert fc1.std().item() == pytest.approx(512**-0.5, rel=0.05)
        assert q_proj.std().item() == pytest.approx(256**-0.5 * 16**-0.5, rel=0.05)
