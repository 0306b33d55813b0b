"""Run configurations: one shared base of sections, one preset format, complete validation.

A run configuration is a dataclass tree: the shared sections `data`, `optim`, `eval`, `output`, the top-level
`seed` / `precision` / `compile`, and two sections each method defines for itself, `model` and the method's
own (named after it: `dcr`, `diffclip`, ...). A preset is the same tree as JSON or YAML, with `method`,
`description` and `notes` on top; `<run>/config.json` is one too, so `--config <run>/config.json` repeats a
run.

`resolve()` builds a configuration from the defaults, a preset and overrides, and validates all of it before
anything runs: unknown keys at any depth (with the nearest known name), wrong types, impossible values and the
method's cross-field rules. Every problem is reported at once, each saying what to change.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from hf_vrl.errors import UserError
from hf_vrl.run.batch import BatchPlan, plan_batches, process_count

__all__ = [
    "DataConfig",
    "Defines",
    "EvalConfig",
    "MEASURED",
    "OptimConfig",
    "OutputConfig",
    "RunConfig",
    "SHARED_SECTIONS",
    "at_least",
    "dropouts",
    "in_range",
    "leaf_fields",
    "load_config_file",
    "nesting_depth",
    "resolve",
    "setting",
]

PRESET_INFO_KEYS = ("method", "description", "notes")  # a preset's documentation, not settings
LAUNCH = "launch"  # <run>/config.json's record of the launch that wrote it (processes, FSDP), not a setting
DATA_FILES = "data_files"  # <run>/config.json's record of the local data it read (run.data.data_fingerprint)
HUB_COMMITS = "hub_commits"  # <run>/config.json's record of the Hub commits it read (data.hub.pinned_commits)
SHARED_SECTIONS = ("data", "optim", "eval", "output")

# -- declaring settings ------------------------------------------------------------------------------------

Check = Callable[[Any], str | None]  # value -> None when fine, else what is wrong
Defines = bool | Literal["measured"] | Callable[["RunConfig"], bool]  # whether a setting defines the run
# a setting that decides what a reported number is measured on (an evaluation set, its split, limit, metric
# options): it defines the run, since the report sets "before" against "after" and a resume must not
# measure them apart
MEASURED: Literal["measured"] = "measured"


def setting(
    default: Any = None,
    help: str = "",
    *,
    check: Check | None = None,
    identity: Defines = True,
    default_factory: Callable[[], Any] | None = None,
) -> Any:
    """A configuration field. `check` returns what is wrong with a value (None when it is fine); `identity`
    says whether the field belongs to what a run *is* (resuming with a different value is refused) rather
    than to how it is watched, where it writes or how much memory it takes (logging, loader workers,
    micro-batches, recomputation); a function of the configuration where that depends on other settings
    (the micro-batch defines the run under micro_batch accumulation only), or `MEASURED` for what a
    reported number is measured on (the evaluation's data, split, limit and tasks, a method's own
    evaluation sets and metric options), which defines the run too (`measured_settings`)."""
    metadata = {"help": help, "check": check, "identity": identity}
    if default_factory is not None:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def _not_finite(value: Any) -> str | None:
    """inf or nan, which pass a comparison with a bound (or fail it with a confusing message)."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value!r}"
    return None


def at_least(low: float) -> Check:
    def check(value: Any) -> str | None:
        if value is None:
            return None
        return _not_finite(value) or (None if value >= low else f"must be >= {low:g}, got {value!r}")

    return check


def in_range(low: float, high: float, *, high_open: bool = False) -> Check:
    def check(value: Any) -> str | None:
        if value is None or (low <= value < high if high_open else low <= value <= high):
            return None
        bounds = ", ".join(str(b) if isinstance(b, int) else f"{b:g}" for b in (low, high))
        return f"must lie in [{bounds}{')' if high_open else ']'}, got {value!r}"

    return check


def _folder_name(value: Any) -> str | None:
    """An output folder's name is not empty (an empty one would fall back to the default folder)."""
    return "must name a folder, got an empty value" if value is not None and not value.strip() else None


def _scheduler_problem(value: Any) -> str | None:
    """What is wrong with an `lr_scheduler` name (transformers' `SchedulerType` values), or None."""
    from transformers.trainer_utils import SchedulerType

    names = [kind.value for kind in SchedulerType]
    if value in names:
        return None
    close = difflib.get_close_matches(str(value), names, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown schedule {value!r}; {hint}choose one of: {', '.join(names)}"


def _report_to_problem(value: Any) -> str | None:
    """What is wrong with a `report_to` list (transformers' integration names, or all / none), or None."""
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    names = ["all", "none", *INTEGRATION_TO_CALLBACK]
    unknown = [name for name in value if name not in names]
    if unknown:
        return f"unknown logger {unknown[0]!r}; choose from: {', '.join(names)}"
    if len(value) > 1 and {"all", "none"} & set(value):
        return "'all' and 'none' stand alone"
    return None


def _streamed_data(config: RunConfig) -> bool:
    """Whether the training data streams (its order then follows the loader workers' count)."""
    from hf_vrl.data.registry import is_streamed

    streaming = False if config.map_style_data else None
    return config.data.dataset is not None and is_streamed(config.data.dataset, streaming)


# -- the shared sections -----------------------------------------------------------------------------------


@dataclass
class DataConfig:
    """Training data."""

    dataset: str | None = setting(
        None,
        "training data: a registry name or path (shapes, fashion_mnist, animal_mnist, digits, "
        "cc3m:<img2dataset folder>, webdataset:<glob or brace pattern>, parquet:<glob>, csv:<glob>, "
        "<benchmark>:<folder> (cub, imagenet, fmow, ...), imagefolder:<dir>, hf:<org>/<name>[@rev][/<glob>] "
        "(a Hub dataset: a webdataset repo streamed shard by shard; offline from the local Hub cache), "
        "hf://datasets/..., pipe:<command>)",
    )
    split: str = setting(
        "train", "training split (a folder or Hub repo of shards named by split gives that split's files)"
    )
    image_column: str | None = setting(
        None, "where the image is: a webdataset member (jpg, webp) or a table column (default: guessed)"
    )
    caption_column: str | None = setting(
        None,
        "where the caption is: a webdataset member (txt), a field of its .json member (json:caption) or a "
        "table column (default: txt, caption, text, else the .json's caption)",
    )
    label_column: str | None = setting(
        None, "where the label is: a webdataset member (cls), json:<field>, or a table column (default: cls)"
    )
    train_limit: int | None = setting(None, "use at most this many training samples", check=at_least(1))
    shuffle_buffer: int = setting(
        10_000, "shuffle buffer of streamed data (0: stream order)", check=at_least(0)
    )
    num_workers: int = setting(
        0,
        "data-loading processes per device (streamed data: fixed for the run, since each worker reads its "
        "own shards and the stream's order follows the count)",
        check=at_least(0),
        identity=_streamed_data,
    )


@dataclass
class OptimConfig:
    """Optimisation."""

    batch_size: int = setting(
        8,
        "micro-batch: samples per process and forward pass (with whole_batch accumulation a memory setting "
        "only: the largest divisor of the process's share up to this)",
        check=at_least(1),
        identity=False,  # what it makes of a step is compared instead (RunConfig.layout_identity)
    )
    global_batch_size: int | None = setting(
        None,
        "samples per optimiser step over all processes (the paper's batch); the micro-batches per process "
        "follow from the process count",
        check=at_least(1),
        identity=False,  # as batch_size
    )
    gradient_accumulation_steps: int | None = setting(
        None,
        "micro-batches per optimiser step (default 1, or from global_batch_size)",
        check=at_least(1),
        identity=False,  # as batch_size
    )
    accumulation: Literal["whole_batch", "micro_batch"] = setting(
        "whole_batch",
        "what the loss sees over several micro-batches: whole_batch (GradCache: the loss of the whole global "
        "batch at the memory of a micro-batch) or micro_batch (plain accumulation: each micro-batch's loss "
        "over its own samples)",
    )
    max_steps: int | None = setting(
        None,
        "optimiser steps of the run's training, of its last stage where there are several (dcr: stage 2 or "
        "end_to_end; dive lp_ft: the fine-tuning); overrides num_train_epochs; needed for streamed data. "
        "Earlier stages and the toy models a run trains for itself have budgets of their own (the method's "
        "section); step_limit bounds them all",
        check=at_least(1),
    )
    step_limit: int | None = setting(
        None,
        "at most this many optimiser steps in every training loop of the run: each stage and each toy model "
        "the run trains for itself (a short trial of a whole run); none: every loop its own budget",
        check=at_least(1),
    )
    num_train_epochs: float = setting(1.0, "passes over the training data", check=at_least(1e-9))
    learning_rate: float = setting(1e-4, "peak learning rate", check=at_least(1e-12))
    weight_decay: float = setting(0.0, "weight decay", check=at_least(0))
    lr_scheduler: str = setting(
        "cosine",
        "learning-rate schedule after warm-up: a transformers scheduler name (cosine, linear, constant, ...)",
        check=_scheduler_problem,
    )
    min_learning_rate: float = setting(
        0.0,
        "learning rate the cosine schedule ends at (SLIP: 1e-5; 0: the schedule's own end)",
        check=at_least(0),
    )
    warmup_steps: int = setting(0, "linear warm-up steps", check=at_least(0))
    warmup_ratio: float = setting(
        0.0,
        "linear warm-up as a fraction of the run (used when warmup_steps is 0)",
        check=in_range(0, 1, high_open=True),
    )
    warmup_start_lr: float = setting(
        0.0, "learning rate the warm-up starts from (SLIP: 1e-6)", check=at_least(0)
    )
    max_grad_norm: float = setting(1.0, "gradient clipping norm (0 disables)", check=at_least(0))
    optimizer: Literal["adamw", "adamw_fused", "sgd"] = setting("adamw", "optimiser")
    adam_beta1: float = setting(0.9, "AdamW beta1", check=in_range(0, 1, high_open=True))
    adam_beta2: float = setting(0.999, "AdamW beta2", check=in_range(0, 1, high_open=True))
    adam_epsilon: float = setting(1e-8, "AdamW epsilon", check=at_least(0))
    sgd_momentum: float = setting(0.9, "SGD momentum", check=in_range(0, 1, high_open=True))


@dataclass
class EvalConfig:
    """Evaluation before and after training."""

    eval_dataset: str | None = setting(
        None, "evaluation data (registry name or path; default: none)", identity=MEASURED
    )
    eval_split: str = setting("test", "evaluation split", identity=MEASURED)
    eval_limit: int | None = setting(
        None, "evaluate on at most this many samples", check=at_least(1), identity=MEASURED
    )
    tasks: list[str] | None = setting(None, "evaluation tasks (default: the method's)", identity=MEASURED)
    eval_before: bool = setting(True, "evaluate the model before training", identity=False)
    eval_after: bool = setting(True, "evaluate the model after training", identity=False)
    figures: bool = setting(True, "draw the method's figures into <run>/figures/", identity=False)


@dataclass
class OutputConfig:
    """Where the run writes, and how often."""

    output_dir: str | None = setting(
        None, "run folder (default: runs/<preset>)", check=_folder_name, identity=False
    )
    save_steps: int = setting(
        500, "checkpoint every this many optimiser steps", check=at_least(1), identity=False
    )
    save_total_limit: int | None = setting(
        2, "checkpoints kept per stage (the newest)", check=at_least(1), identity=False
    )
    logging_steps: int = setting(10, "log every this many optimiser steps", check=at_least(1), identity=False)
    report_to: list[str] = setting(
        help="where the training logs (the loss and each loss term) go, as TrainingArguments' report_to: "
        "none, all, or integrations such as tensorboard, wandb, trackio, mlflow",
        check=_report_to_problem,
        identity=False,
        default_factory=lambda: ["none"],
    )
    logging_dir: str | None = setting(
        None,
        "TensorBoard's folder, one subfolder per stage (default: <run>/logs/tensorboard)",
        identity=False,
    )
    push_to_hub: bool = setting(
        False,
        "publish the run as `hf-vrl push` does (model, card, record) to --hub-model-id when it ends; the "
        "card replaces the repository's, as the Trainer's push does",
        identity=False,
    )
    hub_model_id: str | None = setting(None, "the Hub repository to push to, owner/name", identity=False)
    hub_private_repo: bool = setting(False, "create the Hub repository private", identity=False)


@dataclass
class RunConfig:
    """The base of every method's run configuration; a method subclasses it to set its `model` section and
    add its own section (a field named after the method)."""

    method: ClassVar[str] = ""
    preset: ClassVar[str] = ""  # the default preset of `hf-vrl train <method>`
    # its training data is read map-style where the source allows (a Hub parquet or image repo; webdataset
    # shards always stream): the labelled sets DiVE and CLUE index by sample; else such a repo streams
    map_style_data: ClassVar[bool] = False

    model: Any = None
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    seed: int = setting(
        0,
        "seed of initialisation, data order and augmentation (0 to 2**32 - 1, numpy's range)",
        check=in_range(0, 2**32 - 1),
    )
    precision: Literal["auto", "no", "bf16", "fp16"] = setting(
        "auto", "mixed precision: auto = bf16 on a GPU that has it, else none"
    )
    compile: Literal["auto", "on", "off"] = setting(
        "auto", "torch.compile the trained model: auto = on CUDA unless deterministic", identity=False
    )
    deterministic: bool = setting(
        False,
        "bit-identical runs and resumes on CUDA: deterministic kernels, no cuDNN autotuning, no automatic "
        "compile (slower; the CPU is deterministic already)",
        identity=False,
    )

    def validate(self) -> list[str]:
        """Cross-field rules beyond each field's own check; returns the problems (override and extend)."""
        problems = []
        optim = self.optim
        if optim.global_batch_size is not None and optim.gradient_accumulation_steps is not None:
            problems.append(
                "optim: give global_batch_size or gradient_accumulation_steps, not both "
                "(accumulation follows from the global batch and the process count)"
            )
        if optim.min_learning_rate and optim.lr_scheduler != "cosine":
            problems.append(f"optim.min_learning_rate needs lr_scheduler cosine, not {optim.lr_scheduler!r}")
        if optim.min_learning_rate >= optim.learning_rate:
            problems.append("optim.min_learning_rate must be below learning_rate")
        if self.output.push_to_hub and not self.output.hub_model_id:
            problems.append("output.push_to_hub needs output.hub_model_id: give --hub-model-id owner/name")
        try:
            self.batch_plan(process_count())
        except UserError as error:
            problems.append(f"optim: {error}")
        return problems

    def batch_plan(self, processes: int) -> BatchPlan:
        """How a step of this configuration is laid out on `processes` processes (`hf_vrl.run.batch`)."""
        optim = self.optim
        return plan_batches(
            optim.batch_size,
            processes,
            global_batch_size=optim.global_batch_size,
            gradient_accumulation_steps=optim.gradient_accumulation_steps,
            accumulation=optim.accumulation,
        )

    def loss_terms(self, plan: BatchPlan) -> dict[str, str]:
        """What each term of the method's loss sees under `plan`, one line each (override)."""
        return {}

    def to_dict(self) -> dict[str, Any]:
        """The configuration as the preset format (with `method` on top)."""
        return {"method": self.method, **dataclasses.asdict(self)}

    def flat_settings(self) -> dict[str, Any]:
        """{dotted name: value} of every setting (`optim.batch_size`, ...)."""
        return {path: value for path, value, _ in _leaves(self)}

    # -- what a resume must not change ------------------------------------------------------------------

    loss_gathers: ClassVar[bool] = True  # the loss sees every process's samples; False: each its own (DCR)

    def identity(self, processes: int | None = None) -> dict[str, Any]:
        """What defines the run (what resuming must not change) when it runs on `processes` processes
        (default: this launch's): the settings that define it, flattened to dotted names, and what the
        layout gives each part of a step (`layout_identity`)."""
        fields = {path: value for path, value, meta in _leaves(self) if _defines(meta, self)}
        plan = self.batch_plan(process_count() if processes is None else processes)
        return {**fields, **self.layout_identity(plan)}

    def measured_settings(self) -> list[str]:
        """The dotted names of the settings that decide what a reported number is measured on (`MEASURED`)."""
        return [path for path, _, meta in _leaves(self) if meta.get("identity") == MEASURED]

    def layout_identity(self, plan: BatchPlan) -> dict[str, Any]:
        """What the result of a step depends on in the layout `plan`; everything else in it (process count,
        micro-batches) changes only the float rounding of sums taken in another order.

        * The samples of a step, over all processes: the same on any layout that keeps the global batch
          (`SeededSampler`, and every draw keyed by the step and the micro-batch's place in it).
        * The samples one evaluation of the loss sees, where that is not the whole step: a micro-batch
          under micro_batch accumulation (with every process's under a gathered loss), a process's share
          under a loss that stays within a process (DCR's grid).
        * The micro-batch, where a forward pass computes over its micro-batch alone (`per_micro_batch`).
        * The process count, where a process's part depends on it (`per_process`).
        """
        entries: dict[str, Any] = {SAMPLES_PER_STEP: plan.global_batch}
        if plan.accumulation == "micro_batch" or not self.loss_gathers:
            part = "a micro-batch" if plan.accumulation == "micro_batch" else "the share"
            whose = "of every process" if self.loss_gathers else "of one process"
            seen = plan.loss_batch if self.loss_gathers else plan.local_loss_batch
            entries[f"samples per loss evaluation ({part} {whose})"] = seen
        if reasons := self.per_micro_batch():
            entries[f"samples per micro-batch ({'; '.join(reasons)})"] = plan.micro_batch
        if reasons := self.per_process():
            entries[f"processes ({'; '.join(reasons)})"] = plan.processes
        return entries

    def per_micro_batch(self) -> list[str]:
        """Why a forward pass's result depends on its micro-batch beyond its samples (BatchNorm's statistics,
        dropout's masks drawn per micro-batch), so that the micro-batch defines the run (extend)."""
        return []

    def per_process(self) -> list[str]:
        """Why a process's part of a step depends on the process count, so that the count defines the run
        (extend): streamed data, each process reading its own shards."""
        if _streamed_data(self):
            return ["streamed data: each process reads its own shards of --dataset"]
        return []


SAMPLES_PER_STEP = "samples per optimiser step"


def dropouts(model_config: Any) -> list[str]:
    """The dropout (and stochastic depth) settings above 0 of a transformers configuration or its mapping
    (sub-configurations too), as `name p` strings: each draws its masks for a micro-batch at once."""
    found = []

    def walk(values: Mapping[Any, Any], prefix: str) -> None:
        for key, value in values.items():
            name = f"{prefix}{key}"  # keys need not be strings (id2label's)
            if isinstance(value, Mapping):
                walk(value, f"{name}.")
            elif isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
                if "dropout" in str(key) or "drop_path" in str(key):
                    found.append(f"{name} {value:g}")

    walk(model_config.to_dict() if hasattr(model_config, "to_dict") else model_config, "")
    return found


def _defines(meta: Mapping[str, Any], config: RunConfig) -> bool:
    identity = meta.get("identity", True)
    return identity == MEASURED or bool(identity(config) if callable(identity) else identity)


# -- walking and building ------------------------------------------------------------


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _fields(cls: type) -> Iterator[tuple[dataclasses.Field, Any]]:
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        yield f, hints[f.name]


def leaf_fields(cls: type[RunConfig]) -> list[tuple[str | None, dataclasses.Field, Any]]:
    """(section or None, field, type) of every setting, sections in declaration order."""
    leaves = []
    for f, tp in _fields(cls):
        if _is_section(tp):
            leaves += [(f.name, sub, sub_tp) for sub, sub_tp in _fields(tp)]
        else:
            leaves.append((None, f, tp))
    return leaves


def _leaves(config: Any, prefix: str = "") -> Iterator[tuple[str, Any, Mapping]]:
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            yield from _leaves(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", value, f.metadata


def _describe(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if origin is list:
        return f"a list of {_describe(args[0])}"
    return {type(None): "null", dict: "a mapping"}.get(tp, getattr(tp, "__name__", str(tp)))


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def _means_none(value: Any) -> bool:
    """None, `none` / `null`, or a list flag given that one word (`--crop-scale none`)."""
    if isinstance(value, (list, tuple)) and len(value) == 1:
        value = value[0]
    return value is None or (isinstance(value, str) and value.lower() in ("none", "null"))


def coerce(value: Any, tp: Any) -> Any:
    """`value` as type `tp` (strings from the command line are parsed); raises ValueError when it is not."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if type(None) in args and _means_none(value):
            return None
        for arg in (a for a in args if a is not type(None)):
            try:
                return coerce(value, arg)
            except ValueError:
                continue
        raise ValueError(f"expected {_describe(tp)}, got {value!r}")
    if origin is Literal:
        if value in args:
            return value
        raise ValueError(f"expected {_describe(tp)}, got {value!r}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
            return value.lower() in _TRUE
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, str):
            return value
    elif origin is list:
        if isinstance(value, str):
            value = json.loads(value) if value.startswith("[") else value.replace(",", " ").split()
        if isinstance(value, (list, tuple)):
            return [coerce(item, args[0]) for item in value]
    elif tp is dict or origin is dict:
        if isinstance(value, str):
            value = json.loads(value)
        if isinstance(value, Mapping):
            return dict(value)
    raise ValueError(f"expected {_describe(tp)}, got {value!r}")


# sections and settings of the first preset format -> where they live now
RENAMED = {"training": "optim", "processors": "model", "random_resized_crop_scale": "diffclip.crop_scale"}


def _unknown(key: str, known: list[str], where: str) -> str:
    close = difflib.get_close_matches(key, known + list(RENAMED), n=1)
    if close and close[0] in RENAMED:
        hint = f"did you mean {RENAMED[close[0]]!r}? ('{close[0]}' in the first preset format)"
    else:
        hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(known)}"
    return f"{where}{key}: unknown setting; {hint}"


def _build(cls: type, values: Mapping[str, Any], where: str, problems: list[str]) -> Any:
    """Instantiate dataclass `cls` from a (possibly partial) mapping, collecting every problem."""
    known = [f.name for f in dataclasses.fields(cls)]
    problems += [_unknown(key, known, where) for key in values if key not in known]
    kwargs = {}
    for f, tp in _fields(cls):
        if f.name not in values:
            continue
        value = values[f.name]
        if _is_section(tp):
            if not isinstance(value, Mapping):
                problems.append(f"{where}{f.name}: expected a mapping of settings, got {value!r}")
                continue
            # a partial section keeps the method's defaults for the rest (e.g. DCR's optimisation defaults)
            defaults = dataclasses.asdict(f.default_factory()) if callable(f.default_factory) else {}
            kwargs[f.name] = _build(tp, {**defaults, **value}, f"{where}{f.name}.", problems)
            continue
        try:
            value = coerce(value, tp)
        except (ValueError, json.JSONDecodeError) as error:
            problems.append(f"{where}{f.name}: {error}")
            continue
        check = f.metadata.get("check")
        message = check(value) if check else None
        if message:
            problems.append(f"{where}{f.name}: {message}")
            continue  # the default stands in, so that a section validating itself reports nothing twice
        kwargs[f.name] = value
    return cls(**kwargs)


def deep_merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """`base` updated by `update`, sections merged key by key (a mapping-valued setting is replaced whole
    unless both sides are sections of the configuration, which the caller decides by nesting)."""
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


MAX_DEPTH = 32  # nesting a configuration may reach (the presets: 4, model.architecture.text_config.<key>)


def nesting_depth(value: Any) -> int:
    """How deeply `value` nests mappings and lists, counted without recursion (a hostile file must not
    exhaust the stack) and only up to one level past `MAX_DEPTH`."""
    deepest, todo = 0, [(value, 0)]
    while todo and deepest <= MAX_DEPTH:
        item, level = todo.pop()
        deepest = max(deepest, level)
        children = item.values() if isinstance(item, Mapping) else item if isinstance(item, list) else ()
        todo += [(child, level + 1) for child in children]
    return deepest


MAX_VALUES = 100_000  # values a configuration file may hold, its YAML aliases expanded (the presets: < 300)


def _expands_past(node: Any, bound: int) -> bool:
    """Whether the YAML node graph `node` holds more than `bound` values once its aliases are expanded
    (each use of an anchor counts its values again, as reading the settings walks them), counted without
    recursion and never past `bound`: a "billion laughs" of nested aliases stops here."""
    import yaml

    count, todo = 0, [node]
    while todo and count <= bound:
        item = todo.pop()
        count += 1
        if isinstance(item, yaml.SequenceNode):
            todo += item.value
        elif isinstance(item, yaml.MappingNode):
            todo += [part for pair in item.value for part in pair]
    return count > bound


def _safe_load_bounded(text: str, path: Path) -> Any:
    """`yaml.safe_load`, refusing a document that expands past `MAX_VALUES` before it is constructed."""
    import yaml

    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None and _expands_past(node, MAX_VALUES):
            raise UserError(
                f"{path} holds more than {MAX_VALUES:,} values once its YAML aliases are expanded: no "
                "configuration does; write its settings out without nested aliases"
            )
        return loader.construct_document(node) if node is not None else None
    finally:
        loader.dispose()


def load_config_file(path: str | Path) -> dict[str, Any]:
    """A preset or configuration file: JSON, or YAML (`.yaml` / `.yml`, its aliases expanding to at most
    `MAX_VALUES` values), UTF-8, nested at most `MAX_DEPTH` levels."""
    import yaml

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        where = f"{error.reason} at byte {error.start}"
        raise UserError(f"{path} is not UTF-8 text ({where}): save it as UTF-8") from None
    too_deep = f"{path} nests its settings more than {MAX_DEPTH} levels deep: no configuration does"
    try:
        data = _safe_load_bounded(text, path) if path.suffix in (".yaml", ".yml") else json.loads(text)
    except RecursionError:
        raise UserError(too_deep) from None
    except yaml.MarkedYAMLError as error:  # several lines of context: the problem and where it is
        mark = error.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise UserError(f"{path} is not valid YAML: {error.problem}{where}") from None
    except (yaml.YAMLError, ValueError) as error:
        kind = "YAML" if path.suffix in (".yaml", ".yml") else "JSON"
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise UserError(f"{path} is not valid {kind}: {reason}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} must hold a mapping of settings, got {type(data).__name__}")
    if nesting_depth(data) > MAX_DEPTH:
        raise UserError(too_deep)
    return data


def resolve(
    cls: type[RunConfig],
    preset: Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
    *,
    source: str = "the configuration",
) -> RunConfig:
    """Defaults, updated by `preset` (the preset format), then by `overrides` ({dotted path: value}); every
    problem is collected and raised as one `UserError`."""
    preset = dict(preset or {})
    method = preset.pop("method", cls.method)
    preset.pop(LAUNCH, None)
    preset.pop(DATA_FILES, None)
    preset.pop(HUB_COMMITS, None)
    for key in PRESET_INFO_KEYS:
        preset.pop(key, None)
    if method != cls.method:
        raise UserError(
            f"{source} is a {method!r} preset, not a {cls.method!r} one: run `hf-vrl train {method}` with "
            f"it, or pick a {cls.method} preset (`hf-vrl train {cls.method} --help` lists them)"
        )
    values: dict[str, Any] = dict(preset)
    for path, value in (overrides or {}).items():
        _set_path(values, path.split("."), value)
    if nesting_depth(values) > MAX_DEPTH:  # a mapping given to `hf_vrl.run.train`, as a file is checked
        raise UserError(
            f"{source} nests its settings more than {MAX_DEPTH} levels deep: no configuration does"
        )
    problems: list[str] = []
    config = _build(cls, values, "", problems)
    try:
        problems += config.validate()
    except (TypeError, ValueError, AttributeError):
        pass  # a cross-field rule tripped over a value already reported above
    if problems:
        listing = "\n".join(f"  - {p}" for p in problems)
        raise UserError(f"{source} has {len(problems)} problem(s):\n{listing}")
    return config


def _set_path(values: dict[str, Any], path: list[str], value: Any) -> None:
    head, *rest = path
    if not rest:
        values[head] = value
        return
    child = values.get(head)
    child = dict(child) if isinstance(child, Mapping) else {}
    _set_path(child, rest, value)
    values[head] = child
