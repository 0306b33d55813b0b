"""What `hf-vrl eval` and the reproduce scripts score, loaded: the model and its processors
(`load_model_and_processors`), the data (`load_eval_dataset`; a benchmark counted against its official
numbers, `load_counted_dataset`), a clip_benchmark mirror's own prompts (`mirror_prompts`), and the record of
the data a report's numbers were measured on (`data_record`). The metric suite is `hf_vrl.evaluation`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import datasets

from hf_vrl.data.benchmarks import BENCHMARKS, FINE_LEVELS, benchmark_of_repo, check_counts
from hf_vrl.data.clip_benchmark import read_mirror
from hf_vrl.data.hub import is_hub_spec, parse_hub_spec
from hf_vrl.data.layouts import load_benchmark, published_benchmark, subset
from hf_vrl.data.processors import load_image_processor
from hf_vrl.data.readers import SourceFiles
from hf_vrl.data.registry import (
    LEVEL_PREFIXES,
    how_drawn,
    load_dataset_by_name,
    mirror_source,
    parse_name,
    text_source,
)
from hf_vrl.errors import UserError
from hf_vrl.evaluation import DEFAULT_TASKS, LABEL_TASKS, check_image_model, has_text_tower

EXAMPLE = "hf-vrl eval --model runs/demo/clip/final --dataset fashion_mnist --output-dir runs/eval"


def resolve_model_path(name: str) -> str:
    """A local path or hub id as given; a name of a folder in `hub_configs/` (e.g. tiny-clip) maps there."""
    if Path(name).exists():
        return name
    from hf_vrl.presets import HUB_CONFIGS

    preset = HUB_CONFIGS / name
    return str(preset) if preset.is_dir() else name


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def load_model_and_processors(name: str, *, trust_remote_code: bool = False) -> tuple[Any, Any, Any]:
    """(model, image_processor, tokenizer) from a local dir or hub id; tokenizer is None for vision towers.
    hf_vrl's own model types (DiffCLIP, DCR) load with the installed classes, without remote code. A model
    that cannot be loaded, lacks a tensor, or embeds no images, raises a one-line UserError."""
    from transformers import AutoModel, AutoProcessor, AutoTokenizer, ImageProcessingMixin

    import hf_vrl.models  # noqa: F401  (registers hf_vrl's classes with the Auto classes)
    from hf_vrl.weights import load_pretrained

    path = resolve_model_path(name)
    try:  # a tensor the folder lacks is refused (never evaluated at random); a head's extra ones are dropped
        model = load_pretrained(AutoModel, path, extra_allowed=True, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as error:
        raise UserError(
            f"cannot load a model from {name!r}: {_first_line(error)}. Pass a folder written by "
            f"save_pretrained (weights included), e.g. the demo's: {EXAMPLE}"
        ) from error
    check_image_model(model)
    try:
        processor = AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError):
        processor = None
    image_processor = getattr(processor, "image_processor", None)
    if image_processor is None and isinstance(processor, ImageProcessingMixin):
        image_processor = processor
    try:
        if image_processor is None:
            image_processor = load_image_processor(path, trust_remote_code=trust_remote_code)
        tokenizer = getattr(processor, "tokenizer", None)
        if tokenizer is None and has_text_tower(model):
            tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as error:
        raise UserError(
            f"{name!r} has the model but not its processors ({_first_line(error)}): save the image processor "
            "(and, for a text tower, the tokenizer) into the model folder with save_pretrained"
        ) from error
    return model, image_processor, tokenizer


def data_record(
    name: str | None,
    split: str | None,
    dataset: Any,
    *,
    limit: int | None = None,
    seed: int | None = None,
    classes: Sequence[str] | None = None,
    labels: str | None = None,
    transform: str | None = None,
) -> dict[str, Any]:
    """What a report section records of the data its numbers were measured on (`"data"`; the model-index of
    a run's card is read from it, `hf_vrl.hub.results`): the data as the run named it (a registry name,
    `hf:<id>`, a path), its split and the samples scored, how these were drawn (`drawn`,
    `hf_vrl.data.registry.how_drawn`: generated from `seed`, the whole split, the first `limit` rows of a
    stream, or a seeded random subset of `limit`), where the captions come from when hf_vrl wrote them
    (`texts`), the `classes` kept, the label column scored when not `label`, a `transform` applied to the
    images (DiVE's shifts)."""
    n_samples = len(dataset) if hasattr(dataset, "__len__") else None
    drawn = how_drawn(name, None if classes else n_samples, limit)  # classes kept after the draw
    record = {
        "dataset": name,
        "split": split,
        "n_samples": n_samples,
        "drawn": drawn,
        "limit": limit,
        "seed": seed if drawn in ("generated", "seeded subset") else None,
        "texts": text_source(name, dataset),
        "classes": list(classes) if classes else None,
        "labels": labels if labels != "label" else None,
        "transform": transform,
    }
    return {key: value for key, value in record.items() if value is not None}


def load_eval_dataset(
    name: str,
    *,
    split: str,
    limit: int | None = None,
    image_size: int | None = None,
    seed: int = 0,
    sample_filter: Any = None,
):
    """A map-style dataset from the `hf_vrl.data` registry (imported here: the metrics stay independent of
    it); a benchmark (`<key>:<where>`, a registered Hub mirror, a publisher's annotated folder) is read as
    that benchmark (`load_counted_dataset`, counts not checked). Streamed sources (webdataset, parquet,
    csv) are materialised, which needs a `limit`. A dataset that cannot be loaded raises a UserError saying
    why.
    `sample_filter` (`hf_vrl.data.images.SampleFilter`) counts the images skipped as unusable."""
    if _benchmark_source(name) is not None:
        return load_counted_dataset(name, split=split, allow_partial=True, limit=limit, seed=seed)[0]
    try:
        filtered = {"sample_filter": sample_filter} if sample_filter is not None else {}
        ds = load_dataset_by_name(
            name, split=split, limit=limit, image_size=image_size, seed=seed, **filtered
        )
    except (FileNotFoundError, ImportError, ValueError) as error:
        raise UserError(f"cannot load the {split} split of dataset {name!r}: {error}") from error
    if isinstance(ds, datasets.IterableDataset):
        if limit is None:
            raise UserError(f"{name!r} streams; pass --limit to evaluate a fixed number of its samples")
        ds = datasets.Dataset.from_list(list(ds), features=ds.features)
    return ds


def task_level(key: str, tasks: Sequence[str] | None) -> str | None:
    """The label level FGVC-Aircraft / Stanford Cars are scored at for `tasks`: the fine one (100 variants,
    196 models: `hf_vrl.data.benchmarks.FINE_LEVELS`) for every task but CLUE's granularity, which reads the
    coarse one in `label` and the fine one in `fine_label` (None: that reading), whatever key names the
    data."""
    if key not in FINE_LEVELS:
        return None
    scored = set(tasks or DEFAULT_TASKS) & set(LABEL_TASKS)
    if scored == {"granularity"}:
        return None
    if "granularity" in scored:
        raise UserError(
            f"{key}: granularity scores the coarse level and {', '.join(sorted(scored - {'granularity'}))} "
            f"the fine one ({FINE_LEVELS[key]}): run granularity on its own"
        )
    return FINE_LEVELS[key]


def _benchmark_source(name: str) -> tuple[str, str] | None:
    """(benchmark key, where it is) of a registry name that names a scored benchmark: by its key
    (`<key>:<where>`, `fgvc_aircraft:` / `stanford_cars:` too), as a registered Hub mirror
    (`hf:clip-benchmark/wds_cars`: the repo id, exactly), or as a folder holding a publisher's annotated
    layout (which the registry reads as that benchmark); None for a user's own data, whatever its path is
    named, and for training corpora."""
    prefix, target = parse_name(name)
    if prefix in LEVEL_PREFIXES or prefix in BENCHMARKS:
        key = LEVEL_PREFIXES.get(prefix, (prefix,))[0]
    elif prefix == "hf" and is_hub_spec(name):
        benchmark = benchmark_of_repo(parse_hub_spec(name).repo_id)
        key, target = (benchmark.key if benchmark else None), name
    elif prefix in ("imagefolder", "") and Path(target).expanduser().is_dir():
        key = published_benchmark(Path(target).expanduser())
    else:
        key = None
    if key is None or BENCHMARKS[key].task not in ("classification", "retrieval"):
        return None
    return key, target


def load_counted_dataset(
    name: str,
    *,
    split: str,
    allow_partial: bool = False,
    limit: int | None = None,
    image_size: int | None = None,
    seed: int = 0,
    tasks: Sequence[str] | None = None,
    sample_filter: Any = None,
) -> tuple[Any, dict[str, Any] | None]:
    """(dataset, counts record) of `split`: a benchmark of `hf_vrl.data.benchmarks` (`_benchmark_source`) is
    read from its published layout or Hub mirror and its images and classes checked against the official
    counts (a mirror's: its own) before anything is scored: a partial copy is refused in one line unless
    `allow_partial`, and the record (`Counts.as_dict`, plus `limit`) says what was there and, for a mirror,
    which and where it differs from the registry's reading. FGVC-Aircraft and Stanford Cars are labelled at
    the level `tasks` score (`task_level`). A user's own data loads as `load_eval_dataset` does; in
    clip_benchmark's layout it is counted too (images, captions), against no official numbers.
    `sample_filter` counts a user's data's skipped images."""
    found = _benchmark_source(name)
    if found is None:
        data = {"image_size": image_size, "seed": seed, "sample_filter": sample_filter}
        dataset = load_eval_dataset(name, split=split, limit=limit, **data)
        return dataset, _own_counts(name, dataset)
    key, source = found
    dataset, counts = load_benchmark(key, source, split, level=task_level(key, tasks))
    check_counts(counts, name, allow_partial=allow_partial)
    record = counts.as_dict() | ({"limit": limit} if limit is not None else {})
    return subset(dataset, limit, seed), record


def _own_counts(name: str, dataset: Any) -> dict[str, Any] | None:
    """What a user's clip_benchmark-layout data held (images; captions for a caption set), None for others."""
    if mirror_source(name) is None:
        return None
    record = {"images": len(dataset), "source": mirror_source(name)[0]}
    if "label" not in dataset.column_names:
        record["texts"] = sum(len(c) for c in dataset["caption"][:])
    described = f"{record['images']:,} images" + (
        f", {record['texts']:,} captions" if "texts" in record else ""
    )
    return record | {"complete": True, "described": described}


def mirror_prompts(name: str | None) -> Any:
    """The class names and templates of the clip_benchmark layout `name` reads (`WdsMirror`), None for other
    data: a mirror is scored with its own (its classnames.txt and zeroshot_classification_templates.txt)."""
    found = mirror_source(name) if name else None
    return None if found is None else read_mirror(SourceFiles.of(found[0]))
