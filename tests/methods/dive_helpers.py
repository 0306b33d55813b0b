"""Shared pieces of the DiVE tests: a tiny CLIP, tensor rows (target and reference), a DiVETrainer factory,
and the two-process gloo workers (started with torch.multiprocessing.spawn by the test files)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch
from _dist_worker import WORLD_SIZE, _init, _shutdown
from safetensors.torch import save_file

from hf_vrl.methods.dcr.toy import tiny_clip
from hf_vrl.methods.dive.loss import dive_losses
from hf_vrl.methods.dive.settings import DiVESettings
from hf_vrl.methods.dive.sigmoid_loss import sigmoid_contrastive_loss
from hf_vrl.methods.dive.trainer import DiVETrainer
from hf_vrl.trainer import VRLTrainingArguments

VOCAB, EOS, SEQ_LEN, IMAGE_SIZE = 100, 1, 6, 16
TOWER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
# Adam turns the float noise of gradients that are zero in exact arithmetic (the key biases: softmax ignores
# a shift of all keys) into +-lr updates; comparisons of weights across process layouts use plain SGD.
SGD = {"optim": "sgd", "learning_rate": 0.05}
GLOBAL_BATCH, DIM, STEPS = 6, 5, 3
TRAIN_STEPS = 5  # DiVETrainer's two-process run: crosses a pass of the reference and of the target rows


def model(seed: int = 0):
    """A 2-layer, 32-wide CLIPModel on 16-px images (the same weights for a given seed)."""
    return tiny_clip(image_size=IMAGE_SIZE, vocab_size=VOCAB, seed=seed)


def tiny_siglip():
    """A 1-layer SiglipModel with pre-trained-like t ~ 117 (above CLIP's clamp of 100) and b ~ -13."""
    from transformers import SiglipConfig, SiglipModel

    text = dict(
        vocab_size=VOCAB, max_position_embeddings=SEQ_LEN, bos_token_id=0, eos_token_id=EOS, pad_token_id=EOS
    )
    config = SiglipConfig(
        text_config=text | TOWER, vision_config=TOWER | dict(image_size=IMAGE_SIZE, patch_size=8)
    )
    torch.manual_seed(0)
    siglip = SiglipModel(config)
    with torch.no_grad():
        siglip.logit_scale.fill_(math.log(117.0))
        siglip.logit_bias.fill_(-13.0)
    return siglip


def tiny_diffclip():
    """A 1-layer DiffCLIP (differential attention in both towers)."""
    from hf_vrl.models.diffclip import DiffCLIPConfig, DiffCLIPModel

    text = dict(vocab_size=VOCAB, max_position_embeddings=SEQ_LEN, eos_token_id=EOS, pad_token_id=0)
    vision = dict(image_size=IMAGE_SIZE, patch_size=8)
    heads = dict(num_attention_heads=4)
    config = DiffCLIPConfig(
        projection_dim=16, text_config=TOWER | heads | text, vision_config=TOWER | heads | vision
    )
    torch.manual_seed(0)
    return DiffCLIPModel(config)


def rows(n: int, seed: int) -> list[dict[str, torch.Tensor]]:
    """Random image / caption rows as the collators produce them (tokenised, 16-px pixels)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = 3 + i % (SEQ_LEN - 2)
        ids = torch.zeros(SEQ_LEN, dtype=torch.long)
        ids[: length - 1] = torch.randint(2, VOCAB, (length - 1,), generator=gen)
        ids[length - 1] = EOS
        out.append(
            {
                "pixel_values": torch.randn(3, IMAGE_SIZE, IMAGE_SIZE, generator=gen),
                "input_ids": ids,
                "attention_mask": (torch.arange(SEQ_LEN) < length).long(),
                "class_labels": torch.tensor(i % 3),
            }
        )
    return out


def collate(batch_rows):
    return {key: torch.stack([row[key] for row in batch_rows]) for key in batch_rows[0]}


def trainer(
    out_dir,
    settings: DiVESettings,
    *,
    steps: int,
    batch: int = 4,
    target=None,
    reference=None,
    seed: int = 0,
    dual_encoder=None,
    **kwargs,
) -> DiVETrainer:
    """A DiVETrainer on `dual_encoder` (default: a fresh tiny CLIP, seed 0), tensor rows, sequential order."""
    args = dict(
        output_dir=str(out_dir),
        max_steps=steps,
        per_device_train_batch_size=batch,
        learning_rate=5e-3,
        use_cpu=True,
        report_to="none",
        remove_unused_columns=False,
        save_strategy="no",
        logging_steps=1,
        train_sampling_strategy="sequential",
        disable_tqdm=True,
        seed=seed,
    )
    return DiVETrainer(
        model=dual_encoder if dual_encoder is not None else model(),
        args=VRLTrainingArguments(**(args | kwargs)),
        train_dataset=target if target is not None else rows(16, seed=1),
        data_collator=collate,
        settings=settings,
        reference_dataset=reference if reference is not None else rows(24, seed=2),
        reference_collator=collate,
    )


# -- two-process workers -----------------------------------------------------------------------------------


def global_batches() -> list[list[torch.Tensor]]:
    """STEPS batches of (img_ft, img_pre, txt_ft, txt_pre), float64, the same in every process."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(STEPS):
        pre = [torch.randn(GLOBAL_BATCH, DIM, generator=gen, dtype=torch.float64) for _ in range(2)]
        ft = [p + 0.3 * torch.randn(GLOBAL_BATCH, DIM, generator=gen, dtype=torch.float64) for p in pre]
        out.append([ft[0], pre[0], ft[1], pre[1]])
    return out


def local_rows(rank: int) -> slice:
    size = GLOBAL_BATCH // WORLD_SIZE
    return slice(rank * size, (rank + 1) * size)


def loss_worker(rank: int, port: int, out_dir: str) -> None:
    """dive_losses over STEPS batches carrying m, and the sigmoid loss, on this rank's rows."""
    _init(rank, port)
    results = {}
    m = torch.zeros(DIM, dtype=torch.float64)
    for step, batch in enumerate(global_batches()):
        local = [t[local_rows(rank)].clone() for t in batch]
        local[0].requires_grad_(), local[2].requires_grad_()
        avl, pvl, m = dive_losses(*local, m, alpha=0.9)  # rank / world size from the process group
        (avl + pvl).backward()
        results |= {f"{step}/m": m, f"{step}/avl": avl.detach(), f"{step}/pvl": pvl.detach()}
        results |= {f"{step}/img_grad": local[0].grad, f"{step}/txt_grad": local[2].grad}
    image, _, text, _ = (t[local_rows(rank)].clone().requires_grad_() for t in global_batches()[0])
    loss = sigmoid_contrastive_loss(image, text, 5.0, -1.0)
    loss.backward()
    results |= {"sigmoid/loss": loss.detach(), "sigmoid/img_grad": image.grad, "sigmoid/txt_grad": text.grad}
    save_file({k: v.contiguous() for k, v in results.items()}, str(Path(out_dir) / f"rank{rank}.safetensors"))
    _shutdown()


def global_draw_trainer(out_dir, batch: int) -> DiVETrainer:
    """DiVE with B' = 4 from a 12-row reference set (3 draws per pass: the rows a draw holds depend on how
    draws are laid out over processes) and 16 target rows as the run layer feeds them (a SeededDataset:
    seeded order per epoch); TRAIN_STEPS steps of `batch` per process."""
    from hf_vrl.run.data import SeededDataset

    settings = DiVESettings(reference_dataset="tensor rows", reference_batch_size=4)
    target = SeededDataset(rows(16, seed=1), seed=0)
    reference = rows(12, seed=2)
    run = trainer(
        out_dir, settings, steps=TRAIN_STEPS, batch=batch, target=target, reference=reference, **SGD
    )
    run.data_collator = lambda batch: collate(
        [{k: v for k, v in r.items() if k != "sample_seed"} for r in batch]
    )
    return run


def trainer_worker(rank: int, port: int, out_dir: str) -> None:
    """`global_draw_trainer` on 2 CPU processes, 2 target rows per rank (B' = 4 in all, 2 per rank); rank r
    writes m, its weights and the losses."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2"
    )
    torch.set_num_threads(1)
    run = global_draw_trainer(out_dir, batch=2)
    run.train()
    state = {f"param/{k}": v.detach().clone() for k, v in run.model.state_dict().items()}
    state |= {f"extra/{k}": v.cpu() for k, v in run.extra_state().items()}
    state["loss"] = torch.tensor([h["loss"] for h in run.state.log_history if "loss" in h])
    save_file({k: v.contiguous() for k, v in state.items()}, str(Path(out_dir) / f"rank{rank}.safetensors"))
    run.accelerator.free_memory()
    del run
    _shutdown()


def random_tiny_clip_world():
    """The tiny-clip config (random weights) with its processors, and 24 shapes-world images."""
    from transformers import AutoConfig, CLIPModel

    from hf_vrl.data import shapes_dataset
    from hf_vrl.methods.diffclip.build import load_processors
    from hf_vrl.presets import preset_path

    image_processor, tokenizer = load_processors("tiny-clip", "tiny-clip")
    torch.manual_seed(0)
    clip = CLIPModel(AutoConfig.from_pretrained(preset_path("tiny-clip"))).eval()
    return clip, image_processor, tokenizer, shapes_dataset(24, seed=3, image_size=32)
