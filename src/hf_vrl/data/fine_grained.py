"""FGVC-Aircraft (Maji et al. 2013) and Stanford Cars (Krause et al. 2013) with their label hierarchies, so
CLUE's granularity metrics (§3.1: CDNV within each coarse class, NCC fine / coarse) run on real data.

Rows follow the contract (`schema.py`) with `fine_label` the finest class (Aircraft: variant, 100; Cars: the
196 make-model-body-year classes) and `label` the coarse one (Aircraft: family, 70, or manufacturer, 30;
Cars: make, 49), plus every level as its own ClassLabel column and `key` (the image's relative path). The
caption is a class-name template of the fine class (as CUB's): label supervision, never a description.

Sources: the official FGVC-Aircraft archive (`fgvc-aircraft-2013b/data`: images/<id>.jpg and
images_{variant,family,manufacturer}_{split}.txt, "<id> <name>" per line; the images keep the 20-pixel
copyright banner at the bottom), Stanford Cars as published (`cars_train/`, `cars_test/` and the devkit's
`cars_meta.mat` / `cars_train_annos.mat` with `cars_test_annos_withlabels.mat`, read with `scipy.io.loadmat`;
`class` is 1-based) or as an image folder (`{train,test}/<class name>/<image>`), or any Dataset with a
ClassLabel per level or a fine ClassLabel whose names give the coarse class (`with_hierarchy`: e.g. a Hub copy
of Stanford Cars with `car_make`). The fine level always holds every official class (a partial copy is scored
over all 100 / 196), and images listed but absent are left out (the count check sees them missing).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from datasets import ClassLabel, Dataset, Value

from hf_vrl.errors import UserError

from .benchmarks import BENCHMARKS, Benchmark
from .images import DecodeTransform
from .offline import SPLITS, subsample
from .prompts import captions_for_labels
from .readers import Layout, class_folders, image_files, loadmat, official_labels
from .schema import FINE_LABEL, LABEL, contract_features

__all__ = [
    "AIRCRAFT_LEVELS",
    "at_level",
    "car_make",
    "find_cars_devkit",
    "find_aircraft_root",
    "load_fgvc_aircraft",
    "load_stanford_cars",
    "with_hierarchy",
]

AIRCRAFT_LEVELS = ("variant", "family", "manufacturer")  # fine to coarse
AIRCRAFT_SPLITS = {"train": "trainval", "test": "test"}  # the usual protocol: train on train + val
CARS_TWO_WORD_MAKES = ("AM General", "Aston Martin", "Land Rover")  # every other make is the first word


def find_aircraft_root(root: str | os.PathLike) -> Path:
    """The folder holding images/ and images_variant_test.txt: `root`, `root/data` or
    `root/fgvc-aircraft-2013b/data`."""
    for candidate in (Path(root), Path(root) / "data", Path(root) / "fgvc-aircraft-2013b" / "data"):
        if (candidate / "images_variant_test.txt").is_file() and (candidate / "images").is_dir():
            return candidate
    raise FileNotFoundError(
        f"{root} is not an FGVC-Aircraft folder: expected images/ and images_variant_test.txt in it, in "
        f"{Path(root) / 'data'} or in {Path(root) / 'fgvc-aircraft-2013b' / 'data'}"
    )


def _names_by_id(path: Path) -> dict[str, str]:
    """{image id: class name} of an `images_<level>_<split>.txt` file ("<id> <name with spaces>")."""
    with open(path, encoding="utf-8") as f:
        return dict(line.rstrip("\n").split(" ", 1) for line in f if line.strip())


def _level_names(base: Path, level: str) -> list[str]:
    """Every class of `level` in the official order (variants.txt, ...), else sorted over all splits."""
    listing = base / f"{'families' if level == 'family' else level + 's'}.txt"
    if listing.is_file():
        return [line.strip() for line in listing.read_text(encoding="utf-8").splitlines() if line.strip()]
    if level == "variant":  # the 100 variants in the official order (variants.txt's, OpenAI's)
        return list(BENCHMARKS["aircraft"].class_names)
    names = set()
    for path in base.glob(f"images_{level}_*.txt"):
        names.update(_names_by_id(path).values())
    return sorted(names)


def _hierarchy_dataset(
    paths: Sequence[str],
    keys: Sequence[str],
    levels: dict[str, tuple[list[int], list[str]]],
    fine: str,
    coarse: str,
    seed: int,
) -> Dataset:
    """A contract Dataset (images read lazily) with `fine_label` = level `fine`, `label` = level `coarse`
    and every level as a ClassLabel column."""
    fine_ids, fine_names = levels[fine]
    coarse_ids, coarse_names = levels[coarse]
    columns = {
        "image": [{"bytes": None, "path": p} for p in paths],
        "caption": captions_for_labels(fine_ids, fine_names, seed),
        LABEL: coarse_ids,
        FINE_LABEL: fine_ids,
        "key": list(keys),
        **{level: ids for level, (ids, _) in levels.items()},
    }
    extra = {FINE_LABEL: ClassLabel(names=fine_names), "key": Value("string")}
    extra |= {level: ClassLabel(names=names) for level, (_, names) in levels.items()}
    dataset = Dataset.from_dict(columns, features=contract_features(coarse_names, extra, decode=False))
    return dataset.with_transform(DecodeTransform("image"))


def load_fgvc_aircraft(
    root: str | os.PathLike,
    split: str = "train",
    *,
    coarse: str = "family",
    limit: int | None = None,
    seed: int = 0,
) -> Dataset:
    """FGVC-Aircraft from the official archive: "train" = trainval (6,667 images), "test" (3,333), or any of
    the archive's own splits ("train_only" reads images_*_train.txt, "val", "trainval"); `fine_label` the
    variant, `label` the `coarse` level ("family" or "manufacturer"); columns variant, family,
    manufacturer. `limit`: a seeded random subset."""
    if coarse not in AIRCRAFT_LEVELS[1:]:
        raise ValueError(f"coarse must be one of {AIRCRAFT_LEVELS[1:]}, got {coarse!r}")
    name = {"train_only": "train", "validation": "val", **AIRCRAFT_SPLITS}.get(split, split)
    base = find_aircraft_root(root)
    per_level = {level: _names_by_id(base / f"images_{level}_{name}.txt") for level in AIRCRAFT_LEVELS}
    ids = sorted(i for i in per_level["variant"] if (base / "images" / f"{i}.jpg").is_file())
    ids = [ids[i] for i in subsample(len(ids), limit, seed)]
    levels = {}
    for level in AIRCRAFT_LEVELS:
        names = _level_names(base, level)
        index = {n: i for i, n in enumerate(names)}
        levels[level] = ([index[per_level[level][i]] for i in ids], names)
    paths = [str(base / "images" / f"{i}.jpg") for i in ids]
    return _hierarchy_dataset(paths, [f"{i}.jpg" for i in ids], levels, "variant", coarse, seed)


def car_make(class_name: str) -> str:
    """The make of a Stanford Cars class ("Aston Martin V8 Vantage Coupe 2012" -> "Aston Martin")."""
    for make in CARS_TWO_WORD_MAKES:
        if class_name.startswith(make + " "):
            return make
    return class_name.split(" ", 1)[0]


def find_cars_devkit(root: str | os.PathLike) -> Path | None:
    """The folder holding Stanford Cars' devkit/cars_meta.mat (and cars_train/, cars_test/): `root` or
    `root/stanford_cars` (torchvision's place); None when there is none."""
    for base in (Path(root), Path(root) / "stanford_cars"):
        if (base / "devkit" / "cars_meta.mat").is_file():
            return base
    return None


def _mat_rows(path: Path, key: str) -> list:
    import numpy as np

    return list(np.atleast_1d(loadmat(path)[key]))


def _cars_devkit(base: Path, split: str) -> tuple[list[Path], list[int], list[str]]:
    """(image paths, 0-based class ids, the 196 class names) of a split from the devkit's .mat files."""
    names = [str(name) for name in _mat_rows(base / "devkit" / "cars_meta.mat", "class_names")]
    if split == "train":
        annotations = base / "devkit" / "cars_train_annos.mat"
    else:
        candidates = (
            base / "cars_test_annos_withlabels.mat",
            base / "devkit" / "cars_test_annos_withlabels.mat",
        )
        annotations = next((p for p in candidates if p.is_file()), candidates[0])
    if not annotations.is_file():
        raise UserError(
            f"Stanford Cars at {base}: {annotations.name} is missing (the test labels are published as "
            "cars_test_annos_withlabels.mat, beside cars_test/ or in devkit/)"
        )
    folder = base / f"cars_{split}"
    rows = [(folder / str(a["fname"]), int(a["class"]) - 1) for a in _mat_rows(annotations, "annotations")]
    rows = sorted((path, label) for path, label in rows if path.is_file())
    return [path for path, _ in rows], [label for _, label in rows], names


def _cars_folders(root: Path, split: str) -> tuple[list[Path], list[int], list[str]]:
    """(image paths, class ids, the 196 official names) of `root/<split>/<class name>/`; class folders are
    matched to the official names (`hf_vrl.data.readers.official_labels`)."""
    folder = root / split
    if not folder.is_dir():
        raise FileNotFoundError(
            f"no Stanford Cars split folder {folder} (expected {root}/{{train,test}}/<class>/, or the devkit)"
        )
    benchmark = BENCHMARKS["cars"]
    classes = class_folders(folder)
    paths, labels = [], []
    for label, sub in zip(official_labels(benchmark, [c.name for c in classes]), classes):
        files = image_files(sub)
        paths += files
        labels += [label] * len(files)
    return paths, labels, list(benchmark.class_names)


def load_stanford_cars(
    root: str | os.PathLike, split: str = "train", *, limit: int | None = None, seed: int = 0
) -> Dataset:
    """Stanford Cars from the devkit (`find_cars_devkit`) or an image folder `root/{train,test}/<class
    name>/`: `fine_label` the class (make model body year, all 196), `label` its make (`car_make`, 49);
    columns model and make."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    devkit = find_cars_devkit(root)
    paths, models, classes = _cars_devkit(devkit, split) if devkit else _cars_folders(Path(root), split)
    keep = subsample(len(paths), limit, seed)
    paths, models = [paths[i] for i in keep], [models[i] for i in keep]
    makes = sorted({car_make(c) for c in classes})
    levels = {
        "model": (models, classes),
        "make": ([makes.index(car_make(classes[m])) for m in models], makes),
    }
    keys = [Path(p).relative_to(devkit or root).as_posix() for p in paths]
    return _hierarchy_dataset([str(p) for p in paths], keys, levels, "model", "make", seed)


def at_level(dataset: Dataset, level: str, benchmark: Benchmark) -> Dataset:
    """`dataset` with `label` = its ClassLabel column `level` ("variant", "model": the level a table
    scores); a dataset without that column (a generic copy) is labelled at the fine level already."""
    if level not in dataset.column_names:
        return dataset
    feature, values = dataset.features[level], list(dataset[level])
    return dataset.remove_columns(LABEL).add_column(LABEL, values, feature=feature)


def _find_aircraft(root: Path) -> Path | None:
    try:
        return find_aircraft_root(root)
    except FileNotFoundError:
        return None


def _find_cars_folders(root: Path) -> Path | None:
    return root if any((root / split).is_dir() and class_folders(root / split) for split in SPLITS) else None


LAYOUTS = (
    Layout(
        "fgvc-aircraft",
        "the FGVC-Aircraft archive: fgvc-aircraft-2013b/data/ (images/, images_{variant,family,manufacturer}_"
        "<split>.txt)",
        _find_aircraft,
        lambda root, split, benchmark: load_fgvc_aircraft(root, split),
    ),
    Layout(
        "cars-devkit",
        "Stanford Cars as published: cars_train/, cars_test/, devkit/cars_meta.mat, "
        "devkit/cars_train_annos.mat and cars_test_annos_withlabels.mat",
        find_cars_devkit,
        lambda root, split, benchmark: load_stanford_cars(root, split),
    ),
    Layout(
        "cars-folders",
        "{train,test}/<class name>/<image> (Stanford Cars' class names)",
        _find_cars_folders,
        lambda root, split, benchmark: load_stanford_cars(root, split),
        tree=True,
    ),
)


def with_hierarchy(
    dataset: Dataset,
    fine: str,
    coarse: str | Callable[[str], str],
) -> Dataset:
    """`dataset` (ClassLabel column `fine`, e.g. a Hub copy of Aircraft or Cars) with `fine_label` = `fine`
    and `label` = the coarse class: the ClassLabel column `coarse`, or `coarse(fine class name)` (e.g.
    `car_make`). The other columns are kept."""
    feature = dataset.features[fine]
    if not isinstance(feature, ClassLabel):
        raise ValueError(f"column {fine!r} must be a ClassLabel (the fine classes), got {feature}")
    if callable(coarse):
        coarse_names = sorted({coarse(name) for name in feature.names})
        of_fine = [coarse_names.index(coarse(name)) for name in feature.names]
        coarse_ids = [of_fine[i] for i in dataset[fine]]
    else:
        coarse_names, coarse_ids = list(dataset.features[coarse].names), list(dataset[coarse])
    fine_ids = list(dataset[fine])
    dataset = dataset.remove_columns([c for c in (LABEL, FINE_LABEL) if c in dataset.column_names])
    dataset = dataset.add_column(FINE_LABEL, fine_ids, feature=ClassLabel(names=list(feature.names)))
    return dataset.add_column(LABEL, coarse_ids, feature=ClassLabel(names=coarse_names))
