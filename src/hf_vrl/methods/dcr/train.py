"""`hf-vrl train dcr`: enhance a CLIP-family vision encoder with Diffusion Contrastive Reconstruction.

Recipe (DCR §4.2, §5.1): Stage-1 trains the projector h_omega with the encoder frozen (projector alignment);
Stage-2 trains LoRA adapters on the encoder with h_omega frozen (encoder enhancement). The diffusion model
stays frozen throughout and is never saved with the model. Output folder:

    stage1/ (checkpoints, final/)   stage2/ (checkpoints, final/ = LoRA adapter)
    dcr-model/      the merged DCRModel (encoder + projector), `DCRModel.from_pretrained`
    vision-tower/   the enhanced encoder as a plain CLIPVisionModel / SiglipVisionModel (drops into LLaVA)
    report.json     before/after D-ability (clustering) and P-ability (MMVP-style) numbers

With no arguments it runs the `dcr-tiny` preset: a tiny CLIP and a tiny text-conditioned diffusion model are
first trained on the generated shapes world (`methods/dcr/toy.py`), then both DCR stages run on the CPU.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import torch

logger = logging.getLogger(__name__)

DEFAULT_PRESET = "dcr-tiny"
STAGE_CHOICES = ("1", "2", "both", "end_to_end")


def _help(text: str, default: Any = None) -> Any:
    return field(default=default, metadata={"help": text})


@dataclass
class DCRRunConfig:
    """Every setting of a DCR run; presets in hub_configs/dcr-*.json set these, flags override them."""

    # vision encoder
    clip: str = _help(
        "CLIP/MetaCLIP/SigLIP checkpoint to enhance (Hub id, local dir or preset name)", "tiny-clip"
    )
    clip_pretrain_steps: int = _help(
        "toy world only: first train `clip` from its config with the CLIP loss", 0
    )
    condition_mode: Literal["official", "cls", "cls_patches"] = _help(
        "UNet condition: empty-prompt embedding + projected image embedding (official code), the projected "
        "[CLS] alone (paper §5.1), or [CLS] + a fraction of patch tokens (Table 7)",
        "official",
    )
    patch_token_ratio: float = _help("fraction of patch tokens kept with condition_mode=cls_patches", 0.1)
    # diffusion
    diffusion: str = _help(
        "SD-1.x/2.x pipeline (Hub id or dir; the paper's stabilityai/stable-diffusion-2-1-base is offline: "
        "use the mirror Manojb/stable-diffusion-2-1-base or a local copy), or 'tiny' for the toy-world model",
        "tiny",
    )
    diffusion_pretrain_steps: int = _help(
        "with diffusion=tiny: denoiser training steps on the toy world", 300
    )
    diffusion_dtype: Literal["bfloat16", "float16", "float32"] = _help(
        "dtype of the frozen UNet/VAE", "float32"
    )
    gradient_checkpointing: Literal["none", "blocks", "chunks"] = _help(
        "UNet activation checkpointing: per diffusers block, or whole UNet chunks recomputed in backward",
        "none",
    )
    # objective
    objective: Literal["dcr", "reconstruction", "joint"] = _help(
        "dcr (Eq. 12), reconstruction (Eq. 8, DIVA-style baseline) or joint (Eq. 9, naive baseline)", "dcr"
    )
    temperature: float = _help("tau of Eq. 12 (and of L_con for objective=joint)", 0.1)
    target: Literal["epsilon", "v_prediction", "scheduler"] = _help(
        "the ground-truth positive: eps (paper), v (official code) or the scheduler's prediction_type",
        "epsilon",
    )
    num_negatives: int | None = _help("negatives per anchor (default: the other B-1 images, B^2 UNet passes)")
    unet_chunk_size: int | None = _help("UNet evaluations per call (default: all B^2+B in one call)")
    lambda_con: float = _help("objective=joint: weight of L_con", 1.0)
    lambda_rec: float = _help("objective=joint: weight of L_rec", 1.0)
    official_augment: bool = _help(
        "augment after CLIP normalisation with clamping, as the official code does", False
    )
    input_crop_min_scale: float | None = _help(
        "random-resized-crop scale (s, 1) of the input (official 0.9)", 0.9
    )
    image_mean: list[float] | None = _help("normalisation mean (default: the checkpoint's image processor)")
    image_std: list[float] | None = _help("normalisation std (default: the checkpoint's image processor)")
    # data and evaluation
    dataset: str = _help(
        "training images: a hf_vrl.data registry name or path (CC3M shards: webdataset:...)", "shapes"
    )
    max_train_samples: int | None = _help("cap on training images")
    eval_dataset: str | None = _help(
        "labelled test images for D-ability clustering (registry name)", "shapes"
    )
    eval_samples: int = _help("test images used for D-ability", 500)
    mmvp: str | None = _help("P-ability pairs: 'toy' (shapes-world pairs) or an MMVP-VLM folder", "toy")
    # optimisation (official: AdamW, wd 0.01, constant lr after 10 warmup steps, clip 1.0, batch 16)
    batch_size: int = _help("images per device and step", 16)
    gradient_accumulation_steps: int = _help("micro-batches per optimiser step", 1)
    stage1_steps: int = _help("Stage-1 (projector alignment) steps", 4600)
    stage2_steps: int = _help("Stage-2 (encoder enhancement) steps; also the end_to_end length", 4600)
    stage1_learning_rate: float = _help("Stage-1 learning rate", 1e-4)
    stage2_learning_rate: float = _help("Stage-2 (and end_to_end) learning rate", 1e-5)
    weight_decay: float = _help("AdamW weight decay", 0.01)
    warmup_steps: int = _help("linear warmup steps, then constant", 10)
    max_grad_norm: float = _help("gradient clipping", 1.0)
    mixed_precision: Literal["no", "bf16", "fp16"] = _help("autocast for the encoder forward", "no")
    lora_r: int = _help("Stage-2 LoRA rank", 16)
    lora_alpha: int = _help("Stage-2 LoRA alpha", 16)
    lora_dropout: float = _help("Stage-2 LoRA dropout", 0.1)
    lora_bias: Literal["none", "lora_only"] = _help(
        "also train adapted layers' biases (official: lora_only)", "none"
    )
    seed: int = _help("random seed", 0)
    logging_steps: int = _help("log every N steps", 10)
    save_steps: int = _help("checkpoint every N steps", 500)
    save_total_limit: int | None = _help("checkpoints kept per stage", 2)
    dataloader_num_workers: int = _help("DataLoader workers", 0)


def _build_parser(defaults: dict[str, Any]):
    from transformers import HfArgumentParser

    parser = HfArgumentParser(
        DCRRunConfig,
        prog="hf-vrl train dcr",
        description=__doc__.split("\n\n")[0] + " Two stages: projector alignment, then LoRA on the encoder.",
        epilog=(
            "Presets: dcr-tiny (toy world, CPU, minutes), dcr-openai-l14-224, dcr-openai-l14-336, "
            "dcr-metaclip-l14, dcr-metaclip-h14, dcr-siglip-so400m-224, dcr-siglip-so400m-384. "
            "Any field can be overridden by its flag."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--config", default=DEFAULT_PRESET, help="preset name in hub_configs/ or a JSON file")
    parser.add_argument("--output-dir", default="runs/dcr", help="where stages, exports and report.json go")
    parser.add_argument("--stage", choices=STAGE_CHOICES, default="both", help="which stage(s) to run")
    parser.add_argument("--resume", action="store_true", help="resume each stage from its latest checkpoint")
    parser.add_argument("--no-eval", action="store_true", help="skip the before/after evaluation")
    parser.set_defaults(**defaults)
    return parser


def load_config(name_or_path: str) -> dict[str, Any]:
    """A preset's settings (`description` and keys starting with '_' are comments); unknown keys are an
    error."""
    from hf_vrl.presets import load_preset

    preset = {
        k: v for k, v in load_preset(name_or_path).items() if not k.startswith("_") and k != "description"
    }
    unknown = sorted(set(preset) - {f.name for f in fields(DCRRunConfig)})
    if unknown:
        raise ValueError(f"{name_or_path}: unknown settings {unknown}; see `hf-vrl train dcr --help`")
    return preset


def parse_args(argv: list[str] | None) -> tuple[DCRRunConfig, argparse.Namespace]:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", default=DEFAULT_PRESET)
    known, _ = pre.parse_known_args(argv)
    parser = _build_parser(load_config(known.config))
    config, options = parser.parse_args_into_dataclasses(args=argv)
    return config, options


# -- building blocks ---------------------------------------------------------------------------------


def _resolve(name: str) -> str:
    """A preset folder in hub_configs/ when one has this name, else the string (a path or Hub id)."""
    from hf_vrl.presets import preset_path

    try:
        return str(preset_path(name))
    except FileNotFoundError:
        return name


def _vision_config(clip: str):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(clip)
    return getattr(config, "vision_config", config)


def _normalisation(cfg: DCRRunConfig, clip: str) -> tuple[list[float], list[float]]:
    if cfg.image_mean is not None and cfg.image_std is not None:
        return cfg.image_mean, cfg.image_std
    from transformers import AutoImageProcessor

    try:
        processor = AutoImageProcessor.from_pretrained(clip)
    except OSError as err:
        raise ValueError(f"{clip} has no image processor: pass --image_mean and --image_std") from err
    return list(processor.image_mean), list(processor.image_std)


def _load_data(cfg: DCRRunConfig, split: str, limit: int | None, image_size: int):
    from hf_vrl.data.registry import load_dataset_by_name

    name = cfg.dataset if split == "train" else cfg.eval_dataset
    return load_dataset_by_name(name, split=split, limit=limit, image_size=image_size, seed=cfg.seed)


def prepare_inputs(cfg: DCRRunConfig, out: Path, train) -> tuple[str, str]:
    """(CLIP checkpoint, diffusion pipeline) to use, building the toy-world ones when asked (reused if
    present)."""
    from hf_vrl.methods.dcr import toy

    clip = _resolve(cfg.clip)
    if cfg.clip_pretrain_steps > 0:
        target = out / "base-clip"
        if (target / "model.safetensors").exists():
            logger.info("reusing the toy CLIP in %s (delete it to retrain)", target)
        else:
            toy.pretrain_clip(clip, train, target, cfg.clip_pretrain_steps, seed=cfg.seed)
        clip = str(target)
    diffusion = cfg.diffusion
    if diffusion == "tiny":
        target = out / "tiny-sd"
        if (target / "unet" / "diffusion_pytorch_model.safetensors").exists():
            logger.info("reusing the toy diffusion model in %s (delete it to retrain)", target)
        else:
            size = _vision_config(clip).image_size
            toy.build_tiny_sd(target, clip, train, cfg.diffusion_pretrain_steps, size, seed=cfg.seed)
        diffusion = str(target)
    return clip, diffusion


def task_config(cfg: DCRRunConfig, mean: list[float], std: list[float]):
    from hf_vrl.methods.dcr.task import DCRTaskConfig

    crop = None if cfg.input_crop_min_scale is None else (cfg.input_crop_min_scale, 1.0)
    return DCRTaskConfig(
        objective=cfg.objective,
        temperature=cfg.temperature,
        target=cfg.target,
        num_negatives=cfg.num_negatives,
        unet_chunk_size=cfg.unet_chunk_size,
        lambda_con=cfg.lambda_con,
        lambda_rec=cfg.lambda_rec,
        official_augment=cfg.official_augment,
        input_crop_scale=crop,
        image_mean=tuple(mean),
        image_std=tuple(std),
    )


def training_arguments(cfg: DCRRunConfig, out_dir: Path, learning_rate: float, steps: int):
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(out_dir),
        max_steps=steps,
        per_device_train_batch_size=cfg.batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        learning_rate=learning_rate,
        weight_decay=cfg.weight_decay,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=cfg.warmup_steps,
        max_grad_norm=cfg.max_grad_norm,
        bf16=cfg.mixed_precision == "bf16",
        fp16=cfg.mixed_precision == "fp16",
        logging_steps=cfg.logging_steps,
        save_strategy="steps",
        save_steps=cfg.save_steps,
        save_total_limit=cfg.save_total_limit,
        seed=cfg.seed,
        dataloader_drop_last=True,
        dataloader_num_workers=cfg.dataloader_num_workers,
        remove_unused_columns=False,
        report_to="none",
        use_cpu=not torch.cuda.is_available(),
    )


def run_stage(model, stage: str, diffusion, train, cfg: DCRRunConfig, out_dir: Path, resume: bool, mean, std):
    """Train one stage with DCRTrainer; returns the trained (for stage 2: LoRA-wrapped) model."""
    from transformers.trainer_utils import get_last_checkpoint

    from hf_vrl.methods.dcr.task import DCRCollator, DCRTask
    from hf_vrl.methods.dcr.trainer import DCRTrainer, LoraSettings, prepare_stage

    task = DCRTask(model, diffusion, task_config(cfg, mean, std))
    lora = LoraSettings(r=cfg.lora_r, alpha=cfg.lora_alpha, dropout=cfg.lora_dropout, bias=cfg.lora_bias)
    trainable = prepare_stage(model, stage, lora)
    first = stage == "projector"
    learning_rate = cfg.stage1_learning_rate if first else cfg.stage2_learning_rate
    steps = cfg.stage1_steps if first else cfg.stage2_steps
    args = training_arguments(cfg, out_dir, learning_rate, steps)
    collator = DCRCollator(model.config.vision_config.image_size)
    trainer = DCRTrainer(model=trainable, args=args, train_dataset=train, data_collator=collator, task=task)
    checkpoint = get_last_checkpoint(str(out_dir)) if resume and out_dir.is_dir() else None
    trainer.train(resume_from_checkpoint=checkpoint)
    trainer.save_model(str(out_dir / "final"))
    return trainable


# -- evaluation --------------------------------------------------------------------------------------


@dataclass
class Evaluation:
    """What the before/after evaluation needs (built once)."""

    dataset: Any
    pairs: Any
    clip: Any
    image_processor: Any
    tokenizer: Any
    image_size: int
    mean: list[float]
    std: list[float]

    def __call__(self, encoder) -> dict[str, Any]:
        from hf_vrl.methods.dcr.evaluate import evaluate_encoder

        return evaluate_encoder(
            encoder,
            self.dataset,
            self.pairs,
            clip=self.clip,
            image_processor=self.image_processor,
            tokenizer=self.tokenizer,
            image_size=self.image_size,
            image_mean=self.mean,
            image_std=self.std,
        )


def build_evaluation(cfg: DCRRunConfig, clip: str, image_size: int, mean, std) -> Evaluation | None:
    """Test data, MMVP pairs and the original CLIP's text side (if the checkpoint has one)."""
    from transformers import AutoConfig, AutoImageProcessor, AutoModel, AutoTokenizer

    if cfg.eval_dataset is None:
        return None
    dataset = _load_data(cfg, "test", cfg.eval_samples, image_size)
    pairs = None
    if cfg.mmvp == "toy":
        from hf_vrl.data.toy import shapes_mmvp_pairs

        pairs = shapes_mmvp_pairs(image_size=image_size, seed=cfg.seed)
    elif cfg.mmvp is not None:
        from hf_vrl.metrics import load_mmvp_vlm

        pairs = load_mmvp_vlm(cfg.mmvp)
    text_side = hasattr(AutoConfig.from_pretrained(clip), "text_config")
    full = AutoModel.from_pretrained(clip, dtype=torch.float32).eval() if text_side else None
    return Evaluation(
        dataset=dataset,
        pairs=pairs,
        clip=full,
        image_processor=AutoImageProcessor.from_pretrained(clip) if text_side else None,
        tokenizer=AutoTokenizer.from_pretrained(clip) if text_side else None,
        image_size=image_size,
        mean=mean,
        std=std,
    )


def format_report(report: dict[str, Any]) -> str:
    """One line per evaluated model: clustering NMI/ACC/ARI (D-ability) and MMVP pair accuracy (P-ability)."""
    lines = [f"{'model':<8} {'NMI':>6} {'ACC':>6} {'ARI':>6} {'fineNMI':>8} {'MMVP':>6} {'stmt':>6}"]
    for name in ("before", "after"):
        if name not in report:
            continue
        r = report[name]
        c, f, m = r["clustering"], r.get("clustering_fine", {}), r.get("mmvp", {})
        lines.append(
            f"{name:<8} {c['nmi']:6.3f} {c['acc']:6.3f} {c['ari']:6.3f} {f.get('nmi', float('nan')):8.3f} "
            f"{m.get('accuracy', float('nan')):6.3f} {m.get('statement_accuracy', float('nan')):6.3f}"
        )
    return "\n".join(lines)


# -- main --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    cfg, options = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from transformers import set_seed

    from hf_vrl.methods.dcr.diffusion import load_diffusion
    from hf_vrl.methods.dcr.export import export_vision_tower, merge_lora
    from hf_vrl.models.dcr import DCRModel

    out = Path(options.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "run_config.json").write_text(json.dumps(asdict(cfg) | {"stage": options.stage}, indent=2))
    set_seed(cfg.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    image_size = _vision_config(_resolve(cfg.clip)).image_size
    train = _load_data(cfg, "train", cfg.max_train_samples, image_size)
    clip, diffusion_path = prepare_inputs(cfg, out, train)
    mean, std = _normalisation(cfg, clip)
    diffusion = load_diffusion(diffusion_path, cfg.diffusion_dtype, cfg.gradient_checkpointing, device)
    evaluation = None if options.no_eval else build_evaluation(cfg, clip, image_size, mean, std)

    def fresh_model() -> DCRModel:
        return DCRModel.from_clip(
            clip,
            condition_dim=diffusion.unet.config.cross_attention_dim,
            num_condition_tokens=diffusion.null_text_embeds.shape[1],
            condition_mode=cfg.condition_mode,
            patch_token_ratio=cfg.patch_token_ratio,
        )

    report: dict[str, Any] = {"config": asdict(cfg)}
    if evaluation is not None:
        report["before"] = evaluation(fresh_model().to(device))
    if options.stage in ("1", "both"):
        set_seed(cfg.seed)
        run_stage(
            fresh_model(), "projector", diffusion, train, cfg, out / "stage1", options.resume, mean, std
        )
    trained = None
    if options.stage in ("2", "both"):
        stage1 = out / "stage1" / "final"
        if not (stage1 / "config.json").exists():
            raise FileNotFoundError(
                f"stage 2 starts from the stage-1 model, but {stage1} is missing: run --stage 1"
            )
        set_seed(cfg.seed)
        model = DCRModel.from_pretrained(stage1, dtype=torch.float32)
        trained = run_stage(
            model, "encoder", diffusion, train, cfg, out / "stage2", options.resume, mean, std
        )
    if options.stage == "end_to_end":
        set_seed(cfg.seed)
        out_dir = out / "end_to_end"
        trained = run_stage(
            fresh_model(), "end_to_end", diffusion, train, cfg, out_dir, options.resume, mean, std
        )
    if trained is not None:
        merged = merge_lora(trained)
        merged.save_pretrained(out / "dcr-model")
        processor = evaluation.image_processor if evaluation is not None else None
        export_vision_tower(merged, out / "vision-tower", image_processor=processor)
        if evaluation is not None:
            report["after"] = evaluation(merged.to(device))
    (out / "report.json").write_text(json.dumps(report, indent=2))
    if "before" in report:
        print("\n" + format_report(report))
    print(f"report: {out / 'report.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
