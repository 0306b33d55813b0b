"""CLUEConfig / CLUEModel: the VLAD part descriptor against its formula, the part extractor, the momentum
branch (copy, freeze, EMA update), views and BatchNorm, ResNet and ViT backbones, save/load."""

from __future__ import annotations

import pytest
import torch
from clue_helpers import TINY_HEADS as HEADS
from clue_helpers import TINY_RESNET, TINY_VIT
from transformers import ResNetModel

from hf_vrl.models.clue import CLUEConfig, CLUEModel, vlad


def tiny(backbone: dict = TINY_RESNET, seed: int = 0, **overrides) -> CLUEModel:
    torch.manual_seed(seed)
    return CLUEModel(CLUEConfig(backbone_config=dict(backbone), **(HEADS | overrides)))


def test_vlad_matches_a_loop_over_its_formula():
    gen = torch.Generator().manual_seed(0)
    f, c = torch.randn(2, 5, 3, generator=gen), torch.randn(4, 3, generator=gen)
    alpha = torch.randn(2, 5, 4, generator=gen).softmax(-1)
    expected = torch.zeros(2, 4, 3)
    for b in range(2):
        for k in range(4):
            for u in range(5):
                expected[b, k] += alpha[b, u, k] * (f[b, u] - c[k])
    torch.testing.assert_close(vlad(f, alpha, c), expected)


def test_vlad_hand_checked():
    # hard assignment: locations 0, 1 -> part 0, location 2 -> part 1
    # p_0 = (f0 - c0) + (f1 - c0), p_1 = f2 - c1
    f = torch.tensor([[[1.0, 0.0], [0.0, 2.0], [3.0, 3.0]]])
    alpha = torch.tensor([[[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]])
    c = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    torch.testing.assert_close(vlad(f, alpha, c), torch.tensor([[[-1.0, 0.0], [3.0, 2.0]]]))


def test_part_extractor_assigns_softly_over_parts():
    model = tiny(num_parts=3)
    descriptors = torch.randn(2, 7, model.config.feature_dim)
    parts, alpha = model.part_extractor(descriptors)
    assert parts.shape == (2, 3, 16) and alpha.shape == (2, 7, 3)
    torch.testing.assert_close(alpha.sum(-1), torch.ones(2, 7))
    unit = torch.nn.functional.normalize(descriptors, dim=-1)  # NetVLAD normalises the descriptors first
    expected = vlad(unit, model.part_extractor.assignment(unit).softmax(-1), model.part_extractor.centroids)
    torch.testing.assert_close(parts, expected)
    intra = tiny(num_parts=3, part_intra_normalization=True)
    torch.testing.assert_close(intra.part_extractor(descriptors)[0].norm(dim=-1), torch.ones(2, 3))
    assert tiny(num_parts=0).part_extractor is None


def _state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in module.state_dict().items()}


def test_momentum_branch_starts_as_a_frozen_copy():
    model = tiny()
    for online, momentum in model.momentum_pairs():
        for (name, a), b in zip(online.state_dict().items(), momentum.state_dict().values()):
            assert torch.equal(a, b), name
        assert not any(p.requires_grad for p in momentum.parameters())
        assert all(p.requires_grad for p in online.parameters())
    assert len(model.momentum_pairs()) == 3


def test_update_momentum_matches_the_ema_formula():
    model = tiny()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param))  # online and momentum now differ
    before = [(_state(o), _state(m)) for o, m in model.momentum_pairs()]
    model.update_momentum(0.9)
    for (online, momentum), (online_before, momentum_before) in zip(model.momentum_pairs(), before):
        params = {name for name, _ in momentum.named_parameters()}
        for name, value in momentum.state_dict().items():
            if name in params:  # theta_m <- m theta_m + (1 - m) theta
                expected = momentum_before[name] * 0.9 + online_before[name] * (1 - 0.9)
                torch.testing.assert_close(value, expected, rtol=1e-6, atol=1e-7, msg=name)
            else:  # BatchNorm statistics are not averaged (ReSA)
                assert torch.equal(value, momentum_before[name]), name
        assert all(torch.equal(v, online_before[k]) for k, v in online.state_dict().items())
    model.update_momentum(0.0)
    for online, momentum in model.momentum_pairs():
        for a, b in zip(online.parameters(), momentum.parameters()):
            assert torch.equal(a, b)
    with pytest.raises(ValueError, match="momentum"):
        model.update_momentum(1.5)


@pytest.mark.parametrize("backbone, size, grid", [(TINY_RESNET, 32, (4, 4)), (TINY_VIT, 16, (4, 4))])
def test_forward_shapes_and_views(backbone, size, grid):
    model = tiny(backbone, text_embed_dim=12).train()
    views = torch.randn(4, 2, 3, size, size)
    out = model(views, output_part_assignments=True)
    assert out.features.shape == (4, 2, 16) and out.embeddings.shape == (4, 2, 8)
    assert out.part_descriptors.shape == (4, 2, 3, 16) and out.text_embeds.shape == (4, 2, 12)
    assert out.part_assignments.shape == (4, 2, 3, *grid)
    torch.testing.assert_close(out.part_assignments.sum(2), torch.ones(4, 2, *grid))
    # views run one at a time: the same as calling the model on each view (BatchNorm sees one view)
    torch.testing.assert_close(out.embeddings[:, 1], model(views[:, 1]).embeddings)
    momentum = model(views, momentum=True)
    assert momentum.text_embeds is None and momentum.embeddings.shape == (4, 2, 8)
    torch.testing.assert_close(model.get_image_features(views[:, 0]).pooler_output, out.features[:, 0])


def test_views_keep_their_own_batchnorm_statistics():
    model = tiny().train()
    views = torch.randn(4, 2, 3, 32, 32)
    views[:, 1] = views[:, 1] * 3 + 1  # a very different second view
    per_view = model(views).embeddings[:, 0]
    pooled = model(torch.cat([views[:, 0], views[:, 1]])).embeddings[:4]  # one batch of both views
    assert not torch.allclose(per_view, pooled, atol=1e-3)


def test_resnet_feature_is_the_pooled_last_map():
    model = tiny().eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = model.backbone(pixel_values=x).pooler_output.flatten(1)
        torch.testing.assert_close(model.get_image_features(x).pooler_output, expected)
    assert isinstance(model.backbone, ResNetModel)


def test_save_and_load_round_trip(tmp_path):
    model = tiny(text_embed_dim=12).eval()
    model.update_momentum(0.5)  # (a no-op on equal weights; the checkpoint still carries both branches)
    model.save_pretrained(tmp_path)
    loaded = CLUEModel.from_pretrained(tmp_path).eval()
    assert loaded.config.backbone_config.model_type == "resnet" and loaded.config.text_embed_dim == 12
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    assert not any(p.requires_grad for _, m in loaded.momentum_pairs() for p in m.parameters())
    x = torch.randn(3, 2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x).embeddings, model(x).embeddings)
    config = CLUEConfig.from_pretrained(tmp_path)
    assert config.to_dict()["backbone_config"]["hidden_sizes"] == [8, 16]


def test_config_rejects_what_it_cannot_build():
    with pytest.raises(ValueError, match="model_type"):
        CLUEConfig(backbone_config={"model_type": "clip_vision_model"})
    with pytest.raises(ValueError, match="num_parts"):
        CLUEConfig(num_parts=-1)
    with pytest.raises(ValueError, match="projector_num_layers"):
        CLUEConfig(projector_num_layers=0)
    assert CLUEConfig().backbone_config.hidden_sizes[-1] == 2048  # ResNet-50 by default


def test_runs_on_the_device(device):
    model = tiny(text_embed_dim=12).to(device)
    out = model(torch.randn(2, 2, 3, 32, 32, device=device))
    assert out.embeddings.device.type == device.type
    model.update_momentum(0.99)
