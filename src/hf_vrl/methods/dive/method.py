"""`hf-vrl train dive`: robust fine-tuning of a pre-trained dual encoder with DiVE (or FLYP and the other
baselines), on the shared run design (`hf_vrl.run`).

The run fine-tunes both towers of the pre-trained model on labelled target images captioned from class
templates (FLYP) and, for DiVE, on reference image-caption batches against a frozen copy of the pre-trained
model (Eq. 9). That copy lives in the trainer, follows the model's device and is never saved; the average
vector m and the reference position are checkpointed with the trainer state (`DiVETrainer.extra_state`), so a
killed run resumes exactly. `final/` is the fine-tuned model as itself (a plain CLIPModel / SiglipModel) with
its processors; `exports/vision-tower/` its vision tower alone; `exports/wise-ft/` the WiSE-FT ensemble when
asked. The report holds, before and after: `zero_shot.top1` (ID), `ood.top1` (mean over the OOD sets, each
one beside it), `transfer.top1` (mean over the zero-shot transfer sets) and `rsa.image` / `rsa.text`; with
`dive.macro_f1`, `zero_shot.macro_f1` and `ood.macro_f1` (and each set's), and for sets with a group column
(`dive.group_column`, FMoW's region), `zero_shot.worst_group` / `ood.worst_group` (Table 4).

The cross-entropy baselines (`dive.objective` ft, lp_ft; `head.py`) train a `HeadClassifier`: the image tower
and a zero-shot-initialised linear head (lp_ft: stage `linear_probe`, the head alone, then stage `train`).
Their `final/` is the dual encoder (its text tower the pre-trained one) with the head beside it in
`classification_head.safetensors`; a plain `CLIPModel.from_pretrained` loads the encoder and ignores the head.

With no arguments it runs the `dive-tiny` preset: a tiny CLIP is first pre-trained on the offline
image-caption mix (into `<run>/inputs/pretrained`), then fine-tuned on five Fashion-MNIST classes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from torch import nn

from hf_vrl.data.processors import load_image_processor
from hf_vrl.errors import UserError
from hf_vrl.methods.dive.data import load_reference_dataset
from hf_vrl.methods.dive.settings import DiVESettings
from hf_vrl.run.batch import BatchPlan, contrastive_sees, process_count
from hf_vrl.run.config import OptimConfig, RunConfig, at_least, dropouts, setting
from hf_vrl.run.layout import atomic_dir
from hf_vrl.run.runner import Method

__all__ = ["DiVEMethod", "DiVEModelConfig", "DiVERunConfig"]


@dataclass
class DiVEModelConfig:
    """The pre-trained dual encoder to fine-tune (its processors come with it)."""

    pretrained: str = setting(
        "openai/clip-vit-base-patch16",
        "the pre-trained CLIPModel / SiglipModel / DiffCLIP: a Hub id, a local folder, or a preset folder "
        "(tiny-clip: config and processors only, for the toy world)",
    )
    trust_remote_code: bool = setting(False, "load remote code with the checkpoint")
    pretrain_steps: int = setting(
        0,
        "toy world only: first pre-train `pretrained` from its config with the CLIP loss on pretrain_data "
        "(into <run>/inputs/pretrained), this many steps (at most --step-limit)",
        check=at_least(0),
    )
    pretrain_data: dict = setting(
        help="toy world only: the pre-training mix, {registry name: images}", default_factory=dict
    )
    pretrain_batch_size: int = setting(128, "toy world only: pre-training batch", check=at_least(1))
    pretrain_learning_rate: float = setting(2e-3, "toy world only: pre-training lr", check=at_least(1e-12))
    image_size: int | None = setting(
        None,
        "toy world only: image size of the config-only `pretrained` (default: its own)",
        check=at_least(1),
    )

    def pretrained_config(self) -> Any:
        """The configuration of `pretrained` (hf_vrl's model types registered with AutoConfig)."""
        from transformers import AutoConfig

        import hf_vrl.models  # noqa: F401  (registers hf_vrl's model types with AutoConfig)
        from hf_vrl.eval_inputs import resolve_model_path

        return AutoConfig.from_pretrained(
            resolve_model_path(self.pretrained), trust_remote_code=self.trust_remote_code
        )


@dataclass
class DiVERunConfig(RunConfig):
    """Fine-tune a pre-trained CLIP-like model on target classes with DiVE (FLYP + AVL + PVL, Eq. 9) or a
    baseline (FLYP, FLYP + replay, SnD, vanilla FT, LP-FT); evaluate ID, OOD, zero-shot transfer and RSA
    before and after; save the fine-tuned model as a plain CLIPModel with its processors, its vision tower
    and, when asked, WiSE-FT."""

    method: ClassVar[str] = "dive"
    map_style_data: ClassVar[bool] = True  # its labelled sets: class-balanced, indexed by sample
    preset: ClassVar[str] = "dive-tiny"

    model: DiVEModelConfig = field(default_factory=DiVEModelConfig)
    optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(
            batch_size=512, num_train_epochs=10, learning_rate=1e-5, weight_decay=0.1, warmup_steps=500
        )
    )
    dive: DiVESettings = field(default_factory=DiVESettings)

    def validate(self) -> list[str]:
        problems = super().validate() + self.dive.reference_problems()
        model, dive = self.model, self.dive
        if model.pretrain_steps and not model.pretrain_data:
            problems.append("model.pretrain_steps needs model.pretrain_data ({registry name: images})")
        if dive.wise_ft and dive.trains_head:
            problems.append(
                f"dive.wise_ft interpolates dual encoders; objective {dive.objective!r} trains a classifier"
            )
        if dive.wise_ft and not dive.val_size:
            problems.append(
                "dive.wise_ft chooses its coefficient on held-out training rows: set dive.val_size"
            )
        if dive.held_out_classes and not dive.classes:
            problems.append("dive.held_out_classes needs dive.classes (the classes fine-tuned on)")
        if set(dive.classes or ()) & set(dive.held_out_classes or ()):
            problems.append(
                "dive.classes and dive.held_out_classes overlap: a held-out class is never trained"
            )
        reference = dive.reference_batch_size
        if reference is not None and self.dive.uses_reference:
            plan = None
            try:
                plan = self.batch_plan(process_count())
            except UserError:
                pass  # reported by RunConfig.validate
            chunks = plan.processes * plan.accumulation_steps if plan else 1
            if reference % chunks:
                problems.append(
                    f"dive.reference_batch_size ({reference}, per optimiser step over all processes) must be "
                    f"a multiple of processes x micro-batches ({chunks})"
                )
        return problems

    def per_micro_batch(self) -> list[str]:
        """The pre-trained model's dropout, read from its configuration (unknown: assumed)."""
        try:
            config = self.model.pretrained_config()
        except (OSError, ValueError):
            return [
                *super().per_micro_batch(),
                f"the dropout of {self.model.pretrained}, whose config is unread",
            ]
        return super().per_micro_batch() + dropouts(config)

    def loss_terms(self, plan: BatchPlan) -> dict[str, str]:
        if self.dive.trains_head:
            return {
                "cross-entropy (image classifier)": f"the mean over the {plan.global_batch} images of a step"
            }
        terms = {"L_cl (FLYP)": contrastive_sees(plan)}
        if not self.dive.uses_reference:
            return terms
        whole = plan.accumulation == "whole_batch"
        reference = self.dive.reference_batch_size or plan.global_batch
        seen = reference if whole else reference // plan.accumulation_steps
        name = {"flyp_replay": "replay (Eq. 15)", "snd": "SnD (Eq. 13)"}.get(self.dive.objective, "AVL, PVL")
        terms[name] = f"{seen} reference pairs per evaluation (B' = {reference} per optimiser step)"
        if name == "AVL, PVL":
            times = "once" if whole else f"{plan.accumulation_steps} times"
            terms["m (Eq. 6)"] = f"updated {times} per optimiser step, from the mean over {seen} pairs"
        return terms


class DiVEMethod(Method):
    name = "dive"
    config_class = DiVERunConfig
    summary = "robust fine-tuning of a pre-trained CLIP with DiVE (or FLYP, replay, SnD, FT, LP-FT)"
    sources = {"model.pretrained": ()}  # checked before the run writes

    def stages(self) -> list[str]:
        """LP-FT: the linear probe, then the fine-tuning; every other objective: one stage."""
        return ["linear_probe", "train"] if self.config.dive.objective == "lp_ft" else ["train"]

    def check(self) -> None:
        """The shared checks, and the reference set and the toy pre-training data named."""
        from hf_vrl.methods.dive.model import is_dual_encoder
        from hf_vrl.run.preflight import check_data, check_model_kind, check_remote_code

        model = self.config.model
        check_remote_code(model.pretrained, "--pretrained", model.trust_remote_code)
        expected = (
            "DiVE fine-tunes both towers of a CLIP-like model: give a CLIPModel, SiglipModel or DiffCLIP"
        )
        check_model_kind(model.pretrained, "--pretrained", is_dual_encoder, expected)
        super().check()  # reads --pretrained's image size
        reference = self.config.dive.reference_dataset
        for name in [reference] if isinstance(reference, str) else reference or []:
            check_data(name, "--reference-dataset")
        self._check_reference_stream()
        for name in self.config.model.pretrain_data if self.config.model.pretrain_steps else ():
            check_data(name, "--pretrain-data")
        self._target()  # --classes and --val-size against the data, before the toy pre-training

    def _check_reference_stream(self) -> None:
        """A streamed reference set the settings cannot use, refused before anything is written (not after
        the toy pre-training): the frozen-embedding cache indexes samples, several reference sets are
        concatenated map-style, and a stream must hold one reference batch (its first batch is read)."""
        from hf_vrl.data.registry import is_streamed

        dive = self.config.dive
        names = (
            [dive.reference_dataset] if isinstance(dive.reference_dataset, str) else dive.reference_dataset
        )
        streamed = [name for name in names or [] if is_streamed(name)]
        if not streamed or not dive.uses_reference:
            return
        if len(names) > 1:
            raise UserError(
                f"--reference-dataset {streamed[0]} streams: several reference sets are joined map-style; "
                "give the stream alone, or map-style sets"
            )
        if dive.objective != "flyp_replay" and dive.frozen_embeddings == "cache":
            raise UserError(
                f"--reference-dataset {streamed[0]} streams: frozen_embeddings='cache' needs a map-style "
                "reference set (a stream has no sample index); use --set dive.frozen_embeddings=forward"
            )
        batch = dive.reference_batch_size or self.config.batch_plan(1).global_batch
        held = sum(1 for _ in load_reference_dataset(dive, seed=self.config.seed).take(batch))
        if held < batch:
            raise UserError(
                f"--reference-dataset {streamed[0]} streams {held} samples, fewer than one reference batch "
                f"({batch}): use a larger reference set or a smaller dive.reference_batch_size"
            )

    # -- inputs ----------------------------------------------------------------------------------------------

    def setup(self) -> None:
        from transformers import AutoTokenizer

        self.settings: DiVESettings = self.config.dive
        self.pretrained = self._pretrained_path()
        self.image_processor = load_image_processor(self.pretrained)
        self.tokenizer = AutoTokenizer.from_pretrained(self.pretrained)
        self._frozen: nn.Module | None = None
        self._sets: dict[str, Any] | None = None

    def _pretrained_path(self) -> str:
        """`model.pretrained`, or the toy CLIP pre-trained once into <run>/inputs/pretrained."""
        from accelerate import PartialState

        from hf_vrl.eval_inputs import resolve_model_path

        model = self.config.model
        if not model.pretrain_steps:
            return resolve_model_path(model.pretrained)
        steps, seed = self.run.step_budget(model.pretrain_steps), self.config.seed
        folder = self.run.build_input(
            "pretrained", lambda staging: pretrain_toy_clip(model, staging, steps=steps, seed=seed),
            model=f"a tiny CLIP (`{model.pretrained}` configuration, random start)",
            objective="the CLIP loss (image-caption contrastive)", labels="captions",
            data=[_pretrain_record(name, limit, seed) for name, limit in model.pretrain_data.items()],
            steps=steps,
        )  # fmt: skip
        PartialState().wait_for_everyone()
        return str(folder)

    def _load(self, path: str) -> nn.Module:
        from hf_vrl.methods.dive.model import load_dual_encoder

        return load_dual_encoder(path, trust_remote_code=self.config.model.trust_remote_code)[0]

    def initial_model(self) -> nn.Module:
        """The pre-trained dual encoder; for ft / lp_ft with the zero-shot head of the target's classes."""
        model = self._load(self.pretrained)
        if not self.settings.trains_head:
            return model
        from hf_vrl.methods.dive.head import HeadClassifier, zero_shot_head

        names = self._class_names(self._target()[0])
        weight = zero_shot_head(model.to(self.run.device), self.tokenizer, names, self._templates())
        return HeadClassifier(model, weight, names)

    def _load_result(self, folder: Path) -> nn.Module:
        """A saved stage or final model: the dual encoder, with its head when one was saved beside it."""
        from hf_vrl.methods.dive.head import HEAD_FILE, load_head

        model = self._load(str(folder))
        return load_head(model, folder) if (folder / HEAD_FILE).is_file() else model

    def _frozen_model(self) -> nn.Module:
        """The pre-trained model for RSA and WiSE-FT (loaded once, on the run's device)."""
        if self._frozen is None:
            self._frozen = self._load(self.pretrained).eval().to(self.run.device)
        return self._frozen

    def image_size(self) -> int:
        """The pre-trained model's (the toy one is built from the same configuration)."""
        return self.config.model.pretrained_config().vision_config.image_size

    def _target(self) -> tuple[Any, Any]:
        """(training rows wrapped by the run, the held-out ID validation rows or None); refuses classes the
        data does not have and a validation split that leaves less than one batch."""
        from hf_vrl.methods.dive.data import select_classes
        from hf_vrl.run.data import SeededDataset

        data = self.run.train_data(image_size=self.image_size())
        settings = self.config.dive
        if not isinstance(data, SeededDataset):
            if settings.classes or settings.val_size:
                raise UserError("dive.classes and dive.val_size need a map-style training set, not a stream")
            return data, None
        names = data.dataset.features["label"].names if settings.classes else []
        outside = [c for c in settings.classes or () if not 0 <= c < len(names)]
        if outside:
            raise UserError(
                f"--classes {outside[0]}: {self.config.data.dataset} has classes 0..{len(names) - 1} only"
            )
        rows = select_classes(data.dataset, settings.classes) if settings.classes else data.dataset
        if not settings.val_size:
            return SeededDataset(rows, self.config.seed), None
        if len(rows) - settings.val_size < self.config.optim.batch_size * self.run.world_size:
            raise UserError(
                f"dive.val_size {settings.val_size} leaves fewer than one batch of the {len(rows)} training "
                "rows: lower --val-size, or use more data (--train-limit)"
            )
        split = rows.train_test_split(test_size=settings.val_size, seed=self.config.seed)
        return SeededDataset(split["train"], self.config.seed), split["test"]

    # -- training --------------------------------------------------------------------------------------------

    def _trainer(self, stage: str, model: nn.Module) -> Any:
        """DiVETrainer on the target rows (its frozen model a copy of `model`, the pre-trained weights); for
        ft / lp_ft a HeadTrainer (stage linear_probe: the head alone, lp_steps at lp_learning_rate)."""
        from hf_vrl.data.collate import ImageTextCollator
        from hf_vrl.methods.dive.data import FLYPCollator

        settings = self.settings
        train, _ = self._target()
        collator = FLYPCollator(
            self.image_processor,
            self.tokenizer,
            self._class_names(train),
            self._templates(),
            crop_scale=settings.crop_scale,
        )
        common = {"train_dataset": train, "data_collator": collator}
        common["warmup_start_lr"] = self.config.optim.warmup_start_lr
        if settings.trains_head:
            from hf_vrl.methods.dive.head import HeadTrainer, set_trainable

            probe = stage == "linear_probe"
            set_trainable(model, encoder=not probe)
            lp = {"max_steps": settings.lp_steps, "learning_rate": settings.lp_learning_rate} if probe else {}
            return HeadTrainer(model=model, args=self.run.training_arguments(stage, **lp), **common)
        from hf_vrl.methods.dive.trainer import DiVETrainer

        reference = {}
        if settings.uses_reference:
            reference = {
                "reference_dataset": load_reference_dataset(
                    settings, seed=self.config.seed, image_size=self.image_size()
                ),
                "reference_collator": ImageTextCollator(self.image_processor, self.tokenizer),
            }
        args = self.run.training_arguments(stage)
        return DiVETrainer(model=model, args=args, settings=settings, **common, **reference)

    def train_stage(self, stage: str, model: nn.Module, checkpoint: str | None) -> nn.Module:
        """The stage's trainer (`_trainer`), with best-epoch selection when asked."""
        settings = self.settings
        trainer = self._trainer(stage, model)
        selection = None
        if settings.select_best_epoch:
            from hf_vrl.methods.dive.selection import BestEpoch

            selection = BestEpoch(
                self._validation_score,
                self.run.dir.checkpoints(stage) / "best-epoch",
                unwrap=trainer.accelerator.unwrap_model,
            )
            trainer.add_callback(selection)
        output = trainer.train(resume_from_checkpoint=checkpoint)
        self.run.record_stage(stage, trainer, output)
        model = trainer.accelerator.unwrap_model(trainer.model)
        if selection is not None:
            from accelerate import PartialState

            PartialState().wait_for_everyone()  # the main process wrote the selected weights
            selection.restore(model)
        return model

    def _validation_score(self, model: nn.Module) -> float:
        """Zero-shot top-1 on the ID validation rows: best-epoch selection's score (and WiSE-FT's)."""
        from hf_vrl.methods.dive.evaluate import id_accuracy

        _, validation = self._target()
        return id_accuracy(
            model,
            self.image_processor,
            self.tokenizer,
            validation,
            self._templates(),
            dataset_name=self.config.data.dataset,
        )

    def save_final(self, model: nn.Module, folder: Path) -> None:
        """The dual encoder with its processors; a HeadClassifier's head beside it (`save_head`)."""
        from hf_vrl.methods.dive.export import export_model
        from hf_vrl.methods.dive.head import HeadClassifier, save_head

        encoder = model.encoder if isinstance(model, HeadClassifier) else model
        export_model(encoder, folder, self.image_processor, self.tokenizer)
        if isinstance(model, HeadClassifier):
            save_head(model, folder)

    def load_final(self, folder: Path) -> nn.Module:
        return self._load_result(folder)

    def save_stage(self, stage: str, model: nn.Module, folder: Path) -> None:
        self.save_final(model, folder)

    def load_stage(self, stage: str, folder: Path) -> nn.Module:
        return self._load_result(folder)

    # -- evaluation ------------------------------------------------------------------------------------------

    def _evaluation_sets(self) -> dict[str, Any] | None:
        """ID test rows (the target classes of eval_dataset), OOD, transfer and RSA sets (built once)."""
        if self._sets is not None or self.config.eval.eval_dataset is None:
            return self._sets
        from hf_vrl.methods.dive.data import select_classes
        from hf_vrl.methods.dive.evaluate import load_evaluation_sets
        from hf_vrl.methods.dive.shifts import shift_dataset

        settings, evaluation, size = self.settings, self.config.eval, self.image_size()
        rows = self.run.eval_data(image_size=size)
        id_rows = select_classes(rows, settings.classes) if settings.classes else rows
        sets = load_evaluation_sets(
            settings,
            split=evaluation.eval_split,
            limit=evaluation.eval_limit,
            image_size=size,
            seed=self.config.seed,
        )
        classes = id_rows.features["label"].names if settings.classes else None
        sets["data"]["id"] = self.run.eval_record(id_rows, classes=classes)
        for shift in settings.ood_shifts:
            sets["ood_datasets"][shift] = shift_dataset(id_rows, shift)
            sets["data"]["ood"][shift] = self.run.eval_record(id_rows, classes=classes, transform=shift)
        if settings.held_out_classes:
            held_out = select_classes(rows, settings.held_out_classes)
            sets["transfer_datasets"] = {"held-out classes": held_out} | sets["transfer_datasets"]
            names = held_out.features["label"].names
            sets["data"]["transfer"]["held-out classes"] = self.run.eval_record(held_out, classes=names)
        self._sets = {"id_dataset": id_rows, **sets}
        return self._sets

    def _templates(self) -> list[str]:
        """The caption templates: the settings', else OpenAI's 80 for an ImageNet-family target (the paper's,
        FLYP's), else hf_vrl's caption templates."""
        from hf_vrl.data.benchmarks import benchmark_name
        from hf_vrl.data.prompts import CAPTION_TEMPLATES, IMAGENET_TEMPLATES, imagenet_family

        if self.settings.templates:
            return list(self.settings.templates)
        family = imagenet_family(benchmark_name(self.config.data.dataset))
        return list(IMAGENET_TEMPLATES if family else CAPTION_TEMPLATES)

    def _class_names(self, rows: Any) -> list[str]:
        """The target's class names in its training captions: OpenAI's curated names for ImageNet-family data
        (as the evaluation prompts them, `hf_vrl.data.benchmarks.openai_class_names`), else its own."""
        from hf_vrl.data.benchmarks import benchmark_name, openai_class_names

        names = list(rows.features["label"].names)
        return openai_class_names(benchmark_name(self.config.data.dataset), names) or names

    def evaluate(self, model: nn.Module, when: str) -> dict[str, Any] | None:
        """ID / OOD / transfer / RSA as `evaluate_dive` computes them, in the run report's metric names."""
        from hf_vrl.methods.dive.evaluate import ClassifySettings, evaluate_dive

        sets = self._evaluation_sets()
        if sets is None:
            return None
        templates = self._templates()
        # the held-out classes share the target's data set and prompts; other sets their own unless asked
        own = {"held-out classes"} | (
            set(sets["transfer_datasets"]) if self.settings.transfer_templates == "target" else set()
        )
        report = evaluate_dive(
            model.to(self.run.device).eval(),
            self.image_processor,
            self.tokenizer,
            **sets,
            pretrained_model=self._frozen_model() if sets["rsa_dataset"] is not None else None,
            templates=templates,
            transfer_templates={name: templates for name in own if name in sets["transfer_datasets"]},
            id_dataset_name=self.config.eval.eval_dataset,
            settings=ClassifySettings(
                macro_f1=self.settings.macro_f1,
                group_column=self.settings.group_column,
                group_exclude=tuple(self.settings.group_exclude),
                objectnet_border=self.settings.objectnet_border,
            ),
        )
        return run_report_section(report)

    # -- exports ---------------------------------------------------------------------------------------------

    def finish(self, model: nn.Module) -> dict[str, str]:
        """The vision tower alone; the WiSE-FT ensemble (with its coefficient and evaluation) when asked."""
        from hf_vrl.methods.dive.export import export_vision_tower
        from hf_vrl.methods.dive.head import HeadClassifier

        outputs = {}
        encoder = model.encoder if isinstance(model, HeadClassifier) else model
        with atomic_dir(self.run.dir.exports / "vision-tower") as folder:
            export_vision_tower(encoder, folder, self.image_processor)
        outputs["vision_tower"] = str(self.run.dir.exports / "vision-tower")
        if self.settings.wise_ft:
            outputs["wise_ft"] = str(self._wise_ft(model))
        return outputs

    def _wise_ft(self, model: nn.Module) -> Path:
        """WiSE-FT (App. A): the coefficient with the best ID validation accuracy, saved with its report."""
        from hf_vrl.methods.dive.ensemble import choose_wise_ft
        from hf_vrl.methods.dive.evaluate import id_accuracy
        from hf_vrl.methods.dive.export import export_model

        _, validation = self._target()
        templates = self._templates()

        def score(candidate: nn.Module) -> float:
            return id_accuracy(
                candidate,
                self.image_processor,
                self.tokenizer,
                validation,
                templates,
                dataset_name=self.config.data.dataset,
            )

        alpha, scores, ensemble = choose_wise_ft(
            self._frozen_model(), model, score, alphas=self.settings.wise_ft_alphas
        )
        path = self.run.dir.exports / "wise-ft"
        with atomic_dir(path) as folder:
            export_model(ensemble, folder, self.image_processor, self.tokenizer)
            summary = {
                "alpha": alpha,
                "validation_top1": scores,
                "evaluation": self.evaluate(ensemble, "wise-ft"),
            }
            (folder / "wise_ft.json").write_text(json.dumps(summary, indent=2) + "\n")
        return path


WILDS_METRICS = ("macro_f1", "worst_group")  # Table 4's, where the evaluation computed them


def run_report_section(report: dict[str, Any]) -> dict[str, Any]:
    """`evaluate_dive`'s report as a run report section: zero_shot.top1 (ID), ood.top1 / transfer.top1 (the
    means, each set beside them), rsa.image / rsa.text; zero_shot.macro_f1 / worst_group (ID) and
    ood.macro_f1 / worst_group (the mean over the OOD sets that have it, each as "<set>.<metric>")."""
    summary = report["summary"]
    section: dict[str, Any] = {}
    if "id" in report:
        section["zero_shot"] = {"top1": summary["id.top1"]}
        for metric in WILDS_METRICS:
            if f"zero_shot.{metric}" in report["id"]:
                section["zero_shot"][metric] = report["id"][f"zero_shot.{metric}"]
    for group in ("ood", "transfer"):
        if report[group]:
            each = {name: metrics["zero_shot.top1"] for name, metrics in report[group].items()}
            section[group] = {"top1": summary[f"{group}.top1"], **each}
    for metric in WILDS_METRICS:
        values = {n: m[f"zero_shot.{metric}"] for n, m in report["ood"].items() if f"zero_shot.{metric}" in m}
        if values:
            section["ood"][metric] = sum(values.values()) / len(values)
            section["ood"] |= {f"{name}.{metric}": value for name, value in values.items()}
    if "rsa" in report:
        section["rsa"] = {key.split(".", 1)[-1]: value for key, value in report["rsa"].items()}
    _carry_data(report, section)
    return section


def _carry_data(report: dict[str, Any], section: dict[str, Any]) -> None:
    """The data records of `evaluate_dive`'s report into the run report's sections: zero_shot's is the ID
    set's; ood / transfer hold one per set ("data": {set: record}); rsa's is the RSA set's."""
    if "data" in report.get("id", {}):
        section["zero_shot"]["data"] = report["id"]["data"]
    for group in ("ood", "transfer"):
        records = {name: numbers["data"] for name, numbers in report[group].items() if "data" in numbers}
        if records:
            section[group]["data"] = records


def _pretrain_record(name: str, limit: int | None, seed: int) -> dict[str, Any]:
    """The data record of one set of the pre-training mix (the train split at most `limit` rows, `seed`),
    without loading it."""
    from hf_vrl.data.registry import how_drawn, text_source

    drawn = how_drawn(name, None, limit)
    record = {"dataset": name, "split": "train", "limit": limit, "drawn": drawn, "texts": text_source(name)}
    record["seed"] = seed if drawn in ("generated", "seeded subset") else None
    return {key: value for key, value in record.items() if value is not None}


def pretrain_toy_clip(model: DiVEModelConfig, out_dir: Path, steps: int, seed: int) -> Path:
    """The toy world's pre-trained CLIP: `model.pretrained` (a config-only folder) at `model.image_size`,
    trained `steps` steps with the CLIP loss on the `pretrain_data` mix."""
    import tempfile

    from datasets import concatenate_datasets

    from hf_vrl.data.registry import load_dataset_by_name
    from hf_vrl.methods.dcr.toy import pretrain_clip

    mix = concatenate_datasets(
        [
            load_dataset_by_name(
                name, split="train", limit=limit, image_size=model.image_size, seed=seed
            ).select_columns(["image", "caption"])
            for name, limit in model.pretrain_data.items()
        ]
    )
    with tempfile.TemporaryDirectory() as config_dir:
        pretrain_clip(
            toy_model_dir(model.pretrained, Path(config_dir), model.image_size),
            mix,
            out_dir,
            steps=steps,
            batch_size=min(model.pretrain_batch_size, len(mix)),
            learning_rate=model.pretrain_learning_rate,
            seed=seed,
        )
    return out_dir


def toy_model_dir(source: str, out_dir: Path, image_size: int | None) -> Path:
    """The config, processor and tokenizer of the preset `source`, at `image_size` pixels when given."""
    from transformers import AutoConfig, AutoTokenizer

    from hf_vrl.eval_inputs import resolve_model_path

    source = resolve_model_path(source)
    config, processor = AutoConfig.from_pretrained(source), load_image_processor(source)
    if image_size is not None:
        config.vision_config.image_size = image_size
        processor.size = {"shortest_edge": image_size}
        processor.crop_size = {"height": image_size, "width": image_size}
    for part in (config, processor, AutoTokenizer.from_pretrained(source)):
        part.save_pretrained(out_dir)
    return out_dir
