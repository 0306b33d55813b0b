"""`hf-vrl train diffclip`: DiffCLIP, or the same network with plain attention (the CLIP baseline), trained
from scratch with the CLIP loss on the shared run design (`hf_vrl.run`).

The recipe (DiffCLIP §4.1, training code from SLIP) lives in the `diffclip-b16` preset: AdamW (lr 5e-4, weight
decay 0.5 on weight matrices, β = (0.9, 0.98), ε = 1e-8), one epoch of linear warm-up from 1e-6 then cosine,
40 epochs, global batch 4096, RandomResizedCrop(224, scale=(0.5, 1)) as the only augmentation, CC3M / CC12M.
`diffclip-tiny` is the toy world on a CPU. `ContrastiveTrainer` all-gathers the features, so the negatives of
a step are the batch of every process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from torch import nn

from hf_vrl.errors import UserError
from hf_vrl.run.batch import BatchPlan, contrastive_sees
from hf_vrl.run.config import OptimConfig, RunConfig, dropouts, in_range, setting
from hf_vrl.run.runner import Method

__all__ = ["DiffCLIPMethod", "DiffCLIPModelConfig", "DiffCLIPRunConfig", "DiffCLIPSettings"]

DEFAULT_TASKS = ("zero_shot", "retrieval")


@dataclass
class DiffCLIPModelConfig:
    """The dual encoder: which network, its architecture, its processors."""

    arch: Literal["diffclip", "clip"] = setting(
        "diffclip", "diffclip, or clip: the same network with plain attention in both towers (the baseline)"
    )
    architecture: dict = setting(
        help="DiffCLIPConfig fields: text_config, vision_config, projection_dim, logit_scale_init_value, "
        "lambda_init, lambda_init_schedule, diff_attention_in_text, ... "
        "(edit with --set model.architecture.<key>=)",
        default_factory=dict,
    )
    tokenizer: str = setting("tiny-clip", "tokenizer: a preset folder, local folder or Hub id")
    image_processor: str = setting("tiny-clip", "image processor: a preset folder, local folder or Hub id")
    image_processor_kwargs: dict = setting(
        help="image-processor attributes to override (diffclip-b16: SLIP's ImageNet mean / std)",
        default_factory=dict,
    )


@dataclass
class DiffCLIPSettings:
    """DiffCLIP's own settings."""

    lambda_init: float | None = setting(
        None,
        "λ_init of every layer, both towers (paper: 0.8; default: the architecture's)",
        check=in_range(0, 1, high_open=True),
    )
    lambda_init_schedule: Literal["constant", "depth"] | None = setting(
        None, "'depth' = DiffCLIP*: λ_init(l) = 0.8 - 0.6·exp(-0.3·l) (default: the architecture's)"
    )
    diff_attention_in_text: bool | None = setting(
        None,
        "false = DiffCLIP†: differential attention in the vision tower only (default: the architecture's)",
    )
    crop_scale: list[float] | None = setting(
        None, "RandomResizedCrop area range LOW HIGH (SLIP: 0.5 1); none disables cropping"
    )
    compare_with: str | None = setting(
        None,
        "a trained model of the other arch to draw beside this one in the attention figure (a folder with "
        "its own Python code loads with --trust-remote-code only)",
        identity=False,
    )
    trust_remote_code: bool = setting(
        False, "run the Python code a --compare-with folder carries (its auto_map)", identity=False
    )


@dataclass
class DiffCLIPRunConfig(RunConfig):
    """Train DiffCLIP (CLIP with differential attention in both towers), or the same-size CLIP baseline, from
    scratch with the CLIP loss; evaluate zero-shot classification and retrieval before and after; save the
    model (loadable with AutoModel and trust_remote_code=True) with its processors; draw DiffCLIP Fig. 2."""

    method: ClassVar[str] = "diffclip"
    preset: ClassVar[str] = "diffclip-tiny"

    model: DiffCLIPModelConfig = field(default_factory=DiffCLIPModelConfig)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(learning_rate=5e-4, weight_decay=0.5))
    diffclip: DiffCLIPSettings = field(default_factory=DiffCLIPSettings)

    def validate(self) -> list[str]:
        from hf_vrl.methods.diffclip.build import architecture_problems

        problems = super().validate() + architecture_problems(self.model.architecture)
        scale = self.diffclip.crop_scale
        if scale is not None and not (len(scale) == 2 and 0 < scale[0] <= scale[1] <= 1):
            problems.append(f"diffclip.crop_scale must be two numbers 0 < LOW <= HIGH <= 1, got {scale}")
        options = [
            k
            for k in ("lambda_init", "lambda_init_schedule", "diff_attention_in_text")
            if getattr(self.diffclip, k) is not None
        ]
        if self.model.arch == "clip" and options:
            problems.append(
                f"diffclip.{', '.join(options)} apply to DiffCLIP only; drop them for --arch clip"
            )
        return problems

    def loss_terms(self, plan: BatchPlan) -> dict[str, str]:
        return {"CLIP loss": contrastive_sees(plan)}

    def per_micro_batch(self) -> list[str]:
        return super().per_micro_batch() + dropouts(self.model.architecture)


class DiffCLIPMethod(Method):
    name = "diffclip"
    config_class = DiffCLIPRunConfig
    summary = "DiffCLIP (or its CLIP baseline) from scratch with the CLIP loss"
    # checked before the run writes
    sources = {"model.tokenizer": (), "model.image_processor": (), "diffclip.compare_with": ()}
    aliases: ClassVar[dict[str, list[str]]] = {}

    def known_tasks(self) -> tuple[str, ...]:
        from hf_vrl.evaluation import TASKS

        return TASKS

    def image_size(self) -> int:
        from hf_vrl.methods.diffclip.build import model_config

        return model_config(self.config.model.architecture, self.config.model.arch).vision_config.image_size

    def check(self) -> None:
        """The shared checks (a --compare-with folder's code among them), and the image processor's size."""
        super().check()
        self._check_processor_size()

    def _check_processor_size(self) -> None:
        """The image processor makes images of the size the architecture takes (a configuration without its
        model section pairs the tiny processor with the default 224 px architecture)."""
        from PIL import Image

        from hf_vrl.methods.diffclip.build import load_processors

        model = self.config.model
        processor, _ = load_processors(model.tokenizer, model.image_processor, model.image_processor_kwargs)
        made = processor(images=Image.new("RGB", (8, 8)), return_tensors="pt")["pixel_values"].shape[-1]
        if made != self.image_size():
            raise UserError(
                f"--image-processor {model.image_processor} makes {made} px images, but the architecture "
                f"takes {self.image_size()} px: set model.architecture.vision_config.image_size to {made}, "
                "or give a processor of that size (a configuration file needs its model section)"
            )

    def setup(self) -> None:
        import hf_vrl.models  # noqa: F401  (registers DiffCLIP with the Auto classes for load_final)
        from hf_vrl.methods.diffclip.build import load_processors

        model = self.config.model
        self.image_processor, self.tokenizer = load_processors(
            model.tokenizer, model.image_processor, model.image_processor_kwargs
        )

    def initial_model(self) -> nn.Module:
        from transformers import set_seed

        from hf_vrl.methods.diffclip.build import build_model

        settings = self.config.diffclip
        options = {
            k: getattr(settings, k) for k in ("lambda_init", "lambda_init_schedule", "diff_attention_in_text")
        }
        set_seed(self.config.seed)
        return build_model(
            self.config.model.architecture, self.config.model.arch, tokenizer=self.tokenizer, **options
        )

    def train_stage(self, stage: str, model: nn.Module, checkpoint: str | None) -> nn.Module:
        from hf_vrl.data.collate import ImageTextCollator
        from hf_vrl.methods.diffclip.augment import RandomResizedCropCollator
        from hf_vrl.trainer import ContrastiveTrainer

        size = model.config.vision_config.image_size
        collator = ImageTextCollator(self.image_processor, self.tokenizer)
        if self.config.diffclip.crop_scale is not None:
            collator = RandomResizedCropCollator(collator, size, tuple(self.config.diffclip.crop_scale))
        trainer = ContrastiveTrainer(
            model=model,
            args=self.run.training_arguments(stage),
            train_dataset=self.run.train_data(image_size=size),
            data_collator=collator,
            warmup_start_lr=self.config.optim.warmup_start_lr,
        )
        output = trainer.train(resume_from_checkpoint=checkpoint)
        self.run.record_stage(stage, trainer, output)
        return trainer.accelerator.unwrap_model(trainer.model)

    def save_final(self, model: nn.Module, folder: Path) -> None:
        """The model and its processors, also as one `CLIPProcessor` (processor_config.json), so that
        `AutoProcessor` and the zero-shot pipeline find both."""
        from transformers import CLIPProcessor

        model.save_pretrained(folder)
        CLIPProcessor(image_processor=self.image_processor, tokenizer=self.tokenizer).save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)
        self.image_processor.save_pretrained(folder)  # preprocessor_config.json: AutoImageProcessor's file

    def load_final(self, folder: Path) -> nn.Module:
        from transformers import AutoModel

        from hf_vrl.weights import load_pretrained

        return load_pretrained(AutoModel, folder)

    def evaluate(self, model: nn.Module, when: str) -> dict[str, Any] | None:
        from hf_vrl.evaluation import evaluate_clip

        data = self._eval_data(model)
        if data is None:
            return None
        tasks = self.config.eval.tasks or DEFAULT_TASKS
        return evaluate_clip(
            model,
            self.image_processor,
            self.tokenizer,
            data,
            tasks=tasks,
            dataset_name=self.config.eval.eval_dataset,
            device=self.run.device,
            data=self.run.eval_record(data),
        )

    def _eval_data(self, model: nn.Module) -> Any:
        if not hasattr(self, "_eval"):
            self._eval = self.run.eval_data(image_size=model.config.vision_config.image_size)
        return self._eval

    def finish(self, model: nn.Module) -> dict[str, str]:
        """attention.png (DiffCLIP Fig. 2) for the first evaluation image and its caption."""
        from transformers import AutoModel

        from hf_vrl.methods.diffclip.figures import attention_figure
        from hf_vrl.weights import load_pretrained

        data = self._eval_data(model) if self.config.eval.figures else None
        if data is None:
            return {}
        models = {_label(model): model}
        settings = self.config.diffclip
        if settings.compare_with:
            trusted = settings.trust_remote_code
            loaded = load_pretrained(AutoModel, settings.compare_with, trust_remote_code=trusted)
            models[_label(loaded)] = loaded.to(self.run.device)
        row = data[0]
        path = self.run.dir.figures / "attention.png"
        attention_figure(
            row["image"],
            [row["caption"]],
            dict(sorted(models.items())),
            self.image_processor,
            self.tokenizer,
            path=path,
        )
        return {"attention_figure": str(path)}


def _label(model: nn.Module) -> str:
    """CLIP for a DiffCLIPModel without differential attention, else DiffCLIP."""
    config = model.config
    differential = getattr(config.vision_config, "differential_attention", False)
    return "DiffCLIP" if config.model_type == "diffclip" and differential else "CLIP"
