"""The report every run writes, and `hf-vrl compare`: runs side by side.

    {"method", "config", "before": {...}, "after": {...},
     "train": {"steps", "runtime_s", "samples_per_s", "skipped": {kind: n},
               "stages": {stage: {"steps" (really run), "runtime_s", "samples_per_s", "hardware"}},
               "data": <data record of the training data>},
     "inputs": {name: {"model", "objective", "labels", "data", "steps", "runtime_s", "hardware"}},
     "outputs": {"final": ..., <export or figure>: path}}

It is the one record of what ran, written by the run as it happens: cards (`hf_vrl.hub.card`), `hf-vrl
compare` and the loggers read it alone, never the configuration. `before` / `after` hold `evaluate_clip`'s
sections (`zero_shot`, `retrieval`, `clustering`, `linear_probe`, `granularity`, `rsa`, `mmvp`, ...) with the
same metric names for every method, so one table reads any runs; each section's `data` records what it was
measured on (`hf_vrl.eval_inputs.data_record`: set, split, samples, how they were drawn, where the captions
came from). `inputs` are the run's in-run pre-trainings (`Run.build_input`).
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hf_vrl.errors import UserError
from hf_vrl.run.layout import RUN_MARKER, atomic_write_bytes

__all__ = [
    "compare_table",
    "load_report",
    "log_evaluation",
    "log_tag",
    "main",
    "metric_numbers",
    "metric_rows",
    "check_plot_path",
    "plot_comparison",
]

PLOT_SOFTWARE = "hf-vrl compare"  # the PNG text chunk that marks a plot compare wrote (and may replace)


def load_report(path: str | Path) -> dict[str, Any]:
    """`<run>/report.json` (a run folder or the file itself)."""
    path = Path(path)
    file = path / "report.json" if path.is_dir() else path
    if not file.is_file():
        raise UserError(f"{path} has no report.json: give run folders written by `hf-vrl train`")
    try:
        report = json.loads(file.read_text())
    except (UnicodeDecodeError, ValueError) as error:
        reason = (str(error).splitlines() or [type(error).__name__])[0]
        raise UserError(
            f"{file} is not a readable report ({reason}): give run folders written by `hf-vrl train`"
        ) from None
    if not isinstance(report, dict):
        raise UserError(f"{file} is not a report (a JSON object): give run folders written by `hf-vrl train`")
    return report


def metric_numbers(section: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """Flatten a report section to {"task.metric": value} for the numeric leaves (not the `"data"` records of
    what was measured)."""
    out: dict[str, float] = {}
    for key, value in section.items():
        name = f"{prefix}{key}"
        if key == "data":
            continue
        if isinstance(value, Mapping):
            out.update(metric_numbers(value, f"{name}."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = float(value)
    return out


def log_tag(name: str) -> str:
    """`name` as a logger tag: letters, digits and `_ . - / @` kept (`retrieval.i2t_R@1`), every other
    character `_` ("transfer.held-out classes" -> "transfer.held-out_classes")."""
    return re.sub(r"[^A-Za-z0-9_./@-]", "_", name)


def log_evaluation(report: Mapping[str, Any], args: Any, step: int) -> None:
    """The run's evaluation through the loggers of its `report_to`, as the Trainer logs an evaluation: every
    number of `report["before"]` / `report["after"]` as `eval_<task>.<metric>` (`log_tag`), before at step 0
    and after at `step`, both in the folder of `args` (the TrainingArguments of the last stage: TensorBoard
    writes `eval/<task>.<metric>` beside its training scalars), so one tag holds the before → after (one
    logger each, so one event file holds both, in order)."""
    from transformers import TrainerControl, TrainerState
    from transformers.integrations import TensorBoardCallback, get_reporting_integration_callbacks

    callbacks = [callback() for callback in get_reporting_integration_callbacks(args.report_to)]
    control, state = TrainerControl(), TrainerState(global_step=0)
    for callback in callbacks:
        if isinstance(callback, TensorBoardCallback):
            callback.logging_dir = args.logging_dir  # the stage's folder, as VRLTrainer points it
    for stage, at in (("before", 0), ("after", step)):
        numbers = metric_numbers(report.get(stage) or {})
        state.global_step = at
        logs = {f"eval_{log_tag(name)}": value for name, value in numbers.items()}
        for callback in callbacks if numbers else ():
            callback.on_log(args, state, control, logs=logs)
    for callback in callbacks:
        if isinstance(callback, TensorBoardCallback):
            callback.on_train_end(args, state, control)  # closes its event file


# what a comparison shows by default: headline metrics of every method, in this order
HEADLINE = (
    "zero_shot.top1",
    "ood.top1",
    "transfer.top1",
    "retrieval.i2t_R@1",
    "retrieval.t2i_R@1",
    "retrieval.i2i_R@1",
    "retrieval.i2i_R@5",
    "retrieval.i2t_R@5",
    "clustering.nmi",
    "clustering.acc",
    "linear_probe.top1",
    "mmvp.accuracy",
    "rsa.image",
    "granularity.ncc_fine",
)
_SIZES = ("n_samples", "n_classes", "n_texts", "n_templates", "embedding_dim", "n_pairs", "n_train")


def metric_rows(reports: Mapping[str, Mapping[str, Any]], metrics: Sequence[str] | None = None) -> list[str]:
    """The metrics to show: `metrics`, else the headline ones any report has, else all shared numbers."""
    found: set[str] = set()
    for report in reports.values():
        for stage in ("before", "after"):
            found |= set(metric_numbers(report.get(stage) or {}))
    if metrics:
        return [m for m in metrics if m in found]
    headline = [m for m in HEADLINE if m in found]
    return headline or sorted(m for m in found if m.rsplit(".", 1)[-1] not in _SIZES)


def compare_table(reports: Mapping[str, Mapping[str, Any]], metrics: Sequence[str] | None = None) -> str:
    """One row per metric, one column per run and stage (percent with one decimal; '-' where absent)."""
    from hf_vrl.evaluation import text_table

    rows = metric_rows(reports, metrics)
    header = ["metric"] + [f"{name} {stage}" for name in reports for stage in ("before", "after")]
    table = [header]
    for metric in rows:
        cells = [metric]
        for report in reports.values():
            for stage in ("before", "after"):
                value = metric_numbers(report.get(stage) or {}).get(metric)
                cells.append("-" if value is None else f"{100 * value:.1f}")
        table.append(cells)
    return text_table(table, left_columns=1)


def plot_comparison(
    reports: Mapping[str, Mapping[str, Any]], path: str | Path, metrics: Sequence[str] | None = None
) -> Path:
    """Grouped bars: one group per metric, one bar per run (after training; before where it is all a run
    has)."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = metric_rows(reports, metrics)
    if not rows:
        raise UserError("the reports share no metric to plot")
    fig = Figure(figsize=(max(4.0, 1.2 * len(rows) + 1), 3.2), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    width = 0.8 / len(reports)
    for i, (name, report) in enumerate(reports.items()):
        numbers = metric_numbers(report.get("after") or report.get("before") or {})
        values = [100 * numbers.get(metric, np.nan) for metric in rows]
        ax.bar(np.arange(len(rows)) + i * width, values, width, label=name)
    ax.set_xticks(np.arange(len(rows)) + 0.4 - width / 2, rows, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("%")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    check_plot_path(path)
    atomic_write_bytes(
        path, lambda staged: fig.savefig(staged, format="png", metadata={"Software": PLOT_SOFTWARE})
    )
    return path


def check_plot_path(path: str | Path) -> None:
    """`--plot` writes only a new file or a plot compare wrote before (its PNG text chunk), and never into a
    folder another command made (a run's figures go to the Hub with it); one line otherwise."""
    path = Path(path)
    made = next((folder for folder in path.absolute().parents if (folder / RUN_MARKER).is_file()), None)
    if made is not None:
        raise UserError(
            f"--plot {path} is inside {made}, a folder another hf-vrl command made: write the plot elsewhere"
        )
    if path.is_symlink() or (path.exists() and not _compare_plot(path)):
        raise UserError(f"--plot {path} exists and is not a plot `hf-vrl compare` wrote: give a new file")


def _compare_plot(path: Path) -> bool:
    """Whether `path` is a PNG that `hf-vrl compare` wrote (`PLOT_SOFTWARE` in its text chunk)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            return image.format == "PNG" and image.info.get("Software") == PLOT_SOFTWARE
    except (OSError, UnidentifiedImageError):
        return False


def _run_names(paths: Sequence[str]) -> list[str]:
    names = [Path(p).name or str(p) for p in paths]
    return [str(p) if names.count(n) > 1 else n for n, p in zip(names, paths)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hf-vrl compare",
        description="Print (and plot) the before/after metrics of runs side by side, from their report.json.",
        epilog="example: hf-vrl compare runs/demo/clip runs/demo/diffclip --plot runs/demo/compare.png",
    )
    parser.add_argument("runs", nargs="+", help="run folders (or report.json files)")
    parser.add_argument("--metrics", nargs="+", help="task.metric names to show (default: the headline ones)")
    parser.add_argument("--plot", metavar="PNG", help="also write a bar chart here")
    args = parser.parse_args(argv)
    if args.plot:
        check_plot_path(args.plot)  # before anything is read or printed
    reports = {name: load_report(path) for name, path in zip(_run_names(args.runs), args.runs)}
    print(compare_table(reports, args.metrics))
    print("(percent)")
    if args.plot:
        print(f"plot: {plot_comparison(reports, args.plot, args.metrics)}")
    return 0
