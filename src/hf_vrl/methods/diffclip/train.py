"""`hf-vrl train diffclip`: train DiffCLIP, or the same-size CLIP baseline, from scratch with the CLIP loss.

The recipe (DiffCLIP §4.1, training code from SLIP): AdamW (lr 5e-4, weight decay 0.5, β = (0.9, 0.98),
ε = 1e-8), one epoch of linear warm-up then cosine decay, 40 epochs, global batch 4096, RandomResizedCrop(224,
scale=(0.5, 1)) as the only augmentation, CC3M / CC12M. Presets in `hub_configs/` hold it: `diffclip-b16`
(ViT-B/16 + the 12-layer 512-wide text transformer) and `diffclip-tiny` (the toy world on a CPU).
`--arch clip` builds transformers' `CLIPModel` from the same tower sizes, so the baseline trains with the same
command.

Multi-GPU: `accelerate launch -m hf_vrl.cli train diffclip ...` (or `torchrun -m hf_vrl.cli ...`);
`ContrastiveTrainer` all-gathers the features, so the negatives of a step are the batch of every process
(gradient accumulation adds optimizer batch, not negatives).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, TrainerCallback, TrainingArguments

from hf_vrl.trainer import ContrastiveTrainer

logger = logging.getLogger(__name__)

__all__ = [
    "ARCHS",
    "DEFAULT_PRESET",
    "RandomResizedCropCollator",
    "build_model",
    "comparison_table",
    "evaluate_model",
    "load_processors",
    "main",
    "model_config",
    "save_final",
    "train_clip_like",
    "training_arguments",
]

ARCHS = ("diffclip", "clip")
DEFAULT_PRESET = "diffclip-tiny"
EVAL_TASKS = ("zero_shot", "retrieval")
STREAM_PREFIXES = ("webdataset", "parquet", "csv")  # registry names that stream image-text shards
# DiffCLIP-only fields of a tower config; the CLIP baseline drops them (and needs pre_layernorm True).
_DIFF_TOWER_KEYS = (
    "differential_attention",
    "lambda_init",
    "lambda_init_schedule",
    "lambda_std",
    "diff_norm_eps",
)
# model-level options applied to both towers (every attention layer of both towers, DiffCLIP §4.1)
_DIFF_MODEL_KEYS = ("lambda_init", "lambda_init_schedule")
# training-section keys that are not TrainingArguments fields
_RECIPE_KEYS = ("warmup_epochs", "global_batch_size")
# (report path, row title) of the numbers `comparison_table` shows
TABLE_ROWS = (
    (("zero_shot", "top1"), "zero-shot top-1"),
    (("retrieval", "i2t_R@1"), "image->text R@1"),
    (("retrieval", "i2t_R@5"), "image->text R@5"),
    (("retrieval", "t2i_R@1"), "text->image R@1"),
    (("retrieval", "t2i_R@5"), "text->image R@5"),
)


# -- model -----------------------------------------------------------------------------------------


def _special_token_ids(tokenizer: Any, vocab_size: int) -> dict[str, int]:
    """bos / eos / pad ids of the tokenizer (the text tower pools at the first EOS), checked against vocab."""
    if len(tokenizer) > vocab_size:
        raise ValueError(
            f"the tokenizer has {len(tokenizer)} tokens but the preset's text_config.vocab_size is "
            f"{vocab_size}; raise vocab_size or use the tokenizer the preset was made for."
        )
    ids = {name: getattr(tokenizer, name, None) for name in ("bos_token_id", "eos_token_id", "pad_token_id")}
    return {name: value for name, value in ids.items() if value is not None}


def model_config(
    preset: Mapping[str, Any],
    arch: str = "diffclip",
    *,
    tokenizer: Any = None,
    lambda_init: float | None = None,
    lambda_init_schedule: str | None = None,
    diff_attention_in_text: bool | None = None,
) -> Any:
    """The `DiffCLIPConfig` (arch "diffclip") or `CLIPConfig` (arch "clip") of a preset's "model" section.

    Both archs get the same tower sizes and projection; DiffCLIP's λ options (top-level `lambda_init`,
    `lambda_init_schedule`, `diff_attention_in_text`, overridable here) apply to every layer of both towers
    (DiffCLIP* = `lambda_init_schedule="depth"`, DiffCLIP† = `diff_attention_in_text=False`). With a
    `tokenizer`, the text tower's bos / eos / pad ids are taken from it.
    """
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; choose one of {ARCHS}")
    section = dict(preset["model"])
    text = dict(section.pop("text_config"))
    vision = dict(section.pop("vision_config"))
    options = {key: section.pop(key, None) for key in (*_DIFF_MODEL_KEYS, "diff_attention_in_text")}
    overrides = {
        "lambda_init": lambda_init,
        "lambda_init_schedule": lambda_init_schedule,
        "diff_attention_in_text": diff_attention_in_text,
    }
    overrides = {key: value for key, value in overrides.items() if value is not None}
    if arch == "clip" and overrides:
        raise ValueError(f"{sorted(overrides)} only apply to DiffCLIP; drop them for the CLIP baseline")
    options.update(overrides)
    if tokenizer is not None:
        text.update(_special_token_ids(tokenizer, text.get("vocab_size", 49408)))
    if arch == "clip":
        from transformers import CLIPConfig

        if not vision.pop("pre_layernorm", True):
            raise ValueError(
                "the CLIP baseline always has a pre-LayerNorm; drop vision_config.pre_layernorm=false"
            )
        for tower in (text, vision):
            for key in _DIFF_TOWER_KEYS:
                tower.pop(key, None)
        return CLIPConfig(text_config=text, vision_config=vision, **section)

    from hf_vrl.models.diffclip import DiffCLIPConfig

    for tower in (text, vision):
        tower.update({key: options[key] for key in _DIFF_MODEL_KEYS if options[key] is not None})
    return DiffCLIPConfig(
        text_config=text,
        vision_config=vision,
        diff_attention_in_text=options["diff_attention_in_text"],
        **section,
    )


def build_model(
    arch: str = "diffclip",
    preset: str | Path | Mapping[str, Any] = DEFAULT_PRESET,
    *,
    tokenizer: Any = None,
    **diff_options: Any,
) -> PreTrainedModel:
    """A freshly initialised `DiffCLIPModel` or `CLIPModel` from a preset (name, path or loaded dict).

    Build on the meta device (`with torch.device("meta"): build_model(...)`) to count parameters for free.
    `diff_options` go to `model_config` (lambda_init, lambda_init_schedule, diff_attention_in_text).
    """
    if not isinstance(preset, Mapping):
        from hf_vrl.presets import load_preset

        preset = load_preset(preset)
    config = model_config(preset, arch, tokenizer=tokenizer, **diff_options)
    if arch == "clip":
        from transformers import CLIPModel

        return CLIPModel(config)
    from hf_vrl.models.diffclip import DiffCLIPModel

    return DiffCLIPModel(config)


def load_processors(
    tokenizer: str, image_processor: str, image_processor_kwargs: Mapping[str, Any] | None = None
) -> tuple[Any, Any]:
    """(image_processor, tokenizer) from preset names in hub_configs/ (e.g. "tiny-clip"), local dirs or Hub
    ids; `image_processor_kwargs` override processor attributes (diffclip-b16: SLIP's ImageNet mean/std)."""
    from transformers import AutoImageProcessor, AutoTokenizer

    from hf_vrl.presets import preset_path

    def resolve(name: str) -> str:
        try:
            return str(preset_path(name))
        except FileNotFoundError:
            return name

    try:
        processor = AutoImageProcessor.from_pretrained(
            resolve(image_processor), **(image_processor_kwargs or {})
        )
        return processor, AutoTokenizer.from_pretrained(resolve(tokenizer))
    except OSError as error:
        raise OSError(
            f"could not load the tokenizer {tokenizer!r} / image processor {image_processor!r} ({error}). "
            "Offline, pass --tokenizer / --image-processor a local directory (e.g. tiny-clip, or a saved "
            "openai/clip-vit-base-patch16)."
        ) from error


# -- data and training -----------------------------------------------------------------------------


@dataclass
class RandomResizedCropCollator:
    """SLIP's (and DiffCLIP's) only training augmentation, RandomResizedCrop(size, scale, ratio=(3/4, 4/3))
    with bilinear resampling, applied to each row's PIL image before `collator` (e.g. `ImageTextCollator`).

    Crops draw from torch's global generator, which the Trainer seeds and restores on resume; the data loader
    prepares one batch ahead, so the crops drawn after a resume differ from those of an uninterrupted run
    (everything else, data order included, continues exactly).
    """

    collator: Callable[[Sequence[dict[str, Any]]], dict[str, torch.Tensor]]
    size: int
    scale: tuple[float, float] = (0.5, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)

    def __post_init__(self) -> None:
        if not 0 < self.scale[0] <= self.scale[1] <= 1:
            raise ValueError(f"crop scale must satisfy 0 < low <= high <= 1, got {tuple(self.scale)}")

    def crop(self, image: Any) -> Any:
        from PIL import Image

        from hf_vrl.data.crop import random_resized_crop_box

        top, left, h, w = random_resized_crop_box(image.height, image.width, tuple(self.scale), self.ratio)
        return image.resize((self.size, self.size), Image.BILINEAR, box=(left, top, left + w, top + h))

    def __call__(self, rows: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        column = getattr(self.collator, "image_column", "image")
        return self.collator([{**row, column: self.crop(row[column])} for row in rows])


def _world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def training_arguments(
    recipe: Mapping[str, Any], output_dir: str | Path, **overrides: Any
) -> TrainingArguments:
    """TrainingArguments from a preset's "training" section, with `overrides` (None values ignored) on top.

    Besides TrainingArguments fields the section may hold `warmup_epochs` (linear warm-up over this many of
    the `num_train_epochs`, as a fraction of the run, so it also applies to a `max_steps` run) and
    `global_batch_size` (gradient accumulation is chosen to reach it over the processes, unless
    `gradient_accumulation_steps` is given). bf16 is on when a GPU supports it unless `bf16` is given.
    """
    kwargs = {key: value for key, value in recipe.items() if key not in _RECIPE_KEYS}
    kwargs.update({key: value for key, value in overrides.items() if value is not None})
    epochs = float(kwargs.get("num_train_epochs", 3.0))
    if "warmup_epochs" in recipe and overrides.get("warmup_steps") is None:
        ratio = float(recipe["warmup_epochs"]) / epochs
        if not 0 <= ratio < 1:
            raise ValueError(
                f"warmup_epochs ({recipe['warmup_epochs']}) must be below num_train_epochs ({epochs})"
            )
        kwargs["warmup_steps"] = ratio
    per_device = int(kwargs.get("per_device_train_batch_size", 8))
    if "global_batch_size" in recipe and kwargs.get("gradient_accumulation_steps") is None:
        kwargs["gradient_accumulation_steps"] = max(
            1, math.ceil(int(recipe["global_batch_size"]) / (per_device * _world_size()))
        )
    if kwargs.get("bf16") is None:
        kwargs["bf16"] = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    defaults = {
        "report_to": "none",
        "save_strategy": "steps",
        "remove_unused_columns": False,
        "dataloader_drop_last": True,  # all-gather needs the same batch size on every process
        "ddp_find_unused_parameters": False,
        "use_cpu": not torch.cuda.is_available(),  # also makes torchrun/accelerate form a CPU process group
    }
    try:
        return TrainingArguments(output_dir=str(output_dir), **{**defaults, **kwargs})
    except TypeError as error:
        raise TypeError(
            f"{error}: a preset's 'training' section takes TrainingArguments fields and {list(_RECIPE_KEYS)}"
        ) from error


def train_clip_like(
    model: PreTrainedModel,
    train_dataset: Any,
    image_processor: Any,
    tokenizer: Any,
    training_args: TrainingArguments,
    *,
    crop_scale: tuple[float, float] | None = None,
    resume_from_checkpoint: str | bool | None = None,
    callbacks: list[TrainerCallback] | None = None,
) -> ContrastiveTrainer:
    """Train a CLIP-like dual encoder (DiffCLIP, CLIPModel) with the CLIP loss; returns the trainer (a
    `ContrastiveTrainer`, whose weight decay applies to weight matrices only, as in SLIP).

    Batches come from `ImageTextCollator(image_processor, tokenizer)`, behind SLIP's RandomResizedCrop to the
    model's image size when `crop_scale` is given (e.g. (0.5, 1.0)). The model is trained in place; nothing is
    saved beyond the Trainer's checkpoints (see `save_final`).
    """
    from hf_vrl.data.collate import ImageTextCollator

    collator = ImageTextCollator(image_processor, tokenizer)
    if crop_scale is not None:
        collator = RandomResizedCropCollator(
            collator, model.config.vision_config.image_size, tuple(crop_scale)
        )
    trainer = ContrastiveTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        data_collator=collator,
        callbacks=callbacks,
    )
    trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    return trainer


def save_final(trainer: Any, image_processor: Any, tokenizer: Any, output_dir: str | Path) -> None:
    """Write the trained model (`save_pretrained`; DiffCLIP copies its remote code), tokenizer, image
    processor and the trainer state (log history) to `output_dir`, from the main process."""
    trainer.save_model(str(output_dir))
    trainer.save_state()
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(str(output_dir))
        image_processor.save_pretrained(str(output_dir))


# -- evaluation ------------------------------------------------------------------------------------


def evaluate_model(
    model: PreTrainedModel, image_processor: Any, tokenizer: Any, dataset: Any
) -> dict[str, Any]:
    """Zero-shot classification (when the data has class names) and image-text retrieval (`evaluate_clip`)."""
    from hf_vrl.evaluation import evaluate_clip

    device = "cuda" if torch.cuda.is_available() else "cpu"
    return evaluate_clip(model, image_processor, tokenizer, dataset, tasks=EVAL_TASKS, device=device)


def comparison_table(reports: Mapping[str, Mapping[str, Any]]) -> str:
    """Side-by-side metrics (percent): one column per report (e.g. "clip before", "diffclip after")."""
    from hf_vrl.evaluation import report_percent, text_table

    rows = [["metric", *reports]]
    for path, title in TABLE_ROWS:
        cells = [report_percent(report, path) for report in reports.values()]
        if any(cell != "-" for cell in cells):
            rows.append([title, *cells])
    return text_table(rows, left_columns=1)


def _materialised(dataset: Any, limit: int | None) -> Any:
    """Evaluation needs a map-style dataset: the first `limit` rows of a stream."""
    from datasets import Dataset, IterableDataset

    if not isinstance(dataset, IterableDataset):
        return dataset
    if limit is None:
        raise ValueError("a streamed evaluation dataset needs --eval-limit (how many rows to evaluate on)")
    rows = list(dataset.take(limit))
    return Dataset.from_list(rows, features=dataset.features)


# -- the command -----------------------------------------------------------------------------------


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-vrl train diffclip",
        description=(
            "Train DiffCLIP (CLIP with differential attention in both towers) or the same-size CLIP baseline "
            "from scratch with the CLIP loss, evaluate zero-shot classification and retrieval before and "
            "after, save the model (save_pretrained, loadable with AutoModel and trust_remote_code=True) "
            "with its tokenizer and image processor, and draw the attention maps of DiffCLIP Fig. 2."
        ),
        epilog=(
            "examples:\n"
            "  hf-vrl train diffclip                    # tiny DiffCLIP on the toy world (CPU)\n"
            "  hf-vrl train diffclip --arch clip        # the same-size CLIP baseline, same recipe\n"
            "  accelerate launch -m hf_vrl.cli train diffclip --config diffclip-b16 \\\n"
            "      --dataset 'webdataset:/data/cc3m/*.tar' --max-steps 22500 --output-dir runs/b16\n"
            "  hf-vrl train diffclip --output-dir runs/x --resume-from-checkpoint   # continue the last run"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    model = parser.add_argument_group("model")
    model.add_argument(
        "--config",
        default=DEFAULT_PRESET,
        help=f"preset in hub_configs/ or JSON path (default: {DEFAULT_PRESET}; the paper's: diffclip-b16)",
    )
    model.add_argument(
        "--arch", choices=ARCHS, help="diffclip, or the clip baseline of the same size (default: preset)"
    )
    model.add_argument("--lambda-init", type=float, help="λ_init of every layer (paper: 0.8)")
    model.add_argument(
        "--lambda-init-schedule",
        choices=("constant", "depth"),
        help="'depth' = DiffCLIP*: λ_init(l) = 0.8 - 0.6·exp(-0.3·l)",
    )
    model.add_argument(
        "--diff-attention-in-text",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="--no-diff-attention-in-text = DiffCLIP†, differential attention in the vision tower only",
    )
    model.add_argument("--tokenizer", help="tokenizer: preset dir, local dir or Hub id (default: preset's)")
    model.add_argument(
        "--image-processor", help="image processor: preset dir, local dir or Hub id (default: preset's)"
    )

    data = parser.add_argument_group("data")
    data.add_argument(
        "--dataset",
        help="training data, a hf_vrl.data registry name: shapes, fashion_mnist, "
        "'webdataset:/data/cc3m/*.tar' (CC3M shards, streamed: needs --max-steps), ... (default: preset's)",
    )
    data.add_argument("--split", default="train", help="training split (default: train)")
    data.add_argument("--train-limit", type=int, help="use at most this many training pairs")
    data.add_argument(
        "--crop-scale",
        type=float,
        nargs=2,
        metavar=("LOW", "HIGH"),
        help="RandomResizedCrop area range (recipe: 0.5 1; '1 1' disables cropping; default: preset's)",
    )

    train = parser.add_argument_group("training")
    train.add_argument("--output-dir", help="checkpoints and the final model (default: runs/<config>-<arch>)")
    train.add_argument(
        "--max-steps", type=int, help="optimizer steps (overrides epochs; required when streaming)"
    )
    train.add_argument("--num-train-epochs", type=float, help="epochs (default: preset's; the paper's 40)")
    train.add_argument("--batch-size", type=int, help="per-device batch size (default: preset's)")
    train.add_argument(
        "--gradient-accumulation-steps",
        type=int,
        help="default: reach the preset's global batch over the processes",
    )
    train.add_argument("--learning-rate", type=float, help="peak learning rate (paper: 5e-4)")
    train.add_argument("--weight-decay", type=float, help="AdamW weight decay (paper: 0.5)")
    train.add_argument("--save-steps", type=int, help="checkpoint every this many steps")
    train.add_argument("--logging-steps", type=int, help="log every this many steps")
    train.add_argument("--dataloader-num-workers", type=int, help="data loading processes per device")
    train.add_argument(
        "--seed", type=int, default=0, help="seed of the model init, data order and crops (default: 0)"
    )
    train.add_argument(
        "--bf16",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="bf16 autocast (default: on a GPU that has it)",
    )
    train.add_argument(
        "--resume-from-checkpoint",
        nargs="?",
        const="last",
        metavar="CHECKPOINT",
        help="continue from a checkpoint dir; bare flag: the last checkpoint-* of --output-dir (if any)",
    )

    evaluation = parser.add_argument_group("evaluation and figure")
    evaluation.add_argument(
        "--eval-dataset", help="registry name evaluated before and after training (default: preset's)"
    )
    evaluation.add_argument("--eval-split", default="test", help="evaluation split (default: test)")
    evaluation.add_argument(
        "--eval-limit", type=int, help="evaluate on at most this many pairs (default: preset's)"
    )
    evaluation.add_argument("--no-eval", action="store_true", help="skip the before/after evaluation")
    evaluation.add_argument(
        "--figure",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="write attention.png (DiffCLIP Fig. 2) for the first evaluation image and its caption",
    )
    evaluation.add_argument(
        "--compare-with",
        metavar="MODEL_DIR",
        help="a trained model of the other arch (e.g. the CLIP run's --output-dir) to draw next to this one",
    )
    return parser


def _resume_target(option: str | None, output_dir: Path) -> str | None:
    """The checkpoint to resume from: an explicit directory, or for the bare flag the last in output_dir."""
    from transformers.trainer_utils import get_last_checkpoint

    if option is None:
        if output_dir.is_dir() and get_last_checkpoint(str(output_dir)):
            logger.warning(
                "%s holds checkpoints; pass --resume-from-checkpoint to continue instead", output_dir
            )
        return None
    if option == "last":
        last = get_last_checkpoint(str(output_dir)) if output_dir.is_dir() else None
        logger.info("resuming from %s", last or f"scratch (no checkpoint in {output_dir})")
        return last
    if not Path(option).is_dir():
        raise FileNotFoundError(f"--resume-from-checkpoint {option}: no such checkpoint directory")
    return option


def _load_data(
    name: str, split: str, limit: int | None, image_size: int, seed: int, shuffle_buffer: int
) -> Any:
    """A registry dataset; streamed image-text shards are shuffled (shards + a buffer) and decoded at reduced
    scale (JPEG draft mode, shorter side kept >= the model's input size)."""
    from hf_vrl.data.registry import load_dataset_by_name

    stream_options = {}
    if name.partition(":")[0] in STREAM_PREFIXES:
        stream_options = {"shuffle_buffer": shuffle_buffer, "decode_size": image_size}
    return load_dataset_by_name(
        name, split=split, limit=limit, image_size=image_size, seed=seed, **stream_options
    )


def _label(model: PreTrainedModel) -> str:
    return "DiffCLIP" if model.config.model_type == "diffclip" else "CLIP"


@dataclass
class _Run:
    """What the command works with once the arguments and the preset are resolved."""

    args: argparse.Namespace
    preset: dict[str, Any]
    arch: str
    out: Path
    model: PreTrainedModel
    image_processor: Any
    tokenizer: Any

    @property
    def data(self) -> dict[str, Any]:
        return self.preset.get("data", {})

    @property
    def image_size(self) -> int:
        return self.model.config.vision_config.image_size


def _setup(args: argparse.Namespace) -> _Run:
    """Preset, processors and a freshly initialised model (seeded)."""
    from hf_vrl.presets import load_preset

    preset = load_preset(args.config)
    arch = args.arch or preset.get("arch", "diffclip")
    processors = preset.get("processors", {})
    image_processor, tokenizer = load_processors(
        args.tokenizer or processors["tokenizer"],
        args.image_processor or processors["image_processor"],
        None if args.image_processor else processors.get("image_processor_kwargs"),
    )
    torch.manual_seed(args.seed)
    model = build_model(
        arch,
        preset,
        tokenizer=tokenizer,
        lambda_init=args.lambda_init,
        lambda_init_schedule=args.lambda_init_schedule,
        diff_attention_in_text=args.diff_attention_in_text,
    )
    logger.info("%s: %.2fM parameters", _label(model), sum(p.numel() for p in model.parameters()) / 1e6)
    out = Path(args.output_dir or f"runs/{Path(args.config).stem}-{arch}")
    return _Run(args, preset, arch, out, model, image_processor, tokenizer)


def _train_data(run: _Run) -> Any:
    from datasets import IterableDataset

    name = run.args.dataset or run.data.get("dataset")
    if name is None:
        raise SystemExit(
            f"the {run.args.config} preset names no training data: pass --dataset (e.g. webdataset:<glob>)"
        )
    limit = run.args.train_limit or run.data.get("train_limit")
    shuffle_buffer = run.data.get("shuffle_buffer", 10_000)
    dataset = _load_data(name, run.args.split, limit, run.image_size, run.args.seed, shuffle_buffer)
    if isinstance(dataset, IterableDataset) and run.args.max_steps is None:
        raise SystemExit(
            f"{name} is streamed (no length): pass --max-steps. The recipe's 40 epochs of CC3M (2.3M pairs) "
            "at batch 4096 are about 22,500 steps."
        )
    return dataset


def _eval_data(run: _Run) -> Any:
    """The map-style evaluation dataset; None with --no-eval or when neither flag nor preset names one."""
    name = None if run.args.no_eval else (run.args.eval_dataset or run.data.get("eval_dataset"))
    if name is None:
        return None
    limit = run.args.eval_limit or run.data.get("eval_limit")
    stream = _load_data(name, run.args.eval_split, limit, run.image_size, run.args.seed, shuffle_buffer=0)
    return _materialised(stream, limit)


def _report_before(run: _Run, eval_data: Any, resume: str | None) -> dict[str, Any] | None:
    """The untrained model's evaluation (kept from the first run when resuming)."""
    path = run.out / "eval_before.json"
    if resume:
        return json.loads(path.read_text()) if path.is_file() else None
    report = evaluate_model(run.model, run.image_processor, run.tokenizer, eval_data)
    run.out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
    return report


def _training_arguments(run: _Run) -> TrainingArguments:
    args = run.args
    training_args = training_arguments(
        run.preset.get("training", {}),
        run.out,
        max_steps=args.max_steps,
        num_train_epochs=args.num_train_epochs,
        per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        learning_rate=args.learning_rate,
        weight_decay=args.weight_decay,
        save_steps=args.save_steps,
        logging_steps=args.logging_steps,
        dataloader_num_workers=args.dataloader_num_workers,
        seed=args.seed,
        bf16=args.bf16,
    )
    per_device, processes = training_args.per_device_train_batch_size, training_args.world_size
    logger.info(
        "batch: %d per device x %d processes x %d accumulation steps; %d negatives per contrastive step",
        per_device,
        processes,
        training_args.gradient_accumulation_steps,
        per_device * processes,
    )
    return training_args


def _write_figure(run: _Run, eval_data: Any) -> Path:
    """attention.png for the first evaluation image and its caption (CLIP's column first)."""
    from transformers import AutoModel

    from hf_vrl.methods.diffclip.figures import attention_figure

    models = {_label(run.model): run.model}
    if run.args.compare_with:
        other = AutoModel.from_pretrained(run.args.compare_with, trust_remote_code=True).to(run.model.device)
        models[_label(other)] = other
    row = eval_data[0]
    path = run.out / "attention.png"
    attention_figure(
        row["image"],
        [row["caption"]],
        dict(sorted(models.items())),
        run.image_processor,
        run.tokenizer,
        path=path,
    )
    return path


def main(argv: list[str] | None = None) -> int:
    """`hf-vrl train diffclip`: see `--help`."""
    args = _build_parser().parse_args(argv)
    logging.basicConfig(format="%(message)s")
    logger.setLevel(logging.INFO)  # this command's progress lines; libraries stay at WARNING
    run = _setup(args)
    training_args = _training_arguments(run)  # sets up the process group under torchrun / accelerate launch
    is_main = training_args.process_index == 0
    train_data, eval_data = _train_data(run), _eval_data(run)
    resume = _resume_target(args.resume_from_checkpoint, run.out)
    reports: dict[str, Any] = {}
    if eval_data is not None and is_main:
        before = _report_before(run, eval_data, resume)
        reports.update({"before": before} if before else {})

    crop_scale = args.crop_scale or run.data.get("random_resized_crop_scale")
    trainer = train_clip_like(
        run.model,
        train_data,
        run.image_processor,
        run.tokenizer,
        training_args,
        crop_scale=crop_scale,
        resume_from_checkpoint=resume,
    )
    save_final(trainer, run.image_processor, run.tokenizer, run.out)
    if not is_main:
        return 0

    results: dict[str, Any] = {
        "arch": run.arch,
        "config": args.config,
        "global_step": trainer.state.global_step,
    }
    if eval_data is not None:
        reports["after"] = evaluate_model(run.model, run.image_processor, run.tokenizer, eval_data)
        (run.out / "eval_after.json").write_text(json.dumps(reports["after"], indent=2))
        results.update(reports)
        print(f"\n{_label(run.model)} on {len(eval_data)} evaluation pairs:\n{comparison_table(reports)}")
    if args.figure and eval_data is None:
        logger.warning("no attention figure: it draws the first image of the evaluation dataset")
    elif args.figure:
        results["figure"] = str(_write_figure(run, eval_data))
        print(f"attention maps: {results['figure']}")
    (run.out / "results.json").write_text(json.dumps(results, indent=2))
    print(f"model, tokenizer and image processor: {run.out}")
    return 0
