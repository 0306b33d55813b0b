"""DiVE's objectives against plainly written loops over the paper's formulas (Eq. 4-8, 10-12), hand-checkable
cases, the moving average over several steps, gradients, and SigLIP's sigmoid loss."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import SiglipConfig, SiglipModel

from hf_vrl import losses
from hf_vrl.methods.dive.loss import (
    average_vector_loss,
    difference_vectors,
    dive_losses,
    pairwise_vector_loss,
    snd_loss,
    update_average_vector,
)
from hf_vrl.methods.dive.sigmoid_loss import sigmoid_contrastive_loss

# ---------------------------------------------------------------------------------------------------------
# Plain references: Python loops over samples and dimensions, exactly as Eq. 4-8 and 10-12 are written.


def _unit(vector: list[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector]


def reference_dive(img_ft, img_pre, txt_ft, txt_pre, m_prev, alpha):
    """(AVL, PVL, m) of one batch, Eq. 4-8, with lists of floats."""
    batch, dim = len(img_ft), len(img_ft[0])
    u = [[a - b for a, b in zip(_unit(img_ft[j]), _unit(img_pre[j]))] for j in range(batch)]
    v = [[a - b for a, b in zip(_unit(txt_ft[j]), _unit(txt_pre[j]))] for j in range(batch)]
    m = [
        alpha * m_prev[d] + (1 - alpha) / batch * sum((u[j][d] + v[j][d]) / 2 for j in range(batch))
        for d in range(dim)
    ]
    avl = 0.0
    pvl = 0.0
    for j in range(batch):
        avl += sum((u[j][d] - m[d]) ** 2 for d in range(dim)) + sum((v[j][d] - m[d]) ** 2 for d in range(dim))
        pvl += sum((u[j][d] - v[j][d]) ** 2 for d in range(dim))
    return avl / batch, pvl / batch, m


def reference_cosine_as_written(img_ft, img_pre, txt_ft, txt_pre, m_prev, alpha):
    """Table 7 literally: u = f_ft . f_pre, v = g_ft . g_pre (scalars) in Eq. 6-8."""
    batch = len(img_ft)
    dot = lambda a, b: sum(x * y for x, y in zip(_unit(a), _unit(b)))  # noqa: E731
    u = [dot(img_ft[j], img_pre[j]) for j in range(batch)]
    v = [dot(txt_ft[j], txt_pre[j]) for j in range(batch)]
    m = alpha * m_prev + (1 - alpha) / batch * sum((u[j] + v[j]) / 2 for j in range(batch))
    avl = sum((u[j] - m) ** 2 + (v[j] - m) ** 2 for j in range(batch)) / batch
    pvl = sum((u[j] - v[j]) ** 2 for j in range(batch)) / batch
    return avl, pvl, m


def reference_snd(img_ft, img_pre):
    """Eq. 12."""
    total = 0.0
    for a, b in zip(img_ft, img_pre):
        total += sum((x - y) ** 2 for x, y in zip(_unit(a), _unit(b)))
    return total / len(img_ft)


def reference_sigmoid(img, txt, scale, bias):
    """SigLIP, Zhai et al. 2023, Eq. 1: -1/B sum_i sum_j log sigmoid(z_ij (t x_i.y_j + b))."""
    total = 0.0
    for i, x in enumerate(img):
        for j, y in enumerate(txt):
            z = 1.0 if i == j else -1.0
            logit = scale * sum(a * b for a, b in zip(_unit(x), _unit(y))) + bias
            total += -math.log(1.0 / (1.0 + math.exp(-z * logit)))
    return total / len(img)


def batch_of(seed: int, batch: int, dim: int = 5, dtype=torch.float64) -> list[torch.Tensor]:
    """Four [B, D] embeddings: fine-tuned = pre-trained + a small shift, as during fine-tuning."""
    gen = torch.Generator().manual_seed(seed)
    img_pre, txt_pre = (torch.randn(batch, dim, generator=gen, dtype=dtype) for _ in range(2))
    img_ft = img_pre + 0.3 * torch.randn(batch, dim, generator=gen, dtype=dtype)
    txt_ft = txt_pre + 0.3 * torch.randn(batch, dim, generator=gen, dtype=dtype)
    return [img_ft, img_pre, txt_ft, txt_pre]


# ---------------------------------------------------------------------------------------------------------


def test_hand_checkable_two_by_two():
    """u_1 = (-1, 1), u_2 = v_1 = v_2 = 0, alpha = 0.5, m_p = 0: m = (-1/8, 1/8), AVL = 13/16, PVL = 1."""
    img_pre = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    img_ft = torch.tensor([[0.0, 1.0], [0.0, 1.0]])
    txt = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    avl, pvl, m = dive_losses(img_ft, img_pre, txt, txt, torch.zeros(2), alpha=0.5)
    torch.testing.assert_close(m, torch.tensor([-0.125, 0.125]))
    torch.testing.assert_close(avl, torch.tensor(13 / 16))
    torch.testing.assert_close(pvl, torch.tensor(1.0))


def test_identical_models_give_zero_losses_and_keep_m():
    img, _, txt, _ = batch_of(0, 4, dtype=torch.float32)
    m = torch.full((5,), 0.2)
    avl, pvl, new_m = dive_losses(img, img, txt, txt, m, alpha=0.9)
    assert pvl.item() == 0.0
    torch.testing.assert_close(new_m, 0.9 * m)  # the batch term is zero
    torch.testing.assert_close(avl, 2 * (0.9 * m).pow(2).sum())


@pytest.mark.parametrize("alpha", [0.0, 0.5, 0.99])
def test_matches_reference_over_several_steps(alpha):
    """The moving average carried over four batches of different sizes (B' may change)."""
    m = torch.zeros(5, dtype=torch.float64)
    m_ref = [0.0] * 5
    for step, batch in enumerate([4, 3, 6, 2]):
        tensors = batch_of(step, batch)
        avl, pvl, m = dive_losses(*tensors, m, alpha=alpha)
        want_avl, want_pvl, m_ref = reference_dive(*(t.tolist() for t in tensors), m_ref, alpha)
        torch.testing.assert_close(m, torch.tensor(m_ref, dtype=torch.float64))
        torch.testing.assert_close(avl.item(), want_avl)
        torch.testing.assert_close(pvl.item(), want_pvl)


def test_alpha_zero_is_the_batch_mean():
    tensors = batch_of(1, 4)
    _, _, m = dive_losses(*tensors, torch.full((5,), 3.0, dtype=torch.float64), alpha=0.0)
    u = difference_vectors(tensors[0], tensors[1])
    v = difference_vectors(tensors[2], tensors[3])
    torch.testing.assert_close(m, ((u + v) / 2).mean(0).to(m))


def test_embeddings_are_l2_normalised_inside():
    tensors = batch_of(2, 3)
    scaled = [t * s for t, s in zip(tensors, (2.0, 0.5, 7.0, 3.0))]
    for a, b in zip(dive_losses(*tensors, torch.zeros(5)), dive_losses(*scaled, torch.zeros(5))):
        torch.testing.assert_close(a, b)


def test_gradients_reach_only_the_finetuned_embeddings_and_never_m():
    img_ft, img_pre, txt_ft, txt_pre = (t.requires_grad_() for t in batch_of(3, 4))
    m_prev = torch.randn(5, dtype=torch.float64, requires_grad=True)
    avl, pvl, m = dive_losses(img_ft, img_pre, txt_ft, txt_pre, m_prev, alpha=0.5)
    assert not m.requires_grad
    (avl + pvl).backward()
    assert img_pre.grad is None and txt_pre.grad is None and m_prev.grad is None
    # the autograd gradient is that of Eq. 7 + 8 with m a constant (not the derivative through Eq. 6)
    ft = [t.detach().clone().requires_grad_() for t in (img_ft, txt_ft)]
    u = torch.nn.functional.normalize(ft[0], dim=-1) - torch.nn.functional.normalize(img_pre.detach(), dim=-1)
    v = torch.nn.functional.normalize(ft[1], dim=-1) - torch.nn.functional.normalize(txt_pre.detach(), dim=-1)
    constant_m = m.detach()
    expected = ((u - constant_m).pow(2).sum(1) + (v - constant_m).pow(2).sum(1)).mean() + (u - v).pow(2).sum(
        1
    ).mean()
    expected.backward()
    torch.testing.assert_close(img_ft.grad, ft[0].grad)
    torch.testing.assert_close(txt_ft.grad, ft[1].grad)


def test_pieces_compose_to_dive_losses():
    tensors = batch_of(4, 3)
    u, v = difference_vectors(tensors[0], tensors[1]), difference_vectors(tensors[2], tensors[3])
    m = update_average_vector(torch.ones(5), u, v, 0.7)
    avl, pvl, new_m = dive_losses(*tensors, torch.ones(5), alpha=0.7)
    torch.testing.assert_close(new_m, m)
    torch.testing.assert_close(avl, average_vector_loss(u, v, m))
    torch.testing.assert_close(pvl, pairwise_vector_loss(u, v))


def test_cosine_variant_is_table7_with_m_started_at_one():
    """1 - cos with m from zero == Eq. 6-8 on u = f_ft . f_pre with m from 1 (and m_ours = 1 - m_paper)."""
    m = torch.zeros(1, dtype=torch.float64)
    m_paper = 1.0
    for step, batch in enumerate([4, 2, 5]):
        tensors = batch_of(10 + step, batch)
        avl, pvl, m = dive_losses(*tensors, m, alpha=0.9, difference="cosine")
        want_avl, want_pvl, m_paper = reference_cosine_as_written(
            *(t.tolist() for t in tensors), m_paper, 0.9
        )
        torch.testing.assert_close(avl.item(), want_avl)
        torch.testing.assert_close(pvl.item(), want_pvl)
        torch.testing.assert_close(m.item(), 1.0 - m_paper)


def test_cosine_hand_case():
    """cos(img) = 0 and cos(txt) = 1: u = 1, v = 0; alpha = 0: m = 1/2, AVL = 1/4 + 1/4, PVL = 1."""
    img_ft, img_pre = torch.tensor([[0.0, 1.0]]), torch.tensor([[1.0, 0.0]])
    txt = torch.tensor([[1.0, 0.0]])
    avl, pvl, m = dive_losses(img_ft, img_pre, txt, txt, torch.zeros(1), alpha=0.0, difference="cosine")
    torch.testing.assert_close(m, torch.tensor([0.5]))
    torch.testing.assert_close(avl, torch.tensor(0.5))
    torch.testing.assert_close(pvl, torch.tensor(1.0))


def test_snd_matches_reference_and_hand_case():
    img_ft, img_pre, _, _ = batch_of(5, 4)
    torch.testing.assert_close(
        snd_loss(img_ft, img_pre).item(), reference_snd(img_ft.tolist(), img_pre.tolist())
    )
    # orthogonal unit vectors are sqrt(2) apart: ||.||^2 = 2; identical ones 0; mean 1
    hand = snd_loss(torch.tensor([[0.0, 1.0], [1.0, 0.0]]), torch.tensor([[1.0, 0.0], [1.0, 0.0]]))
    torch.testing.assert_close(hand, torch.tensor(1.0))
    img_ft.requires_grad_(), img_pre.requires_grad_()
    snd_loss(img_ft, img_pre).backward()
    assert img_pre.grad is None and img_ft.grad is not None


def test_shape_and_value_errors():
    tensors = batch_of(6, 3)
    with pytest.raises(ValueError, match="avg_vector must have shape"):
        dive_losses(*tensors, torch.zeros(4))
    with pytest.raises(ValueError, match="difference"):
        difference_vectors(tensors[0], tensors[1], "angle")
    with pytest.raises(ValueError, match="alpha"):
        dive_losses(*tensors, torch.zeros(5), alpha=1.5)
    with pytest.raises(ValueError, match=r"\[B, D\]"):
        difference_vectors(tensors[0], tensors[1][:2])


def test_losses_module_reexports():
    assert losses.dive_losses is dive_losses and losses.snd_loss is snd_loss
    assert losses.sigmoid_contrastive_loss is sigmoid_contrastive_loss


# ---------------------------------------------------------------------------------------------------------
# SigLIP's sigmoid loss


def test_sigmoid_loss_matches_reference_loop():
    img, _, txt, _ = batch_of(7, 4)
    got = sigmoid_contrastive_loss(img, txt, 10.0, -3.0, rank=0, world_size=1)
    torch.testing.assert_close(got.item(), reference_sigmoid(img.tolist(), txt.tolist(), 10.0, -3.0))


def test_sigmoid_loss_hand_case():
    """Two orthogonal pairs, t = 1, b = 0: positive logits 1, negative 0: L = 2 * (sp(-1) + sp(0)) / 2."""
    eye = torch.eye(2)
    softplus = lambda x: math.log1p(math.exp(x))  # noqa: E731   -log sigmoid(x) = softplus(-x)
    got = sigmoid_contrastive_loss(eye, eye, 1.0, 0.0, rank=0, world_size=1)
    torch.testing.assert_close(got.item(), softplus(-1.0) + softplus(0.0))


def test_sigmoid_loss_matches_transformers_siglip():
    config = SiglipConfig(
        text_config=dict(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, max_position_embeddings=8),
        vision_config=dict(image_size=8, patch_size=4, hidden_size=16, intermediate_size=32,
                           num_hidden_layers=1, num_attention_heads=2),
    )  # fmt: skip
    torch.manual_seed(0)
    model = SiglipModel(config).eval()
    with torch.no_grad():
        model.logit_scale.fill_(math.log(7.0))
        model.logit_bias.fill_(-2.0)
    pixels, ids = torch.randn(3, 3, 8, 8), torch.randint(0, 50, (3, 8))
    with torch.no_grad():
        out = model(pixel_values=pixels, input_ids=ids, return_loss=True)
        ours = sigmoid_contrastive_loss(
            out.image_embeds, out.text_embeds, model.logit_scale.exp(), model.logit_bias, rank=0, world_size=1
        )
    torch.testing.assert_close(ours, out.loss)
