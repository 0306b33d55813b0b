"""How a card names the data of a run: a Hub dataset id where the data is one (card metadata `datasets`,
`model-index` dataset types), else a readable name. Local paths never reach a card."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf_vrl.data.hub import HF_URL_PREFIX, is_hub_spec, parse_hub_spec

__all__ = [
    "DataName",
    "describe_dataset",
    "describe_mmvp",
    "is_hub_id",
    "is_local",
    "public_path",
    "without_paths",
]


@dataclass(frozen=True)
class DataName:
    """`type`: what `model-index` records (the Hub id, else a short name); `name`: what a reader sees."""

    type: str
    name: str
    hub_id: str | None = None


# hf_vrl's registry names (hf_vrl.data.registry) and the prefixes of local data
_NAMED = {
    "shapes": DataName("shapes", "hf_vrl's generated shapes world"),
    "fashion_mnist": DataName(
        "zalando-datasets/fashion_mnist", "Fashion-MNIST", "zalando-datasets/fashion_mnist"
    ),
    "animal_mnist": DataName("animal_mnist", "Animal-MNIST"),
    "digits": DataName("digits", "scikit-learn digits"),
}
_PREFIXES = {
    "webdataset": DataName("webdataset", "image-caption shards (webdataset)"),
    "parquet": DataName("parquet", "an image-caption table (parquet)"),
    "csv": DataName("csv", "an image-caption table (CSV)"),
    "imagefolder": DataName("imagefolder", "an image folder"),
}
_CAPTION_SETS = {"cc3m": "CC3M", "cc12m": "CC12M"}


def is_hub_id(name: str) -> bool:
    """Whether `name` reads as a Hub repo id ("owner/name" that `huggingface_hub.utils.validate_repo_id`
    accepts), not a path."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return "/" in name


def describe_dataset(spec: str | None) -> DataName | None:
    """The card's name for a `--dataset` / `--eval-dataset` value (None for none)."""
    if not spec:
        return None
    if spec in _NAMED:
        return _NAMED[spec]
    prefix, _, target = spec.partition(":")
    if (prefix == "hf" or spec.startswith(HF_URL_PREFIX)) and is_hub_spec(spec):
        repo = parse_hub_spec(spec).repo_id  # hf:<id>[@<revision>][/<path>], hf://datasets/<id>/...
        if is_hub_id(repo):
            return DataName(repo, repo, repo)
    if prefix in _benchmarks():
        return DataName(prefix, f"{_benchmarks()[prefix].title} (a local copy)")
    named = _PREFIXES.get(prefix, DataName("local", "local data"))
    known = [label for key, label in _CAPTION_SETS.items() if re.search(rf"\b{key}\b", spec.lower())]
    return DataName(named.type, f"{known[0]} ({named.name})", None) if known else named


def _benchmarks() -> dict:
    """The registry of the papers' benchmarks (`hf_vrl.data.benchmarks`): `<key>:<folder>` names one read
    from its published layout; a local copy has no Hub id, so it names the card's table only."""
    from hf_vrl.data.benchmarks import BENCHMARKS

    return BENCHMARKS


def describe_mmvp(setting: str | None) -> DataName | None:
    """The MMVP pairs a run scored: the toy world's, or the official MMVP-VLM benchmark."""
    if not setting:
        return None
    if setting == "toy":
        return DataName("shapes-mmvp", "MMVP-style pairs of hf_vrl's shapes world")
    return DataName("MMVP/MMVP_VLM", "MMVP-VLM", "MMVP/MMVP_VLM")


def is_local(value: str) -> bool:
    """A path on this machine rather than a Hub id or a preset name."""
    if os.path.isabs(value) or value.startswith(("~", "./", "../")):
        return True
    return "/" in value and (not is_hub_id(value) or Path(value).exists())


def public_path(value: str) -> str:
    """`value` with a local path ("/home/me/data", "webdataset:/data/x") shortened to its last part: local
    paths mean nothing on the Hub and may name the user's folders."""
    prefix, target = re.match(r"^([a-z]+:(?!//))?(.*)$", value, re.S).groups()
    return f"{prefix or ''}…/{Path(target).name}" if is_local(target) else value


def without_paths(value: Any) -> Any:
    """A JSON value (a run's config.json / report.json) with every local path shortened (`public_path`)."""
    if isinstance(value, str):
        return public_path(value)
    if isinstance(value, dict):
        return {key: without_paths(v) for key, v in value.items()}
    if isinstance(value, list):
        return [without_paths(v) for v in value]
    return value
