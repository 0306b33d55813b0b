"""Trainers: ``VRLTrainer`` (GA-correct loss, extra-metric logging) and ``ContrastiveTrainer`` (CLIP).

Every hf_vrl trainer returns the per-micro-batch *mean* loss from ``compute_loss``; the base class declares
it (``loss_is_scaled_for_ga = False``) so ``Trainer.training_step`` divides it by the gradient-accumulation
steps exactly once, whatever the batch holds (a ``labels`` key would otherwise make transformers treat the
loss as already normalised by ``num_items_in_batch`` and skip the division: GA-times too large gradients).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import pickle
import shutil
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from accelerate.data_loader import prepare_data_loader
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from torch.utils.data import DataLoader, IterableDataset
from transformers import Trainer, TrainerCallback, TrainerState, TrainingArguments
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, TrainOutput, rotate_checkpoints

from .accumulation import JoinedBatch, own_draws, reseed, split_batch, whole_batch_backward
from .contrastive import clip_contrastive_loss
from .divergence import stop_if_not_finite

__all__ = [
    "EXTRA_STATE_NAME",
    "STAGING_DIR",
    "ContrastiveTrainer",
    "LogitScaleCap",
    "VRLTrainer",
    "VRLTrainingArguments",
    "in_batch_accuracy",
    "set_logging_dir",
]

logger = logging.getLogger(__name__)

STAGING_DIR = ".staging"  # checkpoints are written here, then renamed into place (never matches checkpoint-*)
EXTRA_STATE_NAME = "extra_state.safetensors"  # a method's own training state, inside each checkpoint


@dataclass
class VRLTrainingArguments(TrainingArguments):
    """``TrainingArguments`` plus whole-batch accumulation (``hf_vrl.accumulation``, GradCache).

    ``per_device_train_batch_size`` and ``gradient_accumulation_steps`` keep the Trainer's meaning (samples
    per forward pass, the DataLoader's batch; forward passes per optimiser step); ``accumulation`` says what
    the loss sees over the micro-batches of a step.
    """

    accumulation: str = field(
        default="micro_batch",
        metadata={
            "help": "What the loss sees over the gradient_accumulation_steps micro-batches of an optimiser "
            "step: 'micro_batch' (the Trainer's accumulation: each micro-batch's loss over its own samples) "
            "or 'whole_batch' (GradCache: one loss over all of them at the memory of one micro-batch; each "
            "micro-batch reaches the device only while it is embedded).",
            "choices": ["micro_batch", "whole_batch"],
        },
    )
    micro_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "Earlier spelling of whole-batch accumulation: micro-batches of this many samples, one "
            "loss over the per_device_train_batch_size samples (per_device_train_batch_size="
            "micro_batch_size, gradient_accumulation_steps=per_device_train_batch_size // micro_batch_size, "
            "accumulation='whole_batch')."
        },
    )

    logging_dir: str | None = field(
        default=None,
        metadata={
            "help": "TensorBoard's folder (transformers 5 reads it only from TENSORBOARD_LOGGING_DIR)."
        },
    )
    run_identity: str | None = field(
        default=None,
        metadata={
            "help": "JSON of what defines the run (hf_vrl.run: RunConfig.identity), recorded in each "
            "checkpoint's checkpoint.json so that a resume refuses another run's checkpoint."
        },
    )

    def __post_init__(self) -> None:
        if self.accumulation not in ("micro_batch", "whole_batch"):
            raise ValueError(
                f"accumulation must be 'micro_batch' or 'whole_batch', got {self.accumulation!r}"
            )
        if self.micro_batch_size is not None:
            self._whole_batch_from_micro_batch_size()
        super().__post_init__()

    def _whole_batch_from_micro_batch_size(self) -> None:
        """``micro_batch_size`` (earlier spelling) as the fields that say the same, or a refusal."""
        micro, batch = self.micro_batch_size, self.per_device_train_batch_size
        if micro < 1 or batch % micro:
            raise ValueError(f"micro_batch_size ({micro}) must divide per_device_train_batch_size ({batch})")
        steps = self.gradient_accumulation_steps
        if steps > 1:
            raise ValueError(
                f"micro_batch_size ({micro}) with gradient_accumulation_steps ({steps}) would accumulate "
                f"{steps} losses of {batch} samples each: for one loss over the {batch * steps} samples of a "
                f"step give per_device_train_batch_size={micro}, gradient_accumulation_steps="
                f"{batch // micro * steps}, accumulation='whole_batch'"
            )
        warnings.warn(
            f"micro_batch_size is an earlier spelling: give per_device_train_batch_size={micro}, "
            f"gradient_accumulation_steps={batch // micro}, accumulation='whole_batch'",
            FutureWarning,
            stacklevel=4,
        )
        self.per_device_train_batch_size, self.gradient_accumulation_steps = micro, batch // micro
        self.accumulation, self.micro_batch_size = "whole_batch", None


def set_logging_dir(trainer: Trainer, folder: str | None) -> None:
    """Point the trainer's TensorBoard callback (when `report_to` has one) at `folder`."""
    from transformers.integrations import TensorBoardCallback

    for callback in trainer.callback_handler.callbacks:
        if folder is not None and isinstance(callback, TensorBoardCallback):
            callback.logging_dir = folder


class VRLTrainer(Trainer):
    """``transformers.Trainer`` for losses computed from custom batches.

    * A method's loss is split in three (override them): ``embed(model, batch)``, the outputs that carry the
      gradient; ``loss_targets(model, batch)``, per-sample values without gradient (a frozen or momentum
      model's); ``objective(embedded, targets, batch)`` -> ``{"loss": ...}``. ``compute_loss`` is their
      composition; with ``VRLTrainingArguments(accumulation="whole_batch")`` the training step runs them over
      the micro-batches of an optimiser step at the memory of one (``hf_vrl.accumulation``), so a loss that
      couples samples sees the whole step. ``step_inputs(batch)`` adds what a training step draws besides
      the batch (once per optimiser step under whole-batch accumulation, shared out over the micro-batches).
    * ``compute_loss`` returns the per-micro-batch mean; the Trainer scales it for gradient accumulation.
    * ``remove_unused_columns`` is forced to ``False`` (with a warning when it was ``True``, the transformers
      default): the collators produce keys the model's ``forward`` does not name (``class_labels``,
      captions, ...) and the losses read them, so dropping columns would only break batches.
    * ``store_metrics({"name": value})`` records extra per-step values; ``log`` averages them into the logs,
      with an ``eval_`` prefix during evaluation (the trl pattern).
    * ``evaluate`` reports ``eval_loss`` from ``compute_loss`` (predictions are not collected; retrieval and
      zero-shot metrics live in ``hf_vrl.evaluation``).
    * Checkpoints are atomic: each is written under ``<output_dir>/.staging/`` and renamed to
      ``checkpoint-<step>`` once complete, so a run killed while saving keeps its previous checkpoints intact
      and never leaves a half-written ``checkpoint-*``.
    * ``extra_state()`` / ``load_extra_state()``: tensors a method keeps besides the model, optimizer and RNG
      (DiVE's moving average vector, ...), saved in every checkpoint and restored on resume.
    * Streams (``IterableDataset``) are batched with ``dataloader_drop_last`` too (transformers applies it to
      map-style datasets only): a contrastive gather across processes needs equal batches. A stream that is
      already this process's share (``per_process = True``, as ``hf_vrl.run.data.SeededStream``) is not split
      across processes again.
    * A run resumed from a checkpoint that already reached ``max_steps`` loads it and trains nothing (the
      Trainer would otherwise train one step past the end).
    * ``warmup_start_lr``: the linear warm-up starts from this learning rate instead of 0 (SLIP: 1e-6); the
      schedule after the warm-up is unchanged.
    * A ``hf_vrl.run.data.SeededDataset`` is sampled by its ``SeededSampler``: the order of each epoch is a
      function of (seed, epoch) and every row knows its epoch (for per-sample augmentation seeds).
    """

    loss_is_scaled_for_ga = False
    shared_outputs: ClassVar[frozenset[str]] = frozenset()  # outputs of `embed` equal in every micro-batch

    def __init__(self, *args: Any, warmup_start_lr: float = 0.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.add_callback(SaveAndStopOnSignal())  # SIGTERM / SIGINT during a run: checkpoint, then stop
        self.add_callback(TrainingClock())  # training time over resumes, kept in the checkpoints
        self.warmup_start_lr = warmup_start_lr
        self._step_micro_batches: list[dict[str, Any]] = []  # whole_batch: this step's micro-batches so far
        self._batch_samples: list[dict[str, Any]] = []  # the micro-batches of the step last read
        self._micro_step = 0  # micro_batch accumulation: the micro-batch of the step trained next
        set_logging_dir(self, getattr(self.args, "logging_dir", None))
        if self.args.remove_unused_columns:
            logger.warning(
                "%s sets `remove_unused_columns=False`: its losses read batch keys that the model's forward "
                "does not name, which the Trainer would otherwise drop. Pass remove_unused_columns=False to "
                "silence this.",
                type(self).__name__,
            )
            self.args.remove_unused_columns = False
        self._metrics: dict[str, defaultdict[str, list[float]]] = {
            "train": defaultdict(list),
            "eval": defaultdict(list),
        }

    def store_metrics(self, metrics: Mapping[str, Tensor | float]) -> None:
        """Record extra metrics for this step, averaged over processes (detached, never differentiated).

        A 0-dim value is one number per process (``accelerator.gather``); a 1-dim value holds one number per
        sample (``accelerator.gather_for_metrics``, which drops the samples duplicated to even out the last
        batch).
        """
        mode = "train" if self.model.training else "eval"
        for name, value in metrics.items():
            value = value.detach() if isinstance(value, Tensor) else torch.tensor(float(value))
            value = value.to(self.accelerator.device, torch.float32)
            if value.ndim > 1:
                raise ValueError(
                    f"Metric {name!r} must be a scalar or a per-sample vector; got {tuple(value.shape)}."
                )
            gather = self.accelerator.gather if value.ndim == 0 else self.accelerator.gather_for_metrics
            self._metrics[mode][name].append(gather(value).mean().item())

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Add the mean of each stored metric since the last log, then clear them."""
        mode = "train" if self.model.training else "eval"
        prefix = "eval_" if mode == "eval" else ""
        logs.update(
            {f"{prefix}{key}": sum(vals) / len(vals) for key, vals in self._metrics[mode].items() if vals}
        )
        super().log(logs, start_time)
        self._metrics[mode].clear()

    # -- the loss: embed, targets, objective ---------------------------------------------------------------

    def embed(self, model: nn.Module, inputs: Mapping[str, Any]) -> dict[str, Tensor]:
        """The outputs of one (micro-)batch that the objective differentiates (override)."""
        raise NotImplementedError(
            f"{type(self).__name__} computes its loss in one piece (compute_loss): it cannot accumulate over "
            "the whole batch; use micro-batch accumulation"
        )

    def loss_targets(self, model: nn.Module, inputs: Mapping[str, Any]) -> dict[str, Tensor]:
        """Per-sample values the objective reads without gradient (called under ``torch.no_grad``)."""
        return {}

    def objective(
        self, embedded: Mapping[str, Tensor], targets: Mapping[str, Tensor], inputs: Mapping[str, Any]
    ) -> dict[str, Tensor]:
        """``{"loss": mean loss, ...}`` of a batch from its outputs (override; store metrics here)."""
        raise NotImplementedError

    def step_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """The inputs of a training step: the batch, plus what the method draws beside it (override)."""
        return inputs

    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, Tensor | Any],
        return_outputs: bool = False,
        num_items_in_batch: Tensor | int | None = None,
    ) -> Tensor | tuple[Tensor, Any]:
        """``objective(embed(batch), loss_targets(batch), batch)["loss"]``; the model's own loss for a
        trainer that does not split its loss."""
        if type(self).embed is VRLTrainer.embed:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        with torch.no_grad():
            targets = self.loss_targets(model, inputs)
        embedded = self.embed(model, inputs)
        loss = self.objective(embedded, targets, inputs)["loss"]
        return (loss, embedded) if return_outputs else loss

    def training_step(
        self,
        model: nn.Module,
        inputs: dict[str, Tensor | Any],
        num_items_in_batch: Tensor | int | None = None,
    ) -> Tensor:
        """The Trainer's step on one micro-batch; with whole-batch accumulation the micro-batches of an
        optimiser step are collected (on the host) and the last call runs GradCache over all of them. A
        non-finite loss stops training before its optimiser step (`hf_vrl.divergence`)."""
        loss = self._micro_batch_step(model, inputs, num_items_in_batch)
        stop_if_not_finite(self, loss=loss)
        return loss

    def _micro_batch_step(
        self, model: nn.Module, inputs: dict[str, Tensor | Any], num_items_in_batch: Tensor | int | None
    ) -> Tensor:
        if not self._whole_batch:
            index = self._micro_step
            self._micro_step = (index + 1) % getattr(self, "current_gradient_accumulation_steps", 1)
            with own_draws(self.args.device):
                reseed(self._draw_seed(index), self.args.device)
                return super().training_step(model, self.step_inputs(inputs), num_items_in_batch)
        self._step_micro_batches.append(inputs)
        if len(self._step_micro_batches) < self.current_gradient_accumulation_steps:
            return torch.zeros((), device=self.args.device)  # the step's loss comes with its last micro-batch
        chunks, self._step_micro_batches = self._step_micro_batches, []
        return self._whole_batch_step(model, chunks)

    def get_batch_samples(
        self, epoch_iterator: Any, num_batches: int, device: torch.device
    ) -> tuple[list, Tensor | int | None]:
        """The Trainer's, after releasing the previous step's micro-batches: the Trainer's loop keeps their
        list until the new one is returned, which would hold two steps of data at once."""
        self._batch_samples.clear()
        self._batch_samples, count = super().get_batch_samples(epoch_iterator, num_batches, device)
        return self._batch_samples, count

    @property
    def _whole_batch(self) -> bool:
        """Whole-batch accumulation over more than one micro-batch per step."""
        whole = getattr(self.args, "accumulation", "micro_batch") == "whole_batch"
        return whole and self.args.gradient_accumulation_steps > 1

    def _whole_batch_step(self, model: nn.Module, chunks: list[dict[str, Any]]) -> Tensor:
        """GradCache over the step's micro-batches (``hf_vrl.accumulation``), each moved to the device only
        while it is embedded; the objective's loss, which the gradient is of (no division by the micro-batch
        count: it is one loss)."""
        model.train()
        if callable(getattr(self.optimizer, "train", None)):  # schedule-free optimisers, as the Trainer
            self.optimizer.train()
        chunks = self.micro_batches(chunks)
        device = self.args.device
        with self.compute_loss_context_manager(), own_draws(device):
            values = whole_batch_backward(
                model,
                chunks,
                JoinedBatch(chunks, self._prepare_input),
                embed=self.embed,
                loss_targets=self.loss_targets,
                objective=self.objective,
                backward=self.accelerator.backward,
                no_sync=partial(self.accelerator.no_sync, model),
                shared=self.shared_outputs,
                device=device,
                prepare=self._prepare_inputs,
                seed=lambda index: reseed(self._draw_seed(index), device),
            )
        return values["loss"]

    def _draw_seed(self, index: int) -> int:
        """The seed of what the `index`-th micro-batch this process trains in the current optimiser step draws
        (dropout's masks, DCR's timesteps and noise, ...): a function of the run's seed, the step and the
        micro-batch's place among the step's, so the same on any process count. accelerate hands process p
        of N every N-th batch of the sampler, so its i-th micro-batch of a step is the step's (i N + p)-th."""
        from hf_vrl.run.data import sample_seed

        place = index * self.args.world_size + self.args.process_index
        return sample_seed(self.args.seed, f"step {self.state.global_step}", f"micro-batch {place}")

    def micro_batches(self, chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The micro-batches of a whole-batch step in the order they are embedded: each with its share of
        what ``step_inputs`` draws beside the batch (override to reorder or separate parts; the last must
        reach every trained parameter under DDP)."""
        drawn = split_batch(self.step_inputs({}), len(chunks))
        return [{**chunk, **part} for chunk, part in zip(chunks, drawn)]

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs: Any) -> TrainOutput:
        """``Trainer.train``, except that a checkpoint at (or past) ``max_steps`` is loaded, not trained."""
        if isinstance(resume_from_checkpoint, (str, os.PathLike)):
            state_file = os.path.join(resume_from_checkpoint, "trainer_state.json")
            state = TrainerState.load_from_json(state_file) if os.path.isfile(state_file) else None
            if state is not None and 0 < self.args.max_steps <= state.global_step:
                logger.info(
                    "%s is at step %d of %d: nothing left to train",
                    resume_from_checkpoint,
                    state.global_step,
                    self.args.max_steps,
                )
                self._load_from_checkpoint(str(resume_from_checkpoint))
                self._load_extra_state(str(resume_from_checkpoint))
                self.state = state
                return TrainOutput(
                    state.global_step, 0.0, {"train_runtime": 0.0, "train_samples_per_second": 0.0}
                )
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)

    def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
        """The Trainer's schedule, its warm-up starting from ``warmup_start_lr`` when that is set."""
        scheduler = super().create_scheduler(num_training_steps, optimizer)
        warmup = self.args.get_warmup_steps(num_training_steps)
        if self.warmup_start_lr and warmup and hasattr(scheduler, "lr_lambdas"):
            start = self.warmup_start_lr / self.args.learning_rate
            scheduler.lr_lambdas = [_warm_up_from(start, warmup, f) for f in scheduler.lr_lambdas]
            for group, factor in zip(scheduler.optimizer.param_groups, scheduler.lr_lambdas):
                group["lr"] = group["initial_lr"] * factor(scheduler.last_epoch)
        return scheduler

    def extra_state(self) -> dict[str, Tensor]:
        """Method state beyond model, optimizer, scheduler and RNG, saved with every checkpoint (override)."""
        return {}

    def load_extra_state(self, state: dict[str, Tensor]) -> None:
        """Restore what ``extra_state`` saved (override together with it)."""
        if state:
            raise ValueError(f"{type(self).__name__} cannot restore the extra state {sorted(state)}")

    def _save_checkpoint(self, model: nn.Module, trial: Any) -> None:
        """Write the checkpoint under ``.staging/`` (with the extra state), list its files
        (``checkpoint.json``: what a complete checkpoint holds), then rename it into place. Files follow the
        umask; a full disk is one line naming it."""
        from hf_vrl.run.layout import (
            disk_full_is_one_line,
            folder_size,
            last_complete_checkpoint,
            readable_as_umask,
            write_checkpoint_manifest,
        )

        run_dir = self._get_output_dir(trial)
        staging = os.path.join(run_dir, STAGING_DIR)
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        if self.args.should_save:  # a previous run may have died while writing this very step
            shutil.rmtree(os.path.join(staging, name), ignore_errors=True)
        stop_if_not_finite(self, parameters=model.parameters())  # no checkpoint of non-finite weights
        self.accelerator.wait_for_everyone()
        self._get_output_dir = lambda trial=None: staging  # the Trainer writes (and rotates) there
        try:
            previous = last_complete_checkpoint(Path(run_dir))  # about what this one needs
            needed = folder_size(previous) if previous else None
            with disk_full_is_one_line(os.path.join(staging, name), os.path.join(run_dir, name), needed):
                super()._save_checkpoint(model, trial)
                if self.args.should_save:
                    extra = {k: v.detach().cpu().contiguous() for k, v in self.extra_state().items()}
                    if extra:
                        save_file(extra, os.path.join(staging, name, EXTRA_STATE_NAME))
        finally:
            del self._get_output_dir
        self.accelerator.wait_for_everyone()  # every process has written its RNG state
        if self.args.should_save:
            readable_as_umask(os.path.join(staging, name))
            identity = getattr(self.args, "run_identity", None)
            write_checkpoint_manifest(os.path.join(staging, name), json.loads(identity) if identity else None)
            target = os.path.join(run_dir, name)
            if os.path.isdir(target):  # saved again at the same step (the end of training)
                shutil.rmtree(target)
            os.replace(os.path.join(staging, name), target)
            rotate_checkpoints(
                output_dir=run_dir,
                save_total_limit=self.args.save_total_limit,
                best_model_checkpoint=self.state.best_model_checkpoint,
                use_mtime=False,
            )
        self.accelerator.wait_for_everyone()

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: nn.Module | None = None) -> None:
        """The model's weights from a checkpoint under the names this transformers gives them (the conversion
        `from_pretrained` applies: `hf_vrl.weights`), every tensor accounted for; FSDP shards as the Trainer
        loads them."""
        from peft import PeftModel

        from hf_vrl.weights import check_keys, restore_weights

        if self.is_fsdp_enabled:
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        model = self.accelerator.unwrap_model(self.model if model is None else model)
        if isinstance(model, PeftModel):  # its adapters: what the checkpoint holds
            loaded = model.load_adapter(resume_from_checkpoint, model.active_adapters[0], is_trainable=True)
            check_keys(resume_from_checkpoint, "the adapters", loaded.missing_keys, loaded.unexpected_keys)
            return None
        restore_weights(model, resume_from_checkpoint)
        return None

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """Also restore the extra state of the checkpoint being resumed (refusing one that lacks it)."""
        with _damaged(checkpoint):
            super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None:
            self._load_extra_state(checkpoint)

    def _load_rng_state(self, checkpoint: str | None) -> None:
        """The Trainer's; a checkpoint written on another process count (a resume the run's rules accept)
        gives every process the state its process 0 saved, as every process of a run holds the same (all
        start from the seed, and what a step draws is seeded apart: `_draw_seed`)."""
        with _damaged(checkpoint):
            first = _first_rng_file(checkpoint) if checkpoint is not None else None
            own = f"rng_state_{self.args.process_index}.pth" if self.args.world_size > 1 else "rng_state.pth"
            if first is None or os.path.isfile(os.path.join(checkpoint, own)):
                return super()._load_rng_state(checkpoint)
            logger.info("%s was written on another process count: each process takes %s", checkpoint, first)
            _restore_rng(first)

    def _load_extra_state(self, checkpoint: str) -> None:
        if not self.extra_state():
            return
        path = os.path.join(checkpoint, EXTRA_STATE_NAME)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"{checkpoint} has no {EXTRA_STATE_NAME}: it was not written by {type(self).__name__}, whose "
                "state it would need to resume exactly"
            )
        device = self.accelerator.device
        self.load_extra_state({key: value.to(device) for key, value in load_file(path).items()})

    def _get_dataloader(
        self,
        dataset: Any,
        description: str,
        batch_size: int,
        sampler_fn: Callable | None = None,
        is_training: bool = False,
        dataloader_key: str | None = None,
    ) -> DataLoader:
        """The Trainer's DataLoader; a training stream also drops its last partial batch (per worker). Under
        whole-batch accumulation the training batches stay on the host (pinned where the Trainer pins), and
        each reaches the device only while it is embedded (``_whole_batch_step``)."""
        if not (is_training and isinstance(dataset, IterableDataset)):
            loader = super()._get_dataloader(
                dataset, description, batch_size, sampler_fn, is_training, dataloader_key
            )
            return self._keep_on_host(loader) if is_training else loader
        args = self.args
        per_process = getattr(dataset, "per_process", False)
        loader = DataLoader(
            dataset,
            batch_size=batch_size,
            collate_fn=self._get_collator_with_removed_columns(self.data_collator, description=description),
            num_workers=args.dataloader_num_workers,
            pin_memory=args.dataloader_pin_memory,
            persistent_workers=args.dataloader_persistent_workers,
            multiprocessing_context=args.dataloader_multiprocessing_context,
            prefetch_factor=args.dataloader_prefetch_factor,
            drop_last=args.dataloader_drop_last,
        )
        if not per_process:
            return self._keep_on_host(self.accelerator.prepare(loader))
        # this process's share already: prepared as a single process's loader (no second split)
        prepared = prepare_data_loader(
            loader,
            self.accelerator.device,
            num_processes=1,
            process_index=0,
            put_on_device=self.accelerator.device_placement,
            dispatch_batches=False,
        )
        self.accelerator._dataloaders.append(prepared)  # what Accelerator.prepare_data_loader records
        return self._keep_on_host(prepared)

    def _keep_on_host(self, loader: DataLoader) -> DataLoader:
        """Under whole-batch accumulation, the prepared training loader no longer moves batches to the device
        (accelerate's `DataLoaderShard.device`; skip_first_batches carries it over on resume): the Trainer
        collects a step's micro-batches before its first is trained, which would put them all there."""
        if self._whole_batch and hasattr(loader, "device"):
            loader.device = None
        return loader

    def _get_train_sampler(self, train_dataset: Any = None) -> torch.utils.data.Sampler | None:
        """A ``SeededDataset`` gets its ``SeededSampler``, each epoch cut to whole optimiser steps under
        ``dataloader_drop_last`` (no partial step at an epoch's end, as open_clip and torch's drop_last);
        anything else the Trainer's sampler."""
        from hf_vrl.run.data import SeededDataset, SeededSampler

        dataset = self.train_dataset if train_dataset is None else train_dataset
        if isinstance(dataset, SeededDataset):
            args = self.args
            step = self._train_batch_size * args.gradient_accumulation_steps * args.world_size
            return SeededSampler(len(dataset), dataset.seed, step if args.dataloader_drop_last else 1)
        return super()._get_train_sampler(train_dataset)

    def prediction_step(
        self,
        model: nn.Module,
        inputs: dict[str, Tensor | Any],
        prediction_loss_only: bool,
        ignore_keys: list[str] | None = None,
    ) -> tuple[Tensor, None, None]:
        """Evaluation loss from ``compute_loss`` (which also stores the ``eval_`` metrics)."""
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs)
        return loss.detach(), None, None


@contextlib.contextmanager
def _damaged(checkpoint: str | None) -> Iterator[None]:
    """A checkpoint file that cannot be read (past the completeness check of `hf_vrl.run.layout`): a line."""
    from hf_vrl.errors import UserError

    try:
        yield
    except (RuntimeError, ValueError, KeyError, EOFError, OSError, pickle.UnpicklingError) as error:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise UserError(
            f"{checkpoint} cannot be resumed ({type(error).__name__}: {reason}): delete it to resume from "
            "the checkpoint before it"
        ) from error


def _first_rng_file(checkpoint: str) -> str | None:
    """The RNG file of a checkpoint's process 0: rng_state.pth (one process) or rng_state_0.pth."""
    paths = (os.path.join(checkpoint, name) for name in ("rng_state.pth", "rng_state_0.pth"))
    return next((path for path in paths if os.path.isfile(path)), None)


def _restore_rng(path: str) -> None:
    """Set the random states a Trainer's RNG file holds (python, numpy, CPU, and this process's CUDA device
    from one device's state or the list of every device's, of which the first is process 0's)."""
    import random

    import numpy as np
    from transformers.trainer_pt_utils import safe_globals

    with safe_globals():
        state = torch.load(path, weights_only=True)
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.random.set_rng_state(state["cpu"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(cuda[0] if isinstance(cuda, (list, tuple)) else cuda)


def _warm_up_from(start: float, warmup: int, factor: Callable[[int], float]) -> Callable[[int], float]:
    """The multiplier `factor` with its warm-up steps rescaled from [0, 1] to [start, 1]."""

    def warmed(step: int) -> float:
        return start + (1.0 - start) * factor(step) if step < warmup else factor(step)

    return warmed


def in_batch_accuracy(image_embeds: Tensor, text_embeds: Tensor) -> Tensor:
    """``[B]`` floats, 1 where an image's most similar (cosine) caption of the local batch is its own."""
    with torch.no_grad():
        sims = F.normalize(image_embeds, dim=-1) @ F.normalize(text_embeds, dim=-1).T
        return (sims.argmax(dim=-1) == torch.arange(sims.shape[0], device=sims.device)).float()


# loss_fn(image_embeds, text_embeds, logit_scale, *, rank, world_size) -> scalar, like clip_contrastive_loss
ContrastiveLossFn = Callable[..., Tensor]


class SaveAndStopOnSignal(TrainerCallback):
    """After SIGTERM / SIGINT during a run's stage (``hf_vrl.run.signals``): save a complete checkpoint at the
    end of the current optimiser step and stop training (every process at the same step)."""

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any):
        from hf_vrl.run.signals import stop_requested

        if stop_requested(args.output_dir):
            control.should_save = True
            control.should_training_stop = True
        return control


class TrainingClock(TrainerCallback, ExportableState):
    """Training time summed over a run's resumes: saved in each checkpoint's ``trainer_state.json`` (as an
    ``ExportableState``), read back on resume; ``total()`` is the time up to now."""

    def __init__(self, runtime_s: float = 0.0) -> None:
        self.base = runtime_s
        self.started: float | None = None

    def _saved(self, state: Any) -> float:
        saved = (state.stateful_callbacks or {}).get(type(self).__name__) or {}
        saved = saved[-1] if isinstance(saved, list) and saved else saved
        return float((saved or {}).get("attributes", {}).get("runtime_s", 0.0))

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any):
        if self.started is None:  # the resumed state is loaded by now
            self.base, self.started = self._saved(state), time.perf_counter()

    def total(self, state: Any = None) -> float:
        if self.started is None:  # no step trained in this process: what the checkpoint says
            return self._saved(state) if state is not None else self.base
        return self.base + time.perf_counter() - self.started

    def state(self) -> dict:
        return {"args": {}, "attributes": {"runtime_s": self.total()}}


class LogitScaleCap(TrainerCallback):
    """open_clip's cap on CLIP's logit scale: the ``logit_scale`` parameter (log of the multiplier) is clamped
    to log(``max_logit_scale``) when training starts and after every optimizer step."""

    def __init__(self, max_logit_scale: float = 100.0) -> None:
        self.max_log_scale = math.log(max_logit_scale)

    def clamp(self, model: nn.Module | None) -> None:
        param = getattr(model, "logit_scale", None)
        if isinstance(param, Tensor):
            with torch.no_grad():
                param.clamp_(max=self.max_log_scale)

    def on_train_begin(self, args: Any, state: Any, control: Any, model: nn.Module | None = None, **kwargs):
        self.clamp(model)

    def on_optimizer_step(
        self, args: Any, state: Any, control: Any, model: nn.Module | None = None, **kwargs
    ):
        self.clamp(model)


class ContrastiveTrainer(VRLTrainer):
    """Train a CLIP-like dual encoder (CLIPModel, DiffCLIP, ...) with the symmetric InfoNCE loss.

    The model is called through its ``forward(pixel_values=, input_ids=, attention_mask=)`` and must return
    ``image_embeds`` and ``text_embeds`` (as CLIPModel does). Calling ``get_image_features`` on the unwrapped
    model would bypass DistributedDataParallel's forward, and DDP then silently skips the gradient all-reduce.

    The logit scale is ``model.logit_scale.exp()``, clipped at ``max_logit_scale`` = 100 as in CLIP (Radford
    et al., 2021, §2.5) by open_clip's rule (``LogitScaleCap``): the *parameter* is clamped to log(100) when
    training starts and after every optimizer step, and the loss multiplies by its ``exp`` unclamped, so the
    gradient reaches the parameter at the cap as well (clamping the multiplier instead passes no gradient
    there, and a scale that reaches 100, or starts there as OpenAI's checkpoints do, never moves again).

    ``loss_fn`` replaces the objective; the default is ``clip_contrastive_loss`` with ``local_loss=True,
    gather_with_grad=True`` (the exact global-batch gradient at 1/N of the logits, open_clip's advice at
    scale). Methods that add terms extend ``embed`` / ``objective`` (DiVE). Over micro-batches
    (``accumulation="whole_batch"``) the loss is that of the whole step, negatives included. Logged extras:
    ``logit_scale`` and ``i2t_accuracy`` (in-batch image-to-text top-1 on the local batch). Under several
    processes keep every rank's batch the same size (all-gather needs equal shapes).
    """

    shared_outputs = frozenset({"logit_scale"})

    def __init__(
        self,
        *args: Any,
        loss_fn: ContrastiveLossFn | None = None,
        max_logit_scale: float = 100.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.loss_fn = loss_fn or partial(clip_contrastive_loss, local_loss=True, gather_with_grad=True)
        self.max_logit_scale = max_logit_scale
        self.add_callback(LogitScaleCap(max_logit_scale))

    def get_decay_parameter_names(self, model: nn.Module) -> list[str]:
        """Only parameters with ndim >= 2 decay: biases, norms, ``logit_scale``, DiffCLIP's λ vectors and the
        1-D class embedding do not (transformers' default would decay the last three, pulling the logit scale
        towards 1). This is open_clip's rule, whose class embedding is 1-D too; SLIP (DiffCLIP's code base)
        excludes ndim < 2, biases and norms as well, but decays its class token, which timm stores 3-D."""
        return [name for name, param in model.named_parameters() if param.ndim >= 2]

    def _logit_scale_param(self, model: nn.Module) -> nn.Parameter:
        param = getattr(self.accelerator.unwrap_model(model), "logit_scale", None)
        if param is None:
            raise AttributeError(
                f"{type(model).__name__} has no `logit_scale` parameter (the log of CLIP's logit "
                "multiplier); ContrastiveTrainer needs one (subclass and override compute_loss otherwise)."
            )
        return param

    def embed(self, model: nn.Module, inputs: Mapping[str, Any]) -> dict[str, Tensor]:
        """Image and text embeddings through the model's forward, and the logit parameters (shared)."""
        image_embeds, text_embeds = _paired_embeds(model(**_encoder_inputs(inputs)))
        return {"image_embeds": image_embeds, "text_embeds": text_embeds, **self.logit_parameters(model)}

    def logit_parameters(self, model: nn.Module) -> dict[str, Tensor]:
        """What `contrastive_loss` reads besides the embeddings: the logit multiplier (capped by
        LogitScaleCap)."""
        return {"logit_scale": self._logit_scale_param(model).exp()}

    def objective(
        self, embedded: Mapping[str, Tensor], targets: Mapping[str, Tensor], inputs: Mapping[str, Any]
    ) -> dict[str, Tensor]:
        """Symmetric InfoNCE over the (global) batch; the mean over this process's rows."""
        image_embeds, text_embeds = embedded["image_embeds"], embedded["text_embeds"]
        loss = self.contrastive_loss(image_embeds, text_embeds, embedded)
        self.store_metrics(
            {
                "logit_scale": embedded["logit_scale"],
                "i2t_accuracy": in_batch_accuracy(image_embeds, text_embeds),
            }
        )
        return {"loss": loss}

    def contrastive_loss(self, image: Tensor, text: Tensor, embedded: Mapping[str, Tensor]) -> Tensor:
        """`loss_fn` of an image / text pair with the batch's logit scale, over every process's batch."""
        world = {"rank": self.accelerator.process_index, "world_size": self.accelerator.num_processes}
        return self.loss_fn(image, text, embedded["logit_scale"], **world)


def _encoder_inputs(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The keys a dual encoder's forward takes, from a batch that may carry more (class_labels, ...)."""
    missing = [key for key in ("pixel_values", "input_ids") if key not in inputs]
    if missing:
        raise KeyError(
            f"ContrastiveTrainer needs {missing} in every batch (got keys {sorted(inputs)}); "
            "use hf_vrl.data's ImageTextCollator or a collator producing pixel_values / input_ids / "
            "attention_mask."
        )
    keys = ("pixel_values", "input_ids", "attention_mask")
    return {key: inputs[key] for key in keys if key in inputs}


def _paired_embeds(outputs: Any) -> tuple[Tensor, Tensor]:
    image_embeds = getattr(outputs, "image_embeds", None)
    text_embeds = getattr(outputs, "text_embeds", None)
    if image_embeds is None or text_embeds is None:
        raise TypeError(
            f"The model's forward returned {type(outputs).__name__} without `image_embeds` / `text_embeds`; "
            "ContrastiveTrainer needs a CLIP-like output (CLIPOutput has both)."
        )
    return image_embeds, text_embeds
