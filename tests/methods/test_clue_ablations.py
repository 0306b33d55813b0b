"""Every ablation of Eq. 8 trains exactly what its terms read: no trainable parameter is left without a
gradient (DDP with find_unused_parameters=False, as the runs use it, fails on one). A term switched off
leaves its module out (beta = 0: no part extractor; gamma = 0: no text head) or frozen (alpha = 0: projector
and predictor). The runs themselves on two processes are in tests/run/test_run_ablations.py."""

from __future__ import annotations

import pytest
import torch
from clue_helpers import TINY_RESNET, TINY_VIT, tiny_settings

from hf_vrl.methods.clue.loss import clue_objective
from hf_vrl.methods.clue.model import build_model

TEXT_DIM = 5
# (alpha, beta, gamma): every combination with a term left; (0, 0, 1) is CLUE Table 2 #2, the text-only row
WEIGHTS = [(a, b, g) for a in (0.0, 1.0) for b in (0.0, 1.0) for g in (0.0, 1.0) if a or b or g]


def _step(model, settings) -> torch.Tensor:
    """One training forward of both branches and Eq. 8's backward (as CLUETrainer computes it)."""
    gen = torch.Generator().manual_seed(0)
    views = torch.randn(4, 2, 3, settings.image_size, settings.image_size, generator=gen)
    text = torch.randn(4, TEXT_DIM, generator=gen) if settings.uses_text else None
    model.train()
    online = model(pixel_values=views)
    with torch.no_grad():
        momentum = model(pixel_values=views, momentum=True)
    losses = clue_objective(
        {k: v for k, v in online.items() if v is not None},
        {k: v for k, v in momentum.items() if v is not None},
        text_embeds=text,
        alpha=settings.alpha,
        beta=settings.beta,
        gamma=settings.gamma,
        targets=settings.targets,
    )
    losses["loss"].backward()
    return losses["loss"]


def _without_gradient(model) -> list[str]:
    return [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None]


@pytest.mark.parametrize("targets", ["sinkhorn", "identity"])
@pytest.mark.parametrize("weights", WEIGHTS, ids=lambda w: "a{:g}b{:g}g{:g}".format(*w))
@pytest.mark.parametrize("backbone", [TINY_RESNET, TINY_VIT], ids=["resnet", "vit"])
def test_every_trainable_parameter_gets_a_gradient(backbone, weights, targets):
    alpha, beta, gamma = weights
    settings = tiny_settings(
        backbone_config=dict(backbone), alpha=alpha, beta=beta, gamma=gamma, targets=targets
    )
    torch.manual_seed(0)
    model = build_model(settings, text_embed_dim=TEXT_DIM if settings.uses_text else None)
    assert torch.isfinite(_step(model, settings))
    assert _without_gradient(model) == []
    assert (model.part_extractor is not None) == (beta > 0)  # no part extractor for an unused term
    assert (model.text_projector is not None) == (gamma > 0)
    heads = [*model.projector.parameters(), *model.predictor.parameters()]
    assert all(p.requires_grad == (alpha > 0) for p in heads)  # frozen: the global term is their only reader
    assert all(p.requires_grad for p in model.backbone.parameters())
    assert not any(p.requires_grad for _, m in model.momentum_pairs() for p in m.parameters())


def test_a_loaded_clue_model_freezes_the_heads_a_run_leaves_unused(tmp_path):
    """A saved CLUE model with parts and a text head, continued with the InfoNCE baseline (Table 2 #1)."""
    torch.manual_seed(0)
    build_model(tiny_settings(), text_embed_dim=TEXT_DIM).save_pretrained(tmp_path)
    settings = tiny_settings(
        backbone=str(tmp_path), backbone_config=None, targets="identity", beta=0.0, gamma=0.0
    )
    model = build_model(settings)  # no text encoder with gamma = 0: its text head stays, frozen
    assert model.part_extractor is not None and model.text_projector is not None
    _step(model, settings)
    assert _without_gradient(model) == []
    assert not any(
        p.requires_grad for p in [*model.part_extractor.parameters(), *model.text_projector.parameters()]
    )
