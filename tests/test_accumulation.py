"""Whole-batch accumulation (GradCache, `hf_vrl.accumulation`): k micro-batches of B give the loss and the
gradient of one batch of kB; plain accumulation does not (the test can tell them apart); dropout draws the
same masks in the recomputation; BatchNorm buffers move once per micro-batch."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file
from test_trainer import PairDataset, collate, tiny_clip, training_args
from torch import nn
from transformers import TrainerCallback
from transformers.models.clip.modeling_clip import CLIPAttention

from hf_vrl.accumulation import (
    concat_outputs,
    own_draws,
    reseed,
    rng_state,
    split_batch,
    whole_batch_backward,
)
from hf_vrl.trainer import ContrastiveTrainer, VRLTrainingArguments


class GradientRecorder(TrainerCallback):
    """The parameter gradients of every optimiser step, just before the step."""

    def __init__(self) -> None:
        self.steps: list[dict[str, torch.Tensor]] = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.steps.append(
            {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        )


def vrl_args(out_dir, **kwargs) -> VRLTrainingArguments:
    return VRLTrainingArguments(**{**training_args(out_dir).to_dict(), **kwargs, "output_dir": str(out_dir)})


def one_step(trainer) -> tuple[float, dict[str, torch.Tensor]]:
    recorder = GradientRecorder()
    trainer.add_callback(recorder)
    trainer.train()
    return trainer.state.log_history[0]["loss"], recorder.steps[0]


def assert_same_gradients(a: dict, b: dict, rtol: float = 1e-9, atol: float = 1e-12) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=rtol, atol=atol, msg=name)


def relative_gap(a: dict, b: dict) -> float:
    num = sum(((a[n] - b[n]) ** 2).sum() for n in a)
    return float(torch.sqrt(num / sum((b[n] ** 2).sum() for n in b)))


# -- the pieces ---------------------------------------------------------------------------------------------


def test_split_batch_cuts_every_tensor_and_repeats_the_rest():
    batch = {
        "x": torch.arange(6),
        "nested": {"y": torch.arange(12).view(6, 2)},
        "scalar": torch.tensor(3),
        "n": 1,
    }
    parts = split_batch(batch, 3)
    assert [p["x"].tolist() for p in parts] == [[0, 1], [2, 3], [4, 5]]
    assert parts[2]["nested"]["y"].tolist() == [[8, 9], [10, 11]]
    assert all(p["scalar"].item() == 3 and p["n"] == 1 for p in parts)
    with pytest.raises(ValueError, match="not a multiple of 4"):
        split_batch(batch, 4)


def test_concat_outputs_joins_rows_and_keeps_one_shared_value():
    chunks = [
        {"a": torch.tensor([1.0]), "s": torch.tensor(5.0)},
        {"a": torch.tensor([2.0]), "b": torch.ones(1)},
    ]
    merged = concat_outputs(chunks, shared={"s"})
    assert merged["a"].tolist() == [1.0, 2.0] and merged["s"].item() == 5.0 and merged["b"].tolist() == [1.0]


class Noisy(nn.Module):
    """A linear map with dropout and BatchNorm: the recomputation must draw the same masks, and the running
    statistics must move once per micro-batch."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(4, 3, dtype=torch.float64)
        self.norm = nn.BatchNorm1d(3, dtype=torch.float64)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.norm(self.linear(x)))


def coupled_loss(out):
    """A loss that couples the rows: log-sum-exp over the whole batch."""
    return {"loss": torch.logsumexp(out["y"].sum(dim=1), dim=0)}


def _four_micro_batches(model: nn.Module, x: torch.Tensor, **kwargs: Any) -> dict[str, torch.Tensor]:
    """`whole_batch_backward` of `coupled_loss` over `x` in 4 micro-batches."""
    return whole_batch_backward(
        model,
        split_batch({"x": x}, 4),
        {"x": x},
        embed=lambda m, chunk: {"y": m(chunk["x"])},
        loss_targets=lambda m, chunk: {},
        objective=lambda out, targets, batch: coupled_loss(out),
        backward=torch.Tensor.backward,
        no_sync=contextlib.nullcontext,
        **kwargs,
    )


def test_recomputation_replays_dropout_and_buffers_move_once_per_micro_batch():
    x = torch.randn(8, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    model = Noisy().train()
    by_hand = Noisy().train()
    torch.manual_seed(7)  # by hand: the micro-batches one after another, with gradient, one backward
    outputs = [by_hand(chunk) for chunk in x.chunk(4)]
    coupled_loss({"y": torch.cat(outputs)})["loss"].backward()
    torch.manual_seed(7)
    values = _four_micro_batches(model, x)
    torch.testing.assert_close(values["loss"], coupled_loss({"y": torch.cat(outputs)})["loss"].detach())
    for (name, param), want in zip(model.named_parameters(), by_hand.parameters()):
        torch.testing.assert_close(param.grad, want.grad, rtol=1e-12, atol=1e-14, msg=name)
    torch.testing.assert_close(model.norm.running_mean, by_hand.norm.running_mean, rtol=1e-12, atol=0)
    assert int(model.norm.num_batches_tracked) == 4


def test_each_micro_batch_draws_from_its_own_seed_and_the_recomputation_replays_it(device):
    """`seed(i)` before the i-th micro-batch's first pass: its dropout masks are those of its seed, whatever
    the micro-batches before it drew, so a micro-batch draws the same on any process it lands on; the run's
    own stream is left where it was (`own_draws`)."""
    x = torch.randn(8, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).to(device)
    model = Noisy().to(device).train()
    by_hand = Noisy().to(device).train()
    outputs = []
    for place, chunk in enumerate(x.chunk(4)):
        reseed(100 + place, device)
        outputs.append(by_hand(chunk))
    coupled_loss({"y": torch.cat(outputs)})["loss"].backward()
    torch.manual_seed(7)
    stream = rng_state(device)
    with own_draws(device):
        _four_micro_batches(model, x, device=device, seed=lambda place: reseed(100 + place, device))
    for (name, param), want in zip(model.named_parameters(), by_hand.parameters()):
        torch.testing.assert_close(param.grad, want.grad, rtol=1e-12, atol=1e-14, msg=name)
    after = torch.rand(3, device=device)
    stream.restore()
    assert torch.equal(after, torch.rand(3, device=device))


# -- CLIP's loss through the Trainer ---------------------------------------------------------------------


def clip_trainer(
    out_dir, micro: int, steps: int = 1, accumulation: str = "micro_batch", dropout: float = 0.0, **kwargs
):
    """ContrastiveTrainer on 8 pairs: micro-batches of `micro`, `steps` of them per optimiser step (with
    `dropout` on the attention probabilities)."""
    model = tiny_clip().double()
    for module in model.modules():
        if isinstance(module, CLIPAttention):
            module.dropout = dropout
    return ContrastiveTrainer(
        model=model,
        args=vrl_args(
            out_dir,
            per_device_train_batch_size=micro,
            gradient_accumulation_steps=steps,
            accumulation=accumulation,
            max_steps=1,
            optim="sgd",
            learning_rate=0.1,
            **kwargs,
        ),
        train_dataset=PairDataset(8),
        data_collator=collate,
    )


def clip_step(out_dir, micro: int, steps: int = 1, accumulation: str = "micro_batch", dropout: float = 0.0):
    return one_step(clip_trainer(out_dir, micro, steps, accumulation, dropout))


def test_clip_loss_over_micro_batches_is_the_loss_of_the_whole_batch(tmp_path):
    loss, grads = clip_step(tmp_path / "one", 8)
    whole_loss, whole = clip_step(tmp_path / "whole", 2, 4, "whole_batch")
    plain_loss, plain = clip_step(tmp_path / "plain", 2, 4)
    assert whole_loss == pytest.approx(loss, rel=1e-12)
    assert_same_gradients(whole, grads)
    assert "logit_scale" in whole  # the shared output's gradient reached its parameter
    # plain accumulation is another objective (2 pairs per loss): a real difference, not rounding
    assert relative_gap(plain, grads) > 1e-2 and abs(plain_loss - loss) > 1e-2


class SizeRecorder(ContrastiveTrainer):
    """Records the rows of every batch the DataLoader yields, that `embed` gets, and that the loss sees."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loaded, self.embedded, self.objective_rows = [], [], []

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        batches, count = super().get_batch_samples(epoch_iterator, num_batches, device)
        self.loaded += [(len(b["pixel_values"]), b["pixel_values"].device.type) for b in batches]
        return batches, count

    def embed(self, model, inputs):
        self.embedded.append((len(inputs["pixel_values"]), inputs["pixel_values"].device.type))
        return super().embed(model, inputs)

    def objective(self, embedded, targets, inputs):
        self.objective_rows.append(len(embedded["image_embeds"]))
        return super().objective(embedded, targets, inputs)


def test_whole_batch_data_streams_by_micro_batch(tmp_path, device):
    """The DataLoader yields micro-batches and leaves them on the host (a step's wait there for the
    recomputation), each forward pass moves one micro-batch to the device, and the loss sees the whole step:
    4 micro-batches of 2 -> one loss of 8."""
    args = vrl_args(
        tmp_path, per_device_train_batch_size=2, gradient_accumulation_steps=4, accumulation="whole_batch",
        max_steps=2, optim="sgd", learning_rate=0.1, use_cpu=device.type == "cpu",
    )  # fmt: skip
    trainer = SizeRecorder(
        model=tiny_clip().double(), args=args, train_dataset=PairDataset(16), data_collator=collate
    )
    trainer.train()
    assert trainer.get_train_dataloader().device is None  # accelerate places nothing
    assert trainer.loaded == [(2, "cpu")] * 8
    assert trainer.embedded == [(2, device.type)] * 16  # each micro-batch embedded twice (cache, recompute)
    assert trainer.objective_rows == [8, 8]


def seeded_whole_batch_run(out_dir, **kwargs) -> ContrastiveTrainer:
    """4 steps of 4 micro-batches of 2 over 24 seeded pairs (3 steps per epoch: the run crosses an epoch)."""
    from hf_vrl.run.data import SeededDataset

    args = vrl_args(
        out_dir, per_device_train_batch_size=2, gradient_accumulation_steps=4, accumulation="whole_batch",
        max_steps=4, optim="sgd", learning_rate=0.1, save_strategy="steps", save_steps=2,
        dataloader_drop_last=True,
    )  # fmt: skip
    pairs = SeededDataset(PairDataset(24), seed=0)
    return ContrastiveTrainer(
        model=tiny_clip().double(),
        args=args,
        train_dataset=pairs,
        data_collator=lambda rows: collate(
            [{k: v for k, v in r.items() if k != "sample_seed"} for r in rows]
        ),
        **kwargs,
    )


def test_a_resumed_whole_batch_run_equals_the_uninterrupted_one(tmp_path):
    """Micro-batch streaming keeps resume exact: from checkpoint-2, steps 3 and 4 (the second epoch's
    micro-batches, skipped by the loader) give the weights of the run that never stopped."""
    whole = seeded_whole_batch_run(tmp_path / "run")
    whole.train()
    resumed = seeded_whole_batch_run(tmp_path / "resumed")
    resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-2"))
    assert resumed.state.global_step == 4
    for (name, got), want in zip(resumed.model.state_dict().items(), whole.model.state_dict().values()):
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=name)


def test_micro_batch_size_is_the_earlier_spelling_of_whole_batch_accumulation(tmp_path):
    with pytest.warns(FutureWarning, match="per_device_train_batch_size=2, gradient_accumulation_steps=4"):
        args = vrl_args(tmp_path, per_device_train_batch_size=8, micro_batch_size=2)
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (2, 4)
    assert (args.accumulation, args.micro_batch_size) == ("whole_batch", None)
    assert vrl_args(tmp_path, **args.to_dict()).to_dict() == args.to_dict()  # a round trip keeps its meaning
    with pytest.raises(ValueError, match="must divide"):
        vrl_args(tmp_path, per_device_train_batch_size=8, micro_batch_size=3)


def test_micro_batch_size_with_accumulation_steps_is_refused(tmp_path):
    """Before, each of the 2 whole-batch losses was back-propagated undivided: gradients 2x the step's. Now
    the combination is refused, naming the layout of one loss over the step."""
    with pytest.raises(ValueError, match="per_device_train_batch_size=2, gradient_accumulation_steps=8"):
        vrl_args(tmp_path, per_device_train_batch_size=8, micro_batch_size=2, gradient_accumulation_steps=2)


def test_whole_batch_over_many_micro_batches_has_the_gradient_of_the_step(tmp_path):
    """The step's gradient, not k times it: 8 micro-batches of 1 give one batch of 8 (ratio 1)."""
    _, grads = clip_step(tmp_path / "one", 8)
    _, whole = clip_step(tmp_path / "whole", 1, 8, "whole_batch")
    ratio = sum((whole[n] * grads[n]).sum() for n in grads) / sum((grads[n] ** 2).sum() for n in grads)
    assert float(ratio) == pytest.approx(1.0, abs=1e-9)


# -- two processes ----------------------------------------------------------------------------------------


def whole_batch_worker(rank: int, port: int, out_dir: str, dropout: float = 0.0) -> None:
    """One rank of 2: 4 pairs in 2 micro-batches, the CLIP loss over both processes' 8; rank 0 writes."""
    import os

    from _dist_worker import _shutdown

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2"
    )
    torch.set_num_threads(1)
    loss, grads = clip_step(out_dir, 2, 2, "whole_batch", dropout)
    if rank == 0:
        save_file({**grads, "loss": torch.tensor(loss)}, os.path.join(out_dir, "grads.safetensors"))
    _shutdown()


def test_two_processes_with_micro_batches_equal_one_process_over_the_global_batch(tmp_path):
    from _dist_worker import free_port

    loss, grads = clip_step(tmp_path / "one", 8)
    mp.spawn(whole_batch_worker, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    two = load_file(str(tmp_path / "grads.safetensors"))
    assert two.pop("loss").item() == pytest.approx(loss, rel=1e-6)  # the log averages float32 per-rank losses
    assert_same_gradients(two, grads, rtol=1e-9, atol=1e-12)


@pytest.mark.slow
def test_dropout_draws_the_same_masks_on_two_processes_as_on_one(tmp_path):
    """Each micro-batch's masks come from (seed, step, its place among the step's micro-batches): process p
    of 2 trains the step's micro-batches p and p + 2, drawing what 1 process draws for them (issue 27)."""
    from _dist_worker import free_port

    loss, grads = clip_step(tmp_path / "one", 2, 4, "whole_batch", dropout=0.3)
    _, undropped = clip_step(tmp_path / "plain", 2, 4, "whole_batch")
    assert relative_gap(grads, undropped) > 1e-2  # the masks matter
    mp.spawn(whole_batch_worker, args=(free_port(), str(tmp_path), 0.3), nprocs=2, join=True)
    two = load_file(str(tmp_path / "grads.safetensors"))
    assert two.pop("loss").item() == pytest.approx(loss, rel=1e-6)
    assert_same_gradients(two, grads, rtol=1e-9, atol=1e-12)
