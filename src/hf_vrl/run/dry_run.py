"""`hf-vrl train <method> --config <preset> --dry-run`: a preset at its real size, checked on this machine.

Every model the preset names by Hub id is replaced by its real-size copy with random weights
(`hf_vrl.run.real_models`: the real configurations, built once into local folders in the Hub layout); the
data by the generated shapes world at the method's image size; evaluation, figures and pushing are off; the
batch is small (2 per micro-batch, 2 micro-batches a step) and every stage takes 2 optimiser steps. Then,
each run a fresh `hf-vrl` process measured by `hf_vrl.run.probe`:
  one process     killed (SIGKILL) at the start of the last stage's step 2, after step 1's checkpoint,
                  then resumed with --resume auto to the end (every weight of the checkpoint must load):
                  final/ and the exports
  two processes   torchrun, the same global batch (skipped where two would not fit in the memory left, or on
                  one GPU)
  memory probes   one step per stage at the two nearest other micro-batches (1 and 3; 3 and 4 where a method
                  needs 2 samples), a larger one only where its host memory, extrapolated, fits; not for DCR,
                  predicted from the parts of its step instead (`hf_vrl.run.memory`, checked against the
                  one-process run's steps)
  load back       every saved model folder in a fresh interpreter without hf_vrl (`hf_vrl.run.load_back`)
and checks that each run's `config.json` and batch layout are what `--print-config` prints for it.

The memory predicted on a GPU at the preset's micro-batch M (`predicted`; DCR's from its parts, the others'
by `predict_memory`), beside the budget it must fit (`hf_vrl.run.memory`): the probe measures, per step,
what stays allocated (weights, buffers, optimiser state, frozen models: S), the gradients (G), the batch the
step moves to the device (D), the most the forward/backward passes hold above S (P(b), D included) and the
optimiser step's own peak (O). A(b) = P(b) - G - D is fitted by least squares through the micro-batches
measured as c + k1 b (c: what does not grow with the batch, such as autocast's copies of the weights), plus
k2 b^2 where the method runs networks on B^2 pairs (`grows_with_square`: DCR's UNet grid), and the
prediction is S + G + max(A(M) + D_M, O), D_M the data of one micro-batch of M samples (the micro-batches of
a step reach the device one at a time, under either accumulation): bytes the CUDA allocator is asked
for, without its caching slack or the CUDA context (about 0.5 GB more per GPU). On a CPU the figures are
tensor bytes (`hf_vrl.methods.dcr.memory.LiveMemory`), on CUDA the allocator's own.
Everything goes to `<output-dir>` (default `runs/<preset>-dry-run`) and its `dry_run.json`.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from hf_vrl.errors import UserError
from hf_vrl.run.config import RunConfig, resolve
from hf_vrl.run.memory import (
    chosen_settings,
    component_prediction,
    fit_at,
    fitted_settings,
    has_components,
    memory_settings,
    prediction_lines,
    preset_prediction,
    real_models,
    validate,
    with_budget,
)

__all__ = [
    "DryRunOptions",
    "dry_run",
    "dry_run_config",
    "fit_runs",
    "grows_with_square",
    "paper_presets",
    "portable",
    "predicted",
    "predict_memory",
    "preset_config",
]

GIB = 2**30
# settings naming data that a method reads beside data.dataset -> the synthetic stand-in
SYNTHETIC_DATA: dict[str, dict[str, Any]] = {
    "dive": {  # class indices of the preset's data mean nothing in the generated world
        "dive.reference_dataset": "shapes",
        "dive.ood_datasets": [],
        "dive.ood_splits": {},
        "dive.ood_limits": {},
        "dive.classes": None,
        "dive.held_out_classes": None,
    },
    "clue": {"model.text_source": "caption"},  # the generated captions stand in for the VLM descriptions
}
STAGE_BUDGETS = ("dcr.stage1_steps", "dive.lp_steps")  # steps of the stages before the last, where set
MIN_MICRO_BATCH = {"clue": 2}  # BatchNorm over one sample is refused (ReSA's heads)
MARKER = ".dry-run"


@dataclass
class DryRunOptions:
    """What a dry run does; the defaults are `--dry-run`'s."""

    micro_batch: int | None = 2  # None: the configuration's own batch sizes
    accumulation: int = 2  # micro-batches per optimiser step on one process
    steps: int = 2  # optimiser steps of every stage
    processes: tuple[int, ...] = (1, 2)
    kill: bool = True  # kill the one-process run at the last stage's step 2 and resume it
    memory_fit: bool = True  # the memory probe at a second micro-batch, and the prediction
    memory_budget_gb: float | None = None  # host memory the runs may use (default: what is free at the start)
    home: Path | None = None  # the real-size folders (default: hf_vrl.run.real_models.real_size_home())
    threads: int | None = None  # torch CPU threads of each run (default: torch's)


# -- the configuration ---------------------------------------------------------------------------------------


def preset_config(preset: str, overrides: Mapping[str, Any] | None = None) -> tuple[type, RunConfig]:
    """(the `Method` class, the resolved configuration) of a preset name or file, with {dotted path: value}
    `overrides`."""
    from hf_vrl.presets import preset_path
    from hf_vrl.run import get_method
    from hf_vrl.run.config import load_config_file

    values = load_config_file(preset_path(preset))
    method_class = get_method(values.get("method", ""))
    return method_class, resolve(method_class.config_class, values, overrides, source=preset)


def paper_presets() -> list[str]:
    """Every preset in hub_configs/ but the tiny ones, the one with the fewest real-size parameters first."""
    from hf_vrl.presets import list_presets
    from hf_vrl.run.real_models import parameter_counts

    sizes = {}
    for name, _, _ in list_presets():
        if not name.endswith("-tiny"):
            repos = set(real_models(preset_config(name)[1]).values())
            sizes[name] = sum(sum(parameter_counts(repo).values()) for repo in repos)
    return sorted(sizes, key=lambda name: (sizes[name], name))


def dry_run_config(config: RunConfig, options: DryRunOptions, micro_batch: int | None = None) -> RunConfig:
    """`config` as a dry run trains it (the module docstring), at `micro_batch` (default: the options')."""
    from hf_vrl.run.real_models import real_size_home

    home = options.home or real_size_home()
    micro = micro_batch or options.micro_batch
    plan = config.batch_plan(1)
    per_step = (micro or plan.micro_batch) * (options.accumulation if micro else plan.accumulation_steps)
    overrides: dict[str, Any] = {
        "data.dataset": "shapes",
        "data.split": "train",
        "data.train_limit": per_step * options.steps,
        "data.num_workers": min(config.data.num_workers, os.cpu_count() or 1),
        "eval.eval_dataset": None,
        "eval.eval_before": False,
        "eval.eval_after": False,
        "eval.figures": False,
        "output.push_to_hub": False,
        "output.save_steps": 1 if options.kill else options.steps,
        "output.logging_steps": 1,
        "optim.max_steps": options.steps,
        **{path: str(home / repo.replace("/", "--")) for path, repo in real_models(config).items()},
        **SYNTHETIC_DATA.get(config.method, {}),
    }
    if micro:
        overrides |= {"optim.batch_size": micro, "optim.global_batch_size": per_step}
        overrides |= {"optim.gradient_accumulation_steps": None}
        if config.method == "dive":
            overrides["dive.reference_batch_size"] = None  # B' = B, as the paper
    flat = config.flat_settings()
    overrides |= {path: options.steps for path in STAGE_BUDGETS if flat.get(path) is not None}
    return resolve(type(config), config.to_dict(), overrides, source="the dry run's configuration")


# -- the runs ------------------------------------------------------------------------------------------------


@dataclass
class _Runner:
    """Launches the dry run's `hf-vrl train` processes, each measured by `hf_vrl.run.probe`."""

    method_class: type
    out: Path
    env: dict[str, str]
    threads: int | None = None

    def run(
        self,
        name: str,
        config_file: Path,
        processes: int = 1,
        probe: Sequence[str] = (),
        train: Sequence[str] = (),
    ) -> dict[str, Any]:
        """`hf-vrl train` of `config_file` into `<out>/<name>`; its output goes to logs/<name>.log."""
        launch = [sys.executable]
        if processes > 1:
            launch += ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]
        record = self.out / "logs" / f"{name}.steps.jsonl"
        command = [*launch, "-m", "hf_vrl.run.probe", "--record", str(record), *probe, "--"]
        command += [
            self.method_class.name,
            "--config",
            str(config_file),
            "--output-dir",
            str(self.out / name),
        ]
        started = time.perf_counter()
        with open(self.out / "logs" / f"{name}.log", "a") as log:
            code = subprocess.run([*command, *train], env=self.env, stdout=log, stderr=subprocess.STDOUT)
        return {"returncode": code.returncode, "wall_s": round(time.perf_counter() - started, 1)}

    def records(self, name: str) -> list[dict[str, Any]]:
        """Run `name`'s step records (`hf_vrl.run.probe`)."""
        from hf_vrl.run.probe import read_records

        return read_records(self.out / "logs" / f"{name}.steps.jsonl")

    def matches_print_config(self, name: str, config_file: Path, processes: int) -> bool:
        """Whether run `name`'s config.json (its configuration and launch) and logged batch layout are what
        `--print-config` shows for its command line on `processes` processes."""
        from hf_vrl.run.config import DATA_FILES, HUB_COMMITS, LAUNCH
        from hf_vrl.run.layout import Launch
        from hf_vrl.run.parser import parse_run_args

        run_dir = self.out / name
        argv = ["--config", str(config_file), "--output-dir", str(run_dir)]
        shown = parse_run_args(self.method_class.config_class, argv, self.method_class.aliases).config
        ran = run_dir / "config.json"
        recorded = json.loads(ran.read_text()) if ran.is_file() else {}
        launch = recorded.pop(LAUNCH, None)
        recorded.pop(DATA_FILES, None)
        recorded.pop(HUB_COMMITS, None)
        if launch != asdict(Launch(processes)) or recorded != json.loads(json.dumps(shown.to_dict())):
            return False
        plan = shown.batch_plan(processes)
        return plan.describe(shown.loss_terms(plan)) in (self.out / "logs" / f"{name}.log").read_text()


def _environment(options: DryRunOptions) -> dict[str, str]:
    env = dict(os.environ) | {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["MALLOC_MMAP_THRESHOLD_"] = "65536"  # freed activations leave the resident set: host peaks mean it
    env.pop("WORLD_SIZE", None)
    return env


def _prepare_folder(out: Path) -> None:
    if out.exists() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise UserError(f"{out} exists and is not a dry run's folder: give another --output-dir")
    shutil.rmtree(out, ignore_errors=True)
    (out / "logs").mkdir(parents=True)
    (out / MARKER).write_text("a dry run's folder: the next dry run into it replaces it\n")


def _write_config(config: RunConfig, path: Path) -> Path:
    path.write_text(json.dumps(config.to_dict(), indent=2) + "\n")
    return path


def _stages(method_class: type, config: RunConfig, out: Path) -> list[str]:
    from hf_vrl.run.layout import RunDir
    from hf_vrl.run.runner import Run

    return method_class(Run(config=config, dir=RunDir(out))).stages()


def _one_process(runner: _Runner, config_file: Path, last_stage: str, options: DryRunOptions) -> dict:
    """The one-process run: killed at the start of the last stage's step 2 and resumed (options.kill)."""
    name = "one-process"
    if not (options.kill and options.steps > 1):
        return {"run": runner.run(name, config_file)}
    killed = runner.run(name, config_file, probe=["--kill-at", f"{last_stage}:1"])
    checkpoint = runner.out / name / "checkpoints" / last_stage / "checkpoint-1"
    resumed = runner.run(name, config_file, train=["--resume", "auto"])
    return {
        "killed": killed,
        "killed_after_checkpoint": killed["returncode"] == -9
        and (checkpoint / "trainer_state.json").is_file(),
        "resumed": resumed,
    }


def _host_budget(options: DryRunOptions) -> float:
    if options.memory_budget_gb is not None:
        return options.memory_budget_gb * GIB
    import psutil

    return float(psutil.virtual_memory().available)


def _processes_skip(records: list[dict[str, Any]], processes: int, budget: float) -> str | None:
    """Why `processes` processes cannot run here, or None."""
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() < processes:
        return f"{torch.cuda.device_count()} GPU for {processes} processes"
    peak = max((r.get("host_peak_bytes") or 0 for r in records), default=0)
    if processes * peak > budget:
        return (
            f"{processes} x {peak / GIB:.1f} GiB (the one-process run's host peak) is more than the "
            f"{budget / GIB:.1f} GiB of host memory the dry run may use"
        )
    return None


def _probe_micro_batches(method: str, micro_batch: int) -> list[int]:
    """The micro-batches of the memory probes: the two nearest the dry run's that the method accepts."""
    low = MIN_MICRO_BATCH.get(method, 1)
    candidates = sorted(
        (size for size in range(low, micro_batch + 3) if size != micro_batch),
        key=lambda size: (abs(size - micro_batch), size),
    )
    return sorted(candidates[:2])


def _memory_probes(
    runner: _Runner, config: RunConfig, options: DryRunOptions, main: Measured
) -> dict[str, Any]:
    """One step per stage at each probe micro-batch; one above the dry run's only where its host peak,
    extrapolated from the runs below it, fits the host budget."""
    runs, measured, budget = {}, [main], _host_budget(options)
    for size in _probe_micro_batches(runner.method_class.name, main.plan.micro_batch):
        name = f"memory-probe-{size}"
        expected = _host_peak_at(measured, size)
        if expected > budget:
            above = f"{expected / GIB:.1f} GiB, is above {budget / GIB:.1f} GiB"
            runs[name] = {"skipped": f"its host peak, about {above}"}
            continue
        probe = dry_run_config(config, replace(options, steps=1), size)
        config_file = _write_config(probe, runner.out / f"config-{name}.json")
        runs[name] = runner.run(name, config_file) | {"micro_batch": size}
        if runs[name]["returncode"] == 0:
            measured.append(Measured(runner.records(name), probe.batch_plan(1)))
    return runs


def _host_peak_at(measured: list[Measured], size: int) -> float:
    """The host peak at micro-batch `size`, on the line through the two largest runs measured (through the
    origin when there is one: an overestimate)."""
    points = sorted(
        (m.plan.micro_batch, max(r.get("host_peak_bytes") or 0 for r in m.records)) for m in measured
    )
    if len(points) == 1:
        ((b, peak),) = points
        return peak * size / b
    (b1, p1), (b2, p2) = points[-2:]
    return p2 + (p2 - p1) / (b2 - b1) * (size - b2)


def _load_back(folders: list[Path], out: Path, env: dict[str, str]) -> dict[str, Any]:
    """`hf_vrl.run.load_back` on `folders` in a fresh interpreter; its findings are also in `out`."""
    script = Path(__file__).with_name("load_back.py")
    with open(out.with_suffix(".log"), "w") as log:
        command = [sys.executable, str(script), str(out), *map(str, folders)]
        subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    return (
        json.loads(out.read_text())
        if out.is_file()
        else {"error": f"no result: see {out.with_suffix('.log')}"}
    )


def _saved_folders(run_dir: Path) -> list[Path]:
    """The model folders a finished run wrote: final/ and every export (DCR writes its exports with final/,
    so the report's outputs do not list them)."""
    from hf_vrl.run.layout import RunDir

    run = RunDir(run_dir)
    paths = [run.final, *sorted(run.exports.iterdir())] if run.exports.is_dir() else [run.final]
    return [path for path in paths if (path / "config.json").is_file()]


def dry_run(
    method_class: type, config: RunConfig, out: Path, options: DryRunOptions | None = None, preset: str = ""
) -> dict:
    """Dry-run `config` (the module docstring) into `out`; returns the report (also in dry_run.json)."""
    options = options or DryRunOptions()
    out = Path(out)
    _prepare_folder(out)
    started = time.perf_counter()
    main = dry_run_config(config, options)
    report = _header(method_class, config, main, options, out) | {
        "preset": preset,
        "precision": main.precision,
    }
    runner = _Runner(method_class, out, _environment(options), options.threads)
    report["runs"] = _runs(runner, config, main, report["stages"][-1], options)
    if (out / "one-process" / "report.json").is_file():
        folders = _saved_folders(out / "one-process")
        report["load_back"] = _load_back(folders, out / "logs" / "load-back.json", runner.env)
    names = [name.replace("_", "-") for name, run in report["runs"].items() if "skipped" not in run]
    report["records"] = {name: runner.records(name) for name in names}
    report["steps"] = {name: _step_summary(records) for name, records in report["records"].items()}
    report["prediction"] = predicted(config, report["stages"], options, report["records"])
    if report["prediction"] and has_components(config):
        measured = report["records"].get("one-process", [])
        size = main.batch_plan(1).micro_batch
        report["prediction"]["validation"] = validate(config, report["stages"], measured, size)
    report["problems"] = problems(report, out)
    report["passed"] = not report["problems"]
    report["wall_s"] = round(time.perf_counter() - started, 1)
    (out / "dry_run.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def portable(report: Any, out: Path, home: Path | None = None) -> Any:
    """`report` without the folders of the machine that made it, for results shared beyond it: paths under
    the dry run's folder `out` relative to it, the real-size folders (under `home`) as `<real-size home>/...`
    (keys and values, also inside messages)."""
    from hf_vrl.run.real_models import real_size_home

    prefixes = {f"{Path(out).resolve()}/": "", f"{Path(out)}/": ""}
    root = Path(home or real_size_home())
    prefixes |= {f"{root.resolve()}/": "<real-size home>/", f"{root}/": "<real-size home>/"}

    def clean(value: Any) -> Any:
        if isinstance(value, str):
            for prefix, replacement in prefixes.items():
                value = value.replace(prefix, replacement)
            return value
        if isinstance(value, Mapping):
            return {clean(key): clean(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [clean(item) for item in value]
        return value

    cleaned = clean(report)
    if (
        isinstance(cleaned, dict)
        and isinstance(cleaned.get("options"), dict)
        and cleaned["options"].get("home")
    ):
        cleaned["options"]["home"] = "<real-size home>"
    return cleaned


def _header(
    method_class: type, config: RunConfig, main: RunConfig, options: DryRunOptions, out: Path
) -> dict:
    """What a dry run's report says before it runs anything; builds the real-size folders it names."""
    from hf_vrl.run.real_models import parameter_counts, real_size_folder

    return {
        "method": method_class.name,
        "machine": machine(),
        "options": {key: str(v) if isinstance(v, Path) else v for key, v in asdict(options).items()},
        "micro_batch": main.optim.batch_size,
        "measured_with": memory_settings(main),
        "global_batch": main.batch_plan(1).global_batch,
        "stages": _stages(method_class, main, out),
        "models": {
            path: {"repo_id": repo, "folder": str(real_size_folder(repo, options.home))}
            | {"parameters": parameter_counts(repo)}
            for path, repo in real_models(config).items()
        },
    }


def _runs(
    runner: _Runner, config: RunConfig, main: RunConfig, last_stage: str, options: DryRunOptions
) -> dict[str, Any]:
    """The one-process run (killed and resumed), the runs on more processes, the memory probes."""
    config_file = _write_config(main, runner.out / "config.json")
    one = _one_process(runner, config_file, last_stage, options)
    one["matches_print_config"] = runner.matches_print_config("one-process", config_file, 1)
    runs: dict[str, Any] = {"one_process": one}
    records = runner.records("one-process")
    if not records:  # it trained nothing: the other runs would not tell more
        return runs
    for processes in (p for p in options.processes if p > 1):
        name = f"{processes}-processes"
        skip = _processes_skip(records, processes, _host_budget(options))
        runs[name] = {"skipped": skip} if skip else runner.run(name, config_file, processes)
        if not skip:
            runs[name]["matches_print_config"] = runner.matches_print_config(name, config_file, processes)
    if options.memory_fit and not has_components(config):  # the parts predict it without probes
        runs |= _memory_probes(runner, config, options, Measured(records, main.batch_plan(1)))
    return runs


def predicted(
    config: RunConfig, stages: list[str], options: DryRunOptions, records: Mapping[str, Any] | None = None
) -> dict[str, Any] | None:
    """The memory `config` asks of one GPU process at its micro-batch, with its budget: from the parts of
    a step where the method has them (`hf_vrl.run.memory`), else fitted through the dry run's `records`."""
    if has_components(config):
        return component_prediction(config, stages)
    fit = fit_runs(config, options, records or {}) if options.memory_fit else []
    if len(fit) < 2:
        return None
    return with_budget(predict_memory(fit, config.batch_plan(1), grows_with_square(config)), config)


def fit_runs(config: RunConfig, options: DryRunOptions, records: Mapping[str, Any]) -> list[Measured]:
    """The runs of a dry run's memory fit, from their step records: the one-process run, then the probes."""
    sizes = {"one-process": options.micro_batch}
    sizes |= {name: int(name.rsplit("-", 1)[1]) for name in records if name.startswith("memory-probe-")}
    return [
        Measured(records[name], dry_run_config(config, options, size).batch_plan(1))
        for name, size in sizes.items()
        if records.get(name)
    ]


def _step_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per stage: the seconds of each step (the first process), the largest host and device peaks."""
    summary: dict[str, Any] = {}
    for stage in dict.fromkeys(r["stage"] for r in records):
        mine = [r for r in records if r["stage"] == stage]
        summary[stage] = {
            "steps": [r["step"] for r in mine if r["rank"] == 0],
            "step_s": [round(r["step_s"], 2) for r in mine if r["rank"] == 0],
            "cpu_s": [round(r["cpu_s"], 2) for r in mine if r["rank"] == 0 and "cpu_s" in r],
            "host_peak_gib": round(max(r.get("host_peak_bytes") or 0 for r in mine) / GIB, 2),
        }
        if any(r["device"] == "cuda" for r in mine):
            summary[stage]["device_peak_gib"] = round(max(r["device_peak_bytes"] for r in mine) / GIB, 2)
    return summary


@dataclass
class Measured:
    """The step records of one run and its batch layout."""

    records: list[dict[str, Any]]
    plan: Any  # hf_vrl.run.batch.BatchPlan

    def stage(self, stage: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["stage"] == stage and r["rank"] == 0]


def grows_with_square(config: RunConfig) -> bool:
    """Whether a step's activations grow with the square of the micro-batch: DCR's Eq. 12 runs the UNet on
    every (latent, condition) pair of a micro-batch, B^2 + B passes (B(1 + K) + B with K sampled negatives, B
    for the reconstruction objective). Every other objective keeps per-sample activations; its B x B logits
    are bytes, and a curvature seen between small micro-batches (kernel choices) must not be extrapolated."""
    dcr = getattr(config, "dcr", None)
    return dcr is not None and dcr.objective != "reconstruction" and dcr.num_negatives is None


def predict_memory(measured: list[Measured], preset: Any, square: bool = False) -> dict[str, Any]:
    """The device memory of one process at the preset's layout (`preset`, a BatchPlan), per stage, from runs
    at several micro-batches (the module docstring's model; `square`: fit the b^2 term too, which takes
    three); `measured[0]` is the dry run's own run."""
    stages = {}
    for stage in dict.fromkeys(r["stage"] for r in measured[0].records):
        runs = [m for m in measured if m.stage(stage)]
        if len(runs) > 1:
            stages[stage] = _stage_prediction(runs, stage, preset, square and len(runs) > 2)
    return {
        "micro_batch": preset.micro_batch,
        "stages": stages,
        "predicted_gib": max((s["predicted_gib"] for s in stages.values()), default=None),
        "how": "S + G + max(A(M) + D, O): S what stays allocated, G the gradients, A the forward/backward "
        "activations fitted as c + k1 b (+ k2 b^2 for DCR's B^2 UNet grid) through the micro-batches "
        "measured, D the data of one micro-batch, O the optimiser step's peak",
    }


def _stage_prediction(runs: list[Measured], stage: str, preset: Any, square: bool) -> dict[str, Any]:
    fit = stage_fit(runs, stage, square)
    at = fit_at({stage: fit}, preset.micro_batch)[stage]
    figures = {
        "static": fit["static_bytes"],
        "gradients": fit["gradient_bytes"],
        "data": fit["data_bytes_per_sample"] * preset.micro_batch,
        "optimizer_step": fit["optimizer_step_bytes"],
    }
    return (
        {f"{name}_gib": round(value / GIB, 4) for name, value in figures.items()}
        | at
        | {"micro_batches": fit["micro_batches"], "fit": "c + k1 b + k2 b^2" if square else "c + k1 b"}
    )


def stage_fit(runs: list[Measured], stage: str, square: bool = False) -> dict[str, Any]:
    """One stage's memory as a function of the micro-batch b, from runs at several micro-batches: what stays
    allocated, the gradients, the optimiser step's peak (the dry run's last step: its optimiser state
    exists), the data per sample, and the activations c + k1 b (+ k2 b^2) fitted through the runs."""
    import numpy as np

    last = runs[0].stage(stage)[-1]
    grads = last["grad_bytes"]
    sizes = [m.plan.micro_batch for m in runs]
    activations = [max(r["step_peak_bytes"] - grads - r["data_bytes"] for r in m.stage(stage)) for m in runs]
    polynomial = np.polyfit(sizes, activations, 2 if square else 1)
    return {
        "static_bytes": last["static_bytes"],
        "gradient_bytes": grads,
        "optimizer_step_bytes": last["optimizer_peak_bytes"],
        "data_bytes_per_sample": last["data_bytes"] / last["data_samples"],
        "activations_polynomial": [round(float(c), 3) for c in polynomial],
        "micro_batches": sizes,
    }


def package_predictions(results: Mapping[str, Any]) -> dict[str, Any]:
    """`hf_vrl/run/memory_predictions.json` from the dry runs' results (benchmarks/results/dry_runs.json):
    each paper preset's prediction at its present settings, DCR's footprint as the results hold it, the
    others' fits as coefficients."""
    packaged = {}
    for preset, kept in sorted(results["presets"].items()):
        config = preset_config(preset)[1]
        prediction = kept["prediction"]
        entry = {
            "method": config.method,
            "global_batch": config.batch_plan(1).global_batch,
            "micro_batch": config.batch_plan(1).micro_batch,
            "settings": fitted_settings(config),
            "memory_settings": memory_settings(config),
            "chosen": chosen_settings(config),
        }
        if has_components(config):
            entry |= {"how": "footprint", "stages": prediction["stages"]}
        else:
            options = DryRunOptions(micro_batch=kept["options"]["micro_batch"])
            runs = fit_runs(config, options, kept["records"])
            fits = {}
            for stage in dict.fromkeys(r["stage"] for r in runs[0].records):
                if len(with_stage := [m for m in runs if m.stage(stage)]) > 1:
                    fits[stage] = stage_fit(with_stage, stage)
            entry |= {"how": "fit", "stages": fits}
        entry |= {key: prediction[key] for key in ("predicted_gib", "budget_gib", "within_budget")}
        packaged[preset] = json.loads(json.dumps(entry))
    return packaged


def problems(report: Mapping[str, Any], out: Path) -> list[str]:
    """What went wrong in a dry run, one line each (empty when it passed)."""
    found = []
    runs = report["runs"]
    one = runs["one_process"]
    if "killed" in one and not one["killed_after_checkpoint"]:
        found.append(
            f"one process: not killed after step 1's checkpoint (exit {one['killed']['returncode']})"
        )
    finished = one.get("resumed", one.get("run"))
    if finished["returncode"] != 0 or not (out / "one-process" / "final").is_dir():
        found.append(f"one process: failed (exit {finished['returncode']}; see logs/one-process.log)")
    steps = list(range(1, report["options"]["steps"] + 1))
    last = report["stages"][-1]
    if report["steps"].get("one-process", {}).get(last, {}).get("steps") != steps:
        found.append(
            f"one process: {last} did not train steps {steps} exactly once (resumed where it stopped)"
        )
    for name, run in runs.items():
        if "skipped" in run:
            continue
        code = run.get("returncode", 0)
        if code != 0:
            found.append(f"{name}: failed (exit {code}; see logs/{name.replace('_', '-')}.log)")
        if run.get("matches_print_config") is False:
            found.append(f"{name}: its config.json or batch layout differ from what --print-config shows")
    if not _loaded_cleanly(report.get("load_back", {})):
        found.append(f"load back: {json.dumps(report.get('load_back'))[:500]}")
    return found


def _loaded_cleanly(found: Mapping[str, Any]) -> bool:
    return (
        bool(found)
        and "error" not in found
        and all(
            "error" not in f and not f["missing_keys"] and not f["unexpected_keys"] for f in found.values()
        )
    )


def summary(report: Mapping[str, Any], out: Path) -> str:
    """The lines `hf-vrl train ... --dry-run` prints."""
    verdict = "passed" if report["passed"] else "FAILED"
    lines = [f"dry run of {report['preset'] or report['method']}: {verdict} ({report['wall_s']:.0f} s)"]
    lines += [f"  problem: {problem}" for problem in report["problems"]]
    for stage, figures in report["steps"].get("one-process", {}).items():
        seconds = ", ".join(f"{s:.1f}" for s in figures["step_s"])
        cpu = ", ".join(f"{s:.1f}" for s in figures.get("cpu_s", []))
        peak = figures.get("device_peak_gib", figures["host_peak_gib"])
        lines.append(
            f"  {stage}: {seconds} s per step{f' ({cpu} s of CPU)' if cpu else ''} at micro-batch "
            f"{report['micro_batch']}, peak {peak:.1f} GiB"
        )
    lines += [f"  {line}" for line in slowness(report)]
    for name, run in report["runs"].items():
        if "skipped" in run:
            lines.append(f"  {name}: skipped ({run['skipped']})")
    lines += [f"  {line}" for line in prediction_lines(report.get("prediction"))]
    lines.append(f"report: {out / 'dry_run.json'}")
    return "\n".join(lines)


def print_prediction(method_class: type, config: RunConfig, source: str | None = None) -> None:
    """--print-config's lines on the memory `config` (from the preset or file `source`) asks of a GPU, to
    stderr (`hf_vrl.run.memory.preset_prediction`), or where to find it."""
    stages = (
        _stages(method_class, config, Path(config.output.output_dir or "."))
        if has_components(config)
        else None
    )
    prediction = preset_prediction(config, Path(source).stem if source else None, stages)
    lines = prediction_lines(prediction) or [
        "memory on a GPU: --dry-run predicts it (fitted through the micro-batches it measures)"
    ]
    for line in lines:
        print(line, file=sys.stderr)


def slowness(report: Mapping[str, Any]) -> list[str]:
    """Why the steps of a dry run on a CPU take longer than their arithmetic, one line each: other load on
    the machine (the steps' wall clock then exceeds their CPU time), bf16 on a CPU without native bf16."""
    found, info = [], report.get("machine", {})
    load, cores = (info.get("load_average_at_start") or [0])[0], info.get("cores") or 1
    if "gpu" not in info and load > cores:
        found.append(
            f"the machine's load average was {load:.1f} on {cores} cores at the start: each step's wall"
            " clock is shared with that load (its CPU time is what it needs)"
        )
    if "gpu" not in info and report.get("precision") in ("bf16", "auto") and info.get("native_bf16") is False:
        found.append(
            "this CPU has no native bf16 (no avx512_bf16 / amx_bf16): the preset's bf16 runs on slow kernels "
            "here, float32 would run faster; the memory predicted for the GPU is the bf16 one"
        )
    return found


def machine() -> dict[str, Any]:
    """The machine a dry run measured on, for its report."""
    import psutil
    import torch

    info: dict[str, Any] = {
        "cpu": _cpu_name(),
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / GIB, 1),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "native_bf16": _native_bf16(),
        "platform": platform.platform(),
        "torch": torch.__version__,
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def _native_bf16() -> bool | None:
    """Whether the CPU computes bf16 natively (the avx512_bf16 or amx_bf16 flags; None where unknown)."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return None
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _cpu_name() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "cpu")


def main(method_class: type, parsed: Any) -> int:
    """`hf-vrl train <method> ... --dry-run [--print-config]`: 0 when the dry run passed, else 1."""
    from hf_vrl.run.batch import process_count

    if process_count() > 1:
        raise UserError("--dry-run starts its own processes: run it without torchrun / accelerate launch")
    if parsed.resume is not None:
        raise UserError("--dry-run starts, kills and resumes its own runs: drop --resume")
    config, options = parsed.config, DryRunOptions(threads=parsed.threads)
    preset = Path(parsed.source).stem
    out = Path(config.output.output_dir or f"runs/{preset}-dry-run")
    if parsed.print_config:
        shown = dry_run_config(config, options)
        print(json.dumps(shown.to_dict(), indent=2))
        plan = shown.batch_plan(1)
        print(plan.describe(shown.loss_terms(plan)), file=sys.stderr)
        print_prediction(method_class, config, parsed.source)
        return 0
    report = dry_run(method_class, config, out, options, preset=preset)
    print(summary(report, out))
    return 0 if report["passed"] else 1
