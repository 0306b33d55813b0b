"""Every official layout of the papers' benchmarks, as a tiny hand-made copy written from the publisher's
documentation (file names, folder names, annotation formats), read by `hf_vrl.data.layouts` with hand-written
expected labels, class names and counts."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from data_fixtures import image_file, row_class_names, write_plain_shard
from PIL import Image
from scipy.io import savemat

from hf_vrl.data.benchmarks import BENCHMARKS, Split, benchmark_of, check_counts
from hf_vrl.data.imagenet import imagenetv2_variant
from hf_vrl.data.layouts import layouts_help, load_benchmark
from hf_vrl.data.registry import check_dataset_name, load_dataset_by_name
from hf_vrl.data.schema import validate_row
from hf_vrl.errors import UserError
from hf_vrl.eval_inputs import load_counted_dataset
from hf_vrl.presets import list_presets, load_preset

TENCH, GOLDFISH, KIT_FOX, ENGLISH_SETTER = "n01440764", "n01443537", "n02119789", "n02100735"


# -- ImageNet ------------------------------------------------------------------------------------------------


def _devkit(root: Path, ground_truth: list[int]) -> None:
    """ILSVRC2012_devkit_t12/data as the devkit ships it: the validation ground truth (one ILSVRC2012_ID
    per line, image 1 first) and meta.mat, whose `synsets` struct array maps ILSVRC2012_ID to WNID (leaves
    1..1000, then the inner nodes)."""
    data = root / "ILSVRC2012_devkit_t12" / "data"
    data.mkdir(parents=True)
    (data / "ILSVRC2012_validation_ground_truth.txt").write_text("".join(f"{i}\n" for i in ground_truth))
    fields = [("ILSVRC2012_ID", "O"), ("WNID", "O"), ("words", "O"), ("num_children", "O")]
    synsets = np.array(
        [
            (1, KIT_FOX, "kit fox, Vulpes macrotis", 0),
            (2, ENGLISH_SETTER, "English setter", 0),
            (3, TENCH, "tench, Tinca tinca", 0),
            (1001, "n00001740", "entity", 3),
        ],
        dtype=fields,
    )
    savemat(data / "meta.mat", {"synsets": synsets})


def test_imagenet_val_flat_with_the_devkit_ground_truth(tmp_path):
    for n in (1, 2, 3, 4):
        image_file(tmp_path / "val" / f"ILSVRC2012_val_{n:08d}.JPEG")
    _devkit(tmp_path, [3, 1, 2, 3])  # image 1: tench, 2: kit fox, 3: English setter, 4: tench
    dataset, counts = load_benchmark("imagenet", str(tmp_path), "test")  # the papers' ImageNet test: val
    assert row_class_names(dataset) == [TENCH, KIT_FOX, ENGLISH_SETTER, TENCH]
    assert dataset["key"] == [f"ILSVRC2012_val_{n:08d}.JPEG" for n in (1, 2, 3, 4)]
    assert dataset.features["label"].num_classes == 1000
    assert dataset[0]["caption"].endswith("tench.") or "tench" in dataset[0]["caption"]  # OpenAI's name
    validate_row(dataset[0])
    assert (counts.split, counts.images, counts.official_images) == ("validation", 4, 50_000)
    assert (counts.classes, counts.official_classes, counts.complete) == (3, 1000, False)
    assert counts.describe() == "4 of 50,000 images, 3 of 1,000 classes"


def test_imagenet_kaggle_layout_with_loc_val_solution(tmp_path):
    base = tmp_path / "ILSVRC" / "Data" / "CLS-LOC"
    for n in (1, 2):
        image_file(base / "val" / f"ILSVRC2012_val_{n:08d}.JPEG")
    for wnid in (TENCH, GOLDFISH):
        image_file(base / "train" / wnid / f"{wnid}_10026.JPEG")
    (tmp_path / "LOC_val_solution.csv").write_text(
        "ImageId,PredictionString\n"
        f"ILSVRC2012_val_00000002,{GOLDFISH} 10 20 100 120 {GOLDFISH} 5 5 50 50\n"
        f"ILSVRC2012_val_00000001,{TENCH} 1 2 3 4\n"
    )
    val, counts = load_benchmark("imagenet", str(tmp_path), "validation")
    assert row_class_names(val) == [TENCH, GOLDFISH] and counts.official_images == 50_000
    train, counts = load_benchmark("imagenet", f"imagenet:{tmp_path}", "train")
    assert row_class_names(train) == [TENCH, GOLDFISH] and counts.official_images == 1_281_167
    assert len(load_dataset_by_name(f"imagenet:{tmp_path}", split="val")) == 2  # through the registry


def test_a_flat_val_without_ground_truth_is_one_line(tmp_path):
    image_file(tmp_path / "val" / "ILSVRC2012_val_00000001.JPEG")
    with pytest.raises(
        UserError, match="flat validation folder: put the devkit .* or Kaggle's LOC_val_solution"
    ):
        load_benchmark("imagenet", str(tmp_path), "test")


@pytest.mark.parametrize(
    ("key", "folder", "wnids", "official"),
    [
        ("imagenet-r", "imagenet-r", (GOLDFISH, "n01484850"), (30_000, 200)),
        ("imagenet-a", "imagenet-a", ("n01498041", "n01531178"), (7_500, 200)),
        ("imagenet-sketch", "sketch", (TENCH, KIT_FOX), (50_889, 1000)),
    ],
)
def test_imagenet_shifts_as_their_archives_extract(tmp_path, key, folder, wnids, official):
    """<archive>/<wnid>/<image>, no split level; the copy holds 2 of the classes, every class a label."""
    for i, wnid in enumerate(wnids):
        for j in range(i + 1):
            image_file(tmp_path / folder / wnid / f"{j}.jpg")
    for split in ("test", "train"):  # however a split is asked for: the archive's one
        dataset, counts = load_benchmark(key, str(tmp_path), split)
        assert row_class_names(dataset) == [wnids[0], wnids[1], wnids[1]]
        assert dataset.features["label"].num_classes == official[1]
        assert (counts.images, counts.classes) == (3, 2)
        assert (counts.official_images, counts.official_classes) == official
        assert len(counts.missing_classes) == official[1] - 2
    with pytest.raises(UserError, match=r"\(missing .* more\); give the whole set, or pass --allow-partial"):
        check_counts(counts, str(tmp_path))
    assert check_counts(counts, str(tmp_path), allow_partial=True) is counts


def test_a_whole_copy_by_the_registry_counts_passes_unmarked(tmp_path, monkeypatch):
    """The registry entry's counts as data: with the copy's own numbers the check passes and marks nothing."""
    for wnid in (GOLDFISH, "n01484850"):
        image_file(tmp_path / "imagenet-r" / wnid / "0.jpg")
    entry = BENCHMARKS["imagenet-r"]
    monkeypatch.setitem(BENCHMARKS, "imagenet-r", replace(entry, splits={"test": Split(2, 2)}))
    dataset, counts = load_benchmark("imagenet-r", str(tmp_path), "test")
    assert counts.complete and check_counts(counts, "here") is counts
    assert counts.as_dict()["complete"] is True and counts.describe() == "2 of 2 images, 2 of 2 classes"


def test_imagenet_v2_folders_by_label_id(tmp_path):
    base = tmp_path / "imagenetv2-matched-frequency-format-val"
    image_file(base / "0" / "7e4f3c.jpeg")  # label 0: tench
    image_file(base / "1" / "a1b2c3.jpeg")  # label 1: goldfish
    image_file(base / "278" / "ffee00.jpeg")  # label 278: kit fox
    dataset, counts = load_benchmark("imagenet-v2", str(tmp_path), "test")
    assert row_class_names(dataset) == [TENCH, GOLDFISH, KIT_FOX]
    assert (counts.images, counts.official_images, counts.official_classes) == (3, 10_000, 1000)


@pytest.mark.parametrize("variant", ["threshold0.7", "top-images"])
def test_imagenet_v2_variants_of_the_same_count_are_told_apart_by_their_archive(tmp_path, variant):
    """threshold0.7 and top-images hold 10,000 images, 10 a class, as matched-frequency does: the name their
    archive extracts to says which one a copy is, and those the tables do not score are refused in one line
    (extracted where given, or one level down)."""
    for where in (tmp_path / "a", tmp_path / "b" / "imagenet-v2"):
        base = where / f"imagenetv2-{variant}-format-val"
        image_file(base / "0" / "7e4f3c.jpeg")
        source = str(base if where.name == "a" else where)
        with pytest.raises(
            UserError, match=rf"ImageNet-V2's {variant} variant .* give imagenetv2-matched-freq"
        ):
            load_benchmark("imagenet-v2", source, "test")
    assert imagenetv2_variant(tmp_path / "x" / "imagenetv2-matched-frequency-format-val" / "0") == (
        "matched-frequency"
    )
    assert imagenetv2_variant(tmp_path / "my-copy") is None  # named for none: read as given


def test_objectnet_reads_the_mapped_folders_as_published(tmp_path):
    images = tmp_path / "objectnet-1.0" / "images"
    image_file(images / "alarm_clock" / "0a1b.png")
    image_file(images / "banana" / "77ff.png")
    image_file(images / "banana" / "88ee.png")
    image_file(images / "squeegee" / "1234.png")  # one of the 200 folders with no ImageNet class: not read
    (tmp_path / "objectnet-1.0" / "mappings").mkdir()
    dataset, counts = load_benchmark("objectnet", str(tmp_path), "test")
    names = dataset.features["label"].names
    assert len(names) == 113 and names[:2] == ["alarm_clock", "backpack"]  # folder names, as published
    assert row_class_names(dataset) == ["alarm_clock", "banana", "banana"]
    assert (counts.images, counts.official_images, counts.classes, counts.official_classes) == (
        3,
        18_574,
        2,
        113,
    )


def test_cub_as_extracted(cub_root):
    dataset, counts = load_benchmark("cub", str(cub_root), "train")
    assert dataset.features["label"].names == [
        "black footed albatross",
        "laysan albatross",
        "sooty albatross",
    ]
    assert (counts.images, counts.official_images) == (6, 5_994)


# -- FGVC-Aircraft and Stanford Cars ------------------------------------------------------------------------


def _aircraft_archive(root: Path) -> None:
    """fgvc-aircraft-2013b/data: images/<7-digit id>.jpg and images_<level>_<split>.txt ("<id> <name>")."""
    data = root / "fgvc-aircraft-2013b" / "data"
    rows = {
        "trainval": [("1025794", "707-320", "Boeing 707", "Boeing"), ("0034309", "A380", "A380", "Airbus")]
    }
    rows["test"] = [("1514522", "A380", "A380", "Airbus")]
    (data / "images").mkdir(parents=True)
    for split, entries in rows.items():
        for level, column in (("variant", 1), ("family", 2), ("manufacturer", 3)):
            lines = "".join(f"{entry[0]} {entry[column]}\n" for entry in entries)
            (data / f"images_{level}_{split}.txt").write_text(lines)
        for entry in entries:
            image_file(data / "images" / f"{entry[0]}.jpg")


def test_aircraft_archive_under_the_benchmark_key_probes_the_100_variants(tmp_path):
    """The issue's case: the archive at <root>/aircraft, read by the benchmark key at the variant level."""
    _aircraft_archive(tmp_path / "aircraft")
    dataset, counts = load_benchmark("aircraft", str(tmp_path / "aircraft"), "train", level="variant")
    assert dataset.features["label"].num_classes == 100  # every variant (variants.txt absent: OpenAI's list)
    assert row_class_names(dataset) == ["A380", "707-320"]  # by image id
    assert (counts.images, counts.official_images, counts.classes, counts.official_classes) == (
        2,
        6_667,
        2,
        100,
    )
    coarse, _ = load_benchmark("aircraft", f"aircraft:{tmp_path / 'aircraft'}", "test")  # CLUE's reading
    assert (
        row_class_names(coarse) == ["A380"]
        and coarse.features["fine_label"].names[coarse[0]["fine_label"]] == "A380"
    )


def _cars_devkit(root: Path) -> None:
    """The devkit as published: cars_meta.mat (class_names), cars_train_annos.mat and (separately released)
    cars_test_annos_withlabels.mat, each `annotations` with bbox_x1..y2, class (1-based) and fname."""
    names = np.array(
        ["AM General Hummer SUV 2000", "Acura RL Sedan 2012", "Acura TL Sedan 2012"], dtype=object
    )
    (root / "devkit").mkdir(parents=True)
    savemat(root / "devkit" / "cars_meta.mat", {"class_names": names.reshape(1, -1)})
    fields = [
        ("bbox_x1", "O"),
        ("bbox_y1", "O"),
        ("bbox_x2", "O"),
        ("bbox_y2", "O"),
        ("class", "O"),
        ("fname", "O"),
    ]
    train = np.array([(1, 2, 10, 9, 3, "00001.jpg"), (0, 0, 11, 9, 1, "00002.jpg")], dtype=fields)
    test = np.array([(1, 1, 9, 8, 2, "00001.jpg"), (2, 2, 8, 8, 2, "00002.jpg")], dtype=fields)
    savemat(root / "devkit" / "cars_train_annos.mat", {"annotations": train.reshape(1, -1)})
    savemat(root / "cars_test_annos_withlabels.mat", {"annotations": test.reshape(1, -1)})
    for split in ("train", "test"):
        for name in ("00001.jpg", "00002.jpg"):
            image_file(root / f"cars_{split}" / name)


def test_stanford_cars_devkit_mat_files(tmp_path):
    _cars_devkit(tmp_path / "stanford_cars")
    train, counts = load_benchmark("cars", str(tmp_path), "train", level="model")
    assert row_class_names(train) == ["Acura TL Sedan 2012", "AM General Hummer SUV 2000"]  # classes 3 and 1
    assert train.features["label"].names[:2] == ["AM General Hummer SUV 2000", "Acura RL Sedan 2012"]
    assert (counts.images, counts.official_images, counts.classes, counts.official_classes) == (
        2,
        8_144,
        2,
        196,
    )
    test, counts = load_benchmark("cars", str(tmp_path), "test", level="model")
    assert row_class_names(test) == ["Acura RL Sedan 2012"] * 2 and counts.official_images == 8_041
    by_make = load_dataset_by_name(f"cars:{tmp_path}", split="train")  # CLUE's reading: label = make
    assert [by_make.features["label"].names[i] for i in by_make["label"]] == ["Acura", "AM General"]
    (tmp_path / "stanford_cars" / "cars_test_annos_withlabels.mat").unlink()
    with pytest.raises(UserError, match="cars_test_annos_withlabels.mat is missing"):
        load_benchmark("cars", str(tmp_path), "test")


# -- WILDS --------------------------------------------------------------------------------------------------


def _csv(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def test_fmow_wilds_splits_and_regions(tmp_path):
    """fmow_v1.1 as WILDS ships it (image i: row i of rgb_metadata.csv); splits by year, region by country."""
    root = tmp_path / "fmow_v1.1"
    rows = [  # split, category, country_code, timestamp -> WILDS split, region (hand-worked)
        ("train", "airport", "USA", "2010-05-01T10:00:00Z"),  # train, Americas
        ("train", "zoo", "FRA", "2014-02-01T10:00:00Z"),  # a train row from the OOD years: in no split
        ("val", "dam", "JPN", "2012-12-31T23:00:00Z"),  # id_val, Asia
        ("val", "dam", "KEN", "2015-06-01T00:00:00Z"),  # val (OOD), Africa
        ("test", "port", "AUS", "2016-01-01T00:00:00Z"),  # test (OOD), Oceania
        ("test", "port", "XKX", "2017-03-01T00:00:00Z"),  # test (OOD), no mapping: Other
        ("test", "barn", "DEU", "2011-01-01T00:00:00Z"),  # id_test, Europe
        ("seq", "barn", "DEU", "2011-01-01T00:00:00Z"),  # sequestered: never
    ]
    _csv(
        root / "rgb_metadata.csv",
        [dict(zip(("split", "category", "country_code", "timestamp"), r)) for r in rows],
    )
    regions = [("USA", "Americas"), ("FRA", "Europe"), ("JPN", "Asia"), ("KEN", "Africa"), ("AUS", "Oceania")]
    _csv(
        root / "country_code_mapping.csv",
        [{"alpha-3": a, "region": r} for a, r in regions + [("DEU", "Europe")]],
    )
    for number in range(len(rows)):
        image_file(root / "images" / f"rgb_img_{number}.png")
    expected = {
        "train": (["airport"], ["Americas"]),
        "id_val": (["dam"], ["Asia"]),
        "val": (["dam"], ["Africa"]),
        "test": (["port", "port"], ["Oceania", "Other"]),
        "id_test": (["barn"], ["Europe"]),
    }
    for split, (categories, region) in expected.items():
        dataset, counts = load_benchmark("fmow", str(tmp_path), split)
        assert row_class_names(dataset) == categories and dataset["region"] == region, split
        assert counts.official_images == BENCHMARKS["fmow"].splits[split].images
    assert load_benchmark("fmow", str(tmp_path), "test")[0]["key"] == ["rgb_img_4.png", "rgb_img_5.png"]
    assert load_benchmark("fmow", str(tmp_path), "train")[1].official_images == 76_863
    assert BENCHMARKS["fmow"].class_names[:2] == ("airport", "airport_hangar")


def test_fmow_given_as_an_image_folder_reads_as_fmow(tmp_path):
    """The issue's case: images with WILDS' metadata as metadata.csv (a `file_name` column names each image),
    given as fmow:, imagefolder: or a bare path, is FMoW with WILDS' splits and regions (as class folders it
    was one class, "images"); without WILDS' country-code mapping it is refused in one line."""
    root = tmp_path / "fmow"
    rows = [
        ("images/a.png", "train", "zoo", "KEN", "2010-01-01T00:00:00Z"),  # train, Africa
        ("images/b.png", "test", "dam", "FRA", "2016-06-01T00:00:00Z"),  # OOD test, Europe
    ]
    columns = ("file_name", "split", "category", "country_code", "timestamp")
    _csv(root / "metadata.csv", [dict(zip(columns, row)) for row in rows])
    for row in rows:
        image_file(root / row[0])
    with pytest.raises(
        UserError, match="metadata.csv needs WILDS' country_code_mapping.csv beside it"
    ) as error:
        load_dataset_by_name(f"imagefolder:{root}", split="train")
    assert len(str(error.value).splitlines()) == 1
    _csv(
        root / "country_code_mapping.csv",
        [{"alpha-3": "KEN", "region": "Africa"}, {"alpha-3": "FRA", "region": "Europe"}],
    )
    for name in (f"fmow:{root}", f"imagefolder:{root}", str(root)):
        train = load_dataset_by_name(name, split="train")
        assert row_class_names(train) == ["zoo"] and train["region"] == ["Africa"], name
    test, record = load_counted_dataset(f"imagefolder:{root}", split="test", allow_partial=True)
    assert test["region"] == ["Europe"] and record["official_images"] == 22_108


def test_iwildcam_wilds_metadata(tmp_path):
    root = tmp_path / "iwildcam_v2.0"
    rows = [
        {"split": "train", "filename": "8a.jpg", "y": "0", "location_remapped": "3"},
        {"split": "id_test", "filename": "8b.jpg", "y": "2", "location_remapped": "3"},
        {"split": "test", "filename": "9c.jpg", "y": "181", "location_remapped": "7"},
    ]
    _csv(root / "metadata.csv", rows)
    for row in rows:
        image_file(root / "train" / row["filename"])
    test, counts = load_benchmark("iwildcam", str(tmp_path), "test")
    assert test["label"] == [181] and test["location"] == ["7"]
    assert (counts.images, counts.official_images) == (1, 42_791)
    id_test, _ = load_benchmark("iwildcam", str(tmp_path), "id_test")
    assert row_class_names(id_test) == ["dasyprocta punctata"]  # y = 2, labelled by its scientific name
    assert "central american agouti" in id_test[0]["caption"]  # and prompted by FLYP's English one
    assert len(BENCHMARKS["iwildcam"].class_names) == 182


# -- retrieval: Karpathy's split files ---------------------------------------------------------------------


def _karpathy(path: Path, entries: list[tuple[str, str, str, list[str]]]) -> None:
    images = [
        {
            "filepath": folder,
            "filename": name,
            "split": split,
            "sentences": [{"raw": c, "tokens": c.split()} for c in caps],
        }
        for folder, name, split, caps in entries
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"images": images, "dataset": path.stem.removeprefix("dataset_")}))


def test_flickr30k_karpathy_test_split_only(tmp_path):
    _karpathy(
        tmp_path / "dataset_flickr30k.json",
        [
            ("", "1000092795.jpg", "train", ["two young guys", "two men outside"]),
            ("", "1007129816.jpg", "test", ["a man with an orange hat", "a man in a hat", "a hat"]),
            ("", "1009434119.jpg", "val", ["a dog"]),
        ],
    )
    for name in ("1000092795.jpg", "1007129816.jpg", "1009434119.jpg"):
        image_file(tmp_path / "flickr30k-images" / name)
    dataset, counts = load_benchmark("flickr30k", str(tmp_path), "test")
    assert dataset["caption"] == [["a man with an orange hat", "a man in a hat", "a hat"]]
    assert (counts.images, counts.official_images, counts.texts, counts.official_texts) == (
        1,
        1_000,
        3,
        5_000,
    )
    with pytest.raises(UserError, match="has no split 'train'"):
        load_benchmark("flickr30k", str(tmp_path), "train")  # the tables score Karpathy's test split


def test_coco_karpathy_with_filepath_folders(tmp_path):
    _karpathy(
        tmp_path / "annotations" / "dataset_coco.json",
        [
            ("val2014", "COCO_val2014_000000391895.jpg", "test", ["a man riding a bike"] * 5),
            ("val2014", "COCO_val2014_000000522418.jpg", "restval", ["a woman cutting cake"]),
        ],
    )
    image_file(tmp_path / "val2014" / "COCO_val2014_000000391895.jpg")
    image_file(tmp_path / "val2014" / "COCO_val2014_000000522418.jpg")
    dataset, counts = load_benchmark("mscoco", str(tmp_path / "annotations"), "test")
    assert dataset["key"] == ["COCO_val2014_000000391895.jpg"] and counts.describe() == (
        "1 of 5,000 images, 5 of 25,010 captions"
    )


# -- CC3M as img2dataset writes it ------------------------------------------------------------------------


def test_cc3m_folder_reads_the_shards_not_their_metadata(tmp_path):
    import io
    import tarfile

    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "cc3m"
    folder.mkdir()
    for shard in ("00000", "00001"):
        with tarfile.open(folder / f"{shard}.tar", "w") as tar:
            for key, member in ((f"{shard}0001", b"a dog on a beach"),):
                buffer = io.BytesIO()
                Image.new("RGB", (40, 40), (1, 2, 3)).save(buffer, "JPEG")
                for ext, data in (
                    ("jpg", buffer.getvalue()),
                    ("txt", member),
                    ("json", b'{"status": "success"}'),
                ):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        pq.write_table(
            pa.table({"key": [f"{shard}0001"], "caption": ["x"], "status": ["success"]}),
            folder / f"{shard}.parquet",
        )
        (folder / f"{shard}_stats.json").write_text('{"successes": 1, "count": 1}')
    rows = list(load_dataset_by_name(f"cc3m:{folder}", split="train", stream_options={"shuffle_buffer": 0}))
    assert sorted(row["caption"] for row in rows) == ["a dog on a beach", "a dog on a beach"]
    assert (
        len(list(load_dataset_by_name(f"webdataset:{folder}", split="train"))) == 2
    )  # the folder: tars only


def test_presets_name_cc3m_by_the_registry_and_its_shards_are_discovered(tmp_path):
    """Every preset that trains on or replays CC3M names it on the Hub (hf:pixparse/cc3m-wds), no fixed
    shard pattern; cc3m:<folder> reads a local copy: an img2dataset folder of any number of shards is read
    whole (here 3, with the metadata img2dataset writes beside each), and an explicit webdataset: pattern
    still reads other shards."""
    folder = tmp_path / "cc3m"
    folder.mkdir()
    for n in range(3):
        write_plain_shard(folder / f"{n:05d}.tar", 10 * n, 2)
        (folder / f"{n:05d}_stats.json").write_text('{"successes": 2, "count": 2}')
        (folder / f"{n:05d}.parquet").write_bytes(b"PAR1 metadata, not data")
    named = {}
    for name, _, _ in list_presets():
        preset = load_preset(name)
        assert "00331" not in json.dumps(preset), name  # no shard count in notes or fields
        for section, field in (("data", "dataset"), ("dive", "reference_dataset")):
            value = preset.get(section, {}).get(field)
            if isinstance(value, str) and "cc3m" in value.lower():
                named[f"{name} {field}"] = value
    assert len(named) == 11 and set(named.values()) == {"hf:pixparse/cc3m-wds"}, named  # 6 DCR, 4 DiVE, B/16
    check_dataset_name(f"cc3m:{folder}")
    rows = list(load_dataset_by_name(f"cc3m:{folder}", split="train", stream_options={"shuffle_buffer": 0}))
    assert sorted(row["caption"] for row in rows) == [f"caption {i}" for i in (0, 1, 10, 11, 20, 21)]
    pattern = f"webdataset:{folder}/{{00000..00001}}.tar"
    assert len(list(load_dataset_by_name(pattern, split="train", stream_options={"shuffle_buffer": 0}))) == 4
    with pytest.raises(UserError, match=r"--dataset cc3m:.*expected img2dataset's output folder") as error:
        check_dataset_name(f"cc3m:{tmp_path / 'photos'}")
    assert len(str(error.value).splitlines()) == 1


# -- generic copies: class names matched to the official ones ----------------------------------------------


def test_split_folders_map_the_publishers_names_to_openais(tmp_path):
    for name in ("AnnualCrop", "SeaLake"):  # EuroSAT's folders (OpenAI renamed them)
        image_file(tmp_path / "eurosat" / "test" / name / f"{name}_1.jpg")
    eurosat, counts = load_benchmark("eurosat", str(tmp_path / "eurosat"), "test")
    assert (
        row_class_names(eurosat) == ["annual crop land", "lake or sea"] and counts.official_images == 27_000
    )
    for name in ("Abyssinian", "american_bulldog"):  # Pets' breeds, in the publisher's spelling
        image_file(tmp_path / "pets" / "test" / name / "1.jpg")
    pets, counts = load_benchmark("pets", str(tmp_path / "pets"), "test")
    assert row_class_names(pets) == ["Abyssinian", "american bulldog"] and counts.official_images == 3_669
    image_file(tmp_path / "caltech101" / "test" / "Faces_easy" / "image_0001.jpg")
    assert row_class_names(load_benchmark("caltech101", str(tmp_path / "caltech101"), "test")[0]) == [
        "centered face"
    ]
    image_file(tmp_path / "cifar10" / "test" / "spaceship" / "0.png")
    with pytest.raises(UserError, match="'spaceship' are not its classes"):
        load_benchmark("cifar10", str(tmp_path / "cifar10"), "test")


def test_a_datasets_copy_is_relabelled_in_the_official_classes(tmp_path):
    import datasets

    rows = {"img": [Image.new("RGB", (8, 8))] * 3, "label": [0, 1, 1]}
    features = datasets.Features(
        {"img": datasets.Image(), "label": datasets.ClassLabel(names=["truck", "airplane"])}
    )
    datasets.DatasetDict({"test": datasets.Dataset.from_dict(rows, features=features)}).save_to_disk(
        tmp_path / "c"
    )
    dataset, counts = load_benchmark("cifar10", f"hf:{tmp_path / 'c'}", "test")
    assert row_class_names(dataset) == ["truck", "airplane", "airplane"] and dataset["label"] == [9, 0, 0]
    assert dataset.features["label"].names == list(BENCHMARKS["cifar10"].class_names)
    assert (counts.images, counts.official_images) == (3, 10_000)


# -- the registry -------------------------------------------------------------------------------------------


def test_a_wrong_or_missing_layout_is_one_line_naming_the_expected_one(tmp_path):
    (tmp_path / "stuff").mkdir()
    (tmp_path / "stuff" / "readme.txt").write_text("nothing here")
    with pytest.raises(
        UserError, match=r"is not a ImageNet-R layout; expected <wnid>/<image> folders"
    ) as error:
        load_benchmark("imagenet-r", str(tmp_path / "stuff"), "test")
    assert len(str(error.value).splitlines()) == 1
    with pytest.raises(UserError, match="does not exist"):
        load_benchmark("fmow", str(tmp_path / "nowhere"), "train")
    with pytest.raises(UserError, match=r"--dataset fmow:.*expected WILDS' fmow_v1.1/"):
        check_dataset_name(f"fmow:{tmp_path / 'stuff'}")


def test_registry_entries_are_consistent():
    for key, benchmark in BENCHMARKS.items():
        assert benchmark.key == key and benchmark.layouts and benchmark.counts_source
        for split in benchmark.splits.values():
            if benchmark.class_names is not None and split.classes is not None and benchmark.task != "pairs":
                assert split.classes <= len(benchmark.class_names), key
    assert BENCHMARKS["imagenet"].split("test") == "validation"  # the papers' ImageNet test
    # a benchmark is named by its key (or a registered Hub mirror), never by a path's name (issue 34)
    assert benchmark_of("imagenet-r:/data/x").key == "imagenet-r" and benchmark_of("/data/my-photos") is None
    assert benchmark_of("imagefolder:/data/imagenet-r") is None and benchmark_of("hf:uoft-cs/cifar10") is None
    assert benchmark_of("hf:clip-benchmark/wds_vtab-eurosat").key == "eurosat"
    assert benchmark_of("fgvc-aircraft-2013b").key == "aircraft"
    help_text = layouts_help(["imagenet", "fmow"])
    assert "LOC_val_solution.csv" in help_text and "country_code_mapping.csv" in help_text
