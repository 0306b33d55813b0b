"""DiVE over two gloo CPU processes: m is updated from the global reference batch (every rank holds the same
m, the single-process m of the whole batch), the losses and gradients are the global batch's, and
DiVETrainer on 2 processes reproduces one process, data included (reference batches drawn by global
position)."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp
from dive_helpers import (
    TRAIN_STEPS,
    WORLD_SIZE,
    global_batches,
    global_draw_trainer,
    local_rows,
    loss_worker,
    trainer_worker,
)
from safetensors.torch import load_file
from test_dive_loss import reference_dive

from hf_vrl.methods.dive.loss import dive_losses
from hf_vrl.methods.dive.sigmoid_loss import sigmoid_contrastive_loss


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def loss_results(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("dive_dist")
    mp.spawn(loss_worker, args=(_free_port(), str(out_dir)), nprocs=WORLD_SIZE, join=True)
    return [load_file(str(out_dir / f"rank{rank}.safetensors")) for rank in range(WORLD_SIZE)]


def test_every_rank_holds_the_global_m(loss_results):
    m_ref = [0.0] * 5
    for step, batch in enumerate(global_batches()):
        _, _, m_ref = reference_dive(*(t.tolist() for t in batch), m_ref, 0.9)
        want = torch.tensor(m_ref, dtype=torch.float64)
        for result in loss_results:
            torch.testing.assert_close(result[f"{step}/m"], want)


def test_rank_losses_average_to_the_global_loss_and_gradient(loss_results):
    m = torch.zeros(5, dtype=torch.float64)
    for step, batch in enumerate(global_batches()):
        img_ft, img_pre, txt_ft, txt_pre = batch
        img_ft, txt_ft = img_ft.clone().requires_grad_(), txt_ft.clone().requires_grad_()
        avl, pvl, m = dive_losses(img_ft, img_pre, txt_ft, txt_pre, m, alpha=0.9, rank=0, world_size=1)
        img_grad, txt_grad = torch.autograd.grad(avl + pvl, (img_ft, txt_ft))
        for name, value in (("avl", avl), ("pvl", pvl)):
            mean = torch.stack([result[f"{step}/{name}"] for result in loss_results]).mean()
            torch.testing.assert_close(mean, value.detach())
        for rank, result in enumerate(loss_results):  # DDP averages: world_size x the global slice
            torch.testing.assert_close(result[f"{step}/img_grad"], WORLD_SIZE * img_grad[local_rows(rank)])
            torch.testing.assert_close(result[f"{step}/txt_grad"], WORLD_SIZE * txt_grad[local_rows(rank)])


def test_sigmoid_loss_over_two_processes(loss_results):
    image, _, text, _ = (t.clone().requires_grad_() for t in global_batches()[0])
    expected = sigmoid_contrastive_loss(image, text, 5.0, -1.0, rank=0, world_size=1)
    image_grad, text_grad = torch.autograd.grad(expected, (image, text))
    losses = torch.stack([result["sigmoid/loss"] for result in loss_results])
    torch.testing.assert_close(losses.mean(), expected.detach())
    for rank, result in enumerate(loss_results):
        torch.testing.assert_close(result["sigmoid/img_grad"], WORLD_SIZE * image_grad[local_rows(rank)])
        torch.testing.assert_close(result["sigmoid/txt_grad"], WORLD_SIZE * text_grad[local_rows(rank)])


def test_two_processes_draw_the_data_of_one_process(tmp_path):
    """Reference batches drawn by global position and map-style target rows: 2 processes x 2 give the run of
    one process x 4 (data included: before, each rank drew its own reference rows with seed + 7919 x rank)."""
    mp.spawn(trainer_worker, args=(_free_port(), str(tmp_path)), nprocs=WORLD_SIZE, join=True)
    single = global_draw_trainer(tmp_path / "single", batch=4)
    single.train()
    losses = torch.tensor([h["loss"] for h in single.state.log_history if "loss" in h])
    for rank in range(WORLD_SIZE):
        result = load_file(str(tmp_path / f"rank{rank}.safetensors"))
        torch.testing.assert_close(result["loss"], losses, rtol=1e-5, atol=1e-5)
        extra = single.extra_state()
        assert extra["avg_vector"].abs().sum() > 0  # the weights moved, so did m
        torch.testing.assert_close(result["extra/avg_vector"], extra["avg_vector"], rtol=1e-4, atol=1e-7)
        assert int(result["extra/reference_batches"]) == TRAIN_STEPS
        for name, value in single.model.state_dict().items():
            torch.testing.assert_close(result[f"param/{name}"], value, rtol=1e-4, atol=1e-6)
