import warnings

import datasets
import numpy as np
import pytest
from data_fixtures import CUB_CLASSES, noise
from PIL import Image

from hf_vrl.data.cub import find_cub_root, load_cub
from hf_vrl.data.generic import load_hf_dataset, load_imagefolder, resolve_columns, to_contract
from hf_vrl.data.images import SampleFilter, SkippedSampleWarning
from hf_vrl.data.prompts import clean_class_name
from hf_vrl.data.schema import validate_row

NAMES = ["black footed albatross", "laysan albatross", "sooty albatross"]


def test_clean_class_name():
    assert clean_class_name("001.Black_footed_Albatross") == "black footed albatross"
    assert clean_class_name("200.Common_Yellowthroat") == "common yellowthroat"
    assert clean_class_name("Cat_Dog") == "cat dog" and clean_class_name("7") == "7"


def test_cub_official_split_names_and_rows(cub_root):
    assert find_cub_root(cub_root).name == "CUB_200_2011" and find_cub_root(cub_root / "CUB_200_2011")
    train, test = load_cub(cub_root, "train"), load_cub(cub_root, "test")
    assert (len(train), len(test)) == (6, 6)
    assert train.features["label"].names == NAMES
    assert train["label"] == [0, 0, 1, 1, 2, 2]
    assert not set(train["key"]) & set(test["key"])
    for row in train:
        validate_row(row)
        assert row["image"].size == (60, 40)
        assert NAMES[row["label"]] in row["caption"]
        assert row["bbox"] == [10.0, 5.0, 30.0, 20.0]
    assert test[0]["key"].startswith(CUB_CLASSES[0])


def test_cub_greyscale_image_comes_out_rgb_and_bbox_crop(cub_root):
    train = load_cub(cub_root, "train")
    grey = [row for row in train if row["key"].endswith("_5.jpg")]  # image 5 is stored greyscale
    assert len(grey) == 1 and grey[0]["image"].mode == "RGB"
    cropped = load_cub(cub_root, "train", bbox_crop=True)
    assert {row["image"].size for row in cropped} == {(30, 20)}


def test_cub_attributes_limit_and_missing_files(cub_root):
    with_attrs = load_cub(cub_root, "train", with_attributes=True)
    assert with_attrs[0]["attributes"] == ["has_wing_color::blue"]  # attribute 1 is present for odd j only
    assert with_attrs[1]["attributes"] == ["has_bill_shape::curved", "has_wing_color::blue"]
    assert len(load_cub(cub_root, "train", limit=3, seed=0)) == 3
    victim = cub_root / "CUB_200_2011" / "images" / load_cub(cub_root, "train")[0]["key"]
    victim.unlink()
    with pytest.warns(SkippedSampleWarning, match="missing_image"):
        assert len(load_cub(cub_root, "train")) == 5


def test_cub_verify_skips_corrupt_files(cub_root):
    victim = cub_root / "CUB_200_2011" / "images" / load_cub(cub_root, "test")[0]["key"]
    victim.write_bytes(b"garbage")
    with pytest.warns(SkippedSampleWarning, match="corrupt_image"):
        assert len(load_cub(cub_root, "test", verify=True)) == 5


def test_not_a_cub_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="images.txt"):
        load_cub(tmp_path)


@pytest.fixture
def image_folder(tmp_path):
    for folder in ("001.Black_footed_Albatross", "Cat_Dog"):
        (tmp_path / "folder" / folder).mkdir(parents=True)
        for i in range(3):
            noise((20, 16), seed=i).save(tmp_path / "folder" / folder / f"{i}.png")
    Image.new("P", (20, 16)).save(tmp_path / "folder" / "Cat_Dog" / "palette.png")
    return tmp_path / "folder"


@pytest.mark.parametrize("streaming", [False, True])
def test_imagefolder_to_contract(image_folder, tmp_path, streaming):
    ds = load_imagefolder(image_folder, streaming=streaming, cache_dir=str(tmp_path / "cache"))
    assert ds.features["label"].names == ["black footed albatross", "cat dog"]
    rows = list(ds)
    assert len(rows) == 7 and sum(r["label"] for r in rows) == 4
    for row in rows:
        validate_row(row)
        assert ds.features["label"].names[row["label"]] in row["caption"]


def test_hf_dataset_with_column_mapping_and_clash(tmp_path):
    pictures = []
    for i in range(4):
        path = tmp_path / f"{i}.png"
        noise((12, 12), seed=i).save(path)
        pictures.append(str(path))
    source = datasets.Dataset.from_dict(
        {
            "img": pictures,
            "sentence": ["one", "  ", "three", "four"],
            "coarse": [0, 1, 0, 1],
            "label": [5, 6, 7, 8],
        },
        features=datasets.Features(
            {
                "img": datasets.Image(),
                "sentence": datasets.Value("string"),
                "coarse": datasets.ClassLabel(names=["Big_Cat", "small_dog"]),
                "label": datasets.Value("int64"),
            }
        ),
    )
    source.save_to_disk(tmp_path / "saved")
    sample_filter = SampleFilter("hf")
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        ds = load_hf_dataset(
            str(tmp_path / "saved"), columns={"label": "coarse"}, sample_filter=sample_filter
        )
    assert set(ds.column_names) == {"image", "caption", "label", "source_label"}
    assert ds["caption"] == ["one", "three", "four"]  # the blank caption is skipped and counted
    assert sample_filter.counts["empty_caption"] == 1
    assert ds.features["label"].names == ["big cat", "small dog"]
    assert ds["source_label"] == [5, 7, 8]
    assert all(row["image"].mode == "RGB" for row in ds)


def test_to_contract_without_labels_or_captions(tmp_path):
    path = tmp_path / "x.png"
    noise((10, 10)).save(path)
    no_label = datasets.Dataset.from_dict({"image": [str(path)], "caption": ["hi"]}).cast_column(
        "image", datasets.Image()
    )
    out = to_contract(no_label)
    assert out[0]["label"] == -1 and out[0]["image"].mode == "RGB"
    no_text = datasets.Dataset.from_dict({"image": [str(path)], "label": [0]}).cast_column(
        "image", datasets.Image()
    )
    with pytest.raises(ValueError, match="no caption column and no ClassLabel"):
        to_contract(no_text)
    with pytest.raises(KeyError, match="not among the columns"):
        resolve_columns(no_text, {"caption": "missing"})
    assert np.asarray(out[0]["image"]).shape == (10, 10, 3)


@pytest.mark.parametrize("streaming", [False, True])
def test_imagefolder_skips_and_counts_bad_images_as_the_stream_does(image_folder, tmp_path, streaming):
    """A zero-byte file and a 1x1 image are skipped and counted, map-style as streamed (they used to stop a
    run, and its resume, at the step that drew them)."""
    from hf_vrl.run.data import SkipLog

    (image_folder / "Cat_Dog" / "empty.png").write_bytes(b"")
    noise((1, 1), seed=0).save(image_folder / "Cat_Dog" / "dot.png")
    log = SkipLog(tmp_path / "skips")
    ds = load_imagefolder(
        image_folder,
        streaming=streaming,
        cache_dir=str(tmp_path / "cache"),
        sample_filter=SampleFilter("folder", log=log),
    )
    rows = list(ds)
    assert len(rows) == 7
    for row in rows:
        validate_row(row)
    assert log.counts() == {"corrupt_image": 1, "too_small": 1}
