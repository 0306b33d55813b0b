"""`hf-vrl llava-align`: relearn LLaVA's projector for a new vision tower (LLaVA's stage 1, with trl).

    hf-vrl llava-align --llava llava-hf/llava-1.5-7b-hf --vision runs/diffclip/final \\
        --dataset cc3m:/data/cc3m --max-steps 2200 --output runs/llava-diffclip

Stage 1 of LLaVA (feature alignment): the vision tower and the language model stay frozen and only
`multi_modal_projector` learns to caption image–caption pairs; the loss is the caption's next-token loss, the
prompt (the image tokens) is masked out. Training is trl's `SFTTrainer` on its prompt-completion format
(`{"image", "prompt", "completion"}`, collated by `DataCollatorForVisionLanguageModeling`). Defaults follow
LLaVA-1.5's pre-training: learning rate 1e-3, cosine schedule, 3 % warm-up, no weight decay, one epoch
(its global batch is 256: set --batch-size × --gradient-accumulation-steps × GPUs). The caption loss on
held-out pairs is measured before and after (`llava_align.json` in the output); the output folder holds the
aligned LLaVA and its processor; it is new, empty or an earlier `hf-vrl llava-align`'s
(`hf_vrl.run.layout.OutputDir`), held by one process at a time. Several GPUs:
`accelerate launch -m hf_vrl.cli llava-align ...`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset, IterableDataset
from safetensors.torch import load_file, save_file
from transformers import LlavaProcessor
from trl import SFTConfig, SFTTrainer

from hf_vrl.errors import UserError
from hf_vrl.integrations.llava_export import add_tower_arguments
from hf_vrl.run.layout import OutputDir, last_complete_checkpoint, write_checkpoint_manifest
from hf_vrl.run.preflight import check_loggers
from hf_vrl.trainer import set_logging_dir

PROJECTOR = "model.multi_modal_projector."
PROJECTOR_WEIGHTS = "projector.safetensors"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def freeze_all_but_projector(llava_model: torch.nn.Module) -> None:
    """Freeze the vision tower and the language model: only `multi_modal_projector` keeps its gradients."""
    for name, parameter in llava_model.named_parameters():
        parameter.requires_grad_(name.startswith(PROJECTOR))


def caption_pairs(
    dataset: Dataset | IterableDataset, prompt: str, eos_token: str
) -> Dataset | IterableDataset:
    """Image–caption rows (`image`, `caption`) as trl's vision prompt-completion rows: the prompt holds the
    image token, the completion is the caption ended by EOS (trl adds none to vision datasets)."""
    if isinstance(dataset, Dataset):  # new columns only: the images are not rewritten
        completions = [caption + eos_token for caption in dataset["caption"]]
        dataset = dataset.add_column("prompt", [prompt] * len(dataset)).add_column("completion", completions)
    else:
        dataset = dataset.map(lambda row: {"prompt": prompt, "completion": row["caption"] + eos_token})
    return dataset.select_columns(["image", "prompt", "completion"])


def hold_out(
    dataset: Dataset | IterableDataset, n: int, seed: int
) -> tuple[Dataset | IterableDataset, Dataset]:
    """(training rows, `n` held-out rows): a seeded split of a map-style dataset; the first `n` rows of a
    stream, materialised so every evaluation sees the same pairs."""
    if isinstance(dataset, Dataset):
        if n >= len(dataset):
            raise UserError(f"--eval-samples {n} leaves no training pairs of {len(dataset)}; lower it.")
        split = dataset.train_test_split(test_size=n, seed=seed)
        return split["train"], split["test"]
    return dataset.skip(n), Dataset.from_list(list(dataset.take(n)))


class ProjectorSFTTrainer(SFTTrainer):
    """trl's `SFTTrainer` whose checkpoints hold the projector alone (`projector.safetensors`): the frozen
    tower and language model are re-read from their sources on resume. A full checkpoint of a 7B LLaVA is
    ~28 GB, and transformers' resume loads its keys without LLaVA's renames (transformers#43701): nothing
    would be restored."""

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        if not self.args.should_save:
            return
        folder = Path(output_dir or self.args.output_dir)
        folder.mkdir(parents=True, exist_ok=True)
        projector = self.accelerator.unwrap_model(self.model).model.multi_modal_projector
        state = {key: value.contiguous() for key, value in projector.state_dict().items()}
        save_file(state, str(folder / PROJECTOR_WEIGHTS))

    def _save_checkpoint(self, model: torch.nn.Module, trial: Any) -> None:
        """The Trainer's checkpoint, then its `checkpoint.json` (the files a complete one holds)."""
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            folder = Path(self._get_output_dir(trial)) / f"checkpoint-{self.state.global_step}"
            write_checkpoint_manifest(folder)

    def _load_from_checkpoint(
        self, resume_from_checkpoint: str, model: torch.nn.Module | None = None
    ) -> None:
        projector = self.accelerator.unwrap_model(model or self.model).model.multi_modal_projector
        projector.load_state_dict(load_file(str(Path(resume_from_checkpoint) / PROJECTOR_WEIGHTS)))


def resume_point(checkpoints: Path) -> str | None:
    """The checkpoint `--resume` continues from: the newest complete one (`hf_vrl.run.layout`: every file
    its manifest lists there and readable; newer incomplete ones are skipped and logged), or None."""
    found = last_complete_checkpoint(checkpoints, report=True)
    return None if found is None else str(found)


def align_projector(
    llava_model: torch.nn.Module,
    processor: LlavaProcessor,
    train_dataset: Dataset | IterableDataset,
    eval_dataset: Dataset,
    args: SFTConfig,
    resume_from_checkpoint: str | bool | None = None,
    logging_dir: str | None = None,
) -> dict[str, float]:
    """Train only the projector of `llava_model` with trl's `SFTTrainer` on
    prompt-completion rows (`caption_pairs`); returns the held-out caption loss before and after.
    `logging_dir`: TensorBoard's folder when `args.report_to` has it."""
    freeze_all_but_projector(llava_model)
    trainer = ProjectorSFTTrainer(
        model=llava_model,
        args=args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=processor,
    )
    set_logging_dir(trainer, logging_dir)
    before = trainer.evaluate()["eval_loss"]
    trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    after = trainer.evaluate()["eval_loss"]
    return {"eval_loss_before": before, "eval_loss_after": after, "steps": trainer.state.global_step}


def _default(text: str) -> str:
    return f"{text} (default: %(default)s)"


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-vrl llava-align",
        description="Relearn a LLaVA's projector (tower and language model frozen) on image-caption pairs: "
        "LLaVA's stage-1 recipe, with trl's SFTTrainer.",
        epilog="Without --vision the LLaVA's own projector is re-tuned for its current tower. Flags take "
        "either spelling (--output-dir, --output_dir) and train's names (--num-train-epochs, --precision, "
        "--num-workers, --train-limit), as in hf-vrl train.",
    )
    output_help = "folder for the aligned LLaVA, its processor and llava_align.json (checkpoints go to "
    add_tower_arguments(parser, vision_required=False, output_help=output_help + "<output>/checkpoints)")
    data = parser.add_argument_group("data")
    data.add_argument(
        "--dataset",
        default="shapes",
        help="image-caption pairs: a hf_vrl.data name or path (default: the generated shapes world)",
    )
    data.add_argument(
        "--train-limit",
        "--max-train-samples",
        dest="max_train_samples",
        type=int,
        help="use at most this many pairs (default: all)",
    )
    data.add_argument("--eval-samples", type=int, default=256, help=_default("held-out pairs for the loss"))
    data.add_argument(
        "--prompt",
        default="<image>\n",
        help="prompt before each caption, with the image token "
        "once (default: '<image>\\n', LLaVA's pre-training template)",
    )
    data.add_argument("--max-length", type=int, default=2048, help=_default("truncate sequences to this"))
    train = parser.add_argument_group("training")
    train.add_argument(
        "--max-steps",
        type=int,
        default=-1,
        help="optimizer steps (default: -1, use --epochs; a streamed dataset needs a number)",
    )
    train.add_argument(
        "--num-train-epochs", "--epochs", dest="epochs", type=float, default=1.0, help=_default("passes")
    )
    train.add_argument("--batch-size", type=int, default=32, help=_default("pairs per device and step"))
    train.add_argument("--gradient-accumulation-steps", type=int, default=1, help=_default("micro-batches"))
    train.add_argument("--learning-rate", type=float, default=1e-3, help=_default("peak learning rate"))
    train.add_argument("--warmup-ratio", type=float, default=0.03, help=_default("warm-up part of the steps"))
    train.add_argument("--dtype", default="float32", choices=tuple(DTYPES), help=_default("LLaVA dtype"))
    train.add_argument(
        "--precision",
        "--mixed-precision",
        dest="mixed_precision",
        default="no",
        choices=("no", "bf16", "fp16"),
        help=_default("autocast"),
    )
    train.add_argument("--activation-checkpointing", action="store_true", help="recompute activations")
    train.add_argument("--logging-steps", type=int, default=10, help=_default("log every this many steps"))
    train.add_argument(
        "--save-steps", type=int, default=500, help=_default("checkpoint every this many steps")
    )
    train.add_argument(
        "--num-workers",
        "--dataloader-num-workers",
        dest="dataloader_num_workers",
        type=int,
        default=0,
        help=_default("loader processes"),
    )
    train.add_argument(
        "--seed", type=int, default=0, help=_default("seed of the split, new projector, order")
    )
    train.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --output")
    logs = parser.add_argument_group("logging")
    logs.add_argument(
        "--report-to",
        nargs="+",
        default=["none"],
        help="where the training logs go, as in hf-vrl train: none, all, tensorboard, wandb, ... "
        "(default: none)",
    )
    logs.add_argument("--logging-dir", help="TensorBoard's folder (default: <output>/logs)")
    return parser


def _validate(options: argparse.Namespace) -> None:
    positive = ("eval_samples", "max_length", "batch_size", "gradient_accumulation_steps", "logging_steps")
    for name in (*positive, "save_steps", "epochs", "learning_rate"):
        if getattr(options, name) <= 0:
            raise UserError(f"--{name.replace('_', '-')} must be positive (got {getattr(options, name)}).")
    if options.max_train_samples is not None and options.max_train_samples <= options.eval_samples:
        raise UserError("--max-train-samples must exceed --eval-samples (the held-out pairs come from it).")
    if not 0 <= options.warmup_ratio < 1:
        raise UserError(f"--warmup-ratio must lie in [0, 1) (got {options.warmup_ratio}).")
    check_loggers(options.report_to)


def _check_prompt(prompt: str, image_token: str) -> None:
    if prompt.count(image_token) != 1:
        raise UserError(f"--prompt must hold the image token {image_token!r} exactly once (got {prompt!r}).")


def sft_config(options: argparse.Namespace, output_dir: Path, streamed: bool) -> SFTConfig:
    """trl's `SFTConfig` for the projector run (LLaVA-1.5 stage-1 defaults, see the module docstring)."""
    if streamed and options.max_steps <= 0:
        raise UserError("a streamed dataset has no length: set --max-steps.")
    return SFTConfig(
        output_dir=str(output_dir),
        max_steps=options.max_steps,
        num_train_epochs=options.epochs,
        per_device_train_batch_size=options.batch_size,
        per_device_eval_batch_size=options.batch_size,
        gradient_accumulation_steps=options.gradient_accumulation_steps,
        learning_rate=options.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=options.warmup_ratio,
        weight_decay=0.0,
        bf16=options.mixed_precision == "bf16",
        fp16=options.mixed_precision == "fp16",
        activation_checkpointing=options.activation_checkpointing,
        max_length=options.max_length,
        logging_steps=options.logging_steps,
        save_strategy="steps",
        save_steps=options.save_steps,
        save_total_limit=1,
        seed=options.seed,
        dataloader_num_workers=options.dataloader_num_workers,
        dataloader_pin_memory=torch.cuda.is_available(),
        use_cpu=not torch.cuda.is_available(),
        report_to=options.report_to,
    )


def _load_pairs(
    options: argparse.Namespace, prompt: str, eos_token: str
) -> tuple[Dataset | IterableDataset, Dataset]:
    """(training pairs, held-out pairs) in trl's prompt-completion format."""
    from hf_vrl.data.registry import load_dataset_by_name

    pairs = load_dataset_by_name(
        options.dataset, split="train", limit=options.max_train_samples, seed=options.seed
    )
    return hold_out(caption_pairs(pairs, prompt, eos_token), options.eval_samples, options.seed)


def main(argv: list[str] | None = None) -> int:
    options = _build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    _validate(options)
    output = OutputDir(Path(options.output), "llava-align", "--output")
    output.check()  # before anything loads: a folder this command must not write is one line
    from transformers import set_seed

    from hf_vrl.integrations.llava import (
        check_llava,
        llava_processor_for,
        load_image_processor,
        load_llava,
        load_llava_processor,
        load_vision_tower,
        swap_vision_tower,
    )

    check_llava(options.llava)
    processor = load_llava_processor(options.llava)
    if processor is None:
        raise UserError(f"--llava {options.llava} has no LLaVA processor (processor_config.json): add one.")
    _check_prompt(options.prompt, processor.image_token)
    train, held_out = _load_pairs(options, options.prompt, processor.tokenizer.eos_token)
    args = sft_config(options, output.root / "checkpoints", streamed=isinstance(train, IterableDataset))
    tower = load_vision_tower(options.vision) if options.vision is not None else None
    set_seed(options.seed)
    llava = load_llava(options.llava, dtype=DTYPES[options.dtype])
    mismatches: list[str] = []
    if tower is not None:
        features = {
            "vision_feature_layer": options.vision_feature_layer,
            "vision_feature_select_strategy": options.vision_feature_select_strategy,
        }
        mismatches = swap_vision_tower(llava, tower, realign=True, **features).problems
    image_processor = load_image_processor(options.vision) if options.vision is not None else None
    processor = llava_processor_for(llava, processor, image_processor)
    lock = output.claim() if args.should_save else None  # the main process holds the folder
    try:
        losses = _align(options, output, llava, processor, train, held_out, args, mismatches)
    finally:
        if lock is not None:
            lock.release()
    if losses is None:  # a worker of a multi-GPU run: the main process writes
        return 0
    print(f"{output.root}: projector aligned in {losses['steps']} steps")
    print(f"  held-out caption loss {losses['eval_loss_before']:.4f} -> {losses['eval_loss_after']:.4f}")
    return 0


def _align(
    options: argparse.Namespace,
    output: OutputDir,
    llava: torch.nn.Module,
    processor: LlavaProcessor,
    train: Dataset | IterableDataset,
    held_out: Dataset,
    args: SFTConfig,
    mismatches: list[str],
) -> dict[str, float] | None:
    """Train the projector (resuming from the folder's last checkpoint with --resume), then write the
    aligned LLaVA and llava_align.json into `output` in one step; None on a worker process."""
    from hf_vrl.integrations.llava import save_llava

    checkpoints = Path(args.output_dir)
    resume = resume_point(checkpoints) if options.resume else None
    if options.resume and resume is None:
        print(f"no complete checkpoint in {checkpoints}: starting from the beginning")
    logging_dir = options.logging_dir or str(output.root / "logs")
    losses = align_projector(
        llava, processor, train, held_out, args, resume_from_checkpoint=resume, logging_dir=logging_dir
    )
    if not args.should_save:
        return None
    report = {**losses, "llava": options.llava, "vision": options.vision, "tower_mismatches": mismatches}
    with output.staged() as folder:
        save_llava(llava, folder, processor)
        (folder / "llava_align.json").write_text(json.dumps(report, indent=2) + "\n")
    shutil.rmtree(checkpoints, ignore_errors=True)
    return losses


if __name__ == "__main__":
    sys.exit(main())
