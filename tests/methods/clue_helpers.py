"""Shared pieces of the CLUE tests: tiny backbone configs, settings, model and toy data, and the worker of the
two-process test (kept light to import: the spawned processes import this module, so transformers and
datasets are imported inside the functions that need them)."""

from __future__ import annotations

import torch

TINY_RESNET = {
    "model_type": "resnet",
    "embedding_size": 8,
    "hidden_sizes": [8, 16],
    "depths": [1, 1],
    "layer_type": "basic",
}
TINY_VIT = {
    "model_type": "vit",
    "image_size": 16,
    "patch_size": 4,
    "hidden_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 32,
}
TINY_HEADS = {"projection_hidden_dim": 32, "projection_dim": 8, "predictor_hidden_dim": 16}


def tiny_config(backbone: dict = TINY_RESNET, **overrides):
    from hf_vrl.models.clue import CLUEConfig

    return CLUEConfig(backbone_config=dict(backbone), **(TINY_HEADS | overrides))


def tiny_model(seed: int = 0, backbone: dict = TINY_RESNET, **overrides):
    from hf_vrl.models.clue import CLUEModel

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return CLUEModel(tiny_config(backbone, **overrides))


def tiny_settings(**overrides):
    from hf_vrl.methods.clue.settings import CLUESettings

    fields = dict(backbone=None, backbone_config=dict(TINY_RESNET), image_size=16, text_encoder="tiny-clip")
    fields |= dict(text_source="caption", **TINY_HEADS)
    return CLUESettings(**(fields | overrides))


def toy_data(n: int = 12, split: str = "train"):
    """`n` 16-pixel shapes-world images (coarse label = shape, fine_label = colour + shape)."""
    from hf_vrl.data.toy import shapes_dataset

    return shapes_dataset(n, seed=0, image_size=16, split=split)


# -- the two-process tests ------------------------------------------------------------------------

DIST_WORLD = 2
DIST_BATCH = 3  # per process


def objective_inputs(batch: int, seed: int = 0) -> tuple[dict, dict, torch.Tensor]:
    """Deterministic float64 branch outputs for `clue_objective` (two views, 3 parts, a text head)."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(batch, *shape, generator=gen, dtype=torch.float64)

    online = {
        "features": rand(2, 6),
        "embeddings": rand(2, 4),
        "part_descriptors": rand(2, 3, 6),
        "text_embeds": rand(2, 5),
    }
    momentum = {
        "features": online["features"] + 0.1 * rand(2, 6),
        "embeddings": rand(2, 4),
        "part_descriptors": rand(2, 3, 6),
    }
    return online, momentum, rand(5)


def dist_objective_worker(rank: int, out_dir: str) -> None:
    """One rank of `test_two_processes_gather_before_sinkhorn`: its rows of the global batch through
    `clue_objective` (rank and world size from the process group); writes losses, targets and gradients."""
    import gc
    from pathlib import Path

    import torch.distributed as dist
    import torch.nn.functional as F
    from safetensors.torch import save_file

    from hf_vrl.contrastive import gather_features
    from hf_vrl.methods.clue.loss import clue_objective, sinkhorn

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{out_dir}/rendezvous", rank=rank, world_size=DIST_WORLD
    )
    online, momentum, text = objective_inputs(batch=DIST_BATCH * DIST_WORLD)
    rows = slice(rank * DIST_BATCH, (rank + 1) * DIST_BATCH)
    online = {key: value[rows].clone() for key, value in online.items()}
    momentum = {key: value[rows].clone() for key, value in momentum.items()}
    leaves = {key: online[key].requires_grad_() for key in ("embeddings", "part_descriptors", "text_embeds")}
    out = clue_objective(online, momentum, text_embeds=text[rows])
    out["loss"].backward()
    anchors = F.normalize(online["features"][:, 0], dim=-1)
    columns = F.normalize(momentum["features"][:, 0], dim=-1)
    columns = gather_features(columns, columns, gather_with_grad=False, rank=rank, world_size=DIST_WORLD)[0]
    results = {name: value.detach() for name, value in out.items()}
    results["targets"] = sinkhorn(anchors @ columns.T)
    results.update({f"grad/{key}": leaf.grad for key, leaf in leaves.items()})
    save_file({k: v.contiguous() for k, v in results.items()}, str(Path(out_dir) / f"rank{rank}.safetensors"))
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


# -- trainers -------------------------------------------------------------------------------------


def training_args(out_dir, steps: int, batch: int, **overrides):
    from hf_vrl.trainer import VRLTrainingArguments

    settings = dict(
        output_dir=str(out_dir),
        max_steps=steps,
        per_device_train_batch_size=batch,
        learning_rate=0.05,
        optim="sgd",
        save_strategy="no",
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        seed=0,
        remove_unused_columns=False,
        dataloader_drop_last=True,
        disable_tqdm=True,
    )
    return VRLTrainingArguments(**(settings | overrides))


def tiny_bank(data):
    """Description embeddings of the toy captions by the fixed random tiny-clip text tower."""
    from hf_vrl.methods.clue.text import build_text_bank, descriptions_of

    return build_text_bank(descriptions_of(data, "caption"), "tiny-clip", text_source="caption", device="cpu")


def clue_trainer(out_dir, data, steps: int = 3, batch: int = 4, settings=None, seed: int = 0, **args):
    """A CLUETrainer on a tiny ResNet (text head sized to tiny-clip) with the text bank of `data`."""
    from hf_vrl.methods.clue.model import build_model
    from hf_vrl.methods.clue.trainer import CLUETrainer

    settings = settings or tiny_settings()
    bank = tiny_bank(data) if settings.uses_text else None
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = build_model(settings, text_embed_dim=bank.dim if bank else None)
    return CLUETrainer(
        model=model,
        args=training_args(out_dir, steps, batch, **args),
        train_dataset=data,
        settings=settings,
        text_bank=bank,
    )


def seeded_rows(n: int):
    """Toy rows with a `sample_seed` column (as the run layer adds it)."""
    data = toy_data(n)
    return data.add_column("sample_seed", list(range(1000, 1000 + n)))


def dist_trainer_worker(rank: int, out_dir: str, port: int) -> None:
    """One rank of the two-process CLUETrainer test: 1 step, DIST_BATCH rows per process, rows in order;
    writes rank 0's log and every rank's final weights."""
    import gc
    import os
    from pathlib import Path

    import torch.distributed as dist
    from safetensors.torch import save_file

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2"
    )
    torch.set_num_threads(1)
    data = seeded_rows(DIST_BATCH * DIST_WORLD)
    trainer = clue_trainer(out_dir, data, steps=1, batch=DIST_BATCH, train_sampling_strategy="sequential")
    trainer.train()
    state = {k: v.detach().contiguous() for k, v in trainer.model.state_dict().items()}
    save_file(state, str(Path(out_dir) / f"weights{rank}.safetensors"))
    if rank == 0:
        logs = {k: torch.tensor(float(v)) for k, v in trainer.state.log_history[0].items()}
        save_file(logs, str(Path(out_dir) / "log.safetensors"))
    trainer.accelerator.free_memory()
    del trainer
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


# -- a tiny image-text-to-text model ---------------------------------------------------------------

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for c in m['content'] %}{% if c['type'] == 'image' %}<image>{% else %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)


def tiny_vlm(seed: int = 0):
    """A random LLaVA (2-layer CLIP tower on 16-px images, 2-layer Llama) with a byte-level tokenizer and a
    chat template: real generation mechanics, meaningless text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import (
        CLIPImageProcessorPil,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
        PreTrainedTokenizerFast,
    )

    specials = ["<pad>", "<s>", "</s>", "<image>"]
    vocab = {token: i for i, token in enumerate(specials + sorted(pre_tokenizers.ByteLevel.alphabet()))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        extra_special_tokens=["<image>"],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    image_processor = CLIPImageProcessorPil(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16})
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=4,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,  # the [CLS] token, dropped by the "default" strategy
        chat_template=CHAT_TEMPLATE,
    )
    vision = dict(image_size=16, patch_size=4, hidden_size=16, intermediate_size=32, num_attention_heads=2)
    vision = CLIPVisionConfig(num_hidden_layers=2, **vision)
    text = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=vocab["<image>"],
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return LlavaForConditionalGeneration(config).eval(), processor
