"""Given models on a paper's benchmarks, the paper's numbers beside the measured ones: the part that
`examples/reproduce_dcr.py` and `examples/reproduce_diffclip.py` share.

A benchmark is found by its key (`BENCHMARKS`): `--source KEY=NAME[@SPLIT]` names it (any name
`hf_vrl.data.registry` loads: `hf:<Hub id>`, a folder, a glob), else `<data-root>/<KEY>/` holds it in the
contract schema (image, label with class names, caption): an image folder with one folder per class inside
each split folder, a `save_to_disk` folder, or parquet files (`<split>-*.parquet`, `datasets`' layout).
Models are `LABEL=PATH` or `PATH`: any CLIP-like folder or Hub id `hf-vrl eval` loads; a DCRModel export gets
its text side from `--text-model` (DCR's P-ability setting: the enhanced image tower against the original
text tower).

LLaVA tables (DCR's and DiffCLIP's Table 3) score `hf-vrl export-llava` / `llava-align` folders with
lmms-eval (`hf_vrl.integrations.llava_eval`): each column is an `LmmsColumn` (a task's metric), and
`--task COLUMN=TASK[:METRIC]` points one at another task (e.g. a YAML of your own in `--include-path`).
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from hf_vrl.errors import UserError, explain
from hf_vrl.metrics.mmvp import MMVP_CATEGORIES

__all__ = [
    "BENCHMARKS",
    "write_measured",
    "add_model_and_data_arguments",
    "main_with_user_errors",
    "MMVP_SHORT_NAMES",
    "Benchmark",
    "LmmsColumn",
    "add_llava_arguments",
    "check_sources",
    "few_shot_episodes",
    "load_benchmark",
    "load_model",
    "load_retrieval",
    "llava_table",
    "llava_table_command",
    "lmms_columns",
    "mmvp_row",
    "mmvp_source",
    "paper_comparison",
    "parse_labelled",
]


@dataclass(frozen=True)
class Benchmark:
    """A benchmark's folder name under --data-root (also its --source key), its name for prompt templates
    and ImageNet-family class names, and the split evaluated."""

    key: str
    name: str
    split: str = "test"


BENCHMARKS: dict[str, Benchmark] = {
    b.key: b
    for b in (
        Benchmark("mnist", "mnist"),
        Benchmark("cifar10", "cifar10"),
        Benchmark("cifar100", "cifar100"),
        Benchmark("eurosat", "eurosat"),
        Benchmark("caltech101", "caltech101"),
        Benchmark("dtd", "dtd"),
        Benchmark("pets", "pets"),
        Benchmark("flowers", "flowers"),
        Benchmark("sun397", "sun397"),
        Benchmark("aircraft", "fgvc_aircraft"),
        Benchmark("food101", "food101"),
        Benchmark("imagenet", "imagenet"),
        Benchmark("imagenet-v2", "imagenet-v2"),
        Benchmark("imagenet-a", "imagenet-a"),
        Benchmark("imagenet-r", "imagenet-r"),
        Benchmark("imagenet-sketch", "imagenet-sketch"),
        Benchmark("flickr8k", "flickr8k"),
        Benchmark("flickr30k", "flickr30k"),
        Benchmark("mscoco", "mscoco"),
    )
}


# MMVP-VLM's visual patterns (`hf_vrl.metrics.MMVP_CATEGORIES`) by the short names tables use as columns
MMVP_SHORT_NAMES: dict[str, str] = dict(
    zip(
        MMVP_CATEGORIES,
        (
            "Orientation",
            "Presence",
            "State",
            "Quantity",
            "Position",
            "Color",
            "Structure",
            "Texts",
            "Viewpoint",
        ),
    )
)


def mmvp_row(score: Mapping[str, Any]) -> dict[str, float]:
    """`hf_vrl.metrics.mmvp_score`'s result as a table row (percent): per pattern by short name, and "Avg"
    (the mean over patterns)."""
    row = {MMVP_SHORT_NAMES.get(name, name): 100 * value for name, value in score["per_category"].items()}
    return row | {"Avg": 100 * score["mean_category_accuracy"]}


def parse_labelled(specs: Sequence[str] | None, what: str) -> dict[str, str]:
    """["LABEL=VALUE" or "VALUE", ...] -> {label: value} (a bare value is its own label)."""
    out: dict[str, str] = {}
    for spec in specs or []:
        label, eq, value = spec.partition("=")
        label, value = (label, value) if eq else (spec, spec)
        if not label or not value:
            raise UserError(f"{what} {spec!r}: write LABEL=VALUE or VALUE")
        out[label] = value
    return out


def _source(key: str, data_root: str | Path | None, sources: Mapping[str, str]) -> tuple[str, str]:
    """(registry name, split) of benchmark `key`."""
    split = BENCHMARKS[key].split if key in BENCHMARKS else "test"
    if key in sources:
        name, at, given = sources[key].rpartition("@")
        return (name, given) if at and "/" not in given else (sources[key], split)
    if data_root is None:
        raise UserError(f"no data for {key}: pass --data-root DIR (with {key}/ in it) or --source {key}=NAME")
    folder = Path(data_root) / key
    if not folder.is_dir():
        raise UserError(
            f"{folder} is missing: put {key} there (an image folder per split, a save_to_disk folder or "
            f"parquet files) or pass --source {key}=hf:<Hub id>[@split]"
        )
    return (f"hf:{folder}" if next(folder.rglob("*.parquet"), None) else str(folder)), split


def check_sources(keys: Sequence[str], data_root: str | Path | None, sources: Mapping[str, str]) -> None:
    """Raise a one-line UserError for the first benchmark of `keys` that has no data (before any model
    loads)."""
    for key in keys:
        if key == "mmvp_vlm":
            mmvp_source(data_root, sources)
        else:
            _source(key, data_root, sources)


def load_benchmark(
    key: str,
    data_root: str | Path | None,
    sources: Mapping[str, str],
    *,
    split: str | None = None,
    limit: int | None = None,
    seed: int = 0,
):
    """Benchmark `key`'s evaluation split (or `split`) as a map-style contract dataset."""
    from hf_vrl.evaluation import load_eval_dataset

    name, default_split = _source(key, data_root, sources)
    return load_eval_dataset(name, split=split or default_split, limit=limit, seed=seed)


CAPTION_COLUMNS = ("caption", "captions", "sentences", "text", "raw")


def load_retrieval(
    key: str,
    data_root: str | Path | None,
    sources: Mapping[str, str],
    *,
    limit: int | None = None,
    seed: int = 0,
):
    """Retrieval benchmark `key` with every caption of each image (columns image, caption: a list of strings
    per row, as `evaluate_clip` scores them); read with `datasets` directly, since the contract loader keeps
    rows of one string caption."""
    import datasets

    from hf_vrl.data.offline import subsample

    name, split = _source(key, data_root, sources)
    target = name.removeprefix("hf:")
    path = Path(target)
    if (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
        ds = datasets.load_from_disk(target)
        ds = ds[split] if isinstance(ds, datasets.DatasetDict) else ds
    elif path.is_dir() and next(path.rglob("*.parquet"), None) is None:
        ds = datasets.load_dataset("imagefolder", data_dir=target, split=split)
    else:
        ds = datasets.load_dataset(target, split=split)
    image = next((c for c, f in ds.features.items() if isinstance(f, datasets.Image)), None)
    caption = next((c for c in CAPTION_COLUMNS if c in ds.column_names), None)
    if image is None or caption is None:
        raise UserError(
            f"{key} ({name}): needs an image column and a caption column, found {ds.column_names}"
        )
    renames = {old: new for old, new in ((image, "image"), (caption, "caption")) if old != new}
    ds = ds.select_columns([image, caption]).rename_columns(renames)
    return ds.select(subsample(len(ds), limit, seed)) if limit is not None else ds


def mmvp_source(data_root: str | Path | None, sources: Mapping[str, str]) -> str:
    """The MMVP-VLM folder (official layout: Questions.csv + "MLLM_VLM Images/"): --source mmvp_vlm=DIR or
    <data-root>/mmvp_vlm."""
    if "mmvp_vlm" in sources:
        return sources["mmvp_vlm"]
    if data_root is None or not (Path(data_root) / "mmvp_vlm").is_dir():
        raise UserError(
            "MMVP-VLM: put the official folder at <data-root>/mmvp_vlm or pass --source mmvp_vlm=DIR"
        )
    return str(Path(data_root) / "mmvp_vlm")


def load_model(path: str, text_model: str | None = None, device: str | None = None) -> tuple[Any, Any, Any]:
    """(model, image_processor, tokenizer) of `path`; an image model with `get_image_features` but no text
    tower (a DCRModel) gets `text_model`'s (`hf_vrl.methods.dcr.evaluate.DCREvalModel`)."""
    from hf_vrl.evaluation import has_text_tower, load_model_and_processors

    model, image_processor, tokenizer = load_model_and_processors(path)
    if not has_text_tower(model) and text_model and callable(getattr(model, "get_image_features", None)):
        from hf_vrl.methods.dcr.evaluate import DCREvalModel

        clip, _, tokenizer = load_model_and_processors(text_model)
        model = DCREvalModel(model, clip)
    if device:
        model.to(device)
    return model.eval(), image_processor, tokenizer


Measured = float | tuple[float, float] | None  # a value, or (mean, std) over seeds


def paper_comparison(
    columns: Sequence[str],
    paper: Mapping[str, Sequence[float | None]],
    measured: Mapping[str, Mapping[str, Measured]],
    digits: int = 1,
) -> str:
    """The paper's rows beside measured ones, "paper / measured" per cell: one line per paper row (measured
    where a model carries that row's label), then one per other model ("- / measured"); "-" where absent,
    "mean ± std" for (mean, std) pairs. `paper` is {row: values in `columns` order}, `measured` {row: {column:
    value}}."""
    from hf_vrl.evaluation import text_table

    def cell(value: Measured) -> str:
        if isinstance(value, tuple):
            return f"{value[0]:.{digits}f} ± {value[1]:.{digits}f}"
        return "-" if value is None else f"{value:.{digits}f}"

    lines: list[Sequence[str]] = [["", *columns]]
    for row in [*paper, *(name for name in measured if name not in paper)]:
        values = paper.get(row) or [None] * len(columns)
        ours = measured.get(row, {})
        lines.append([row, *(f"{cell(v)} / {cell(ours.get(c))}" for c, v in zip(columns, values))])
    return text_table(lines, left_columns=1)


def few_shot_episodes(
    train_x: torch.Tensor,
    train_y: Sequence[int],
    test_x: torch.Tensor,
    test_y: Sequence[int],
    *,
    ways: int = 5,
    shots: int = 5,
    queries: int = 6,
    episodes: int = 5000,
    seed: int = 0,
) -> dict[str, float]:
    """Few-shot accuracy as LGSSL evaluates it (El Banani et al. 2023, `lgssl/evaluation/fewshot.py`, the
    protocol DiffCLIP follows): per episode `ways` random classes, `shots` support images each from train and
    `queries` query images each from test (all it has when fewer), features centred on the support mean and
    L2-normalised, each query labelled by the nearest class mean. {"accuracy_mean", "accuracy_std"} over
    episodes, fractions."""
    import numpy as np

    train_y, test_y = np.asarray(train_y), np.asarray(test_y)
    classes = np.unique(train_y)
    ways = min(ways, classes.size)
    by_class = {c: (np.flatnonzero(train_y == c), np.flatnonzero(test_y == c)) for c in classes}
    short = [int(c) for c, (train, _) in by_class.items() if train.size < shots]
    if short:
        raise UserError(f"few-shot: classes {short[:5]} have fewer than {shots} training images")
    rng = np.random.default_rng(seed)
    train_x, test_x = train_x.float(), test_x.float()
    accuracies = []
    for _ in range(episodes):
        chosen = rng.choice(classes, size=ways, replace=False)
        support = np.concatenate([rng.choice(by_class[c][0], shots, replace=False) for c in chosen])
        query = [rng.permutation(by_class[c][1])[:queries] for c in chosen]
        truth = torch.as_tensor(np.concatenate([np.full(len(q), i) for i, q in enumerate(query)]))
        if truth.numel() == 0:
            continue
        feats_support, feats_query = train_x[support], test_x[np.concatenate(query)]
        mean = feats_support.mean(dim=0, keepdim=True)
        feats_support = torch.nn.functional.normalize(feats_support - mean, dim=-1)
        feats_query = torch.nn.functional.normalize(feats_query - mean, dim=-1)
        prototypes = feats_support.view(ways, shots, -1).mean(dim=1)
        predicted = torch.cdist(feats_query, prototypes).argmin(dim=1)
        accuracies.append((predicted == truth).float().mean().item())
    if not accuracies:
        raise UserError("few-shot: the test split has no images of the sampled classes")
    return {"accuracy_mean": float(np.mean(accuracies)), "accuracy_std": float(np.std(accuracies))}


def main_with_user_errors(run: Callable[[list[str] | None], int], argv: list[str] | None = None) -> int:
    """`run(argv)`, with user errors (and the libraries' missing-path errors) as one line and status 2."""
    try:
        return run(argv)
    except Exception as error:
        message = explain(error)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        return 2


# -- LLaVA tables: columns from lmms-eval ------------------------------------------------------------------


@dataclass(frozen=True)
class LmmsColumn:
    """Where a table column comes from in lmms-eval: the mean of `task`'s `metrics`, times `scale` (lmms-eval
    gives most metrics as fractions; the tables print percent). With `source`, the accuracy over the logged
    samples whose `metrics[0]` record has that `source` (CV-Bench 2D's ADE20K and COCO halves)."""

    task: str
    metrics: tuple[str, ...]
    scale: float = 100.0
    source: str | None = None

    def __str__(self) -> str:
        where = f" [source {self.source}]" if self.source else ""
        return f"{self.task}:{'+'.join(self.metrics)}{where}"


def lmms_columns(
    columns: Mapping[str, LmmsColumn], overrides: Sequence[str] | None, chosen: Sequence[str] | None = None
) -> dict[str, LmmsColumn]:
    """`columns` (only those `chosen`, in table order) with each `--task COLUMN=TASK[:METRIC[+METRIC]]` of
    `overrides` applied: the column then reads TASK (its metrics unless given; same scale)."""
    picked = dict(columns)
    if chosen:
        unknown = [name for name in chosen if name not in columns]
        if unknown:
            raise UserError(f"--sets {unknown}: the table's columns are {list(columns)}")
        picked = {name: column for name, column in columns.items() if name in chosen}
    for spec in overrides or []:
        name, eq, target = spec.partition("=")
        task, _, metrics = target.partition(":")
        if not eq or not task:
            raise UserError(f"--task {spec!r}: write COLUMN=TASK or COLUMN=TASK:METRIC")
        if name not in columns:
            raise UserError(f"--task {spec!r}: no column {name!r}; the table's columns are {list(columns)}")
        if name in picked:
            given = tuple(m for m in metrics.split("+") if m) if metrics else ()
            changes = dict(metrics=given, source=None) if given else {}
            picked[name] = replace(picked[name], task=task, **changes)
    return picked


def add_model_and_data_arguments(parser: Any, *, model_required: bool, model_example: str) -> None:
    """The flags both reproduce scripts take: --model (repeatable, [LABEL=]PATH), --data-root, --source."""
    parser.add_argument(
        "--model",
        action="append",
        required=model_required,
        metavar="[LABEL=]PATH",
        help=f"a model to evaluate (repeatable); LABEL names its row, e.g. {model_example}",
    )
    parser.add_argument("--data-root", help="the folder holding one folder per benchmark (layout above)")
    parser.add_argument(
        "--source",
        action="append",
        metavar="KEY=NAME[@SPLIT]",
        help="where a benchmark is, instead of --data-root",
    )


def add_llava_arguments(parser: Any) -> None:
    """The flags of the LLaVA tables (lmms-eval): --task, --include-path, --eval-dir, --dtype."""
    group = parser.add_argument_group(
        "LLaVA tables (lmms-eval, models from hf-vrl export-llava / llava-align)"
    )
    group.add_argument(
        "--task",
        action="append",
        metavar="COLUMN=TASK[:METRIC]",
        help='score a column with another lmms-eval task (and metric), e.g. "POPE rand=my_pope:pope_recall"',
    )
    group.add_argument("--include-path", help="a folder of your own lmms-eval task YAMLs (for --task)")
    group.add_argument(
        "--eval-dir", help="lmms-eval's output, a folder per model (default: runs/<paper>-table3)"
    )
    group.add_argument(
        "--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"), help="LLaVA dtype"
    )


def _column_value(column: LmmsColumn, report: Mapping[str, Any], results: Path, label: str) -> float:
    """One cell from `hf-vrl llava-eval`'s report (its llava_eval.json) and lmms-eval's RESULTS file."""
    from hf_vrl.integrations.llava_eval import logged_samples

    if column.source is not None:
        records = [sample.get(column.metrics[0]) for sample in logged_samples(results, column.task)]
        hits = [
            bool(r["is_correct"]) for r in records if isinstance(r, dict) and r.get("source") == column.source
        ]
        if not hits:
            raise UserError(f"{label}: lmms-eval logged no {column.task} samples from {column.source}")
        return column.scale * statistics.mean(hits)
    metrics = report["tasks"].get(column.task, {})
    missing = [m for m in column.metrics if not isinstance(metrics.get(m), (int, float))]
    if missing:
        found = sorted(m for m in metrics if "_stderr" not in m)
        raise UserError(f"{label}: lmms-eval gave {column.task} no {'/'.join(missing)} (it gave {found})")
    return column.scale * statistics.mean(metrics[m] for m in column.metrics)


def llava_table(
    columns: Mapping[str, LmmsColumn],
    models: Mapping[str, str],
    output: str | Path,
    *,
    include_path: str | None = None,
    limit: int | None = None,
    device: str | None = None,
    dtype: str = "auto",
) -> dict[str, dict[str, float]]:
    """{label: {column: value}}: each LLaVA folder of `models` ({label: path}) scored by `hf-vrl llava-eval`
    on the tasks of `columns` in one lmms-eval run, into OUTPUT/<label>/."""
    from hf_vrl.integrations import llava_eval

    tasks = ",".join(dict.fromkeys(column.task for column in columns.values()))
    measured = {}
    for label, path in models.items():
        folder = Path(output) / (re.sub(r"[^\w.-]+", "-", label).strip("-") or "model")
        argv = [path, "--tasks", tasks, "--output-dir", str(folder), "--dtype", dtype]
        for flag, value in (("--include-path", include_path), ("--limit", limit), ("--device", device)):
            argv += [flag, str(value)] if value is not None else []
        llava_eval.main(argv)
        report = json.loads((folder / llava_eval.RESULTS_FILE).read_text())
        results = folder / report["lmms_eval_results"]
        measured[label] = {name: _column_value(c, report, results, label) for name, c in columns.items()}
    return measured


def llava_table_command(
    args: Any,
    lmms: Mapping[str, LmmsColumn],
    paper: Mapping[str, Sequence[float | None]],
    heading: str,
    *,
    default_dir: str,
    digits: int = 1,
) -> dict[str, dict[str, float]]:
    """A reproduce script's LLaVA table: `args.model` (LABEL=LLAVA_DIR) scored on the columns of `lmms` (table
    order; `paper` rows in it) that `args.sets` names, `args.task` overrides applied, printed "paper /
    measured" under `heading`; returns {label: {column: value}}."""
    if not args.model:
        raise UserError("pass --model [LABEL=]LLAVA_DIR (repeatable): folders from hf-vrl export-llava")
    columns = lmms_columns(lmms, args.task, args.sets)
    models = parse_labelled(args.model, "--model")
    measured = llava_table(
        columns,
        models,
        args.eval_dir or default_dir,
        include_path=args.include_path,
        limit=args.limit,
        device=args.device,
        dtype=args.dtype,
    )
    order = list(lmms)
    rows = {row: [values[order.index(name)] for name in columns] for row, values in paper.items()}
    print(f"\n{heading}; paper / measured")
    print("lmms-eval: " + "; ".join(f"{name} = {column}" for name, column in columns.items()))
    print(paper_comparison(list(columns), rows, measured, digits=digits))
    return measured


def write_measured(output: str | None, record: Mapping[str, Any]) -> int:
    """`--output`: the measured numbers as JSON (nothing without a path); the script's exit status, 0."""
    if output:
        Path(output).write_text(json.dumps(record, indent=2))
        print(f"measured: {output}")
    return 0
