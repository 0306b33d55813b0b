"""One way to run every method: the lifecycle of a run, written once.

    validate the configuration -> open the run folder (resume rules) -> the method builds its model
    -> evaluate before -> for each stage: train, or load its result when it is done -> final/
    -> evaluate after -> figures and exports -> report.json

A method (`Method` subclass, in `methods/<name>/method.py`) supplies only what is its own: how to build its
model, train one stage (its Trainer), save and load a stage's result, evaluate, and draw or export extras. The
runner owns the folder, resume, seeds, devices, precision, data wrapping, the report and multi-process order
(only the main process evaluates and writes; the others wait).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from hf_vrl.data.hub import pinned_commits
from hf_vrl.errors import UserError
from hf_vrl.hub.publish import portable_files
from hf_vrl.run import fsdp, preflight
from hf_vrl.run.config import HUB_COMMITS, RunConfig
from hf_vrl.run.data import (
    SeededDataset,
    SeededStream,
    SkipLog,
    data_fingerprint,
    materialise,
    rows_summary,
)
from hf_vrl.run.layout import (
    Launch,
    RunDir,
    RunLock,
    atomic_dir,
    atomic_write_json,
    checkpoint_problem,
    folder_size,
    last_complete_checkpoint,
    write_checkpoint_manifest,
)
from hf_vrl.run.report import log_evaluation
from hf_vrl.run.signals import handle_signals, saving_on_signal

logger = logging.getLogger("hf_vrl.run")

__all__ = ["Method", "Run", "execute"]


@dataclass
class Run:
    """What a method works with during one run: the configuration, the folder, the processes."""

    config: RunConfig
    dir: RunDir
    resume: str | None = None
    rank: int = 0
    world_size: int = 1
    skip_log: SkipLog = None  # type: ignore[assignment]
    stats: dict[str, Any] = field(default_factory=dict)
    _datasets: dict[tuple, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.skip_log is None:  # aside (made when a skip comes) until the folder is the run's
            self.skip_log = SkipLog(Path(tempfile.gettempdir()) / f"hf-vrl-skips-{uuid.uuid4().hex}")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def device(self) -> torch.device:
        from hf_vrl.devices import default_device

        return default_device()

    # -- data ------------------------------------------------------------------------------------------------

    def sample_filter(self, name: str, decode_size: int | None = None) -> Any:
        from hf_vrl.data.images import SampleFilter

        return SampleFilter(name, draft_size=decode_size, log=self.skip_log)

    def _load(self, name: str, what: str, split: str, limit: int | None, image_size: int | None) -> Any:
        """`load_dataset_by_name` once per arguments (the checks before the first write load what training
        then uses); a source that cannot be loaded is one line naming the setting."""
        from hf_vrl.data.registry import load_dataset_by_name

        key = (name, split, limit, image_size)
        if key not in self._datasets:
            stream_options: dict[str, Any] = {"decode_size": image_size}
            training = what == "--dataset"
            if training:  # data that trains no step is refused now, before the run folder is written
                data = self.config.data
                stream_options |= {"shuffle_buffer": data.shuffle_buffer, "require_trainable": True}
                columns = {"image_column": data.image_column, "caption_column": data.caption_column}
                stream_options |= {
                    k: v for k, v in (columns | {"label_column": data.label_column}).items() if v
                }
                filtered = {"sample_filter": self.sample_filter(f"{name} ({split})", image_size)}
            else:
                stream_options["shuffle_buffer"], filtered = 0, {}
            streams = training and not self.config.map_style_data  # a Hub table or image repo too
            try:
                self._datasets[key] = load_dataset_by_name(
                    name,
                    split=split,
                    streaming=None if streams else False,
                    limit=limit,
                    seed=self.config.seed,
                    image_size=image_size,
                    stream_options=stream_options,
                    **filtered,
                )
            except (FileNotFoundError, ValueError, KeyError) as error:
                raise UserError(f"{what} {name} (split {split}): {_load_problem(error)}") from None
        return self._datasets[key]

    def train_data(self, image_size: int | None = None) -> Any:
        """The training data, seeded per sample (`hf_vrl.run.data`); streams are this process's share."""
        from datasets import IterableDataset

        data = self.config.data
        if data.dataset is None:
            raise UserError("no training data: give --dataset (a registry name or path)")
        dataset = self._load(data.dataset, "--dataset", data.split, data.train_limit, image_size)
        if isinstance(dataset, IterableDataset):
            if self.config.optim.max_steps is None:
                raise UserError(f"{data.dataset} is streamed (its length is unknown): give --max-steps")
            return SeededStream(dataset, self.config.seed, self.rank, self.world_size)
        batch = self.batch_plan().global_batch
        if len(dataset) < batch:
            raise UserError(
                f"{data.dataset} has {len(dataset)} training samples, fewer than one optimiser step of "
                f"{batch}: lower --global-batch-size / --batch-size or use more data"
            )
        return SeededDataset(dataset, self.config.seed)

    def eval_data(self, image_size: int | None = None, dataset: str | None = None) -> Any:
        """The map-style evaluation dataset (None when the configuration names none)."""
        settings = self.config.eval
        name = dataset or settings.eval_dataset
        if name is None:
            return None
        loaded = self._load(name, "--eval-dataset", settings.eval_split, settings.eval_limit, image_size)
        return materialise(loaded, settings.eval_limit, "evaluation")

    def eval_record(self, rows: Any, dataset: str | None = None, **kwargs: Any) -> dict[str, Any]:
        """The `data_record` of evaluation `rows` drawn from `dataset` (default `eval.eval_dataset`) as
        `eval_data` loads it; `kwargs` (classes, labels, transform) say how the rows were changed since."""
        from hf_vrl.eval_inputs import data_record

        settings = self.config.eval
        name = dataset or settings.eval_dataset
        split, limit = settings.eval_split, settings.eval_limit
        return data_record(name, split, rows, limit=limit, seed=self.config.seed, **kwargs)

    def train_record(self) -> dict[str, Any] | None:
        """The `data_record` of the training data as `train_data` loaded it (None before it is loaded): the
        set, split, the samples and how they were drawn."""
        from datasets import IterableDataset

        from hf_vrl.eval_inputs import data_record

        data = self.config.data
        loaded = [
            v
            for (name, split, *_), v in self._datasets.items()
            if (name, split) == (data.dataset, data.split)
        ]
        if not loaded:
            return None
        record = data_record(
            data.dataset, data.split, loaded[0], limit=data.train_limit, seed=self.config.seed
        )
        if isinstance(loaded[0], IterableDataset) and record.get("drawn") == "seeded subset":
            record.update(drawn="stream start", seed=None)  # a Hub table streamed for this method
        if record.get("drawn") == "stream start" and data.shuffle_buffer:
            record.update(
                drawn="shuffled stream start", shuffle_buffer=data.shuffle_buffer, seed=self.config.seed
            )
        return record

    def check_data(self, image_size: int | None) -> None:
        """Load the training and evaluation data at `image_size` (kept for the run): a split that does not
        exist, too few samples for one step, a streamed source without its bound, refused before the first
        write. Skipped samples are logged aside until the folder is the run's (`keep_skip_logs`)."""
        self.train_data(image_size)
        if self.config.eval.eval_before or self.config.eval.eval_after or self.config.eval.figures:
            self.eval_data(image_size)

    def keep_skip_logs(self) -> None:
        """Move the skips logged while the data was checked into <run>/logs/skips, where the rest go."""
        staged, self.skip_log.folder = self.skip_log.folder, self.dir.logs / "skips"
        if staged != self.skip_log.folder and staged.is_dir():
            self.skip_log.folder.mkdir(parents=True, exist_ok=True)
            for path in staged.glob("*.tsv"):
                with open(self.skip_log.folder / path.name, "a", encoding="utf-8") as handle:
                    handle.write(path.read_text(encoding="utf-8"))
            shutil.rmtree(staged, ignore_errors=True)

    # -- training --------------------------------------------------------------------------------------------

    def precision(self) -> str:
        """`no`, `bf16` or `fp16`: `auto` is bf16 on a GPU that supports it."""
        precision = self.config.precision
        if precision == "auto":
            cuda = torch.cuda.is_available()
            return "bf16" if cuda and torch.cuda.is_bf16_supported() else "no"
        return precision

    def compiled(self) -> bool:
        auto = torch.cuda.is_available() and not self.config.deterministic
        return self.config.compile == "on" or (self.config.compile == "auto" and auto)

    def batch_plan(self) -> Any:
        """The step's layout on this run's processes (`hf_vrl.run.batch.BatchPlan`)."""
        return self.config.batch_plan(self.world_size)

    def step_budget(self, steps: int | None) -> int | None:
        """The optimiser steps of a training loop of this run: `steps` (None: by epochs), bounded by
        `optim.step_limit` (a trial of every loop)."""
        limit = self.config.optim.step_limit
        if limit is None:
            return steps
        return limit if steps is None else min(limit, steps)

    def training_arguments(
        self,
        stage: str,
        *,
        max_steps: int | None = None,
        learning_rate: float | None = None,
        warmup_steps: int | None = None,
        **overrides: Any,
    ) -> Any:
        """`TrainingArguments` of one stage from the shared sections (checkpoints in checkpoints/<stage>/)."""
        from hf_vrl.trainer import VRLTrainingArguments

        cfg, optim, output = self.config, self.config.optim, self.config.output
        plan = self.batch_plan()
        cuda = torch.cuda.is_available()
        precision = self.precision()
        steps = self.step_budget(max_steps if max_steps is not None else optim.max_steps)
        warmup = warmup_steps if warmup_steps is not None else optim.warmup_steps
        optimizer = {"adamw": "adamw_torch", "adamw_fused": "adamw_torch_fused", "sgd": "sgd"}[
            optim.optimizer
        ]
        settings: dict[str, Any] = dict(
            output_dir=str(self.dir.checkpoints(stage)),
            max_steps=steps if steps is not None else -1,
            num_train_epochs=optim.num_train_epochs,
            per_device_train_batch_size=plan.micro_batch,
            gradient_accumulation_steps=plan.accumulation_steps,
            accumulation=plan.accumulation,
            learning_rate=learning_rate if learning_rate is not None else optim.learning_rate,
            weight_decay=optim.weight_decay,
            lr_scheduler_type="cosine_with_min_lr" if optim.min_learning_rate else optim.lr_scheduler,
            lr_scheduler_kwargs={"min_lr": optim.min_learning_rate} if optim.min_learning_rate else None,
            warmup_steps=warmup if warmup or not optim.warmup_ratio else optim.warmup_ratio,
            max_grad_norm=optim.max_grad_norm,
            optim=optimizer,
            optim_args=f"momentum={optim.sgd_momentum}" if optimizer == "sgd" else None,
            adam_beta1=optim.adam_beta1,
            adam_beta2=optim.adam_beta2,
            adam_epsilon=optim.adam_epsilon,
            bf16=precision == "bf16",
            fp16=precision == "fp16",
            tf32=True if cuda and torch.cuda.get_device_capability()[0] >= 8 else None,
            torch_compile=self.compiled(),
            full_determinism=cfg.deterministic,
            seed=cfg.seed,
            logging_steps=output.logging_steps,
            save_strategy="steps",
            save_steps=output.save_steps,
            save_total_limit=output.save_total_limit,
            dataloader_num_workers=cfg.data.num_workers,
            dataloader_drop_last=True,  # equal batches: the contrastive gather needs them
            remove_unused_columns=False,
            report_to=output.report_to,
            logging_dir=str(Path(output.logging_dir or self.dir.logs / "tensorboard") / stage),
            use_cpu=not cuda,
            ddp_find_unused_parameters=False,
            accelerator_config={"dispatch_batches": False},  # each process reads its own share
            run_identity=json.dumps(cfg.identity(self.world_size)),  # in each checkpoint: whose it is
        )
        settings.update(overrides)
        return VRLTrainingArguments(**settings)

    def build_input(self, name: str, build: Callable[[Path], Any], **record: Any) -> Path:
        """`<run>/inputs/<name>`: a model the run trains for itself before its stages (a toy-world stand-in
        for pretrained weights), built once on the main process by `build(folder)` and recorded as it ran in
        `<run>/inputs/<name>.json` (the report's `inputs`, the card's in-run pre-training): `record` says what
        it is (`model`), what it learnt from (`objective`; `labels`: "captions", "shape labels", ...; `data`:
        a `data_record`) and the `steps` it ran; the build's time and hardware are added. The other
        processes only get the path (they wait for the main one)."""
        folder = self.dir.inputs / name
        if self.is_main and not folder.is_dir():
            started = time.perf_counter()
            with atomic_dir(folder) as staging:
                build(staging)
            record |= {
                "runtime_s": round(time.perf_counter() - started, 2),
                "hardware": f"CPU ({os.cpu_count()} cores), the main process",  # the builders run on the CPU
            }
            atomic_write_json(self.dir.inputs / f"{name}.json", record)
        return folder

    def input_records(self) -> dict[str, Any]:
        """{name: record} of every in-run pre-training (`build_input`), in the order they were built."""
        records = [(path.stat().st_mtime_ns, path) for path in self.dir.inputs.glob("*.json")]
        return {path.stem: json.loads(path.read_text()) for _, path in sorted(records)}

    def record_stage(self, stage: str, trainer: Any, output: Any) -> None:
        """Keep a stage's training figures (steps, runtime, throughput) for the report."""
        from hf_vrl.devices import describe_hardware
        from hf_vrl.trainer import TrainingClock

        metrics = getattr(output, "metrics", {}) or {}
        runtime = float(metrics.get("train_runtime", 0.0))
        clocks = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, TrainingClock)]
        total = clocks[0].total(trainer.state) if clocks else runtime  # over all resumes of the stage
        samples_per_s = float(metrics.get("train_samples_per_second", 0.0))
        self.stats[stage] = {
            "steps": int(trainer.state.global_step),
            "runtime_s": round(max(total, runtime), 2),
            "samples_per_s": round(samples_per_s, 2),
            "hardware": describe_hardware(self.world_size),
        }


def _load_problem(error: Exception) -> str:
    """What kept a data source from loading, in a line (a text file that is not UTF-8 said as such)."""
    if isinstance(error, UnicodeDecodeError):
        where = f"{error.reason} at byte {error.start}"
        return f"a text file in it (metadata.csv, ...) is not UTF-8 ({where}): save it as UTF-8"
    text = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
    return (str(text).strip().splitlines() or [type(error).__name__])[0]


class Method:
    """What one method adds to the shared run: override the hooks below (peft-tuner style)."""

    name: ClassVar[str] = ""
    config_class: ClassVar[type[RunConfig]] = RunConfig
    aliases: ClassVar[dict[str, list[str]]] = {}  # deprecated flag -> replacement tokens
    summary: ClassVar[str] = ""  # one line for `hf-vrl train --help`
    # settings that name a model to load ("model.tokenizer") -> values that are no path, preset or Hub id
    sources: ClassVar[dict[str, tuple[str, ...]]] = {}

    def __init__(self, run: Run):
        self.run = run
        self.config = run.config

    def stages(self) -> list[str]:
        """Stage names in order; each trains with its own checkpoints folder."""
        return ["train"]

    def check(self) -> None:
        """Everything that can be known before training (data names and paths, model sources in `sources`,
        --tasks, then the data itself: `Run.check_data`), checked before the run folder is written; raise
        `UserError` (extend for a method's own inputs)."""
        from hf_vrl.run.preflight import check_data, check_remote_code, check_source, check_tasks

        check_data(self.config.data.dataset, "--dataset")
        check_data(self.config.eval.eval_dataset, "--eval-dataset")
        for path, special in self.sources.items():
            section, _, name = path.rpartition(".")
            value = getattr(getattr(self.config, section) if section else self.config, name)
            check_source(value, "--" + name.replace("_", "-"), special)
            check_remote_code(value, "--" + name.replace("_", "-"), self.trusts_remote_code())
        check_tasks(self.config.eval.tasks, self.known_tasks(), self.name)
        self.run.check_data(self.image_size())

    def trusts_remote_code(self) -> bool:
        """Whether the run was given --trust-remote-code (a `trust_remote_code` setting in any section)."""
        sections = [getattr(self.config, field.name) for field in dataclasses.fields(self.config)]
        return any(getattr(section, "trust_remote_code", False) is True for section in sections)

    def known_tasks(self) -> tuple[str, ...]:
        """What --tasks may name (override; none: the method's evaluation is fixed)."""
        return ()

    def image_size(self) -> int | None:
        """The image size the method loads its data at (generated and offline sets are drawn at it), from the
        configuration alone (override; None: as stored)."""
        return None

    def setup(self) -> None:
        """Load processors, build inputs (e.g. toy-world models); runs on every process before anything."""

    def initial_model(self) -> nn.Module:
        """The model before training (evaluated 'before'; the first stage's input)."""
        raise NotImplementedError

    def train_stage(self, stage: str, model: nn.Module, checkpoint: str | None) -> nn.Module:
        """Train `stage` from `model` (resuming from `checkpoint` when given); return the trained model and
        call `self.run.record_stage(stage, trainer, output)`."""
        raise NotImplementedError

    def save_stage(self, stage: str, model: nn.Module, folder: Path) -> None:
        """Save an intermediate stage's result (the last stage's goes through `save_final`)."""
        model.save_pretrained(folder)

    def load_stage(self, stage: str, folder: Path) -> nn.Module:
        raise NotImplementedError

    def save_final(self, model: nn.Module, folder: Path) -> None:
        """Write what `from_pretrained` loads, with the processors."""
        model.save_pretrained(folder)

    def load_final(self, folder: Path) -> nn.Module:
        raise NotImplementedError

    def evaluate(self, model: nn.Module, when: str) -> dict[str, Any] | None:
        """The report section of `model` ("before" or "after"); None when there is no evaluation data."""
        return None

    def finish(self, model: nn.Module) -> dict[str, str]:
        """Exports, and figures when `self.config.eval.figures`, of the final model; returns {name: path}.
        Failures are warnings."""
        return {}


# -- the lifecycle ------------------------------------------------------------


def _process_state() -> tuple[int, int, Any]:
    """(rank, world size, accelerate PartialState); sets up the process group under torchrun / accelerate."""
    from accelerate import PartialState

    state = PartialState(cpu=not torch.cuda.is_available())
    return state.process_index, state.num_processes, state


def _stage_checkpoint(run: Run, stage: str) -> str | None:
    """The checkpoint `stage` resumes from: the newest complete one (`--resume auto`; the log names those
    skipped, and says when none is left), the given one when it belongs to this stage, else none."""
    folder = run.dir.checkpoints(stage)
    if run.resume is None:
        return None
    if run.resume == "auto":
        found = last_complete_checkpoint(folder, report=run.is_main)
        if found is not None:
            logger.info("%s: resuming from %s", stage, found)
        elif run.is_main and any(folder.glob("checkpoint-*")):
            logger.warning("%s: no complete checkpoint in %s: the stage starts over", stage, folder)
        return str(found) if found else None
    given = Path(run.resume).resolve()
    if given.parent != folder.resolve():
        return None
    problem = checkpoint_problem(given)
    if problem is not None:
        raise UserError(
            f"--resume {run.resume}: not a complete checkpoint ({problem}); --resume auto takes "
            "the newest complete one"
        )
    return str(given)


def _check_resume_target(run: Run, stages: Sequence[str]) -> None:
    if run.resume in (None, "auto"):
        return
    given = Path(run.resume).resolve()
    if not any(given.parent == run.dir.checkpoints(stage).resolve() for stage in stages):
        raise UserError(
            f"--resume {run.resume} is not a checkpoint of {run.dir.root} (expected "
            f"{run.dir.root}/checkpoints/<stage>/checkpoint-<step>); use --resume auto for the newest"
        )


def _write_report(run: Run, report: Mapping[str, Any]) -> None:
    if run.is_main:
        atomic_write_json(run.dir.report_file, dict(report))


def _train_summary(run: Run) -> dict[str, Any]:
    stages = dict(run.stats)
    runtime = sum(s["runtime_s"] for s in stages.values())
    samples = sum(s["samples_per_s"] * s["runtime_s"] for s in stages.values())
    summary = {
        "steps": sum(s["steps"] for s in stages.values()),
        "runtime_s": round(runtime, 2),
        "samples_per_s": round(samples / runtime, 2) if runtime else 0.0,
        "skipped": run.skip_log.counts(),
        "stages": stages,
    }
    data = run.train_record()
    return summary | ({"data": data} if data else {})


def execute(method_class: type[Method], config: RunConfig, resume: str | None = None) -> dict[str, Any]:
    """Run `config` with `method_class` (see the module docstring); returns the report."""
    rank, world_size, state = _process_state()
    sharded = fsdp.fsdp_requested()  # FSDP through accelerate launch (hf_vrl.run.fsdp)
    if config.deterministic:  # before any CUDA work: cuBLAS reads its workspace setting once
        from transformers import enable_full_determinism

        enable_full_determinism(config.seed)
    elif torch.cuda.is_available():
        torch.backends.cudnn.benchmark = True  # the fast CUDA settings (TF32 comes with TrainingArguments)
    out = RunDir(Path(config.output.output_dir or f"runs/{method_class.name}"))
    run = Run(config=config, dir=out, resume=resume, rank=rank, world_size=world_size)
    with pinned_commits(_recorded_commits(out, resume)) as commits:  # a resume reads the commits it read
        method = method_class(run)
        stages = method.stages()
        _check_resume_target(run, stages)
        out.check_writable()
        method.check()  # all that can be known before training, before anything is written
        preflight.check_loggers(config.output.report_to)
        preflight.check_push(config.output.push_to_hub, config.output.hub_model_id)
        lock = _lock(out, state)  # one writer per folder, taken before the folder is read
        try:
            with handle_signals():
                return _execute(method, run, stages, state, sharded, commits)
        finally:
            if lock is not None:
                lock.release()
            if not run.skip_log.folder.is_relative_to(
                out.root
            ):  # a run refused before its folder was its own
                shutil.rmtree(run.skip_log.folder, ignore_errors=True)


def _recorded_commits(out: RunDir, resume: str | None) -> dict[str, str]:
    """The Hub commits the run in `out` read ({repo_id[@revision]: commit}, config.json's `hub_commits`),
    which its resume reads again; none for a new run."""
    recorded = (out.recorded_config() or {}).get(HUB_COMMITS) if resume is not None else None
    if not isinstance(recorded, dict):
        return {}
    return {str(repo): str(commit) for repo, commit in recorded.items()}


def _lock(out: RunDir, state: Any) -> RunLock | None:
    """The main process takes the folder's lock; every process learns the outcome (none goes on alone)."""
    refused, lock = None, None
    if state.is_main_process:
        try:
            lock = out.lock()
        except UserError as error:
            refused = str(error)
    if state.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        refused = broadcast_object_list([refused], from_process=0)[0]
    if refused is not None:
        raise UserError(refused)
    return lock


def _execute(
    method: Method, run: Run, stages: list[str], state: Any, sharded: bool, commits: Mapping[str, str]
) -> dict[str, Any]:
    """The run in its folder; `commits`: the Hub commits its data is read at (`pinned_commits`), recorded
    in config.json and the report as they grow."""
    config, out, resume, method_class = run.config, run.dir, run.resume, type(method)
    launch = Launch(run.world_size, sharded)
    data = _data_fingerprints(config)
    resumed = out.open(config, resume, launch, data)  # every process checks before the main one writes
    state.wait_for_everyone()
    if run.is_main:
        out.mark()
        if not resumed:  # a folder whose run never saved a step: taken over, its leftovers cleared
            out.clear_unstarted(config)
        out.sweep_temporaries()
        out.record_config(config, launch, data, commits)
        logger.info("%s run in %s%s", method_class.name, out.root, " (resumed)" if resumed else "")
        plan = run.batch_plan()
        logger.info("%s", plan.describe(config.loss_terms(plan)))
    state.wait_for_everyone()  # the folder is cleared before any process records into it
    run.keep_skip_logs()
    method.setup()
    report: dict[str, Any] = {"method": method_class.name, "config": config.to_dict()}
    previous = _previous_report(out) if resumed else {}
    if "after" in previous and out.final.is_dir():
        logger.info("%s is finished: nothing to train; its report stands", out.root)
        push_failure = _push(run) if run.is_main and config.output.push_to_hub else None
        state.wait_for_everyone()
        if push_failure is not None:  # --push-to-hub of a finished run: pushed now, or one line why not
            raise UserError(push_failure)
        return previous
    report.update({key: previous[key] for key in ("before",) if key in previous})
    model = None
    if config.eval.eval_before and "before" not in report and not out.final.is_dir():
        model = method.initial_model()
        if run.is_main:
            before = method.evaluate(model, "before")
            if before is not None:
                report["before"] = before
                _write_report(run, report)
        state.wait_for_everyone()
    for index, stage in enumerate(stages):
        last = index == len(stages) - 1
        result = out.stage_result(stage, last)
        if result.is_dir():
            logger.info("%s: finished earlier, loading %s", stage, result)
            model = method.load_final(result) if last else method.load_stage(stage, result)
            _load_stats(run, stage)
            continue
        if model is None:
            model = method.initial_model() if index == 0 else _previous_result(method, out, stages, index)
        if sharded:
            fsdp.prepare(model)
        with saving_on_signal(out.checkpoints(stage)):  # SIGTERM / SIGINT: checkpoint now, then stop
            model = method.train_stage(stage, model, _stage_checkpoint(run, stage))
        if sharded:  # every process: a plain model with the full weights again
            model = fsdp.gather(model)
        if run.is_main:
            newest = last_complete_checkpoint(out.checkpoints(stage))  # its weights: about what is written
            with atomic_dir(result, folder_size(newest, "*.safetensors") if newest else None) as folder:
                if last:
                    method.save_final(model, folder)
                else:
                    method.save_stage(stage, model, folder)
                write_checkpoint_manifest(folder, config.identity(launch.processes))  # whose result it is
            atomic_write_json(out.checkpoints(stage) / "stats.json", run.stats.get(stage, {}))
            with contextlib.suppress(OSError):  # the trainer's staging folder, empty once all is renamed
                (out.checkpoints(stage) / ".staging").rmdir()
        state.wait_for_everyone()
    report["train"] = _train_summary(run)
    report["inputs"] = run.input_records()  # the in-run pre-trainings, as they ran
    push_failure = None
    if run.is_main:
        skipped = report["train"]["skipped"]
        logger.info("skipped samples: %s", rows_summary(skipped))
        if config.eval.eval_after:
            after = method.evaluate(model, "after")
            if after is not None:
                report["after"] = after
        report["outputs"] = {"final": str(out.final), **_finish(method, model)}
        if commits:
            report[HUB_COMMITS] = dict(commits)
        if dict(commits) != (out.recorded_config() or {}).get(HUB_COMMITS, {}):  # read after the start
            out.record_config(config, launch, data, commits)
        for folder in (out.final, *sorted(p for p in out.exports.glob("*") if p.is_dir())):
            portable_files(folder)  # nothing machine-local in a folder the run writes (is_local, paths)
        _write_report(run, report)
        last = report["train"]["stages"].get(stages[-1], {}).get("steps", 0)  # evaluations to the loggers
        log_evaluation(report, run.training_arguments(stages[-1]), last)
        if config.output.push_to_hub:
            push_failure = _push(run)
    state.wait_for_everyone()
    if push_failure is not None:  # the run is complete; the exit status says the push is not
        raise UserError(push_failure)
    return report


def _data_fingerprints(config: RunConfig) -> dict[str, Any]:
    """{setting: fingerprint} of the local map-style data the run reads (`data_fingerprint`), which a resume
    compares: images edited or deleted between a run and its resume are refused, not trained on."""
    names = {"--dataset": config.data.dataset, "--eval-dataset": config.eval.eval_dataset}
    prints = {setting: data_fingerprint(name) for setting, name in names.items()}
    return {setting: found for setting, found in prints.items() if found is not None}


def _push(run: Run) -> str | None:
    """--push-to-hub: publish the finished run as `hf-vrl push` does; a failed upload loses nothing (the run
    is saved): returns what failed and how to retry, None when it is pushed."""
    from hf_vrl.hub.publish import publish

    output = run.config.output
    try:
        publication = publish(
            run.dir.root, output.hub_model_id, private=output.hub_private_repo, overwrite_card=True
        )
    except Exception as error:
        reason = (str(error).strip().splitlines() or [""])[0]
        return (
            f"the run is saved in {run.dir.root}, but the push to {output.hub_model_id} failed "
            f"({type(error).__name__}: {reason}): retry with "
            f"`hf-vrl push {run.dir.root} {output.hub_model_id}`"
        )
    logger.info("pushed to %s", publication.url)
    return None


def _previous_report(out: RunDir) -> dict[str, Any]:
    return json.loads(out.report_file.read_text()) if out.report_file.is_file() else {}


def _previous_result(method: Method, out: RunDir, stages: Sequence[str], index: int) -> nn.Module:
    previous = stages[index - 1]
    return method.load_stage(previous, out.stage_result(previous, last=False))


def _load_stats(run: Run, stage: str) -> None:
    path = run.dir.checkpoints(stage) / "stats.json"
    if path.is_file():
        run.stats[stage] = json.loads(path.read_text())


def _finish(method: Method, model: nn.Module) -> dict[str, str]:
    """Exports always; figures when `eval.figures` (the method checks it: `Method.finish`)."""
    started = time.perf_counter()
    try:
        outputs = method.finish(model)
    except Exception as error:  # a figure or export must never lose a finished run
        logger.warning(
            "could not finish the figures/exports (%s: %s); the model is saved", type(error).__name__, error
        )
        return {}
    logger.info("figures and exports in %.1f s", time.perf_counter() - started)
    return outputs
