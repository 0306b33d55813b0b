"""FGVC-Aircraft and Stanford Cars with their label hierarchies (`hf_vrl.data.fine_grained`), on generated
data written in the official layouts; the granularity metrics run on the coarse and fine levels they give."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
from PIL import Image

from hf_vrl import metrics
from hf_vrl.data.benchmarks import BENCHMARKS
from hf_vrl.data.fine_grained import (
    car_make,
    find_aircraft_root,
    load_fgvc_aircraft,
    load_stanford_cars,
    with_hierarchy,
)
from hf_vrl.data.registry import load_dataset_by_name
from hf_vrl.data.schema import validate_row

# (variant, family, manufacturer) as in the archive's variants / families / manufacturers
AIRCRAFT = [
    ("707-320", "Boeing 707", "Boeing"),
    ("727-200", "Boeing 727", "Boeing"),
    ("737-200", "Boeing 737", "Boeing"),
    ("737-300", "Boeing 737", "Boeing"),
    ("A300B4", "A300", "Airbus"),
    ("A310", "A310", "Airbus"),
]
CARS = [
    "AM General Hummer SUV 2000",
    "Aston Martin V8 Vantage Coupe 2012",
    "Audi R8 Coupe 2012",
    "Audi TT RS Coupe 2012",
]


def _image(seed: int) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (20, 24, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


@pytest.fixture
def aircraft_root(tmp_path):
    """fgvc-aircraft-2013b/data with 2 images per variant and split (ids 7-digit, names with spaces)."""
    base = tmp_path / "fgvc-aircraft-2013b" / "data"
    (base / "images").mkdir(parents=True)
    for level, column in (("variants", 0), ("families", 1), ("manufacturers", 2)):
        names = list(dict.fromkeys(row[column] for row in AIRCRAFT))
        (base / f"{level}.txt").write_text("\n".join(names) + "\n")
    image_id = 1000000
    for split in ("train", "val", "test"):
        lines = {level: [] for level in ("variant", "family", "manufacturer")}
        for row in AIRCRAFT:
            for _ in range(2 if split != "val" else 1):
                image_id += 1
                _image(image_id).save(base / "images" / f"{image_id}.jpg")
                for level, name in zip(lines, row):
                    lines[level].append(f"{image_id} {name}")
        for level, rows in lines.items():
            (base / f"images_{level}_{split}.txt").write_text("\n".join(rows) + "\n")
    for level in ("variant", "family", "manufacturer"):  # the archive's trainval files: train + val
        parts = [(base / f"images_{level}_{split}.txt").read_text() for split in ("train", "val")]
        (base / f"images_{level}_trainval.txt").write_text("".join(parts))
    return tmp_path


@pytest.fixture
def cars_root(tmp_path):
    root = tmp_path / "stanford_cars"
    for s, split in enumerate(("train", "test")):
        for c, name in enumerate(CARS):
            (root / split / name).mkdir(parents=True)
            for i in range(3):
                _image(100 * s + 10 * c + i).save(root / split / name / f"{i:05d}.jpg")
    return root


def test_aircraft_keeps_variant_family_and_manufacturer(aircraft_root):
    assert find_aircraft_root(aircraft_root).name == "data"
    train, test = load_fgvc_aircraft(aircraft_root, "train"), load_fgvc_aircraft(aircraft_root, "test")
    assert (len(train), len(test)) == (18, 12)  # trainval = train (12) + val (6)
    assert train.features["fine_label"].names == [row[0] for row in AIRCRAFT]
    assert train.features["label"].names == ["Boeing 707", "Boeing 727", "Boeing 737", "A300", "A310"]
    assert not set(train["key"]) & set(test["key"])
    for row in test:
        validate_row(row)
        variant, family, manufacturer = AIRCRAFT[row["fine_label"]]
        assert train.features["label"].names[row["label"]] == family
        assert train.features["manufacturer"].names[row["manufacturer"]] == manufacturer
        assert (
            row["variant"] == row["fine_label"]
            and row["family"] == row["label"]
            and variant in row["caption"]
        )
    by_maker = load_fgvc_aircraft(aircraft_root, "test", coarse="manufacturer")
    assert by_maker.features["label"].names == ["Boeing", "Airbus"] and set(by_maker["label"]) == {0, 1}
    assert len(load_fgvc_aircraft(aircraft_root, "train_only")) == 12
    assert len(load_fgvc_aircraft(aircraft_root, "train", limit=5)) == 5
    with pytest.raises(ValueError, match="coarse"):
        load_fgvc_aircraft(aircraft_root, coarse="variant")
    with pytest.raises(FileNotFoundError, match="FGVC-Aircraft"):
        find_aircraft_root(aircraft_root / "nowhere")


def test_cars_keeps_model_and_make(cars_root):
    assert (
        car_make("Aston Martin V8 Vantage Coupe 2012") == "Aston Martin"
        and car_make("Audi R8 Coupe 2012") == "Audi"
    )
    train, test = load_stanford_cars(cars_root, "train"), load_stanford_cars(cars_root, "test")
    assert (len(train), len(test)) == (12, 12)
    official = list(BENCHMARKS["cars"].class_names)  # every class, whatever folders the copy has
    assert train.features["fine_label"].names == official == test.features["fine_label"].names
    assert len(official) == 196 and official[0] == CARS[0] and set(CARS) <= set(official)
    makes = train.features["label"].names
    assert len(makes) == 49 and makes[:3] == ["AM General", "Acura", "Aston Martin"]
    for row in train:
        validate_row(row)
        model = official[row["fine_label"]]
        assert model in CARS and makes[row["label"]] == car_make(model)
        assert row["key"].startswith(f"train/{model}/")
    assert [makes[i] for i in train["label"]].count("Audi") == 6  # two Audi models, three images each


def test_registry_names_and_granularity_on_both_levels(aircraft_root, cars_root):
    aircraft = load_dataset_by_name(f"aircraft:{aircraft_root}", split="test")
    cars = load_dataset_by_name(f"cars:{cars_root}", split="train", limit=8, seed=1)
    assert len(aircraft) == 12 and len(cars) == 8
    for data in (aircraft, cars):
        features = np.random.default_rng(0).normal(size=(len(data), 8))
        scores = metrics.granularity_scores(features, data["fine_label"], data["label"])
        assert (
            0 <= scores["ncc_fine"] <= 1
            and 0 <= scores["ncc_coarse"] <= 1
            and scores["cdnv_coarse_mean"] >= 0
        )


def test_with_hierarchy_from_columns_or_from_class_names():
    names = datasets.ClassLabel(names=CARS)
    hub = datasets.Dataset.from_dict(
        {"label": [0, 1, 2, 3, 3], "family": [0, 0, 1, 1, 1]},
        features=datasets.Features({"label": names, "family": datasets.ClassLabel(names=["x", "y"])}),
    )
    by_name = with_hierarchy(hub, "label", car_make)
    assert by_name["fine_label"] == [0, 1, 2, 3, 3] and by_name["label"] == [0, 1, 2, 2, 2]
    assert by_name.features["label"].names == ["AM General", "Aston Martin", "Audi"]
    by_column = with_hierarchy(hub, "label", "family")
    assert by_column["label"] == [0, 0, 1, 1, 1] and by_column.features["fine_label"].names == CARS
    with pytest.raises(ValueError, match="ClassLabel"):
        with_hierarchy(datasets.Dataset.from_dict({"v": [1]}), "v", car_make)
