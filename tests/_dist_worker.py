"""Workers for the two-process gloo tests, started with torch.multiprocessing.spawn by the test files.

Each worker joins a gloo group on localhost, computes its rank's share, writes tensors to
``out_dir/rank{r}.safetensors`` and frees everything before leaving (two-process runs crash at exit
otherwise).
"""

from __future__ import annotations

import gc
import os
import socket
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch import nn

from hf_vrl.contrastive import clip_contrastive_loss

WORLD_SIZE = 2
GLOBAL_BATCH = 6
DIM = 5
LOGIT_SCALE = 3.0
# (local_loss, gather_with_grad)
SETTINGS = [(False, True), (True, True), (False, False), (True, False)]
DDP_SETTINGS = [(False, True), (True, True), (False, False)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tag(local_loss: bool, gather_with_grad: bool) -> str:
    return f"local{int(local_loss)}_grad{int(gather_with_grad)}"


def global_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """The same float64 embeddings in every process and in the test."""
    gen = torch.Generator().manual_seed(0)
    return (
        torch.randn(GLOBAL_BATCH, DIM, generator=gen, dtype=torch.float64),
        torch.randn(GLOBAL_BATCH, DIM, generator=gen, dtype=torch.float64),
    )


class PairProjection(nn.Module):
    """Two linear heads: a stand-in for a dual encoder under DDP."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(1)
        self.image = nn.Linear(DIM, 4, dtype=torch.float64)
        self.text = nn.Linear(DIM, 4, dtype=torch.float64)
        with torch.no_grad():
            for param in self.parameters():
                param.copy_(torch.randn(param.shape, generator=gen, dtype=torch.float64))

    def forward(self, image: torch.Tensor, text: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.image(image), self.text(text)


def _init(rank: int, port: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE)


def _shutdown() -> None:
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def loss_worker(rank: int, port: int, out_dir: str) -> None:
    """Loss and local-embedding gradients for every setting, plus DDP parameter gradients."""
    _init(rank, port)
    image, text = global_batch()
    rows = slice(rank * GLOBAL_BATCH // WORLD_SIZE, (rank + 1) * GLOBAL_BATCH // WORLD_SIZE)
    results = {}
    for local_loss, gather_with_grad in SETTINGS:
        local_image = image[rows].clone().requires_grad_()
        local_text = text[rows].clone().requires_grad_()
        # rank / world_size come from the initialised process group
        loss = clip_contrastive_loss(
            local_image, local_text, LOGIT_SCALE, local_loss=local_loss, gather_with_grad=gather_with_grad
        )
        loss.backward()
        name = tag(local_loss, gather_with_grad)
        results[f"{name}/loss"] = loss.detach()
        results[f"{name}/image_grad"] = local_image.grad
        results[f"{name}/text_grad"] = local_text.grad
    for local_loss, gather_with_grad in DDP_SETTINGS:
        ddp = nn.parallel.DistributedDataParallel(PairProjection())
        loss = clip_contrastive_loss(
            *ddp(image[rows], text[rows]),
            LOGIT_SCALE,
            local_loss=local_loss,
            gather_with_grad=gather_with_grad,
        )
        loss.backward()
        for pname, param in ddp.module.named_parameters():
            results[f"ddp_{tag(local_loss, gather_with_grad)}/{pname}"] = param.grad.clone()
        del ddp, loss
    save_file({k: v.contiguous() for k, v in results.items()}, str(Path(out_dir) / f"rank{rank}.safetensors"))
    _shutdown()


def trainer_worker(rank: int, port: int, out_dir: str) -> None:
    """One ContrastiveTrainer step on 2 CPU processes; rank 0 writes the log history."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(WORLD_SIZE),
    )
    torch.set_num_threads(1)
    from test_trainer import PAIRS_PER_STEP, one_step_history  # the test file's tiny model and data

    history, trainer = one_step_history(
        out_dir, per_device_batch=PAIRS_PER_STEP // WORLD_SIZE, gradient_accumulation_steps=1
    )
    if rank == 0:
        save_file(
            {k: torch.tensor(float(v)) for k, v in history.items()},
            str(Path(out_dir) / "history.safetensors"),
        )
    trainer.accelerator.free_memory()
    del trainer
    _shutdown()
