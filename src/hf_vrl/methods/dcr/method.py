"""`hf-vrl train dcr`: enhance a CLIP-family vision encoder with Diffusion Contrastive Reconstruction, on the
shared run design (`hf_vrl.run`).

Recipe (DCR §4.2, §5.1): stage 1 trains the projector h_omega with the encoder frozen (projector alignment);
stage 2 trains LoRA adapters on the encoder with h_omega frozen (encoder enhancement). The diffusion model
stays frozen and is never saved with the model. The run folder's `final/` holds the base model with the
enhanced vision tower (a plain `CLIPModel` / `SiglipModel` / vision model: the official release merges its
LoRA into the full CLIPModel the same way, the text tower untouched); `exports/vision-tower/` the plain
`CLIPVisionModel` / `SiglipVisionModel` LLaVA loads; `exports/dcr-model/` the `DCRModel` with its projector.

With no arguments it runs the `dcr-tiny` preset: a tiny CLIP and a tiny text-conditioned diffusion model are
first trained on the generated shapes world (`methods/dcr/toy.py`, into `<run>/inputs/`), then both stages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from torch import nn

from hf_vrl.data.processors import load_image_processor
from hf_vrl.data.toy import OMITTABLE
from hf_vrl.errors import UserError
from hf_vrl.run.batch import BatchPlan
from hf_vrl.run.config import MEASURED, OptimConfig, RunConfig, at_least, in_range, setting
from hf_vrl.run.data import materialise
from hf_vrl.run.layout import atomic_dir
from hf_vrl.run.runner import Method

__all__ = ["DCRMethod", "DCRModelConfig", "DCRRunConfig", "DCRSettings"]

STAGE_PLANS = {
    "both": ["stage1", "stage2"],
    "1": ["stage1"],
    "2": ["stage1", "stage2"],
    "end_to_end": ["end_to_end"],
}
TRAINER_STAGES = {"stage1": "projector", "stage2": "encoder", "end_to_end": "end_to_end"}
TOY_STREAM_ROWS = 512  # rows of a streamed training set the toy inputs pre-train on


@dataclass
class DCRModelConfig:
    """The vision encoder to enhance, and how it conditions the UNet."""

    clip: str = setting(
        "tiny-clip", "CLIP / MetaCLIP / SigLIP checkpoint to enhance (Hub id, local folder or preset)"
    )
    clip_pretrain_steps: int = setting(
        0,
        "toy world only: first train `clip` from its config with the CLIP loss, this many steps (at most "
        "--step-limit)",
        check=at_least(0),
    )
    clip_blind_to: list[str] = setting(
        help="toy world only: the toy CLIP's captions never mention these factors (e.g. colour), while the "
        "toy diffusion model learns from full captions",
        default_factory=list,
    )
    condition_mode: Literal["official", "cls", "cls_patches"] = setting(
        "official",
        "UNet condition: empty-prompt embedding + projected image embedding (official code), the projected "
        "[CLS] alone (paper §5.1), or [CLS] + a fraction of patch tokens (Table 7)",
    )
    patch_token_ratio: float = setting(
        0.1, "fraction of patch tokens kept with condition_mode=cls_patches", check=in_range(0, 1)
    )


@dataclass
class DCRSettings:
    """DCR's own settings (the stage-2 / end-to-end length and learning rate are --max-steps and
    --learning-rate; --step-limit bounds every stage and toy model)."""

    stage: Literal["both", "1", "2", "end_to_end"] = setting(
        "both", "stages to run: both, 1 (projector only), 2 (after a finished stage 1), end_to_end (Table 4b)"
    )
    stage1_steps: int = setting(
        4600, "stage-1 (projector alignment) steps (at most --step-limit)", check=at_least(1)
    )
    stage1_learning_rate: float = setting(1e-4, "stage-1 learning rate", check=at_least(1e-12))
    diffusion: str = setting(
        "tiny",
        "SD-1.x/2.x pipeline (Hub id or folder; stabilityai/stable-diffusion-2-1-base is offline: use the "
        "mirror Manojb/stable-diffusion-2-1-base or a local copy), or 'tiny' for the toy-world model",
    )
    diffusion_pretrain_steps: int = setting(
        300, "with diffusion=tiny: denoiser training steps (at most --step-limit)", check=at_least(1)
    )
    diffusion_dtype: Literal["bfloat16", "float16", "float32"] = setting(
        "float32", "dtype of the frozen UNet / VAE"
    )
    gradient_checkpointing: Literal["none", "blocks", "feedforward", "pointwise", "selective", "chunks"] = (
        setting(
            "none",
            "UNet activation recompute in backward: none; per diffusers block; feedforward (the lean UNet "
            "+ each GEGLU projection); pointwise ops only; selective (matmuls kept, the rest recomputed); "
            "whole UNet chunks",
            identity=False,
        )
    )
    encoder_gradient_checkpointing: bool = setting(
        False,
        "recompute each layer of the vision tower in backward (transformers' gradient checkpointing) in the "
        "stages that train it: the tower keeps its layers' inputs only",
        identity=False,
    )
    reuse_prefix: bool = setting(
        True, "run the UNet's condition-independent prefix once per latent, not once per condition (exact)"
    )
    compile_unet: bool = setting(False, "torch.compile the frozen UNet (worth it on a GPU)", identity=False)
    lean_activations: bool = setting(
        True,
        "keep only what the backward pass to the condition needs (no convolution inputs; norm+SiLU and "
        "GEGLU recomputed): bit-identical, less memory",
        identity=False,
    )
    unet_autocast: bool = setting(
        False,
        "let the run's bf16/fp16 autocast reach into the frozen UNet (CUDA then runs its norms in fp32 and "
        "keeps fp32 activations); off: the UNet runs in diffusion_dtype",
    )
    empty_prompt_mask: bool = setting(
        True, "encode the empty prompt with its attention mask (official code; SD pipelines pass none)"
    )
    objective: Literal["dcr", "reconstruction", "joint"] = setting(
        "dcr", "dcr (Eq. 12), reconstruction (Eq. 8, DIVA-style baseline) or joint (Eq. 9, naive baseline)"
    )
    temperature: float = setting(
        0.1, "tau of Eq. 12 (and of L_con for objective=joint)", check=at_least(1e-9)
    )
    target: Literal["epsilon", "v_prediction", "scheduler"] = setting(
        "epsilon",
        "the ground-truth positive: eps (paper), v (official code) or the scheduler's prediction_type",
    )
    num_negatives: int | None = setting(
        None, "negatives per anchor (default: the other B-1 images, B^2 UNet passes)", check=at_least(1)
    )
    unet_chunk_size: int | Literal["auto"] | None = setting(
        None,
        "UNet evaluations per call (default: all in one call; auto: as many as free GPU memory holds)",
        check=lambda v: None if v in (None, "auto") or v >= 1 else f"must be >= 1, 'auto' or none, got {v!r}",
        identity=False,
    )
    reconstruction_reduction: Literal["sum", "mean"] = setting(
        "sum",
        "L_rec (Eq. 8) per sample: sum = the squared L2 norm of the paper; mean = DIVA's per-value mean",
    )
    lambda_con: float = setting(1.0, "objective=joint: weight of L_con", check=at_least(0))
    lambda_rec: float = setting(1.0, "objective=joint: weight of L_rec", check=at_least(0))
    official_augment: bool = setting(
        False, "augment after CLIP normalisation with clamping, as the official code"
    )
    input_crop_min_scale: float | None = setting(
        0.9,
        "random-resized-crop scale (s, 1) of the input (official 0.9; none: no crop)",
        check=in_range(0, 1),
    )
    image_mean: list[float] | None = setting(
        None, "normalisation mean (default: the checkpoint's image processor)"
    )
    image_std: list[float] | None = setting(
        None, "normalisation std (default: the checkpoint's image processor)"
    )
    mmvp: str | None = setting(
        "toy", "P-ability pairs: 'toy' (shapes-world pairs) or an MMVP-VLM folder", identity=MEASURED
    )
    lora_r: int = setting(16, "stage-2 LoRA rank", check=at_least(1))
    lora_alpha: int = setting(16, "stage-2 LoRA alpha", check=at_least(1))
    lora_dropout: float = setting(0.1, "stage-2 LoRA dropout", check=in_range(0, 1, high_open=True))
    lora_bias: Literal["none", "lora_only"] = setting(
        "none", "also train the adapted layers' biases (official: lora_only)"
    )


@dataclass
class DCRRunConfig(RunConfig):
    """Enhance a CLIP-family vision encoder with a frozen diffusion model (DCR): stage 1 aligns a projector
    into the UNet's condition space, stage 2 trains LoRA adapters on the encoder through the contrastive loss
    over predicted noises (Eq. 12). Evaluates D-ability (clustering) and P-ability (MMVP-style pairs) before
    and after; exports the enhanced tower as a plain transformers model."""

    method: ClassVar[str] = "dcr"
    preset: ClassVar[str] = "dcr-tiny"
    loss_gathers: ClassVar[bool] = False  # Eq. 12's grid is one process's micro-batch, as the official code

    model: DCRModelConfig = field(default_factory=DCRModelConfig)
    optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(
            batch_size=16,
            max_steps=4600,
            learning_rate=1e-5,
            weight_decay=0.01,
            lr_scheduler="constant_with_warmup",
            warmup_steps=10,
            max_grad_norm=1.0,
            accumulation="micro_batch",
        )
    )
    dcr: DCRSettings = field(default_factory=DCRSettings)

    def validate(self) -> list[str]:
        problems = super().validate()
        if self.optim.accumulation != "micro_batch":
            problems.append(
                "optim.accumulation: DCR's loss is per micro-batch (the B^2 grid of Eq. 12 over one "
                "micro-batch, as the official 16 x GA 2 x 8 GPUs run): use micro_batch"
            )
        if self.optim.max_steps is None:
            problems.append("optim.max_steps: DCR trains by steps (the stage-2 / end-to-end length); set it")
        blind = self.model.clip_blind_to
        if blind and not (self.model.clip_pretrain_steps and self.data.dataset == "shapes"):
            problems.append(
                "model.clip_blind_to needs the toy world: dataset shapes and clip_pretrain_steps > 0"
            )
        if set(blind) - set(OMITTABLE):
            problems.append(f"model.clip_blind_to: captions can leave out {OMITTABLE}, not {blind}")
        if self.dcr.objective != "dcr" and self.dcr.num_negatives is not None:
            problems.append("dcr.num_negatives applies to objective=dcr only")
        for name in ("image_mean", "image_std"):
            value = getattr(self.dcr, name)
            if value is not None and len(value) != 3:
                problems.append(f"dcr.{name} needs three values (R G B), got {value}")
        return problems

    def loss_terms(self, plan: BatchPlan) -> dict[str, str]:
        b, wanted = plan.local_loss_batch, self.optim.batch_size
        grid = (
            f"the {b} x {b} grid of one process's micro-batch ({b - 1} negative{'s' * (b != 2)} per image; "
            "not gathered across processes, as the official code)"
        )
        if b < wanted:
            grid += (
                f"; batch_size is {wanted}, but the global batch over {plan.processes} processes leaves {b} "
                f"per process: --global-batch-size {wanted * plan.processes} keeps {wanted}-image grids"
            )
        return {"Eq. 12 (contrastive over predicted noises)": grid}


class DCRMethod(Method):
    name = "dcr"
    config_class = DCRRunConfig
    summary = "enhance a CLIP vision encoder with a frozen diffusion model (2 stages)"
    sources = {"model.clip": (), "dcr.diffusion": ("tiny",)}  # checked before the run writes
    aliases: ClassVar[dict[str, list[str]]] = {
        "--max-train-samples": ["--train-limit"],
        "--eval-samples": ["--eval-limit"],
        "--stage2-steps": ["--max-steps"],
        "--stage2-learning-rate": ["--learning-rate"],
    }

    def stages(self) -> list[str]:
        return STAGE_PLANS[self.config.dcr.stage]

    def image_size(self) -> int:
        return _vision_config(_resolve(self.config.model.clip)).image_size

    def check(self) -> None:
        """The shared checks, and --clip a CLIP-family model (what `DCRModel.from_clip` builds on)."""
        from hf_vrl.models.dcr.modeling_dcr import _TOWER_CLASSES  # the towers from_clip takes
        from hf_vrl.run.preflight import check_model_kind

        expected = (
            "DCR enhances a CLIP/MetaCLIP or SigLIP checkpoint (CLIPModel, SiglipModel or their towers)"
        )
        check_model_kind(self.config.model.clip, "--clip", lambda c: c.model_type in _TOWER_CLASSES, expected)
        super().check()  # reads --clip's image size

    # -- inputs ----------------------------------------------------------------------------------------------

    def setup(self) -> None:
        from hf_vrl.methods.dcr.diffusion import load_diffusion

        run, dcr = self.run, self.config.dcr
        if dcr.stage == "2" and not run.dir.stage_result("stage1", last=False).is_dir():
            raise UserError("--stage 2 continues a run whose stage 1 is finished: run --stage both instead")
        self.base = _resolve(self.config.model.clip)
        self.image_size = _vision_config(self.base).image_size
        self.clip, diffusion_path = self._inputs()
        self.mean, self.std = self._normalisation()
        self.diffusion = load_diffusion(
            diffusion_path,
            dcr.diffusion_dtype,
            dcr.gradient_checkpointing,
            run.device,
            empty_prompt_mask=dcr.empty_prompt_mask,
            reuse_prefix=dcr.reuse_prefix,
            compile_unet=dcr.compile_unet,
            unet_autocast=dcr.unet_autocast,
            lean_activations=dcr.lean_activations,
        )
        self._evaluation = None

    def _inputs(self) -> tuple[str, str]:
        """(CLIP, diffusion pipeline) paths; the toy-world stand-ins are built once into <run>/inputs/ and
        recorded there as they ran (`Run.build_input`)."""
        from accelerate import PartialState

        run, model, dcr = self.run, self.config.model, self.config.dcr
        clip, diffusion = self.base, dcr.diffusion
        toy_clip = run.dir.inputs / "base-clip"
        toy_sd = run.dir.inputs / "tiny-sd"
        if run.is_main and (model.clip_pretrain_steps or diffusion == "tiny"):
            if model.clip_pretrain_steps and not toy_clip.is_dir():
                self._pretrain_clip("base-clip", omit=model.clip_blind_to)
            if diffusion == "tiny" and not toy_sd.is_dir():
                text_encoder = self._sd_text_encoder() if model.clip_blind_to else None
                text_encoder = text_encoder or (toy_clip if model.clip_pretrain_steps else clip)
                self._build_tiny_sd(text_encoder)
        PartialState().wait_for_everyone()
        if model.clip_pretrain_steps:
            clip = str(toy_clip)
        return clip, str(toy_sd) if diffusion == "tiny" else diffusion

    def _pretrain_clip(self, name: str, omit: list[str] | None = None) -> Path:
        """A tiny CLIP trained with the CLIP loss on the training rows into inputs/`name` (captions leaving
        out `omit`), recorded as it ran."""
        from hf_vrl.methods.dcr import toy

        data, steps = self._toy_data(omit=omit), self.run.step_budget(self.config.model.clip_pretrain_steps)
        labels = "captions" + (f" that never name {', '.join(omit)}" if omit else "")

        def build(folder: Path) -> None:
            toy.pretrain_clip(
                self.base, data, folder, steps, batch_size=min(64, len(data)), seed=self.config.seed
            )

        return self.run.build_input(
            name, build, model=f"a tiny CLIP (`{self.config.model.clip}` configuration, random start)",
            objective="the CLIP loss (image-caption contrastive)", labels=labels,
            data=self._toy_record(data), steps=steps,
        )  # fmt: skip

    def _build_tiny_sd(self, text_encoder: str | Path) -> Path:
        """The toy world's latent diffusion model in inputs/tiny-sd (a random VAE, a UNet trained to denoise
        conditioned on the captions), recorded as it ran."""
        from hf_vrl.methods.dcr import toy

        data, steps = self._toy_data(), self.run.step_budget(self.config.dcr.diffusion_pretrain_steps)

        def build(folder: Path) -> None:
            toy.build_tiny_sd(
                folder, text_encoder, data, steps, self.image_size, batch_size=min(64, len(data)),
                seed=self.config.seed,
            )  # fmt: skip

        return self.run.build_input(
            "tiny-sd", build, model="a tiny latent diffusion model (random VAE, UNet trained from scratch)",
            objective="noise prediction (epsilon MSE) conditioned on the captions, 10 % left empty",
            labels="captions", data=self._toy_record(data), steps=steps,
        )  # fmt: skip

    def _sd_text_encoder(self) -> Path:
        """A toy CLIP trained on the full captions, whose text tower conditions the toy diffusion model when
        the CLIP to enhance is blind to a factor (SD's own text encoder is another model than the CLIP,
        too)."""
        folder = self.run.dir.inputs / "sd-text-clip"
        return folder if folder.is_dir() else self._pretrain_clip("sd-text-clip")

    def _toy_record(self, rows: Any) -> dict[str, Any]:
        from hf_vrl.eval_inputs import data_record

        data = self.config.data
        return data_record(data.dataset, data.split, rows, limit=data.train_limit, seed=self.config.seed)

    def _toy_data(self, omit: list[str] | None = None) -> Any:
        """The rows the toy CLIP and diffusion model pre-train on: the training data, or the first
        `TOY_STREAM_ROWS` (or --train-limit) rows of a stream (CC3M's shards)."""
        from hf_vrl.data.registry import load_dataset_by_name

        data = self.config.data
        extra = {"omit": omit} if omit else {}
        loaded = load_dataset_by_name(
            data.dataset,
            split=data.split,
            limit=data.train_limit,
            seed=self.config.seed,
            image_size=self.image_size,
            **extra,
        )
        return materialise(loaded, data.train_limit or TOY_STREAM_ROWS, "toy pre-training")

    def _normalisation(self) -> tuple[list[float], list[float]]:
        dcr = self.config.dcr
        if dcr.image_mean is not None and dcr.image_std is not None:
            return dcr.image_mean, dcr.image_std

        try:
            processor = load_image_processor(self.clip)
        except OSError:
            raise UserError(
                f"{self.clip} has no image processor: give --image-mean and --image-std"
            ) from None
        return list(processor.image_mean), list(processor.image_std)

    # -- models ----------------------------------------------------------------------------------------------

    def initial_model(self) -> nn.Module:
        from transformers import set_seed

        from hf_vrl.models.dcr import DCRModel

        set_seed(self.config.seed)
        model = self.config.model
        return DCRModel.from_clip(
            self.clip,
            condition_dim=self.diffusion.unet.config.cross_attention_dim,
            num_condition_tokens=self.diffusion.null_text_embeds.shape[1],
            condition_mode=model.condition_mode,
            patch_token_ratio=model.patch_token_ratio,
        )

    def _task_config(self) -> Any:
        from hf_vrl.methods.dcr.task import DCRTaskConfig

        dcr = self.config.dcr
        crop = None if dcr.input_crop_min_scale is None else (dcr.input_crop_min_scale, 1.0)
        return DCRTaskConfig(
            objective=dcr.objective,
            temperature=dcr.temperature,
            target=dcr.target,
            num_negatives=dcr.num_negatives,
            unet_chunk_size=dcr.unet_chunk_size,
            reconstruction_reduction=dcr.reconstruction_reduction,
            lambda_con=dcr.lambda_con,
            lambda_rec=dcr.lambda_rec,
            official_augment=dcr.official_augment,
            input_crop_scale=crop,
            image_mean=tuple(self.mean),
            image_std=tuple(self.std),
        )

    def train_stage(self, stage: str, model: nn.Module, checkpoint: str | None) -> nn.Module:
        from transformers import set_seed

        from hf_vrl.methods.dcr.task import DCRTask
        from hf_vrl.methods.dcr.trainer import DCRTrainer, LoraSettings, prepare_stage

        dcr, optim = self.config.dcr, self.config.optim
        set_seed(self.config.seed)
        task = DCRTask(model, self.diffusion, self._task_config())
        lora = LoraSettings(r=dcr.lora_r, alpha=dcr.lora_alpha, dropout=dcr.lora_dropout, bias=dcr.lora_bias)
        trainable = prepare_stage(model, TRAINER_STAGES[stage], lora)
        if dcr.encoder_gradient_checkpointing and stage != "stage1":
            model.activation_checkpointing_enable({"use_reentrant": False})
        first = stage == "stage1"
        args = self.run.training_arguments(
            stage,
            max_steps=dcr.stage1_steps if first else optim.max_steps,
            learning_rate=dcr.stage1_learning_rate if first else optim.learning_rate,
        )
        trainer = DCRTrainer(
            model=trainable,
            args=args,
            train_dataset=self.run.train_data(image_size=self.image_size),
            data_collator=task.collator(self.image_size),
            task=task,
        )
        output = trainer.train(resume_from_checkpoint=checkpoint)
        self.run.record_stage(stage, trainer, output)
        return trainable

    def load_stage(self, stage: str, folder: Path) -> nn.Module:
        from hf_vrl.models.dcr import DCRModel
        from hf_vrl.weights import load_pretrained

        return load_pretrained(DCRModel, folder, dtype=torch.float32)

    def save_final(self, model: nn.Module, folder: Path) -> None:
        """The base model with the enhanced tower in `folder` (final/), the tower and the DCRModel in
        exports/; a stage-1-only run's final is the DCRModel itself."""
        from hf_vrl.methods.dcr.export import export_base_model, export_vision_tower, merge_lora

        merged = merge_lora(model)
        processor = self._processor()
        if self.stages() == ["stage1"]:
            _save_with(merged, processor, folder)
            return
        with atomic_dir(self.run.dir.exports / "dcr-model") as dcr_folder:
            _save_with(merged, processor, dcr_folder)  # with its image processor, as the other folders
        with atomic_dir(self.run.dir.exports / "vision-tower") as tower_folder:
            export_vision_tower(merged, tower_folder, image_processor=processor)
        export_base_model(merged, self.clip, folder)

    def load_final(self, folder: Path) -> nn.Module:
        from hf_vrl.models.dcr import DCRModel
        from hf_vrl.weights import load_pretrained

        source = folder if self.stages() == ["stage1"] else self.run.dir.exports / "dcr-model"
        return load_pretrained(DCRModel, source, dtype=torch.float32)

    def _processor(self) -> Any:

        try:
            return load_image_processor(self.clip)
        except OSError:
            return None

    # -- evaluation ------------------------------------------------------------------------------------------

    def evaluate(self, model: nn.Module, when: str) -> dict[str, Any] | None:
        from hf_vrl.methods.dcr.evaluate import evaluate_encoder
        from hf_vrl.methods.dcr.export import merge_lora

        evaluation = self._evaluation_inputs()
        if evaluation is None:
            return None
        encoder = merge_lora(model).to(self.run.device)
        return evaluate_encoder(
            encoder, image_size=self.image_size, image_mean=self.mean, image_std=self.std, **evaluation
        )

    def _evaluation_inputs(self) -> dict[str, Any] | None:
        """Test images, MMVP pairs and the original CLIP's text side (loaded once)."""
        if self._evaluation is not None or self.config.eval.eval_dataset is None:
            return self._evaluation
        from transformers import AutoConfig, AutoModel, AutoTokenizer

        from hf_vrl.weights import load_pretrained

        dataset = self.run.eval_data(image_size=self.image_size)
        mmvp = self.config.dcr.mmvp
        pairs = None
        if mmvp == "toy":
            from hf_vrl.data.toy import shapes_mmvp_pairs

            pairs = shapes_mmvp_pairs(image_size=self.image_size, seed=self.config.seed)
        elif mmvp is not None:
            from hf_vrl.metrics import load_mmvp_vlm

            pairs = load_mmvp_vlm(mmvp)
        text_side = hasattr(AutoConfig.from_pretrained(self.clip), "text_config")
        clip = (
            load_pretrained(AutoModel, self.clip, extra_allowed=True, dtype=torch.float32)
            if text_side
            else None
        )
        self._evaluation = {
            "dataset": dataset,
            "pairs": pairs,
            "data": self.run.eval_record(dataset),
            "pairs_data": None if pairs is None else self._pairs_record(pairs),
            "clip": clip.to(self.run.device) if clip is not None else None,
            "image_processor": self._processor() if text_side else None,
            "tokenizer": AutoTokenizer.from_pretrained(self.clip) if text_side else None,
        }
        return self._evaluation

    def _pairs_record(self, pairs: Any) -> dict[str, Any]:
        """The data record of the MMVP pairs: the toy world's are generated from the run's seed."""
        from hf_vrl.eval_inputs import data_record

        record = data_record(self.config.dcr.mmvp, None, pairs)
        toy = self.config.dcr.mmvp == "toy"
        return record | ({"drawn": "generated", "seed": self.config.seed} if toy else {})


def _save_with(model: nn.Module, processor: Any, folder: Path) -> None:
    """`model` and its image processor (where the CLIP has one) in `folder`."""
    model.save_pretrained(folder)
    if processor is not None:
        processor.save_pretrained(folder)


def _resolve(name: str) -> str:
    """A preset folder in hub_configs/ when one has this name, else the string (a path or Hub id)."""
    from hf_vrl.presets import preset_path

    try:
        return str(preset_path(name))
    except FileNotFoundError:
        return name


def _vision_config(clip: str) -> Any:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(clip)
    return getattr(config, "vision_config", config)
