"""`hf-vrl train clue`: CLUE (ReSA's soft-InfoNCE with Sinkhorn targets, a VLAD part term and alignment to
frozen-CLIP embeddings of VLM descriptions, Eq. 8) on the shared run design (`hf_vrl.run`).

The recipe lives in the `clue-r50` preset (ResNet-50 from supervised ImageNet weights, SGD with cosine and
warm-up, batch 512, lr scaled by batch / 256, momentum encoder 0.999, K = 3 parts, CUB-200); `clue-tiny` is
the toy world on a CPU. Descriptions come from a dataset column or from the JSON file of
`python -m hf_vrl.methods.clue.describe`; they are embedded once into `<run>/inputs/` (`text.TextBank`). The
momentum branch is part of the model, so checkpoints hold it and a resumed run continues it bit for bit; its
coefficient is a function of the global step.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from torch import nn

from hf_vrl.errors import UserError
from hf_vrl.methods.clue.settings import CLUEMethodFields, CLUEModelFields, CLUESettings
from hf_vrl.run.batch import BatchPlan, batchnorm_sees
from hf_vrl.run.config import OptimConfig, RunConfig, at_least, setting
from hf_vrl.run.runner import Method

__all__ = ["CLUEMethod", "CLUEModelConfig", "CLUERunConfig"]

logger = logging.getLogger(__name__)


@dataclass
class CLUEModelConfig(CLUEModelFields):
    """The backbone CLUE starts from, the frozen text encoder and description source, the processor."""

    image_processor: str | None = setting(
        None,
        "checkpoint whose image processor's mean/std normalise the views and the evaluation (default: the "
        "backbone's; ImageNet's for a backbone_config)",
    )
    backbone_pretrain_steps: int = setting(
        0,
        "toy world only (dataset shapes, backbone_config): first train the backbone to name the shape of "
        "separate shapes-world images for this many SGD steps (at most --step-limit), a stand-in for "
        "ImageNet weights",
        check=at_least(0),
    )
    text_encoder_pretrain_steps: int = setting(
        0,
        "toy world only (dataset shapes, text_encoder a config-only folder such as tiny-clip): first train "
        "that CLIP with the CLIP loss on separate shapes-world image-caption pairs for this many steps (at "
        "most --step-limit), a stand-in for pretrained CLIP weights; its text tower then embeds the "
        "descriptions",
        check=at_least(0),
    )


@dataclass
class CLUERunConfig(RunConfig):
    """Train a ResNet/ViT with CLUE's Eq. 8 (global soft-InfoNCE, part term, text term); evaluate linear
    probe, retrieval Rank-1/5 and the granularity metrics before and after; save the CLUE model (AutoModel
    with trust_remote_code=True), export the backbone as a stock ResNetModel/ViTModel, draw Figs. 6 and 9."""

    method: ClassVar[str] = "clue"
    map_style_data: ClassVar[bool] = True  # its labelled sets: the probe and granularity read them whole
    preset: ClassVar[str] = "clue-tiny"

    model: CLUEModelConfig = field(default_factory=CLUEModelConfig)
    optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(optimizer="sgd", learning_rate=0.1, weight_decay=1e-5)
    )
    clue: CLUEMethodFields = field(default_factory=CLUEMethodFields)

    def settings(self, backbone: str | None = None, text_encoder: str | None = None) -> CLUESettings:
        """Both sections as validated `CLUESettings`; `backbone` and `text_encoder` (toy stand-ins for
        pretrained weights) replace the model's."""
        model = {k: v for k, v in asdict(self.model).items() if k in _MODEL_FIELDS}
        if backbone is not None:
            model.update(backbone=backbone, backbone_config=None)
        if text_encoder is not None:
            model.update(text_encoder=text_encoder)
        return CLUESettings(**model, **asdict(self.clue))

    def validate(self) -> list[str]:
        problems = super().validate()
        try:
            self.settings()
        except UserError as error:
            problems.append(str(error))
        if self.model.backbone_pretrain_steps and (
            self.model.backbone_config is None or self.data.dataset != "shapes"
        ):
            problems.append(
                "model.backbone_pretrain_steps needs the toy world: dataset shapes and a backbone_config"
            )
        return problems + self._text_problems()

    def _text_problems(self) -> list[str]:
        """Description sources that cannot work, or that would turn the text term into label supervision."""
        from hf_vrl.methods.clue.toy_describer import SOURCES
        from hf_vrl.presets import HUB_CONFIGS

        model, dataset, problems = self.model, self.data.dataset, []
        labelled = _class_name_captions(dataset)
        if self.clue.gamma and model.text_source == "caption" and labelled:
            problems.append(
                f"model.text_source caption on {labelled}: its captions are class-name templates, so the "
                "text term would be label supervision; use VLM descriptions (python -m "
                "hf_vrl.methods.clue.describe --dataset <data> --output descriptions.json, then "
                "--text-source descriptions.json)"
            )
        if model.text_source in SOURCES and dataset != "shapes":
            problems.append(
                f"model.text_source {model.text_source} describes the toy world only: dataset shapes"
            )
        if model.text_encoder_pretrain_steps and (
            dataset != "shapes" or not (HUB_CONFIGS / model.text_encoder).is_dir()
        ):
            problems.append(
                "model.text_encoder_pretrain_steps needs the toy world: dataset shapes and a config-only "
                "text_encoder such as tiny-clip"
            )
        return problems

    def loss_terms(self, plan: BatchPlan) -> dict[str, str]:
        rows = plan.per_process if plan.accumulation == "whole_batch" else plan.micro_batch
        columns = f"{rows} rows (this process's) against {plan.loss_batch} columns (every process's)"
        terms = {"Sinkhorn targets, soft-InfoNCE (Eq. 5-6)": columns}
        if self.clue.gamma:
            terms["text alignment (Eq. 7)"] = columns
        terms["BatchNorm statistics"] = batchnorm_sees(plan, self.clue.sync_batchnorm)
        return terms

    def per_micro_batch(self) -> list[str]:
        return [*super().per_micro_batch(), "BatchNorm normalises each micro-batch (the heads, a ResNet)"]

    def per_process(self) -> list[str]:
        """BatchNorm's running statistics: each process updates its own with its micro-batches and DDP keeps
        process 0's (it broadcasts them before every forward pass), so they follow the process count; with
        SyncBatchNorm its batch statistics too."""
        running = ["BatchNorm's running statistics are process 0's under DDP"]
        joined = (
            ["SyncBatchNorm joins the processes' micro-batches on GPUs"] if self.clue.sync_batchnorm else []
        )
        return super().per_process() + running + joined


_MODEL_FIELDS = set(CLUEModelFields.__dataclass_fields__)


def _pretrain_record(size: int, seed: int) -> dict[str, Any]:
    """The data record of the toy pre-trainings: `size` shapes-world images of the "pretrain" split (a stream
    apart from the training images), generated from `seed`."""
    return {"dataset": "shapes", "split": "pretrain", "n_samples": size, "drawn": "generated", "seed": seed}


def _class_name_captions(dataset: str | None) -> str | None:
    """The name of a fine-grained set whose caption column is a class-name template (the label itself):
    CUB-200 ("cub:<root>" or a bare path to its folder), FGVC-Aircraft, Stanford Cars; else None."""
    from hf_vrl.data.cub import find_cub_root

    if not dataset:
        return None
    prefix = dataset.split(":", 1)[0]
    named = {"cub": "CUB-200", "aircraft": "FGVC-Aircraft", "cars": "Stanford Cars"}
    if prefix in named:
        return named[prefix]
    try:
        find_cub_root(Path(dataset).expanduser())
    except (FileNotFoundError, OSError):
        return None
    return named["cub"]


class CLUEMethod(Method):
    name = "clue"
    config_class = CLUERunConfig
    summary = "CLUE: soft-InfoNCE + part + description terms (Eq. 8) for fine-grained SSL"

    def known_tasks(self) -> tuple[str, ...]:
        from hf_vrl.methods.clue.evaluate import TASKS

        return TASKS

    def image_size(self) -> int:
        return self.config.clue.image_size

    def setup(self) -> None:
        import hf_vrl.models  # noqa: F401  (registers CLUE with the Auto classes for load_final)
        from hf_vrl.methods.clue.model import build_image_processor

        self.settings = self.config.settings(self._pretrained_backbone(), self._pretrained_text_encoder())
        source = self.config.model.image_processor
        self.image_processor = build_image_processor(self.settings, source)
        self.train_dataset = self.run.train_data(image_size=self.settings.image_size)
        if self.settings.uses_text:
            self.train_dataset = self._described(self.train_dataset)
        self.text_bank = self._text_bank() if self.settings.uses_text else None
        self._eval: Any = None

    def _pretrained_backbone(self) -> str | None:
        """The toy stand-in for ImageNet weights, trained once into <run>/inputs/backbone (or None), recorded
        as it ran: a supervised classifier of the shapes (labels), not self-supervised."""
        from accelerate import PartialState

        from hf_vrl.methods.clue.miniature import PRETRAIN_SIZE, pretrain_backbone

        steps = self.run.step_budget(self.config.model.backbone_pretrain_steps)
        if not steps:
            return None
        seed, size = self.config.seed, self.config.clue.image_size

        def build(folder: Path) -> None:
            pretrain_backbone(
                self.config.model.backbone_config, steps, seed=seed, image_size=size
            ).save_pretrained(folder)

        folder = self.run.build_input(
            "backbone", build, model="the backbone (ResNet from its configuration, random start)",
            objective="supervised classification (cross-entropy) of the shape, through a linear head "
            "dropped afterwards", labels="shape labels (the coarse class)",
            data=_pretrain_record(PRETRAIN_SIZE, seed), steps=steps,
        )  # fmt: skip
        PartialState().wait_for_everyone()
        return str(folder)

    def _pretrained_text_encoder(self) -> str | None:
        """The toy stand-in for pretrained CLIP, trained once into <run>/inputs/text_encoder (or None),
        recorded as it ran."""
        from accelerate import PartialState

        from hf_vrl.methods.clue.miniature import PRETRAIN_SIZE, pretrain_text_encoder

        steps = self.run.step_budget(self.config.model.text_encoder_pretrain_steps)
        if not steps or not self.config.clue.gamma:
            return None
        encoder, seed = self.config.model.text_encoder, self.config.seed
        folder = self.run.build_input(
            "text_encoder", lambda out: pretrain_text_encoder(encoder, out, steps, seed=seed),
            model=f"the text encoder (`{encoder}` CLIP configuration, random start)",
            objective="the CLIP loss (image-caption contrastive)", labels="captions",
            data=_pretrain_record(PRETRAIN_SIZE, seed), steps=steps,
        )  # fmt: skip
        PartialState().wait_for_everyone()
        return str(folder)

    def _described(self, train_dataset: Any) -> Any:
        """The training rows with the toy describer's descriptions as the column `text_source` (when the
        source is one of `toy_describer.SOURCES`; other sources leave the rows as they are)."""
        from hf_vrl.methods.clue.toy_describer import SOURCES, describe_images
        from hf_vrl.run.data import SeededDataset

        source = self.settings.text_source
        if source not in SOURCES:
            return train_dataset
        rows = train_dataset.dataset
        texts = describe_images(rows["image"], self.config.seed, shuffled=SOURCES[source])
        return SeededDataset(rows.add_column(source, texts), self.config.seed)

    def _text_bank(self) -> Any:
        """Description embeddings of the training rows, cached in <run>/inputs/ (the main process first)."""
        from accelerate import PartialState

        from hf_vrl.methods.clue.text import (
            build_text_bank,
            descriptions_of,
            is_json_source,
            load_descriptions,
        )

        s = self.settings
        if is_json_source(s.text_source):
            texts = list(load_descriptions(s.text_source).values())
        else:
            rows = getattr(self.train_dataset, "dataset", None)
            if rows is None or not hasattr(rows, "column_names"):
                raise UserError("streamed data needs descriptions from a .json file: set model.text_source")
            texts = descriptions_of(rows, s.text_source, s.text_id_column)
        with PartialState().main_process_first():
            return build_text_bank(
                texts,
                s.text_encoder,
                text_source=s.text_source,
                id_column=s.text_id_column,
                cache_dir=self.run.dir.inputs,
                device=self.run.device,
            )

    def initial_model(self) -> nn.Module:
        from transformers import set_seed

        from hf_vrl.methods.clue.model import build_model

        set_seed(self.config.seed)
        return build_model(self.settings, text_embed_dim=self.text_bank.dim if self.text_bank else None)

    def train_stage(self, stage: str, model: nn.Module, checkpoint: str | None) -> nn.Module:
        """Eq. 8 with `CLUETrainer`; with clue.sync_batchnorm on several GPU processes the BatchNorm layers
        train as SyncBatchNorm (before the Trainer wraps the model) and come back as plain BatchNorm."""
        from hf_vrl.methods.clue.model import to_plain_batchnorm, to_sync_batchnorm
        from hf_vrl.methods.clue.trainer import CLUETrainer

        if self._sync_batchnorm():
            model = to_sync_batchnorm(model)
        trainer = CLUETrainer(
            model=model,
            args=self.run.training_arguments(stage),
            train_dataset=self.train_dataset,
            settings=self.settings,
            text_bank=self.text_bank,
            image_processor=self.image_processor,
        )
        output = trainer.train(resume_from_checkpoint=checkpoint)
        self.run.record_stage(stage, trainer, output)
        return to_plain_batchnorm(trainer.accelerator.unwrap_model(trainer.model))

    def _sync_batchnorm(self) -> bool:
        """Whether this run trains with SyncBatchNorm: the setting, several processes, and GPUs (torch's
        SyncBatchNorm refuses CPU tensors)."""
        if not self.settings.sync_batchnorm or self.run.world_size < 2:
            return False
        if self.run.device.type == "cpu":
            if self.run.is_main:
                logger.warning(
                    "clue.sync_batchnorm: torch's SyncBatchNorm needs GPUs; on CPU each of the %d processes "
                    "keeps its own BatchNorm statistics",
                    self.run.world_size,
                )
            return False
        return True

    def save_final(self, model: nn.Module, folder: Path) -> None:
        model.save_pretrained(folder)
        self.image_processor.save_pretrained(folder)

    def load_final(self, folder: Path) -> nn.Module:
        from transformers import AutoModel

        from hf_vrl.weights import load_pretrained

        return load_pretrained(AutoModel, folder)

    def evaluate(self, model: nn.Module, when: str) -> dict[str, Any] | None:
        """linear_probe.top1, retrieval.i2i_R@1 / i2i_R@5 and granularity.* (CLUE §5.1.2, §3.1; granularity on
        clue.granularity_split, the training rows by default)."""
        from hf_vrl import metrics
        from hf_vrl.eval_inputs import data_record
        from hf_vrl.methods.clue.evaluate import TASKS, evaluate_clue

        test = self._eval_data()
        if test is None:
            return None
        train = self.train_dataset.dataset if hasattr(self.train_dataset, "dataset") else None
        data = self.config.data
        return evaluate_clue(
            model.to(self.run.device),
            self.image_processor,
            test,
            train,
            tasks=self.config.eval.tasks or TASKS,
            label_column=self.settings.eval_label_column,
            seed=self.config.seed,
            probe_cs=tuple(self.settings.probe_cs or metrics.DEFAULT_CS),
            granularity_split=self.settings.granularity_split,
            data=self.run.eval_record(test),
            train_data=None
            if train is None
            else data_record(data.dataset, data.split, train, limit=data.train_limit, seed=self.config.seed),
        )

    def _eval_data(self) -> Any:
        if self._eval is None:
            self._eval = self.run.eval_data(image_size=self.settings.image_size)
        return self._eval

    def finish(self, model: nn.Module) -> dict[str, str]:
        """exports/backbone (a stock ResNetModel / ViTModel), figures/part_maps.png (Fig. 6) and
        figures/gradcam.png (Fig. 9)."""
        from hf_vrl.methods.clue.evaluate import plot_part_maps
        from hf_vrl.methods.clue.export import export_backbone
        from hf_vrl.run.layout import atomic_dir

        backbone = self.run.dir.exports / "backbone"
        with atomic_dir(backbone) as folder:
            export_backbone(model, folder, self.image_processor)
        outputs = {"backbone": str(backbone)}
        test = self._eval_data() if self.config.eval.figures else None
        count = self.settings.part_map_images
        if test is not None and count and getattr(model, "part_extractor", None) is not None:
            path = self.run.dir.figures / "part_maps.png"
            plot_part_maps(model, self.image_processor, test["image"][:count], path)
            outputs["part_maps"] = str(path)
        if test is not None and count:
            outputs["gradcam"] = str(self._plot_grad_cam(model, test, count))
        return outputs

    def _plot_grad_cam(self, model: nn.Module, test: Any, count: int) -> Path:
        """Fig. 9 on the first `count` test images: Grad-CAM of the start (the model before training) and of
        the trained model, each image scored against its class prototype over the test images of the shown
        classes (`figures.grad_cam`)."""
        from hf_vrl.methods.clue.evaluate import eval_label_column
        from hf_vrl.methods.clue.figures import plot_grad_cam

        column = eval_label_column(test, self.settings.eval_label_column)
        labels = list(test[column])
        shown = set(labels[:count])
        reference = test.select([i for i, label in enumerate(labels) if label in shown])
        models = {"start": self.initial_model().to(self.run.device), "CLUE": model}
        path = self.run.dir.figures / "gradcam.png"
        plot_grad_cam(
            models,
            self.image_processor,
            test["image"][:count],
            labels[:count],
            reference["image"],
            reference[column],
            path,
        )
        return path
