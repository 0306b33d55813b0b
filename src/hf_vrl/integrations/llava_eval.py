"""`hf-vrl llava-eval`: score a LLaVA (the folder `hf-vrl export-llava` or `llava-align` wrote, or a Hub id)
on lmms-eval benchmarks.

    hf-vrl llava-eval runs/llava-dcr --tasks pope,mmvp --output-dir runs/llava-dcr/eval
    hf-vrl llava-eval runs/llava-dcr --tasks my_yesno --include-path my_tasks/ --limit 50 --output-dir out

It runs lmms-eval (`pip install "hf-vrl[llava-eval]"`) with its `llava_hf` backend in a child process, one
sample at a time, greedy as each task's YAML says. `--tasks` takes lmms-eval's task names (`lmms-eval --tasks
list`); `--include-path` adds a folder of task YAMLs of your own (a local dataset: `dataset_path: parquet` or
`json` with `dataset_kwargs: {data_files: ...}`). lmms-eval's own files (results and the model's answer to
every sample) go to OUTPUT/lmms_eval/; OUTPUT/llava_eval.json holds every task's metrics, and a table is
printed. Benchmarks on the Hub are downloaded by lmms-eval (Hub datasets cache); with HF_HUB_OFFLINE=1 only
cached or local tasks run.

Two lmms-eval 0.7 quirks are handled here: its `llava_hf` backend passes `device_map=""`, which transformers 5
rejects (this command passes `device_map=DEVICE`), and its file-lock patch imports `filelock._api`, which
filelock 4 no longer has (the patch is skipped there). A processor without a chat template (the folder has no
chat_template.jinja / .json) is run through lmms-eval's simple `llava_hf` path, which prompts in LLaVA-1.5's
Vicuna format; with one, its chat path applies the processor's template.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import math
import subprocess
import sys
import time
from pathlib import Path

from hf_vrl.errors import UserError
from hf_vrl.run.layout import OutputDir, atomic_write_json

INSTALL_HINT = "lmms-eval is not installed: pip install 'hf-vrl[llava-eval]'"
RESULTS_FILE = "llava_eval.json"
LMMS_EVAL_DIR = "lmms_eval"

# Runs lmms-eval's command line in the child process (`python -c RUNNER ARGS...`).
RUNNER = """\
import sys
import lmms_eval.evaluator as evaluator
try:
    import filelock._api  # noqa: F401  filelock 3.x: lmms-eval's lock patch applies
except ImportError:  # filelock 4 has no _api module; lmms-eval 0.7's patch would fail on it
    evaluator._enable_reentrant_filelocks._patched = True
from lmms_eval.cli.dispatch import main
sys.argv = ["lmms-eval", *sys.argv[1:]]
main()
"""


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-vrl llava-eval",
        description="Score a LLaVA (transformers LlavaForConditionalGeneration) on lmms-eval benchmarks.",
        epilog="Needs lmms-eval: pip install 'hf-vrl[llava-eval]'. Flags take either spelling (--output-dir, "
        "--output_dir), as in hf-vrl train.",
    )
    parser.add_argument("model", help="LLaVA folder (e.g. from hf-vrl export-llava) or Hub id")
    parser.add_argument(
        "--tasks",
        required=True,
        help="comma-separated lmms-eval task names, e.g. pope,mmvp (lmms-eval --tasks list)",
    )
    parser.add_argument(
        "--include-path", help="a folder of your own lmms-eval task YAMLs (and their utils.py)"
    )
    parser.add_argument(
        "--limit", type=int, help="score only the first N samples of each task (a quick check)"
    )
    parser.add_argument(
        "--output-dir", "--output", dest="output", required=True, help="folder for the results"
    )
    parser.add_argument("--device", help="cpu, cuda, cuda:1, ... (default: cuda when there is one, else cpu)")
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", "float32", "bfloat16", "float16"),
        help="dtype the model is loaded in (default: auto, the checkpoint's)",
    )
    parser.add_argument(
        "--model-args",
        default="",
        help="more of lmms-eval's llava_hf arguments, k=v,k=v (e.g. attn_implementation=sdpa)",
    )
    return parser


def require_lmms_eval() -> None:
    if importlib.util.find_spec("lmms_eval") is None:
        raise UserError(INSTALL_HINT)


def has_chat_template(model: str) -> bool:
    """Whether a local LLaVA folder's processor has a chat template; a Hub id is taken to have one."""
    folder = Path(model)
    if not folder.is_dir():
        return True
    if (folder / "chat_template.jinja").exists() or (folder / "chat_template.json").exists():
        return True
    processor_config = folder / "processor_config.json"
    return processor_config.exists() and "chat_template" in json.loads(processor_config.read_text())


def lmms_eval_command(options: argparse.Namespace, output: Path) -> list[str]:
    """The child command: lmms-eval's `llava_hf` backend on OPTIONS' model and tasks, writing to OUTPUT."""
    model_args = [
        f"pretrained={options.model}",
        f"device={options.device}",
        f"device_map={options.device}",  # lmms-eval's default "" is rejected by transformers 5
        f"dtype={options.dtype}",
    ]
    if options.model_args:
        model_args.append(options.model_args)
    command = [sys.executable, "-c", RUNNER, "--model", "llava_hf", "--model_args", ",".join(model_args)]
    command += ["--tasks", options.tasks, "--batch_size", "1", "--output_path", str(output), "--log_samples"]
    if options.include_path:
        command += ["--include_path", str(Path(options.include_path).resolve())]
    if options.limit is not None:
        command += ["--limit", str(options.limit)]
    if not has_chat_template(options.model):
        command.append("--force_simple")
    return command


def newest_results(folder: Path, since: float) -> Path | None:
    """lmms-eval's `*_results.json` written under FOLDER after SINCE, the newest."""
    found = [path for path in folder.rglob("*_results.json") if path.stat().st_mtime >= since]
    return max(found, key=lambda path: path.stat().st_mtime, default=None)


def task_metrics(results: dict) -> dict[str, dict[str, float | str]]:
    """{task: {metric: value}} from lmms-eval's results; a filter other than `none` stays in the name
    (`exact_match,flexible`), stderrs keep their `_stderr` names."""
    tasks = {}
    for task, values in results.get("results", {}).items():
        metrics = {}
        for key, value in values.items():
            if key == "alias" or value == "N/A":
                continue
            name, _, filter_name = key.partition(",")
            metrics[name if filter_name in ("", "none") else key] = value
        tasks[task] = metrics
    return tasks


def logged_samples(results_path: Path, task: str) -> list[dict]:
    """TASK's logged samples beside lmms-eval's RESULTS_PATH (each with its doc, answer and per-sample
    metrics); [] when there are none."""
    prefix = results_path.name.removesuffix("_results.json")
    found = results_path.parent / f"{prefix}_samples_{task}.jsonl"
    return [json.loads(line) for line in found.read_text().splitlines()] if found.is_file() else []


def empty_answers(results_path: Path) -> dict[str, int]:
    """{task: samples answered with nothing}: lmms-eval logs a generation error and scores an empty answer."""
    prefix = results_path.name.removesuffix("_results.json")
    counts = {}
    for samples in results_path.parent.glob(f"{prefix}_samples_*.jsonl"):
        task = samples.stem.removeprefix(f"{prefix}_samples_")
        empty = 0
        for line in samples.read_text().splitlines():
            answer = json.loads(line).get("filtered_resps")
            while isinstance(answer, list):  # one answer, or a list of them (repeats)
                answer = answer[0] if answer else ""
            if isinstance(answer, dict):
                answer = answer.get("text", "")
            empty += not str(answer).strip()
        counts[task] = empty
    return counts


def format_table(tasks: dict[str, dict[str, float | str]]) -> str:
    rows = [("task", "metric", "value", "stderr")]
    for task, metrics in tasks.items():
        for name, value in metrics.items():
            if "_stderr" in name:
                continue
            stderr = metrics.get(name.replace(",", "_stderr,", 1) if "," in name else f"{name}_stderr", "")
            rows.append((task, name, _number(value), _number(stderr)))
    widths = [max(len(row[column]) for row in rows) for column in range(4)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows
    )


def _number(value: float | str) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4f}"
    return str(value)


def main(argv: list[str] | None = None) -> int:
    options = _build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    output = OutputDir(Path(options.output), "llava-eval")
    output.check()  # a folder this command must not write is one line, before anything runs
    require_lmms_eval()
    if "," in options.model:
        raise UserError(
            f"the model path {options.model!r} holds a comma, which lmms-eval's --model_args splits on"
        )
    if options.include_path and not Path(options.include_path).is_dir():
        raise UserError(f"--include-path {options.include_path}: no such folder")
    if options.device is None:
        import torch

        options.device = "cuda" if torch.cuda.is_available() else "cpu"
    with output.claim():  # one writer per folder
        return _score(options, output.root)


def _score(options: argparse.Namespace, output: Path) -> int:
    """Run lmms-eval into `output`, write the summary report and print the table."""
    lmms_output = output / LMMS_EVAL_DIR
    lmms_output.mkdir(parents=True, exist_ok=True)

    started = time.time() - 1
    command = lmms_eval_command(options, lmms_output)
    status = subprocess.run(command, check=False).returncode
    results_path = newest_results(lmms_output, started)
    if status != 0 or results_path is None:
        raise UserError(
            f"lmms-eval wrote no results for {options.tasks} (exit status {status}): see its messages above"
        )

    results = json.loads(results_path.read_text())
    tasks = task_metrics(results)
    empty = empty_answers(results_path)
    report = {
        "model": options.model,
        "tasks": tasks,
        "samples": {task: counts.get("effective") for task, counts in results.get("n-samples", {}).items()},
        "empty_answers": empty,
        "limit": options.limit,
        "include_path": options.include_path,
        "device": options.device,
        "dtype": options.dtype,
        "lmms_eval_version": importlib.metadata.version("lmms-eval"),
        "lmms_eval_results": str(results_path.relative_to(output)),
    }
    atomic_write_json(output / RESULTS_FILE, report)

    print(f"\n{options.model} on {options.tasks} (lmms-eval llava_hf, {options.device})")
    print(format_table(tasks))
    for task, count in empty.items():
        if count:
            print(f"  {task}: {count} answer(s) empty: generation failed there, see lmms-eval's log above")
    print(f"{output / RESULTS_FILE}; lmms-eval's results and samples: {results_path.parent}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
