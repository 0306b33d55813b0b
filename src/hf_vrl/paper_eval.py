"""Given models on a paper's benchmarks, the paper's numbers beside the measured ones: the part that
`examples/reproduce_dcr.py` and `examples/reproduce_diffclip.py` share (and, for its data checks and marks,
`examples/reproduce_dive.py`).

A benchmark is one of `hf_vrl.data.benchmarks` (its key): `--source KEY=NAME[@SPLIT]` names it (a folder in
one of its published layouts, `hf:<Hub id>`, `imagefolder:<dir>`), else `<data-root>/<KEY>/` holds it in one
of its layouts (`layouts_help` lists them; each script's --help prints its own), else (no --data-root) its
Hub mirror is read (`hf:clip-benchmark/wds_<name>`: online from the Hub, offline from the local Hub cache),
scored with the mirror's own class names and templates and noted beside the table. Every set a table needs is
loaded and counted against the official numbers before the first model is loaded (`TableData`): a partial
copy is refused in one line, or, with --allow-partial, scored and marked beside the table with its counts.
FGVC-Aircraft and Stanford Cars are scored at their fine level (100 variants, 196 models), as the papers do.
Models are `LABEL=PATH` or `PATH`: any CLIP-like folder or Hub id `hf-vrl eval` loads, loaded only when a cell
needs them (`LazyModels`); a DCRModel export gets its text side from `--text-model` (DCR's P-ability setting:
the enhanced image tower against the original text tower). Each table cell is kept in `<output-dir>/cells/`
(`CellCache`) keyed by what made it (the model's contents, the data, the protocol, the settings), so an
interrupted run resumes where it stopped and a model re-saved in place is scored again.

LLaVA tables (DCR's and DiffCLIP's Table 3) score `hf-vrl export-llava` / `llava-align` folders with
lmms-eval (`hf_vrl.integrations.llava_eval`): each column is an `LmmsColumn` (a task's metric), and
`--task COLUMN=TASK[:METRIC]` points one at another task (e.g. a YAML of your own in `--include-path`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import statistics
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from hf_vrl.data.benchmarks import FINE_LEVELS
from hf_vrl.errors import UserError, explain
from hf_vrl.metrics.mmvp import MMVP_CATEGORIES

__all__ = [
    "FINE_LEVELS",
    "PARTIAL",
    "CellCache",
    "FileDigests",
    "LazyModels",
    "LmmsColumn",
    "MMVP_SHORT_NAMES",
    "TableCells",
    "TableData",
    "add_llava_arguments",
    "add_model_and_data_arguments",
    "data_help",
    "few_shot_episodes",
    "hub_mirror",
    "mirror_notes",
    "llava_table",
    "llava_table_command",
    "lmms_columns",
    "load_model",
    "main_with_user_errors",
    "mmvp_row",
    "paper_comparison",
    "parse_labelled",
    "percent",
    "ran_header",
    "write_measured",
]

PARTIAL = "†"  # the mark of a cell measured on a partial copy or a --limit subset


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


def percent(scores: Mapping[str, Any], metric: str) -> float | None:
    """`scores[metric]` (a fraction) in percent; None where it was not reported (R@5 of fewer than 5
    images: the cell's `not_reported` says so)."""
    value = scores.get(metric)
    return None if value is None else 100 * value


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


def data_help(keys: Sequence[str], lead: str | None = None, only: Sequence[str] | None = None) -> str:
    """The --help paragraph on data: where each benchmark of `keys` goes (`lead`, default: a folder per key
    under --data-root, or --source) and the layouts it is read from (those in `only`, where given)."""
    from hf_vrl.data.layouts import layouts_help

    lead = lead or (
        "--data-root DIR holds one folder per benchmark, named by its key (or --source KEY=PATH|hf:<id>"
        "[@SPLIT] points at one), in one of its published layouts; without either, its Hub mirror is read:"
    )
    return f"{lead}\n{layouts_help(keys, only)}"


def _source(key: str, data_root: str | Path | None, sources: Mapping[str, str]) -> tuple[str, str | None]:
    """(where benchmark `key` is, the split --source asks for or None)."""
    if key in sources:
        name, at, given = sources[key].rpartition("@")
        return (name, given) if at and "/" not in given else (sources[key], None)
    if data_root is None:
        return _hub_mirror(key), None
    folder = Path(data_root) / key
    if not folder.is_dir():
        from hf_vrl.data.benchmarks import BENCHMARKS
        from hf_vrl.data.layouts import expected

        raise UserError(f"{folder} is missing: put {key} there as {expected(BENCHMARKS[key])}")
    return str(folder), None


_SHARD_LAYOUTS = ("timm-wds", "webdataset")  # read without a gated login (ILSVRC/imagenet-1k asks for one)


def hub_mirror(key: str, split: str | None = None) -> str | None:
    """`hf:<repo>` of benchmark `key`'s Hub mirror that holds `split` (any split when None): clip_benchmark's
    first, then shard mirrors (timm's ImageNet), then the others; None when none does (the set needs
    --data-root). A training corpus's mirror (CC3M's shards) streams through the registry."""
    from hf_vrl.data.benchmarks import BENCHMARKS, CLIP_BENCHMARK_LAYOUT

    benchmark = BENCHMARKS[key]
    official = benchmark.split(split) if split is not None else None
    found = [
        m
        for m in benchmark.mirrors
        if (m.layout in benchmark.layouts or benchmark.task == "image-text")
        and (official is None or m.split(official) in m.splits)
    ]
    found.sort(key=lambda m: (m.layout != CLIP_BENCHMARK_LAYOUT, m.layout not in _SHARD_LAYOUTS))
    return f"hf:{found[0].repo_id}" if found else None


def _hub_mirror(key: str) -> str:
    """`hf:<repo>` of benchmark `key`'s Hub mirror, read when neither --data-root nor --source names it
    (`hub_mirror`; online from the Hub, offline from the local Hub cache)."""
    mirror = hub_mirror(key)
    if mirror is None:
        raise UserError(
            f"no data for {key} (it has no Hub mirror): pass --data-root DIR (with {key}/ in it) or "
            f"--source {key}=PATH"
        )
    return mirror


@dataclass
class TableData:
    """The sets a table scores, each loaded (images read lazily) and counted before any model is loaded:
    `load(key, split)` -> the dataset; `counts` {key/split: record}, the partial ones marked."""

    data_root: str | Path | None
    sources: Mapping[str, str]
    allow_partial: bool = False
    limit: int | None = None
    seed: int = 0
    loaded: dict[tuple[str, str], Any] = field(default_factory=dict)
    counts: dict[str, dict[str, Any]] = field(default_factory=dict)
    mirrors: dict[str, Any] = field(
        default_factory=dict
    )  # key -> its clip_benchmark mirror's names, templates

    def load(self, key: str, split: str = "test", *, limit: int | None = None) -> Any:
        """Benchmark `key`'s `split` (a seeded subset of `limit`, default the table's --limit)."""
        if (key, split) not in self.loaded:
            from hf_vrl.data.benchmarks import BENCHMARKS, check_counts
            from hf_vrl.data.layouts import load_benchmark, subset
            from hf_vrl.eval_inputs import mirror_prompts

            where, asked = _source(key, self.data_root, self.sources)
            dataset, counts = load_benchmark(key, where, asked or split, level=FINE_LEVELS.get(key))
            check_counts(counts, where, allow_partial=self.allow_partial)
            limit = self.limit if limit is None else limit
            record = counts.as_dict() | ({"limit": limit} if limit is not None else {})
            if limit is not None and limit < len(dataset):
                record |= {"complete": False, "described": f"{counts.describe()}, a seeded subset of {limit}"}
            self.counts[f"{key}/{BENCHMARKS[key].split(asked or split)}"] = record
            self.loaded[(key, split)] = subset(dataset, limit, self.seed)
            if counts.source is not None:
                self.mirrors[key] = mirror_prompts(where)
        return self.loaded[(key, split)]

    def mirror(self, key: str) -> Any:
        """The clip_benchmark mirror `key` was read from (its own class names and templates, which zero-shot
        uses: `hf_vrl.evaluation.evaluate_clip`), None for a local layout."""
        return self.mirrors.get(key)

    def mmvp(self) -> Any:
        """MMVP-VLM's pairs (`hf_vrl.metrics.load_mmvp_vlm`), counted like the other sets."""
        if ("mmvp_vlm", "test") not in self.loaded:
            from hf_vrl.data.benchmarks import BENCHMARKS
            from hf_vrl.data.layouts import counts_of
            from hf_vrl.data.readers import local_copy
            from hf_vrl.metrics import load_mmvp_vlm

            where, _ = _source("mmvp_vlm", self.data_root, self.sources)
            pairs = load_mmvp_vlm(local_copy(where), allow_partial=self.allow_partial)
            benchmark = BENCHMARKS["mmvp_vlm"]
            mirror = benchmark.mirror(repo_id=where.removeprefix("hf:"))
            self.counts["mmvp_vlm/test"] = counts_of(pairs, benchmark, "test", mirror).as_dict()
            self.loaded[("mmvp_vlm", "test")] = pairs
        return self.loaded[("mmvp_vlm", "test")]

    def records(self, key: str) -> dict[str, dict[str, Any]]:
        """The counts records of `key`'s loaded splits."""
        return {name: record for name, record in self.counts.items() if name.split("/")[0] == key}

    def partial(self, key: str) -> bool:
        """Whether any split of `key` that was loaded is partial (or a subset)."""
        return any(not record["complete"] for record in self.records(key).values())

    def notes(self) -> list[str]:
        """One line per partial set, and per set scored on a Hub mirror (which, and where it differs from the
        paper's protocol), for beside the table."""
        lines = [
            f"{PARTIAL} {name}: {record['described']} (not the paper's set)"
            for name, record in self.counts.items()
            if not record["complete"]
        ]
        return lines + mirror_notes(self.counts)


def mirror_notes(counts: Mapping[str, Mapping[str, Any] | None]) -> list[str]:
    """One line per set of `counts` ({set: counts record}) scored on a Hub mirror: which, and where it differs
    from the paper's protocol."""
    lines = []
    for name, record in counts.items():
        if record and record.get("source"):
            differs = f"; where it differs: {record['differs']}" if record.get("differs") else ""
            lines.append(f"{name}: scored on the Hub mirror {record['source']}{differs}")
    return lines


class LazyModels(Mapping):
    """{label: (model, image processor, tokenizer)}, each loaded on first use by `loader(path)`, so that a
    table whose cells are all cached loads no model."""

    def __init__(self, paths: Mapping[str, str], loader: Callable[[str], tuple[Any, Any, Any]]) -> None:
        self.paths, self.loader, self._loaded = dict(paths), loader, {}

    def __getitem__(self, label: str) -> tuple[Any, Any, Any]:
        if label not in self._loaded:
            self._loaded[label] = self.loader(self.paths[label])
        return self._loaded[label]

    def __iter__(self) -> Iterator[str]:
        return iter(self.paths)

    def __len__(self) -> int:
        return len(self.paths)


class CellCache:
    """One JSON file per table cell under `<folder>/cells/<table>/<label>/<key>.json`, holding what determined
    it: the model's contents (`model_key`), the data's, the protocol and the settings. A cell is recomputed
    only when missing or made from anything else (a model re-saved in place is scored again; a run that
    stopped resumes at the first missing cell)."""

    def __init__(self, folder: str | Path, table: str) -> None:
        self.folder = Path(folder) / "cells" / _slug(table)
        self.digests = FileDigests(Path(folder) / "cells" / "file-digests.json")

    def _path(self, label: str, key: str) -> Path:
        return self.folder / _slug(label) / f"{_slug(key)}.json"

    def model_key(self, name: str) -> dict[str, str]:
        """What a model `name` (a folder or a Hub id) is, by content: a folder by the SHA-256 of its files
        (README.md and hidden files aside), a Hub id by the commit its snapshot is of."""
        from hf_vrl.eval_inputs import resolve_model_path

        path = Path(resolve_model_path(name))
        if path.is_file():
            return {"name": name, "sha256": self.digests.digest(path)}
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and _model_file(p.relative_to(path)))
            digests = {str(p.relative_to(path)): self.digests.digest(p) for p in files}
            self.digests.save()
            return {"name": name, "sha256": _sha256(json.dumps(digests, sort_keys=True).encode())}
        return {"name": name, "commit": _hub_commit(name)}

    def get(self, label: str, key: str, settings: Mapping[str, Any]) -> dict[str, Any] | None:
        path = self._path(label, key)
        if not path.is_file():
            return None
        cell = json.loads(path.read_text())
        return cell["values"] if cell.get("settings") == json.loads(json.dumps(settings)) else None

    def put(self, label: str, key: str, settings: Mapping[str, Any], values: Mapping[str, Any]) -> None:
        _write_json(self._path(label, key), {"settings": settings, "values": values})

    def cell(
        self, label: str, key: str, settings: Mapping[str, Any], compute: Callable[[], Mapping[str, Any]]
    ) -> dict[str, Any]:
        """The cached values of a cell, or `compute()`'s, kept for next time."""
        cached = self.get(label, key, settings)
        if cached is None:
            cached = dict(compute())
            self.put(label, key, settings, cached)
        return cached


class FileDigests:
    """SHA-256 of files, kept in a JSON file by (path, mtime, size): a file is read again only when it
    changed (a re-saved model), so a resumed table hashes nothing it hashed before."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.known: dict[str, dict[str, Any]] = json.loads(path.read_text()) if path.is_file() else {}

    def digest(self, file: Path) -> str:
        stat = file.stat()
        seen = {"mtime_ns": stat.st_mtime_ns, "size": stat.st_size}
        entry = self.known.get(str(file.resolve()))
        if entry is None or {k: entry[k] for k in seen} != seen:
            digest = hashlib.sha256()
            with file.open("rb") as stream:
                for block in iter(lambda: stream.read(1 << 20), b""):
                    digest.update(block)
            entry = self.known[str(file.resolve())] = seen | {"sha256": digest.hexdigest()}
        return entry["sha256"]

    def save(self) -> None:
        _write_json(self.path, self.known)


def _model_file(relative: Path) -> bool:
    """Whether a file of a model folder determines its outputs (its card and hidden files do not)."""
    return relative.name != "README.md" and not any(part.startswith(".") for part in relative.parts)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _hub_commit(name: str) -> str:
    """The commit of Hub model `name` that loading it reads (the cached one offline)."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(name, allow_patterns=["config.json"])).name
    except Exception as error:  # noqa: BLE001  (any failure to resolve the id is the user's to fix)
        raise UserError(f"model {name!r} is neither a folder nor a Hub model: {explain(error)}") from error


def _write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.tmp")
    staged.write_text(json.dumps(value, indent=2))
    os.replace(staged, path)


@dataclass
class TableCells:
    """What a table's cells need: the models (loaded on first use), the data (loaded and counted), the cell
    cache, the settings every cell records (limit, seeds, ...) and the other models a cell uses (`also`,
    {setting: path}, e.g. DCR's --text-model), recorded by content as the cell's model is."""

    models: LazyModels
    data: TableData
    cache: CellCache
    settings: Mapping[str, Any] = field(default_factory=dict)
    also: Mapping[str, str | None] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)  # {set: what its cells do not report, and why}

    def cell(self, label: str, key: str, compute: Callable, *args: Any) -> dict[str, Any]:
        """Model `label`'s values on set `key`: cached, or `compute((model, processor, tokenizer), *args)`.
        The cell is keyed by the model's and `also`'s contents, the data (counts and the rows' fingerprint),
        the protocol (`compute` and its plain arguments) and the settings."""
        settings = {
            "model": self.cache.model_key(self.models.paths[label]),
            **{name: self.cache.model_key(path) if path else None for name, path in self.also.items()},
            "data": self._data_key(key),
            "protocol": [f"{compute.__module__}.{compute.__qualname__}", *_plain(args)],
            **self.settings,
        }
        values = self.cache.cell(label, key, settings, lambda: compute(self.models[label], *args))
        if "not_reported" in values:
            self.notes[key] = values["not_reported"]
        return values

    def _data_key(self, key: str) -> dict[str, Any]:
        """Set `key`'s counts and the fingerprints of its loaded splits' rows (paths, labels, texts)."""
        rows = {
            split: getattr(dataset, "_fingerprint", None)
            for (name, split), dataset in self.data.loaded.items()
            if name == key
        }
        return {"counts": self.data.records(key), "rows": rows}


def _plain(args: Sequence[Any]) -> list[Any]:
    """The arguments of a cell's computation that name its protocol (a task, a set), as JSON values."""
    return [arg for arg in args if isinstance(arg, str | int | float | bool)]


def _slug(text: str) -> str:
    slug = re.sub(r"[^\w.-]+", "-", text).strip("-") or "cell"
    return slug if len(slug) < 80 else slug[:60] + "-" + hashlib.sha1(text.encode()).hexdigest()[:10]


def ran_header(title: str, lines: Mapping[str, Any]) -> str:
    """What ran, above a table: the title, then "what: value" lines (models, data, settings)."""
    body = [f"  {name}: {value}" for name, value in lines.items() if value not in (None, "", [], {})]
    return "\n".join([title, *body])


def load_model(path: str, text_model: str | None = None, device: str | None = None) -> tuple[Any, Any, Any]:
    """(model, image_processor, tokenizer) of `path`; an image model with `get_image_features` but no text
    tower (a DCRModel) gets `text_model`'s (`hf_vrl.methods.dcr.evaluate.DCREvalModel`)."""
    from hf_vrl.eval_inputs import load_model_and_processors
    from hf_vrl.evaluation import has_text_tower

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
    *,
    marked: Sequence[str] = (),
    differs: str | None = None,
) -> str:
    """The paper's rows beside measured ones, "paper / measured" per cell: one line per paper row (measured
    where a model carries that row's label), then one per other model ("- / measured"); "-" where absent,
    "mean ± std" for (mean, std) pairs. `paper` is {row: values in `columns` order}, `measured` {row: {column:
    value}}. Columns in `marked` (measured on a partial copy or a subset) carry `PARTIAL` after the measured
    value. `differs`: how the measured protocol differs from the paper's; then no measured value stands beside
    a paper one: the paper's rows show "paper / -" and each model its own row "<label> (<differs>)"."""
    from hf_vrl.evaluation import text_table

    def cell(value: Measured, column: str = "") -> str:
        mark = PARTIAL if column in marked and value is not None else ""
        if isinstance(value, tuple):
            return f"{value[0]:.{digits}f} ± {value[1]:.{digits}f}{mark}"
        return "-" if value is None else f"{value:.{digits}f}{mark}"

    if differs is not None:
        measured = {f"{row} ({differs})": values for row, values in measured.items()}
    lines: list[Sequence[str]] = [["", *columns]]
    for row in [*paper, *(name for name in measured if name not in paper)]:
        values = paper.get(row) or [None] * len(columns)
        ours = measured.get(row, {})
        lines.append([row, *(f"{cell(v)} / {cell(ours.get(c), c)}" for c, v in zip(columns, values))])
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
    """The flags the reproduce scripts share: --model (repeatable, [LABEL=]PATH), --data-root, --source,
    --allow-partial, --output-dir (the cell cache)."""
    parser.add_argument(
        "--model",
        action="append",
        required=model_required,
        metavar="[LABEL=]PATH",
        help=f"a model to evaluate (repeatable); LABEL names its row, e.g. {model_example}",
    )
    parser.add_argument(
        "--data-root",
        help="the folder holding one folder per benchmark (layouts above); without it (and --source), each "
        "benchmark's Hub mirror (hf:clip-benchmark/wds_<name>)",
    )
    parser.add_argument(
        "--source",
        action="append",
        metavar="KEY=NAME[@SPLIT]",
        help="where a benchmark is, instead of --data-root (a folder in one of its layouts, hf:<Hub id>)",
    )
    parser.add_argument(
        "--allow-partial",
        action="store_true",
        help=f"score a set that lacks images or classes of the official one; its cells are marked {PARTIAL} "
        "and its counts printed under the table and written to --output",
    )
    parser.add_argument(
        "--output-dir",
        help="where each table cell is kept as it is measured, so that a stopped run resumes "
        "(default: runs/<paper>-table<N>)",
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


GPT_JUDGED_TASKS = ("hallusion_bench_image",)  # lmms-eval grades them with GPT: OPENAI_API_KEY


def check_llava(models: Mapping[str, str], columns: Mapping[str, LmmsColumn]) -> None:
    """Before anything runs: lmms-eval installed, each local model a LLaVA folder, OPENAI_API_KEY set where a
    column's task is graded by GPT. A one-line UserError otherwise."""
    from hf_vrl.integrations.llava_eval import require_lmms_eval

    require_lmms_eval()
    for label, path in models.items():
        if Path(path).exists():
            config = Path(path) / "config.json"
            kind = json.loads(config.read_text()).get("model_type") if config.is_file() else None
            if kind != "llava":
                raise UserError(
                    f"--model {label}={path} is {f'a {kind!r} folder' if kind else 'no model folder'}, not a "
                    "LLaVA: the LLaVA tables score folders from hf-vrl export-llava / llava-align"
                )
    judged = sorted({column.task for column in columns.values() if column.task in GPT_JUDGED_TASKS})
    if judged and not os.environ.get("OPENAI_API_KEY"):
        raise UserError(
            f"{', '.join(judged)} is graded by GPT through lmms-eval: set OPENAI_API_KEY, or leave its "
            "column out with --sets"
        )


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
    into OUTPUT/<label>/, in one lmms-eval run on the tasks of the columns not yet in OUTPUT's cell cache
    (`CellCache`: a stopped table resumes at its missing cells)."""
    from hf_vrl.integrations import llava_eval

    cache = CellCache(output, "llava")
    measured = {}
    for label, path in models.items():
        model = cache.model_key(path)
        settings = {
            n: {"model": model, "column": str(c), "limit": limit, "include_path": include_path}
            for n, c in columns.items()
        }
        row = {name: cache.get(label, name, settings[name]) for name in columns}
        missing = {name: column for name, column in columns.items() if row[name] is None}
        if missing:
            folder = Path(output) / _slug(label)
            tasks = ",".join(dict.fromkeys(column.task for column in missing.values()))
            argv = [path, "--tasks", tasks, "--output-dir", str(folder), "--dtype", dtype]
            for flag, value in (("--include-path", include_path), ("--limit", limit), ("--device", device)):
                argv += [flag, str(value)] if value is not None else []
            llava_eval.main(argv)
            report = json.loads((folder / llava_eval.RESULTS_FILE).read_text())
            results = folder / report["lmms_eval_results"]
            for name, column in missing.items():
                row[name] = {"value": _column_value(column, report, results, label)}
                cache.put(label, name, settings[name], row[name])
        measured[label] = {name: cell["value"] for name, cell in row.items()}
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
    measured" under `heading` (a column pointed at another task, or --limit, is the paper's no more: its
    models get rows of their own); returns {label: {column: value}}. Everything is checked first
    (`check_llava`)."""
    if not args.model:
        raise UserError("pass --model [LABEL=]LLAVA_DIR (repeatable): folders from hf-vrl export-llava")
    columns = lmms_columns(lmms, args.task, args.sets)
    models = parse_labelled(args.model, "--model")
    check_llava(models, columns)
    output = args.output_dir or args.eval_dir or default_dir
    measured = llava_table(
        columns,
        models,
        output,
        include_path=args.include_path,
        limit=args.limit,
        device=args.device,
        dtype=args.dtype,
    )
    order = list(lmms)
    rows = {row: [values[order.index(name)] for name in columns] for row, values in paper.items()}
    changed = [name for name, column in columns.items() if column != lmms[name]]
    differs = "; ".join(
        part
        for part in (
            f"{', '.join(changed)} from other tasks" if changed else "",
            f"first {args.limit} samples of each task" if args.limit else "",
        )
        if part
    )
    print(ran_header(f"\n{heading}; paper / measured", {"models": models, "cells": f"{output}/cells/llava"}))
    print("lmms-eval: " + "; ".join(f"{name} = {column}" for name, column in columns.items()))
    print(paper_comparison(list(columns), rows, measured, digits=digits, differs=differs or None))
    return measured


def write_measured(output: str | None, record: Mapping[str, Any], data: TableData | None = None) -> int:
    """`--output`: the measured numbers as JSON, with the counts of the sets they come from (nothing without
    a path); the script's exit status, 0."""
    if output:
        counts = {"counts": data.counts} if data is not None and data.counts else {}
        Path(output).write_text(json.dumps({**record, **counts}, indent=2))
        print(f"measured: {output}")
    return 0
