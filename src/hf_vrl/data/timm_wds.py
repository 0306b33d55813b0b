"""ImageNet as timm publishes it on the Hub (`timm/imagenet-1k-wds`), from the repo or a folder of its
files: `imagenet1k-train-NNNN.tar` and `imagenet1k-validation-NNNN.tar` side by side, members `<key>.jpg`,
`<key>.cls` (the class index in ImageNet's standard order: the sorted WordNet ids, the registry's label order)
and `<key>.json`. A split reads only its own shards (train and validation never mix)."""

from __future__ import annotations

import re
from pathlib import Path

from datasets import ClassLabel, Dataset, Features, Value

from hf_vrl.errors import UserError

from .benchmarks import Benchmark
from .prompts import captions_for_labels
from .readers import Layout, ReadTarMember, SourceFiles, prompt_names, tar_samples
from .schema import CAPTION, IMAGE, LABEL

__all__ = ["LAYOUT", "find_timm_wds", "load_timm_wds"]

SHARD = re.compile(r"imagenet1k-(train|validation)-\d+\.tar")


def find_timm_wds(root: Path) -> Path | None:
    """`root` when it holds timm's `imagenet1k-<split>-NNNN.tar` shards, else None."""
    return (
        root
        if root.is_dir() and any(SHARD.fullmatch(p.name) for p in root.glob("imagenet1k-*.tar"))
        else None
    )


def load_timm_wds(source: Path | str, split: str, benchmark: Benchmark) -> Dataset:
    """Split `split` ("train" or "validation") of timm's ImageNet shards at `source` (a folder or
    `hf:timm/imagenet-1k-wds`), labelled in the benchmark's official classes by each `.cls` index."""
    files = SourceFiles.of(source)
    shards = sorted(n for n in files.names if (m := SHARD.fullmatch(n)) and m.group(1) == split)
    if not shards:
        raise UserError(f"{files.where} has no imagenet1k-{split}-*.tar shards (timm/imagenet-1k-wds)")
    samples = [s for name in shards for s in tar_samples(files.fetch(name), "classification")]
    samples = [s for s in samples if s.image and s.label is not None]
    names = list(benchmark.class_names)
    labels = [s.label for s in samples]
    rows = {
        IMAGE: [{"path": s.image[0], "offset": s.image[1], "size": s.image[2]} for s in samples],
        "key": [s.key for s in samples],
        LABEL: labels,
        CAPTION: captions_for_labels(labels, prompt_names(benchmark), 0),
    }
    where = Features({"path": Value("string"), "offset": Value("int64"), "size": Value("int64")})
    features = {
        IMAGE: where,
        "key": Value("string"),
        LABEL: ClassLabel(names=names),
        CAPTION: Value("string"),
    }
    return Dataset.from_dict(rows, features=Features(features)).with_transform(ReadTarMember())


LAYOUT = Layout(
    "timm-wds",
    "timm's webdataset (hf:timm/imagenet-1k-wds or its folder): imagenet1k-{train,validation}-NNNN.tar with "
    ".jpg and .cls (ImageNet's class index) members",
    find_timm_wds,
    load_timm_wds,
)
