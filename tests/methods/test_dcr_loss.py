"""DCR objectives against plainly written loops over the paper's formulas (Eq. 7, 8, 11, 12) and hand
cases."""

from __future__ import annotations

import math

import pytest
import torch

from hf_vrl.methods.dcr.loss import (
    dcr_logits,
    dcr_loss,
    gradient_cosine,
    joint_loss,
    reconstruction_loss,
    supervised_contrastive_loss,
)


def _cos(u: torch.Tensor, v: torch.Tensor) -> float:
    u, v = u.flatten().double(), v.flatten().double()
    return float(u @ v / (u.norm() * v.norm()))


def reference_dcr_loss(pred, pred_pos, target, tau, anchor_columns=None) -> float:
    """Eq. 12 / Algorithm 1 lines 16-20 with python floats: one loop per anchor, one term per set member."""
    batch, columns = pred.shape[:2]
    total = 0.0
    for i in range(batch):
        a = i if anchor_columns is None else anchor_columns[i]
        anchor = pred[i, a]
        positives = [pred_pos[i], target[i]]
        negatives = [pred[i, j] for j in range(columns) if j != a]

        def d(u, v):
            return math.exp(_cos(u, v) / tau)

        denominator = sum(d(anchor, c) for c in positives + negatives)
        total += -0.5 * sum(math.log(d(anchor, p) / denominator) for p in positives)
    return total / batch


@pytest.mark.parametrize("tau", [0.1, 0.5, 1.0])
def test_dcr_loss_matches_loop_full_batch(tau):
    torch.manual_seed(0)
    batch, shape = 5, (4, 3, 3)
    pred, pred_pos, target = (
        torch.randn(batch, batch, *shape),
        torch.randn(batch, *shape),
        torch.randn(batch, *shape),
    )
    got = dcr_loss(pred, pred_pos, target, temperature=tau)
    assert got.item() == pytest.approx(reference_dcr_loss(pred, pred_pos, target, tau), rel=1e-5)


def test_dcr_loss_matches_loop_subsampled_negatives():
    torch.manual_seed(1)
    batch, k, shape = 6, 3, (4, 2, 2)
    pred = torch.randn(batch, 1 + k, *shape)
    pred_pos, target = torch.randn(batch, *shape), torch.randn(batch, *shape)
    # anchor in column 0 (an int) ...
    got = dcr_loss(pred, pred_pos, target, 0.1, anchor_index=0)
    assert got.item() == pytest.approx(reference_dcr_loss(pred, pred_pos, target, 0.1, [0] * batch), rel=1e-5)
    # ... or a different column per row (a tensor)
    columns = torch.tensor([0, 1, 2, 3, 0, 2])
    got = dcr_loss(pred, pred_pos, target, 0.1, anchor_index=columns)
    assert got.item() == pytest.approx(
        reference_dcr_loss(pred, pred_pos, target, 0.1, columns.tolist()), rel=1e-5
    )


def test_dcr_loss_hand_case():
    """Anchor e1; positive e1 (cos 1); target e2 (cos 0); negative -e1 (cos -1); tau = 1.

    L = -1/2 [log(e / S) + log(1 / S)] with S = e + 1 + 1/e, i.e. L = log(S) - 1/2, for both rows.
    """
    e1, e2 = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    pred = torch.stack([torch.stack([e1, -e1]), torch.stack([-e2, e2])])  # anchors on the diagonal
    pred_pos = torch.stack([e1, e2])
    target = torch.stack([e2, e1])
    expected = math.log(math.e + 1 + 1 / math.e) - 0.5
    assert dcr_loss(pred, pred_pos, target, temperature=1.0).item() == pytest.approx(expected, rel=1e-6)
    pos, neg = dcr_logits(pred, pred_pos, target, temperature=1.0)
    assert pos.tolist() == [[1.0, 0.0], [1.0, 0.0]]
    assert neg.tolist() == [[-1.0], [-1.0]]


def test_dcr_loss_is_scale_invariant_and_stable():
    """Cosine similarity ignores magnitudes; logsumexp keeps tiny temperatures finite."""
    torch.manual_seed(2)
    pred, pred_pos, target = torch.randn(4, 4, 8), torch.randn(4, 8), torch.randn(4, 8)
    base = dcr_loss(pred, pred_pos, target, 0.1)
    scaled = dcr_loss(pred * 7.0, pred_pos * 0.01, target * 3.0, 0.1)
    assert scaled.item() == pytest.approx(base.item(), rel=1e-5)
    assert torch.isfinite(dcr_loss(pred, pred_pos, target, 1e-4))


def test_dcr_loss_gradients_match_autograd_of_loop():
    torch.manual_seed(3)
    pred = torch.randn(3, 3, 5, dtype=torch.float64, requires_grad=True)
    pred_pos = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    target = torch.randn(3, 5, dtype=torch.float64)
    dcr_loss(pred, pred_pos, target, 0.2).backward()

    def loop(p, pp):
        total = 0
        for i in range(3):
            a = p[i, i] / p[i, i].norm()
            cands = [pp[i], target[i]] + [p[i, j] for j in range(3) if j != i]
            sims = torch.stack([a @ c / c.norm() for c in cands]) / 0.2
            total = total + torch.logsumexp(sims, 0) - sims[:2].mean()
        return total / 3

    p2, pp2 = pred.detach().clone().requires_grad_(), pred_pos.detach().clone().requires_grad_()
    loop(p2, pp2).backward()
    torch.testing.assert_close(pred.grad, p2.grad)
    torch.testing.assert_close(pred_pos.grad, pp2.grad)


def test_dcr_loss_rejects_bad_shapes():
    with pytest.raises(ValueError, match="anchor_index"):
        dcr_loss(torch.randn(3, 2, 4), torch.randn(3, 4), torch.randn(3, 4))
    with pytest.raises(ValueError, match="anchor_index must lie"):
        dcr_loss(torch.randn(3, 2, 4), torch.randn(3, 4), torch.randn(3, 4), anchor_index=2)
    with pytest.raises(ValueError, match="trailing dims"):
        dcr_loss(torch.randn(3, 3, 5), torch.randn(3, 4), torch.randn(3, 4))
    with pytest.raises(ValueError, match="temperature"):
        dcr_loss(torch.randn(3, 3, 4), torch.randn(3, 4), torch.randn(3, 4), temperature=0.0)


def test_supervised_contrastive_matches_eq7_loop():
    torch.manual_seed(4)
    z, labels, tau = torch.randn(8, 6), torch.tensor([0, 1, 0, 2, 1, 0, 3, 2]), 0.3
    expected, anchors = 0.0, 0
    for i in range(8):
        positives = [j for j in range(8) if j != i and labels[j] == labels[i]]
        if not positives:
            continue  # label 3 has a single sample: no positive, left out
        num = sum(math.exp(_cos(z[i], z[j]) / tau) for j in positives)
        den = sum(math.exp(_cos(z[i], z[k]) / tau) for k in range(8) if k != i)
        expected += -math.log(num / den)
        anchors += 1
    got = supervised_contrastive_loss(z, labels, tau)
    assert got.item() == pytest.approx(expected / anchors, rel=1e-5)
    with pytest.raises(ValueError, match="no sample has a positive"):
        supervised_contrastive_loss(z[:3], torch.arange(3), tau)


def test_reconstruction_and_joint():
    pred, target = torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([[1.0, 0.0], [0.0, 4.0]])
    # Eq. 8: squared L2 norm per sample (0 + 4, 9 + 0), mean over the batch
    assert reconstruction_loss(pred, target).item() == pytest.approx((4 + 9) / 2)
    assert reconstruction_loss(pred, target, "mean").item() == pytest.approx(
        (0 + 4 + 9 + 0) / 4
    )  # DIVA's mse
    with pytest.raises(ValueError, match="reduction"):
        reconstruction_loss(pred, target, "none")
    assert joint_loss(torch.tensor(2.0), torch.tensor(3.0), 0.5, 2.0).item() == pytest.approx(7.0)  # Eq. 9


def test_reconstruction_matches_eq8_loop():
    torch.manual_seed(5)
    pred, target = torch.randn(3, 4, 2, 2), torch.randn(3, 4, 2, 2)
    expected = sum(float(((pred[i] - target[i]) ** 2).sum()) for i in range(3)) / 3
    assert reconstruction_loss(pred, target).item() == pytest.approx(expected, rel=1e-6)


def test_gradient_cosine_eq11():
    z = torch.tensor([1.0, 2.0, -1.0], requires_grad=True)
    w_a, w_b = torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0.0, 1.0, 1.0])
    loss_a, loss_b = (w_a * z).sum(), (w_b * z).sum()  # gradients are w_a and w_b: cos = 1/2
    assert gradient_cosine(loss_a, loss_b, z).item() == pytest.approx(0.5)
    assert gradient_cosine(loss_a, -loss_a, z).item() == pytest.approx(-1.0)  # conflicting objectives
    (loss_a + loss_b).backward()  # the graph is kept for the real update
    torch.testing.assert_close(z.grad, w_a + w_b)


def test_gradient_cosine_over_shared_rows():
    """Row 1 only feeds loss_a: over all rows it shrinks the cosine, over the shared row 0 it is exact."""
    z = torch.tensor([[1.0, 0.0], [0.0, 0.0]], requires_grad=True)
    loss_a = (torch.tensor([[1.0, 1.0], [3.0, 0.0]]) * z).sum()  # gradient [[1, 1], [3, 0]]
    loss_b = (torch.tensor([1.0, 0.0]) * z[0]).sum()  # gradient [[1, 0], [0, 0]]
    assert gradient_cosine(loss_a, loss_b, z, rows=slice(0, 1)).item() == pytest.approx(1 / math.sqrt(2))
    assert gradient_cosine(loss_a, loss_b, z).item() == pytest.approx(1 / math.sqrt(11))
