"""VRLTrainer / ContrastiveTrainer on a tiny random CLIPModel: training, metric logging, GA scaling, DDP."""

from __future__ import annotations

import logging
import math

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file
from torch import nn
from transformers import CLIPConfig, CLIPModel, TrainingArguments
from transformers.modeling_outputs import BaseModelOutputWithPooling

from hf_vrl.contrastive import as_embeddings, clip_contrastive_loss
from hf_vrl.trainer import ContrastiveTrainer, VRLTrainer

VOCAB, EOS, SEQ_LEN, IMAGE_SIZE = 100, 99, 6, 16
PAIRS_PER_STEP = 4


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models gain nothing from threads; on a loaded 2-core machine threads oversubscribe badly."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_clip(seed: int = 0) -> CLIPModel:
    torch.manual_seed(seed)
    config = CLIPConfig(
        text_config=dict(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=SEQ_LEN,
            eos_token_id=EOS,
            pad_token_id=0,
        ),
        vision_config=dict(
            image_size=IMAGE_SIZE,
            patch_size=8,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
        ),
        projection_dim=16,
    )
    return CLIPModel(config)


class PairDataset(torch.utils.data.Dataset):
    """Random image / caption pairs; the ``labels`` key is there on purpose: it arms transformers' GA trap."""

    def __init__(self, n: int, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        self.rows = []
        for i in range(n):
            length = 3 + i % (SEQ_LEN - 2)
            ids = torch.zeros(SEQ_LEN, dtype=torch.long)
            ids[: length - 1] = torch.randint(1, EOS, (length - 1,), generator=gen)
            ids[length - 1] = EOS
            self.rows.append(
                {
                    "pixel_values": torch.randn(3, IMAGE_SIZE, IMAGE_SIZE, generator=gen),
                    "input_ids": ids,
                    "attention_mask": (torch.arange(SEQ_LEN) < length).long(),
                    "labels": torch.tensor(i % 2),
                }
            )

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.rows[i]


def collate(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {key: torch.stack([row[key] for row in rows]) for key in rows[0]}


def training_args(out_dir, **kwargs) -> TrainingArguments:
    defaults = dict(
        output_dir=str(out_dir),
        use_cpu=True,
        report_to="none",
        remove_unused_columns=False,
        save_strategy="no",
        logging_steps=1,
        train_sampling_strategy="sequential",
        disable_tqdm=True,
        seed=0,
    )
    return TrainingArguments(**{**defaults, **kwargs})


def one_step_history(out_dir, per_device_batch, gradient_accumulation_steps, trainer_cls=ContrastiveTrainer):
    """Train one optimizer step over the first PAIRS_PER_STEP pairs (per process); return its log entry."""
    trainer = trainer_cls(
        model=tiny_clip(),
        args=training_args(
            out_dir,
            per_device_train_batch_size=per_device_batch,
            gradient_accumulation_steps=gradient_accumulation_steps,
            max_steps=1,
            learning_rate=1e-3,
        ),
        train_dataset=PairDataset(2 * PAIRS_PER_STEP),
        data_collator=collate,
    )
    trainer.train()
    return trainer.state.log_history[0], trainer


def clip_loss_by_hand(model: CLIPModel, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The loss through get_*_features (not the forward the trainer calls)."""
    image = as_embeddings(model.get_image_features(pixel_values=batch["pixel_values"]))
    text = as_embeddings(
        model.get_text_features(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    )
    return clip_contrastive_loss(image, text, model.logit_scale.exp(), rank=0, world_size=1)


def manual_ga_step(micro_batches: list[dict[str, torch.Tensor]]) -> tuple[float, float]:
    """Mean loss and norm of the mean gradient over micro-batches, on a fresh copy of the initial model."""
    model = tiny_clip()
    losses = []
    for batch in micro_batches:
        loss = clip_loss_by_hand(model, batch)
        (loss / len(micro_batches)).backward()
        losses.append(loss.item())
    grad_norm = torch.sqrt(sum((p.grad**2).sum() for p in model.parameters() if p.grad is not None))
    return sum(losses) / len(losses), grad_norm.item()


def test_trains_logs_metrics_and_evaluates(tmp_path):
    data = PairDataset(8)
    model = tiny_clip()
    trainer = ContrastiveTrainer(
        model=model,
        args=training_args(tmp_path, per_device_train_batch_size=4, max_steps=12, learning_rate=5e-3),
        train_dataset=data,
        data_collator=collate,
    )
    trainer.train()
    train_logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(train_logs) == 12
    losses = [entry["loss"] for entry in train_logs]
    assert all(math.isfinite(loss) for loss in losses)
    assert sum(losses[-2:]) < sum(losses[:2]), losses  # the two batches of the first vs the last epoch
    for entry in train_logs:
        assert 0.0 <= entry["i2t_accuracy"] <= 1.0
    initial_scale = math.exp(model.config.logit_scale_init_value)
    assert train_logs[0]["logit_scale"] == pytest.approx(initial_scale, rel=1e-5)
    assert train_logs[-1]["logit_scale"] != pytest.approx(initial_scale, rel=1e-5)  # the scale is trained

    metrics = trainer.evaluate(eval_dataset=data)  # default eval batch 8: the whole set in one batch
    model.eval()
    with torch.no_grad():
        batch = collate(data.rows)
        expected_loss = clip_loss_by_hand(model, batch).item()
        image = as_embeddings(model.get_image_features(pixel_values=batch["pixel_values"]))
        text = as_embeddings(
            model.get_text_features(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        )
        sims = nn.functional.normalize(image, dim=-1) @ nn.functional.normalize(text, dim=-1).T
        expected_accuracy = (sims.argmax(-1) == torch.arange(8)).float().mean().item()
    assert metrics["eval_loss"] == pytest.approx(expected_loss, rel=1e-5)
    assert metrics["eval_i2t_accuracy"] == pytest.approx(expected_accuracy)
    assert metrics["eval_logit_scale"] == pytest.approx(model.logit_scale.exp().item(), rel=1e-6)
    assert "i2t_accuracy" not in metrics  # train metrics stay out of the eval log


class DefaultGAScalingTrainer(ContrastiveTrainer):
    """Negative control: transformers' default GA rule (a ``labels`` key => 'loss already scaled')."""

    loss_is_scaled_for_ga = None


def test_gradient_accumulation_matches_mean_of_micro_batches(tmp_path):
    data = PairDataset(PAIRS_PER_STEP)
    micro = [collate(data.rows[:2]), collate(data.rows[2:])]
    expected_loss, expected_norm = manual_ga_step(micro)

    history, _ = one_step_history(tmp_path / "ga", per_device_batch=2, gradient_accumulation_steps=2)
    assert history["loss"] == pytest.approx(expected_loss, rel=1e-5)
    assert history["grad_norm"] == pytest.approx(expected_norm, rel=1e-4)

    # the same check fails when the loss is not divided by the GA steps: it can tell right from wrong
    wrong, _ = one_step_history(tmp_path / "bad", 2, 2, trainer_cls=DefaultGAScalingTrainer)
    assert wrong["grad_norm"] == pytest.approx(2 * expected_norm, rel=1e-4)
    assert wrong["loss"] == pytest.approx(2 * expected_loss, rel=1e-5)


def scale_derivative_by_loops(image: torch.Tensor, text: torch.Tensor, log_scale: float) -> float:
    """d loss / d log_scale of the symmetric InfoNCE, from its formula with plain loops (float64).

    loss = 1/2 [mean_i(-t S_ii + log sum_j exp(t S_ij)) + mean_j(-t S_jj + log sum_i exp(t S_ij))], t = e^s,
    S the cosine similarities; d loss / dt = 1/2 [mean_i(-S_ii + sum_j p_ij S_ij) + mean_j(-S_jj + sum_i q_ij
    S_ij)] with p, q the softmax over a row, a column; d loss / ds = t d loss / dt.
    """
    image = nn.functional.normalize(image.double(), dim=-1)
    text = nn.functional.normalize(text.double(), dim=-1)
    n, t = image.shape[0], math.exp(log_scale)
    sims = [[float(image[i] @ text[j]) for j in range(n)] for i in range(n)]
    rows = cols = 0.0
    for i in range(n):
        weights = [math.exp(t * sims[i][j]) for j in range(n)]
        rows += -sims[i][i] + sum(w * sims[i][j] for j, w in enumerate(weights)) / sum(weights)
        weights = [math.exp(t * sims[j][i]) for j in range(n)]
        cols += -sims[i][i] + sum(w * sims[j][i] for j, w in enumerate(weights)) / sum(weights)
    return t * 0.5 * (rows / n + cols / n)


def test_logit_scale_gets_gradient_at_the_cap(tmp_path):
    """At the cap (log 100 in float32, where OpenAI's checkpoints start) the loss still moves the scale."""
    model = tiny_clip()
    with torch.no_grad():
        model.logit_scale.fill_(math.log(100.0))
    trainer = ContrastiveTrainer(model=model, args=training_args(tmp_path))
    batch = collate(PairDataset(4).rows)
    trainer.compute_loss(model, batch).backward()
    with torch.no_grad():
        out = model(**{k: batch[k] for k in ("pixel_values", "input_ids", "attention_mask")})
    expected = scale_derivative_by_loops(out.image_embeds, out.text_embeds, model.logit_scale.item())
    assert abs(expected) > 1e-3  # a case where the scale has somewhere to go
    assert model.logit_scale.grad.item() == pytest.approx(expected, rel=1e-4)


def test_logit_scale_trains_from_the_cap(tmp_path):
    """Started at 100, the scale moves (here down: random embeddings); it never exceeds the cap."""
    model = tiny_clip()
    with torch.no_grad():
        model.logit_scale.fill_(math.log(100.0))
    trainer = ContrastiveTrainer(
        model=model,
        args=training_args(tmp_path, per_device_train_batch_size=4, max_steps=4, learning_rate=1e-2),
        train_dataset=PairDataset(8),
        data_collator=collate,
    )
    trainer.train()
    scales = [entry["logit_scale"] for entry in trainer.state.log_history if "logit_scale" in entry]
    assert scales[0] == pytest.approx(100.0)
    assert scales[-1] < 99.0 and max(scales) <= 100.0 + 1e-4
    assert model.logit_scale.item() < math.log(99.0)


def test_logit_scale_is_clamped_before_training_and_after_each_step(tmp_path):
    model = tiny_clip()
    with torch.no_grad():
        model.logit_scale.fill_(math.log(200.0))
    trainer = ContrastiveTrainer(
        model=model,
        args=training_args(tmp_path, per_device_train_batch_size=4, max_steps=1, learning_rate=1e-3),
        train_dataset=PairDataset(4),
        data_collator=collate,
    )
    trainer.train()
    assert trainer.state.log_history[0]["logit_scale"] == pytest.approx(100.0)  # clamped before the step
    assert model.logit_scale.item() <= math.log(100.0) + 1e-6  # and after it (float32 rounding of log 100)


def test_remove_unused_columns_is_forced_off(tmp_path, caplog):
    args = training_args(tmp_path, remove_unused_columns=True)
    with caplog.at_level(logging.WARNING, logger="hf_vrl.trainer"):
        trainer = VRLTrainer(model=tiny_clip(), args=args, data_collator=collate)
    assert trainer.args.remove_unused_columns is False
    assert "remove_unused_columns=False" in caplog.text


def test_store_metrics_and_log(tmp_path):
    def last_log():
        return {k: v for k, v in trainer.state.log_history[-1].items() if k not in ("epoch", "step")}

    trainer = VRLTrainer(model=tiny_clip(), args=training_args(tmp_path))
    trainer.model.train()
    trainer.store_metrics(
        {"scale": torch.tensor(1.0, requires_grad=True), "hit": torch.tensor([1.0, 0.0, 1.0, 1.0])}
    )
    trainer.store_metrics({"scale": 3.0, "hit": torch.tensor([0.0, 0.0, 1.0, 1.0])})
    trainer.log({"loss": 0.5})
    assert last_log() == {"loss": 0.5, "scale": 2.0, "hit": 0.625}
    trainer.model.eval()
    trainer.store_metrics({"scale": 4.0})
    trainer.log({"eval_loss": 0.1})
    assert last_log() == {"eval_loss": 0.1, "eval_scale": 4.0}
    trainer.log({"eval_loss": 0.2})  # the stored values were consumed
    assert last_log() == {"eval_loss": 0.2}
    with pytest.raises(ValueError, match="per-sample vector"):
        trainer.store_metrics({"matrix": torch.ones(2, 2)})


class NoEmbeddings(nn.Module):
    def __init__(self):
        super().__init__()
        self.logit_scale = nn.Parameter(torch.tensor(1.0))

    def forward(self, pixel_values, input_ids, attention_mask=None):
        return BaseModelOutputWithPooling(pooler_output=pixel_values.flatten(1))


def test_clear_errors(tmp_path):
    batch = collate(PairDataset(2).rows)
    trainer = ContrastiveTrainer(model=tiny_clip(), args=training_args(tmp_path))
    with pytest.raises(KeyError, match="pixel_values"):
        trainer.compute_loss(trainer.model, {k: v for k, v in batch.items() if k != "pixel_values"})
    trainer = ContrastiveTrainer(model=NoEmbeddings(), args=training_args(tmp_path))
    with pytest.raises(TypeError, match="image_embeds"):
        trainer.compute_loss(trainer.model, batch)


def test_two_processes_match_one_process_on_global_batch(tmp_path):
    """DDP over 2 gloo processes (2 pairs each) == one process over the 4 pairs: same loss, same grad norm."""
    from _dist_worker import WORLD_SIZE, free_port, trainer_worker

    single, _ = one_step_history(
        tmp_path / "single", per_device_batch=PAIRS_PER_STEP, gradient_accumulation_steps=1
    )
    mp.spawn(trainer_worker, args=(free_port(), str(tmp_path)), nprocs=WORLD_SIZE, join=True)
    distributed = {
        key: value.item() for key, value in load_file(str(tmp_path / "history.safetensors")).items()
    }
    assert distributed["loss"] == pytest.approx(single["loss"], rel=1e-5)
    assert distributed["grad_norm"] == pytest.approx(single["grad_norm"], rel=1e-4)
    assert distributed["logit_scale"] == pytest.approx(single["logit_scale"], rel=1e-6)
