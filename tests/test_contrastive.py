"""CLIP loss against a plain loop over the InfoNCE formula; gather across processes (faked and real gloo)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from _dist_worker import (
    DDP_SETTINGS,
    GLOBAL_BATCH,
    LOGIT_SCALE,
    SETTINGS,
    WORLD_SIZE,
    PairProjection,
    free_port,
    global_batch,
    loss_worker,
    tag,
)
from safetensors.torch import load_file
from transformers.modeling_outputs import BaseModelOutputWithPooling

from hf_vrl import contrastive
from hf_vrl.contrastive import as_embeddings, clip_contrastive_loss, clip_logits
from hf_vrl.losses import clip_contrastive_loss as reexported


def reference_loss(image, text, scale, rows=None):
    """DiVE Eq. (1) written out: per-row -log softmax, image->text and text->image, summed over rows, / 2B.

    ``rows`` defaults to the whole batch (B = len(rows)); a subset gives one process's share of the global
    sum (divided by 2 * len(rows), i.e. that process's mean).
    """
    u = [x / torch.sqrt(torch.dot(x, x)) for x in image]
    v = [t / torch.sqrt(torch.dot(t, t)) for t in text]
    n = len(u)
    rows = range(n) if rows is None else rows
    total = 0.0
    for i in rows:
        image_to_text = torch.stack([scale * torch.dot(u[i], v[k]) for k in range(n)])
        text_to_image = torch.stack([scale * torch.dot(u[k], v[i]) for k in range(n)])
        total = total - (image_to_text[i] - torch.logsumexp(image_to_text, 0))
        total = total - (text_to_image[i] - torch.logsumexp(text_to_image, 0))
    return total / (2 * len(rows))


def random_pairs(n=5, d=7, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randn(n, d, generator=gen, dtype=torch.float64),
        torch.randn(n, d, generator=gen, dtype=torch.float64),
    )


def test_matches_reference_loop():
    image, text = random_pairs()
    for scale in (1.0, 14.3, 100.0):
        expected = reference_loss(image, text, scale)
        torch.testing.assert_close(clip_contrastive_loss(image, text, scale), expected)
        torch.testing.assert_close(clip_contrastive_loss(image, text, torch.tensor(scale)), expected)


def test_hand_checkable_2x2():
    eye = torch.eye(2, dtype=torch.float64)
    # matched orthogonal pairs: each row's logits are [1, 0] -> -log(e / (e + 1)) = log(1 + 1/e)
    torch.testing.assert_close(clip_contrastive_loss(eye, eye, 1.0).item(), math.log(1 + math.exp(-1)))
    # swapped captions: each positive scores 0 against a negative at 1 -> log(1 + e)
    torch.testing.assert_close(clip_contrastive_loss(eye, eye.flip(0), 1.0).item(), math.log(1 + math.e))
    # a zero multiplier makes every pair equally likely -> log(B)
    torch.testing.assert_close(clip_contrastive_loss(eye, eye.flip(0), 0.0).item(), math.log(2))


def test_invariant_to_embedding_norm():
    image, text = random_pairs()
    gen = torch.Generator().manual_seed(1)
    row_scales = torch.rand(len(image), 1, generator=gen, dtype=torch.float64) * 10 + 0.1
    torch.testing.assert_close(
        clip_contrastive_loss(image * row_scales, text * row_scales.flip(0), 5.0),
        clip_contrastive_loss(image, text, 5.0),
    )


def test_gradcheck_embeddings_and_scale():
    image, text = random_pairs(n=4, d=3)
    scale = torch.tensor(2.5, dtype=torch.float64)
    inputs = tuple(t.clone().requires_grad_() for t in (image, text, scale))
    assert torch.autograd.gradcheck(lambda i, t, s: clip_contrastive_loss(i, t, s), inputs)
    # and the autograd gradient is the gradient of the plain formula
    loss_grads = torch.autograd.grad(clip_contrastive_loss(*inputs), inputs)
    reference_grads = torch.autograd.grad(reference_loss(*inputs), inputs)
    for got, want in zip(loss_grads, reference_grads):
        torch.testing.assert_close(got, want)


def test_logits_layout():
    image, text = random_pairs(n=3)
    logits = clip_logits(image, text, 2.0)
    expected = 2.0 * F.normalize(image, dim=-1) @ F.normalize(text, dim=-1).T
    torch.testing.assert_close(logits.logits_per_image, expected)
    torch.testing.assert_close(logits.logits_per_text, expected.T)
    assert logits.labels.tolist() == [0, 1, 2]


def test_as_embeddings():
    x = torch.randn(2, 4)
    assert as_embeddings(x) is x
    assert (
        as_embeddings(BaseModelOutputWithPooling(last_hidden_state=torch.randn(2, 3, 8), pooler_output=x))
        is x
    )
    with pytest.raises(TypeError, match="pooler_output"):
        as_embeddings((torch.randn(2, 3, 8), x))


def test_bad_input_errors():
    image, text = random_pairs(n=3)
    with pytest.raises(ValueError, match="same shape"):
        clip_contrastive_loss(image, text[:2], 1.0)
    with pytest.raises(ValueError, match="same shape"):
        clip_contrastive_loss(image[0], text[0], 1.0)
    with pytest.raises(ValueError, match="rank"):
        clip_contrastive_loss(image, text, 1.0, rank=2, world_size=2)
    with pytest.raises(RuntimeError, match="init_process_group"):
        clip_contrastive_loss(image, text, 1.0, rank=0, world_size=2)


def test_losses_module_reexports():
    assert reexported is clip_contrastive_loss


# ------------------------------------------------------------------------------------------------------------
# Gather with faked collectives (open_clip's test style): every simulated rank reads the slices of one global
# leaf, so summing the ranks' losses and back-propagating accumulates what the real reduce-scatter delivers.


class FakeWorld:
    """Stands in for the collectives of ``world_size`` processes holding slices of ``image`` / ``text``."""

    def __init__(self, image, text, world_size, rank):
        self.sources, self.world_size, self.rank, self.calls = (image, text), world_size, rank, 0
        self.batch = len(image) // world_size

    def _others(self, local):
        source = F.normalize(self.sources[self.calls % 2], dim=-1)  # gather_features: image first, then text
        self.calls += 1
        return [
            local if r == self.rank else source[r * self.batch : (r + 1) * self.batch]
            for r in range(self.world_size)
        ]

    def all_gather_with_grad(self, local):
        return torch.cat(self._others(local))

    def all_gather(self, slots, local):
        for slot, value in zip(slots, self._others(local)):
            slot.copy_(value.detach())


def fake_rank_losses(monkeypatch, image, text, world_size, **kwargs):
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    batch = len(image) // world_size
    losses = []
    for rank in range(world_size):
        world = FakeWorld(image, text, world_size, rank)
        monkeypatch.setattr(contrastive, "_all_gather_with_grad", world.all_gather_with_grad)
        monkeypatch.setattr(dist, "all_gather", world.all_gather)
        rows = slice(rank * batch, (rank + 1) * batch)
        losses.append(
            clip_contrastive_loss(image[rows], text[rows], 3.0, rank=rank, world_size=world_size, **kwargs)
        )
    return losses


@pytest.mark.parametrize("local_loss", [False, True])
def test_fake_gather_with_grad(monkeypatch, local_loss):
    world_size = 3
    image, text = (t.requires_grad_() for t in random_pairs(n=6, d=4))
    expected = reference_loss(image, text, 3.0)
    want_grads = torch.autograd.grad(expected, (image, text))
    losses = fake_rank_losses(
        monkeypatch, image, text, world_size, local_loss=local_loss, gather_with_grad=True
    )
    if not local_loss:
        for loss in losses:
            torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(torch.stack(losses).mean(), expected)
    # each slice receives every rank's gradient: world_size x the global one, which DDP's averaging undoes
    got_grads = torch.autograd.grad(sum(losses), (image, text))
    for got, want in zip(got_grads, want_grads):
        torch.testing.assert_close(got, world_size * want)


def test_fake_gather_without_grad_keeps_local_slot(monkeypatch):
    world_size = 3
    image, text = (t.requires_grad_() for t in random_pairs(n=6, d=4))
    expected = reference_loss(image, text, 3.0)
    want_grads = torch.autograd.grad(expected, (image, text))
    losses = fake_rank_losses(monkeypatch, image, text, world_size, local_loss=False, gather_with_grad=False)
    # no gradient crosses ranks, yet each rank's own slice gets its exact global-loss gradient
    got_grads = torch.autograd.grad(sum(losses), (image, text))
    for got, want in zip(got_grads, want_grads):
        torch.testing.assert_close(got, want)


# ------------------------------------------------------------------------------------------------------------
# Real collectives: two gloo processes on CPU.


@pytest.fixture(scope="module")
def two_process_results(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("dist")
    mp.spawn(loss_worker, args=(free_port(), str(out_dir)), nprocs=WORLD_SIZE, join=True)
    return [load_file(str(out_dir / f"rank{rank}.safetensors")) for rank in range(WORLD_SIZE)]


def _local_rows(rank):
    batch = GLOBAL_BATCH // WORLD_SIZE
    return slice(rank * batch, (rank + 1) * batch)


@pytest.mark.parametrize(("local_loss", "gather_with_grad"), SETTINGS)
def test_two_processes_match_global_batch(two_process_results, local_loss, gather_with_grad):
    image, text = (t.requires_grad_() for t in global_batch())
    expected = reference_loss(image, text, LOGIT_SCALE)
    image_grad, text_grad = torch.autograd.grad(expected, (image, text))
    name = tag(local_loss, gather_with_grad)
    losses = [result[f"{name}/loss"] for result in two_process_results]
    torch.testing.assert_close(torch.stack(losses).mean(), expected.detach())
    for rank, result in enumerate(two_process_results):
        rows = _local_rows(rank)
        if local_loss:  # this rank's rows of the global sum
            torch.testing.assert_close(
                losses[rank], reference_loss(image, text, LOGIT_SCALE, rows=range(GLOBAL_BATCH)[rows])
            )
        else:
            torch.testing.assert_close(losses[rank], expected.detach())
        if gather_with_grad:  # every rank's gradient reaches the slice: world_size x the global gradient
            want_image, want_text = WORLD_SIZE * image_grad[rows], WORLD_SIZE * text_grad[rows]
        elif not local_loss:  # the local slot alone carries the whole global-loss gradient of the slice
            want_image, want_text = image_grad[rows], text_grad[rows]
        else:  # only this rank's rows, other ranks' features held constant
            keep = torch.zeros(GLOBAL_BATCH, 1, dtype=torch.float64)
            keep[rows] = 1
            mixed = [keep * t + (1 - keep) * t.detach() for t in (image, text)]
            local_share = reference_loss(*mixed, LOGIT_SCALE, rows=range(GLOBAL_BATCH)[rows])
            want_image, want_text = (g[rows] for g in torch.autograd.grad(local_share, (image, text)))
        torch.testing.assert_close(result[f"{name}/image_grad"], want_image)
        torch.testing.assert_close(result[f"{name}/text_grad"], want_text)


@pytest.mark.parametrize(("local_loss", "gather_with_grad"), DDP_SETTINGS)
def test_two_process_ddp_gradient(two_process_results, local_loss, gather_with_grad):
    """Under DDP the model gets the global-batch gradient (with gather_with_grad) or 1/N of it (without)."""
    model = PairProjection()
    image, text = global_batch()
    reference_loss(*model(image, text), LOGIT_SCALE).backward()
    factor = 1.0 if gather_with_grad else 1.0 / WORLD_SIZE
    for result in two_process_results:
        for pname, param in model.named_parameters():
            torch.testing.assert_close(
                result[f"ddp_{tag(local_loss, gather_with_grad)}/{pname}"], factor * param.grad
            )
