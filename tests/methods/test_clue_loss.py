"""CLUE's objectives against plainly written references (loops over the formulas) and hand-checked cases:
Sinkhorn-Knopp, soft-InfoNCE (Eq. 4-6), text alignment (Eq. 7), Eq. 8, and the two-process gather."""

from __future__ import annotations

import math

import pytest
import torch
import torch.multiprocessing as mp
from clue_helpers import DIST_BATCH, DIST_WORLD, dist_objective_worker, objective_inputs
from safetensors.torch import load_file

from hf_vrl.contrastive import clip_contrastive_loss
from hf_vrl.losses import clue_objective, identity_targets, sinkhorn, soft_info_nce, text_alignment_loss


def sinkhorn_reference(scores: list[list[float]], n_iters: int, epsilon: float) -> list[list[float]]:
    """ReSA's `sinkhorn_knopp`, one process, written with loops in Python floats (float64)."""
    q = [[math.exp(s / epsilon) for s in row] for row in scores]  # rows: samples, columns: prototypes
    n, k = len(q), len(q[0])
    for _ in range(n_iters):
        for j in range(k):  # every column (prototype) gets mass 1/K
            col = sum(q[i][j] for i in range(n))
            for i in range(n):
                q[i][j] /= col * k
        for i in range(n):  # every row (sample) gets mass 1/n
            row = sum(q[i])
            q[i] = [v / (row * n) for v in q[i]]
    return [[v * n for v in row] for row in q]


def soft_info_nce_reference(s: torch.Tensor, a: torch.Tensor, tau: float) -> float:
    """Eq. 5: -1/(2m) sum_ij [A_ij log D(S)_ij + A_ji log D(S^T)_ji], D the row-softmax of S / tau."""
    m, s, a = s.shape[0], s.tolist(), a.tolist()
    total = 0.0
    for i in range(m):
        for j in range(m):
            row = sum(math.exp(s[i][k] / tau) for k in range(m))
            col = sum(math.exp(s[k][j] / tau) for k in range(m))  # row j of S^T
            total += a[i][j] * math.log(math.exp(s[i][j] / tau) / row)
            total += a[j][i] * math.log(
                math.exp(s[i][j] / tau) / col
            )  # D(S^T)_ji = exp(S_ij) / sum_k exp(S_kj)
    return -total / (2 * m)


def cross_view_reference(online: torch.Tensor, momentum: torch.Tensor, a: torch.Tensor, tau: float) -> float:
    """The two-branch soft-InfoNCE of training (ReSA): each online view's rows against the *other* momentum
    view's columns, both with target A: -1/(2m) sum_v sum_ij A_ij log softmax_j(<q^v_i, k^(1-v)_j> / tau).
    `online` / `momentum` `[m, 2, ...]`, flattened per view and L2-normalised here, with loops."""

    def unit(x: torch.Tensor) -> list[list[float]]:
        rows = [[float(v) for v in row.flatten()] for row in x.double()]
        return [[v / math.sqrt(sum(u * u for u in row)) for v in row] for row in rows]

    m, a = online.shape[0], a.tolist()
    total = 0.0
    for view in (0, 1):
        q, k = unit(online[:, view]), unit(momentum[:, 1 - view])
        for i in range(m):
            logits = [sum(x * y for x, y in zip(q[i], k[j])) / tau for j in range(m)]
            log_norm = math.log(sum(math.exp(x) for x in logits))
            total += sum(a[i][j] * (logits[j] - log_norm) for j in range(m))
    return -total / (2 * m)


def text_reference(v: torch.Tensor, t: torch.Tensor, tau: float) -> float:
    """Eq. 7 with unit-norm v_i, t_i."""
    v = [row / row.norm() for row in v.double()]
    t = [row / row.norm() for row in t.double()]
    m = len(v)
    total = 0.0
    for i in range(m):
        logits = [float(v[i] @ t[j]) / tau for j in range(m)]
        total += math.log(math.exp(logits[i]) / sum(math.exp(x) for x in logits))
    return -total / m


@pytest.mark.parametrize("shape", [(5, 5), (4, 7), (6, 3)])
def test_sinkhorn_matches_the_loop_reference(shape):
    scores = torch.rand(*shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 2 - 1
    ours = sinkhorn(scores, n_iters=3, epsilon=0.05)
    reference = torch.tensor(sinkhorn_reference(scores.tolist(), 3, 0.05), dtype=torch.float64)
    assert ours.dtype == torch.float64
    torch.testing.assert_close(ours, reference, rtol=1e-10, atol=1e-12)


def test_sinkhorn_is_doubly_stochastic():
    scores = torch.randn(6, 6, generator=torch.Generator().manual_seed(0)).clamp(-1, 1)
    three = sinkhorn(scores)
    torch.testing.assert_close(three.sum(dim=1), torch.ones(6))  # rows: exact after every iteration
    converged = sinkhorn(scores, n_iters=500, epsilon=0.5)
    torch.testing.assert_close(converged.sum(dim=0), torch.ones(6), rtol=0, atol=1e-4)
    torch.testing.assert_close(converged.sum(dim=1), torch.ones(6), rtol=0, atol=1e-5)
    wide = sinkhorn(torch.randn(4, 8, generator=torch.Generator().manual_seed(2)), n_iters=500, epsilon=0.5)
    torch.testing.assert_close(wide.sum(dim=0), torch.full((8,), 0.5), rtol=0, atol=1e-4)  # n / K per column


def test_sinkhorn_hand_checked():
    # a symmetric 2x2 problem: A = [[p, 1-p], [1-p, p]] with p = sigmoid((a - b) / epsilon)
    out = sinkhorn(torch.tensor([[0.1, 0.0], [0.0, 0.1]]), epsilon=0.05)
    p = 1 / (1 + math.exp(-2.0))
    torch.testing.assert_close(out, torch.tensor([[p, 1 - p], [1 - p, p]]))
    # equal scores: every sample spread evenly
    torch.testing.assert_close(sinkhorn(torch.full((3, 4), 0.7)), torch.full((3, 4), 0.25))


def test_sinkhorn_is_stable_where_the_linear_domain_overflows():
    scores = torch.rand(5, 5, generator=torch.Generator().manual_seed(3)) * 2 - 1
    # epsilon = 0.01: exp(scores / epsilon) reaches e^100, beyond float32
    assert not torch.isfinite(torch.exp(scores / 0.01)).all()
    ours = sinkhorn(scores, epsilon=0.01)
    reference = torch.tensor(sinkhorn_reference(scores.double().tolist(), 3, 0.01), dtype=torch.float32)
    torch.testing.assert_close(ours, reference, rtol=1e-4, atol=1e-6)
    # half precision in (float16 overflows exp(scores / 0.05)), float32 out, close to the float32 result
    assert not torch.isfinite(torch.exp(scores.half() / 0.05)).all()
    for dtype in (torch.bfloat16, torch.float16):
        low = sinkhorn(scores.to(dtype))
        assert low.dtype == torch.float32 and torch.isfinite(low).all()
        torch.testing.assert_close(low.sum(dim=1), torch.ones(5))
        torch.testing.assert_close(low, sinkhorn(scores.to(dtype).float()), rtol=0, atol=1e-6)
        torch.testing.assert_close(low, sinkhorn(scores), rtol=0, atol=0.05)


def test_sinkhorn_rejects_bad_settings():
    with pytest.raises(ValueError, match="n_iters"):
        sinkhorn(torch.zeros(2, 2), n_iters=0)
    with pytest.raises(ValueError, match="epsilon"):
        sinkhorn(torch.zeros(2, 2), epsilon=0)


def _embeddings(m: int = 5, d: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    z = torch.nn.functional.normalize(torch.randn(m, d, generator=gen, dtype=torch.float64), dim=-1)
    return z, torch.nn.functional.normalize(torch.randn(m, d, generator=gen, dtype=torch.float64), dim=-1)


def test_soft_info_nce_with_identity_targets_is_info_nce():
    z, z2 = _embeddings()
    ours = soft_info_nce(z @ z2.T, torch.eye(5, dtype=torch.float64), temperature=0.4)
    torch.testing.assert_close(ours, clip_contrastive_loss(z, z2, 1 / 0.4).to(ours.dtype))


def test_soft_info_nce_matches_the_loop_reference():
    z, z2 = _embeddings(seed=1)
    s = z @ z2.T
    a = sinkhorn(z @ z.T)  # a soft, non-symmetric target
    expected = soft_info_nce_reference(s, a, 0.4)
    assert soft_info_nce(s, a, 0.4).item() == pytest.approx(expected, rel=1e-9)


def test_soft_info_nce_hand_checked():
    # all similarities equal: D = 1/m whatever the targets, so the loss is log m
    a = sinkhorn(torch.randn(4, 4, generator=torch.Generator().manual_seed(0)))
    assert soft_info_nce(torch.zeros(4, 4), a, 0.4).item() == pytest.approx(math.log(4), rel=1e-6)
    # 2 samples, identity targets, S = [[1, 0], [0, 1]], tau = 1: -log(e / (e + 1)) in both directions
    loss = soft_info_nce(torch.eye(2), torch.eye(2), 1.0)
    assert loss.item() == pytest.approx(-math.log(math.e / (math.e + 1)), rel=1e-6)


def test_soft_info_nce_second_direction():
    z, z2 = _embeddings(seed=2)
    s1, s2 = z @ z2.T, z2 @ z.T + 0.1
    a = sinkhorn(z @ z2.T)
    ours = soft_info_nce(s1, a, 0.4, similarity_t=s2).item()
    expected = 0.0
    for s in (s1.tolist(), s2.tolist()):  # both directions: row i against target row A_i
        for i, row in enumerate(s):
            log_norm = math.log(sum(math.exp(x / 0.4) for x in row))
            expected -= sum(a[i, j].item() * (row[j] / 0.4 - log_norm) for j in range(len(row)))
    assert ours == pytest.approx(expected / (2 * len(s1)), rel=1e-9)
    with pytest.raises(ValueError, match="similarity_t"):
        soft_info_nce(torch.zeros(2, 3), torch.zeros(2, 3), 0.4)


def test_text_alignment_matches_eq7():
    gen = torch.Generator().manual_seed(4)
    v, t = torch.randn(5, 6, generator=gen), torch.randn(5, 6, generator=gen)
    assert text_alignment_loss(v, t, 0.1).item() == pytest.approx(text_reference(v, t, 0.1), rel=1e-5)
    # aligned orthonormal pairs: logits 1/tau on the diagonal, 0 elsewhere
    loss = text_alignment_loss(torch.eye(3), 2 * torch.eye(3), 0.5)
    assert loss.item() == pytest.approx(-math.log(math.e**2 / (math.e**2 + 2)), rel=1e-6)


def test_identity_targets_offset_by_rank():
    targets = identity_targets(2, rank=1, world_size=3)
    assert targets.shape == (2, 6)
    assert targets.nonzero().tolist() == [[0, 2], [1, 3]]


def test_eq8_weights_and_switches():
    online, momentum, text = objective_inputs(batch=6)
    kwargs = dict(text_embeds=text, world_size=1, rank=0)
    full = clue_objective(online, momentum, alpha=1.0, beta=1.0, gamma=1.0, **kwargs)
    weighted = clue_objective(online, momentum, alpha=0.5, beta=2.0, gamma=3.0, **kwargs)
    expected = 0.5 * full["loss_global"] + 2.0 * full["loss_local"] + 3.0 * full["loss_text"]
    torch.testing.assert_close(weighted["loss"], expected)
    only_global = clue_objective(online, momentum, alpha=1.0, beta=0.0, gamma=0.0, **kwargs)
    assert set(only_global) == {"loss", "loss_global", "target_self_weight"}
    torch.testing.assert_close(only_global["loss"], full["loss_global"])
    with pytest.raises(ValueError, match="weight 0"):
        clue_objective(online, momentum, alpha=0.0, beta=0.0, gamma=0.0, **kwargs)


def test_training_terms_match_the_cross_view_loop_reference():
    """What training computes (online view v against momentum view 1 - v, Sinkhorn targets from the weak
    view's backbone features) against `cross_view_reference`, written independently with loops."""
    online, momentum, text = objective_inputs(batch=5, seed=3)
    out = clue_objective(
        online, momentum, text_embeds=text, temperature=0.3, part_temperature=0.2, world_size=1, rank=0
    )
    n = torch.nn.functional.normalize
    a = sinkhorn(n(online["features"][:, 0]) @ n(momentum["features"][:, 0]).T)
    for name, key, tau in (("global", "embeddings", 0.3), ("local", "part_descriptors", 0.2)):
        expected = cross_view_reference(online[key], momentum[key], a, tau)
        assert out[f"loss_{name}"].item() == pytest.approx(expected, rel=1e-9)
    # the same-view pairing (online v against momentum v) gives a different value: the test tells them apart
    same_view = cross_view_reference(online["embeddings"], momentum["embeddings"].flip(1), a, 0.3)
    assert out["loss_global"].item() != pytest.approx(same_view, rel=1e-3)


def test_eq8_terms_follow_eq5_to_eq7():
    """The global and part terms are soft-InfoNCE of online view 1 x momentum view 2 (and 2 x 1) against
    Sinkhorn targets from the weak view's backbone features; the text term averages Eq. 7 over both views."""
    online, momentum, text = objective_inputs(batch=6)
    out = clue_objective(
        online, momentum, text_embeds=text, temperature=0.3, part_temperature=0.2, world_size=1, rank=0
    )
    n = torch.nn.functional.normalize
    a = sinkhorn(n(online["features"][:, 0]) @ n(momentum["features"][:, 0]).T)
    for name, key, tau in (("global", "embeddings", 0.3), ("local", "part_descriptors", 0.2)):
        rows, cols = n(online[key].flatten(2), dim=-1), n(momentum[key].flatten(2), dim=-1)
        expected = soft_info_nce(rows[:, 0] @ cols[:, 1].T, a, tau, similarity_t=rows[:, 1] @ cols[:, 0].T)
        torch.testing.assert_close(out[f"loss_{name}"], expected)
    text_loss = sum(text_alignment_loss(online["text_embeds"][:, v], text, 0.1) for v in (0, 1)) / 2
    torch.testing.assert_close(out["loss_text"], text_loss)
    infonce = clue_objective(online, momentum, targets="identity", beta=0, gamma=0, world_size=1, rank=0)
    rows, cols = n(online["embeddings"], dim=-1), n(momentum["embeddings"], dim=-1)
    labels = torch.arange(6)
    ce = torch.nn.functional.cross_entropy
    expected = (ce(rows[:, 0] @ cols[:, 1].T / 0.4, labels) + ce(rows[:, 1] @ cols[:, 0].T / 0.4, labels)) / 2
    torch.testing.assert_close(infonce["loss_global"], expected)
    assert infonce["target_self_weight"].item() == 1.0


def test_two_processes_gather_before_sinkhorn(tmp_path):
    """2 gloo processes, 3 samples each == 1 process with the 6 samples: the same targets rows, the mean of
    the per-process losses equals the global loss, and the per-process gradients are the global ones x 2
    (which DDP's averaging turns back into the global gradient)."""
    online, momentum, text = objective_inputs(batch=DIST_BATCH * DIST_WORLD)
    leaves = {
        key: online[key].clone().requires_grad_() for key in ("embeddings", "part_descriptors", "text_embeds")
    }
    single = clue_objective({**online, **leaves}, momentum, text_embeds=text, world_size=1, rank=0)
    single["loss"].backward()
    mp.spawn(dist_objective_worker, args=(str(tmp_path),), nprocs=DIST_WORLD, join=True)
    ranks = [load_file(str(tmp_path / f"rank{r}.safetensors")) for r in range(DIST_WORLD)]
    for name in ("loss", "loss_global", "loss_local", "loss_text"):
        mean = sum(r[name] for r in ranks) / DIST_WORLD
        torch.testing.assert_close(mean, single[name].detach(), rtol=1e-10, atol=1e-12)
    n = torch.nn.functional.normalize
    targets = sinkhorn(n(online["features"][:, 0]) @ n(momentum["features"][:, 0]).T)
    torch.testing.assert_close(torch.cat([r["targets"] for r in ranks]), targets, rtol=1e-10, atol=1e-12)
    for key, leaf in leaves.items():
        gathered = torch.cat([r[f"grad/{key}"] for r in ranks]) / DIST_WORLD
        torch.testing.assert_close(gathered, leaf.grad, rtol=1e-9, atol=1e-12)
