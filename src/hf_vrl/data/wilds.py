"""FMoW and iWildCam as WILDS publishes them (Koh et al. 2021; `p-lambda/wilds`), the data of DiVE's Table 4.

- FMoW (`fmow_v1.1/`): `rgb_metadata.csv` (one row per image, in image-index order: `split`, `category`,
  `country_code`, `timestamp`, ...), `country_code_mapping.csv` (`alpha-3` -> `region`) and
  `images/rgb_img_<row>.png`. WILDS' official splits ("time_after_2016"): OOD test = the original test rows
  from 2016 on, OOD val = the original val rows of 2013-2015, and train / id_val / id_test = the original
  train / val / test rows before 2013; `seq` rows are never used. `region` is WILDS': the country code's
  region, "Other" where the mapping has none (worst-region accuracy leaves "Other" out). An image folder with
  WILDS' metadata saved as `metadata.csv` (a `file_name` column, where it has one, names each image) and the
  mapping beside it reads the same; without the mapping it is refused in one line (no regions).
- iWildCam (`iwildcam_v2.0/`): `metadata.csv` (`split` in train / val / test / id_val / id_test, `filename`,
  `y`, `location_remapped`) and `train/<filename>` (every split's images are in train/).

Labels: FMoW's 62 categories in WILDS' order, iWildCam's 182 `y` with FLYP's English names
(`hf_vrl.data.transfer_classes`). Images listed but absent are left out (the count check sees them).
"""

from __future__ import annotations

import csv
from datetime import UTC, datetime
from pathlib import Path

from datasets import Dataset, Value

from hf_vrl.errors import UserError

from .benchmarks import Benchmark
from .readers import Layout, folder_with, lazy_dataset

FMOW_METADATA = ("rgb_metadata.csv", "metadata.csv")  # WILDS' name, then an image folder's
FMOW_COLUMNS = {"split", "category", "country_code", "timestamp"}
REGION_MAPPING = "country_code_mapping.csv"
OOD_TEST_FROM, OOD_VAL_FROM = 2016, 2013  # WILDS' "time_after_2016" and its three years before
OTHER_REGION = "Other"


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _utc(timestamp: str) -> datetime:
    moment = datetime.fromisoformat(timestamp.strip())
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def fmow_split(row: dict[str, str]) -> str | None:
    """WILDS' official split of an FMoW metadata row (None: in none of them)."""
    when = _utc(row["timestamp"])
    ood_test = when >= datetime(OOD_TEST_FROM, 1, 1, tzinfo=UTC)
    ood_val = not ood_test and when >= datetime(OOD_VAL_FROM, 1, 1, tzinfo=UTC)
    original = row["split"]
    if original == "test":
        return "test" if ood_test else None if ood_val else "id_test"
    if original == "val":
        return "val" if ood_val else None if ood_test else "id_val"
    return "train" if original == "train" and not (ood_test or ood_val) else None


def fmow_metadata(folder: Path) -> Path | None:
    """WILDS' FMoW metadata in `folder`: rgb_metadata.csv, or a metadata.csv with its columns."""
    for name in FMOW_METADATA:
        path = folder / name
        if path.is_file():
            with path.open(newline="", encoding="utf-8") as f:
                if FMOW_COLUMNS <= set(next(csv.reader(f), [])):
                    return path
    return None


def _find_fmow(root: Path) -> Path | None:
    return next((base for base in (root, root / "fmow_v1.1") if fmow_metadata(base) is not None), None)


def load_fmow(root: Path, split: str, benchmark: Benchmark) -> Dataset:
    """FMoW's WILDS `split` (train, id_val, id_test, val, test) with its `region` column."""
    metadata = fmow_metadata(root)
    if not (root / REGION_MAPPING).is_file():
        raise UserError(
            f"FMoW at {root}: {metadata.name} needs WILDS' {REGION_MAPPING} beside it (country code -> "
            "region; it ships in fmow_v1.1/)"
        )
    regions = {row["alpha-3"]: row["region"] for row in _rows(root / REGION_MAPPING)}
    names = list(benchmark.class_names)
    index = {name: i for i, name in enumerate(names)}
    paths, labels, region = [], [], []
    for number, row in enumerate(_rows(metadata)):
        if fmow_split(row) != split:
            continue
        if row["category"] not in index:
            raise UserError(f"{metadata} row {number}: {row['category']!r} is not an FMoW category")
        path = root / (row.get("file_name") or f"images/rgb_img_{number}.png")
        if path.is_file():
            paths.append(path)
            labels.append(index[row["category"]])
            region.append(regions.get(row["country_code"], OTHER_REGION))
    return lazy_dataset(
        paths, labels, names, columns={"region": region}, features={"region": Value("string")}
    )


def load_iwildcam(root: Path, split: str, benchmark: Benchmark) -> Dataset:
    """iWildCam's WILDS `split` (train, id_val, id_test, val, test) with its camera `location` column."""
    names = list(benchmark.class_names)
    paths, labels, location = [], [], []
    for row in _rows(root / "metadata.csv"):
        if row["split"] != split:
            continue
        label = int(row["y"])
        if not 0 <= label < len(names):
            raise UserError(f"{root}/metadata.csv: y = {label} is outside iWildCam's {len(names)} classes")
        path = root / "train" / row["filename"]
        if path.is_file():
            paths.append(path)
            labels.append(label)
            location.append(row.get("location_remapped", ""))
    columns, features = {"location": location}, {"location": Value("string")}
    return lazy_dataset(
        paths, labels, names, columns=columns, features=features, caption_names=benchmark.prompt_names
    )


LAYOUTS = (
    Layout(
        "wilds-fmow",
        "WILDS' fmow_v1.1/ (rgb_metadata.csv, country_code_mapping.csv, images/rgb_img_<i>.png)",
        _find_fmow,
        load_fmow,
    ),
    Layout(
        "wilds-iwildcam",
        "WILDS' iwildcam_v2.0/ (metadata.csv, train/<filename>)",
        lambda root: folder_with(root, ("metadata.csv",), "iwildcam_v2.0"),
        load_iwildcam,
    ),
)
