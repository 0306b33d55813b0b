"""The CLIP transfer / probe sets in their publishers' own layouts (`hf_vrl.data.transfer`, `packed`): each a
tiny hand-made copy written from the publisher's documentation (file names, annotation formats), read with
hand-written expected labels, class names and counts; each partial copy refused in one line and scored with
--allow-partial, its counts recorded."""

from __future__ import annotations

import gzip
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
from data_fixtures import image_file, mjpeg_avi, row_class_names
from PIL import Image
from scipy.io import savemat

from hf_vrl.data.layouts import load_benchmark
from hf_vrl.data.registry import load_dataset_by_name
from hf_vrl.data.schema import validate_row
from hf_vrl.errors import UserError
from hf_vrl.eval_inputs import load_counted_dataset


def _official(counts) -> tuple:
    return counts.images, counts.official_images, counts.classes, counts.official_classes


def _lines(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{line}\n" for line in lines))


# -- the copies, as their publishers document them -----------------------------------------------------------


def flowers(root: Path) -> Path:
    """102flowers.tgz's jpg/ and the two .mat files (1 x N doubles), in torchvision's flowers-102/."""
    base = root / "flowers-102"
    for i in range(1, 7):
        image_file(base / "jpg" / f"image_{i:05d}.jpg")
    savemat(base / "imagelabels.mat", {"labels": np.array([[77, 1, 1, 102, 52, 77]], dtype=float)})
    ids = {"trnid": [3, 1], "valid": [2, 6], "tstid": [5, 4]}
    savemat(base / "setid.mat", {k: np.array([v], dtype=float) for k, v in ids.items()})
    return root


def pets(root: Path) -> Path:
    """images/ and annotations/{trainval,test}.txt ("<image> <class id> <species> <breed id>")."""
    base = root / "oxford-iiit-pet"
    train = ["Abyssinian_100 1 1 1", "american_bulldog_10 2 2 1", "Sphynx_3 34 1 12"]
    test = ["yorkshire_terrier_190 37 2 25", "Abyssinian_1 1 1 1"]
    _lines(base / "annotations" / "trainval.txt", train)
    _lines(base / "annotations" / "test.txt", test)
    for line in train + test:
        image_file(base / "images" / f"{line.split()[0]}.jpg")
    return root


def dtd(root: Path) -> Path:
    """dtd-r1.0.1 extracted where torchvision puts it (dtd/dtd/): images/<class>/, labels/<split><n>.txt."""
    base = root / "dtd" / "dtd"
    splits = {
        "train1.txt": ["banded/banded_0002.jpg", "zigzagged/zigzagged_0010.jpg"],
        "val1.txt": ["banded/banded_0004.jpg"],
        "test1.txt": ["zigzagged/zigzagged_0011.jpg"],
        "train2.txt": ["banded/banded_0004.jpg"],  # split 2: not read
    }
    for name, lines in splits.items():
        _lines(base / "labels" / name, lines)
        for line in lines:
            image_file(base / "images" / line)
    return root


def food(root: Path) -> Path:
    """food-101/: images/<class>/<id>.jpg and meta/ (classes.txt; train.txt, test.txt without extensions)."""
    base = root / "food-101"
    _lines(base / "meta" / "classes.txt", ["apple_pie", "waffles"])
    _lines(base / "meta" / "train.txt", ["apple_pie/1005649", "waffles/100"])
    _lines(base / "meta" / "test.txt", ["apple_pie/101"])
    for line in ("apple_pie/1005649", "waffles/100", "apple_pie/101"):
        image_file(base / "images" / f"{line}.jpg")
    return root


def sun397(root: Path) -> Path:
    """SUN397/ (letter / class [/ sub-class] folders, ClassName.txt) and Partitions.zip beside it."""
    files = [
        "/a/abbey/sun_aaa.jpg",
        "/b/bakery/shop/sun_ccc.jpg",
        "/a/apartment_building/outdoor/sun_bbb.jpg",
    ]
    _lines(root / "SUN397" / "ClassName.txt", ["/a/abbey", "/a/apartment_building/outdoor", "/b/bakery/shop"])
    for line in files:
        image_file(root / "SUN397" / line.lstrip("/"))
    _lines(
        root / "Partitions" / "ClassName.txt", ["/a/abbey", "/a/apartment_building/outdoor", "/b/bakery/shop"]
    )
    _lines(root / "Partitions" / "Training_01.txt", files[:2])
    _lines(root / "Partitions" / "Testing_01.txt", files[2:])
    _lines(root / "Partitions" / "Training_02.txt", files[2:])  # another partition: not read
    return root


def caltech(root: Path) -> Path:
    """caltech-101.zip extracted (torchvision's caltech101/): 101_ObjectCategories/<class>/image_<n>.jpg."""
    jpeg = image_file(root / "sample.jpg").read_bytes()
    for name, count in (("BACKGROUND_Google", 31), ("Faces_easy", 32), ("car_side", 30)):
        folder = root / "caltech101" / "101_ObjectCategories" / name
        folder.mkdir(parents=True)
        for i in range(1, count + 1):
            (folder / f"image_{i:04d}.jpg").write_bytes(jpeg)
    (root / "sample.jpg").unlink()
    return root


def eurosat(root: Path) -> Path:
    """EuroSAT.zip extracted: 2750/<Class>/<Class>_<n>.jpg."""
    for name in ("AnnualCrop/AnnualCrop_1.jpg", "SeaLake/SeaLake_7.jpg", "SeaLake/SeaLake_8.jpg"):
        image_file(root / "2750" / name)
    return root


CIFAR10_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def _batch(labels: list[int], colours: list[tuple[int, int, int]], key: str = "labels") -> dict:
    """A CIFAR batch: `data` N x 3072 uint8 (the red, then green, then blue 32 x 32 plane of each image)."""
    planes = np.stack([np.repeat(np.array(c, dtype=np.uint8), 1024) for c in colours])
    return {"batch_label": "tiny", key: labels, "data": planes, "filenames": [f"img_{i}.png" for i in labels]}


def _pickle(path: Path, value: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(value, protocol=4))


def cifar10(root: Path) -> Path:
    base = root / "cifar-10-batches-py"
    _pickle(base / "batches.meta", {"label_names": CIFAR10_NAMES, "num_vis": 3072, "num_cases_per_batch": 1})
    for n, label in enumerate((0, 9, 3, 3, 8), start=1):
        _pickle(base / f"data_batch_{n}", _batch([label], [(255, 0, 0)]))
    _pickle(base / "test_batch", _batch([6, 1], [(0, 0, 255), (0, 255, 0)]))
    return root


def cifar100(root: Path) -> Path:
    """cifar-100-python/ with a meta of four hand-picked fine names (labels index them, not the 100)."""
    base = root / "cifar-100-python"
    names = ["apple", "aquarium_fish", "maple_tree", "worm"]
    _pickle(base / "meta", {"fine_label_names": names, "coarse_label_names": ["fruit_and_vegetables"]})
    _pickle(base / "train", _batch([2, 0], [(1, 2, 3), (4, 5, 6)], "fine_labels"))
    _pickle(base / "test", _batch([1, 3], [(1, 2, 3), (4, 5, 6)], "fine_labels"))
    return root


def _idx(path: Path, array: np.ndarray) -> None:
    """LeCun's idx format: 0, 0, type 0x08 (unsigned byte), the number of dimensions, big-endian sizes."""
    data = bytes([0, 0, 8, array.ndim]) + np.asarray(array.shape, dtype=">i4").tobytes() + array.tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)


def mnist(root: Path) -> Path:
    """The four idx files (train gzipped as published, test already unpacked) in torchvision's MNIST/raw/."""
    base = root / "MNIST" / "raw"
    train = np.zeros((3, 28, 28), dtype=np.uint8)
    train[0, 0, 0] = 255
    _idx(base / "train-images-idx3-ubyte.gz", train)
    _idx(base / "train-labels-idx1-ubyte.gz", np.array([5, 0, 4], dtype=np.uint8))
    _idx(base / "t10k-images-idx3-ubyte", np.zeros((2, 28, 28), dtype=np.uint8))
    _idx(base / "t10k-labels-idx1-ubyte", np.array([7, 2], dtype=np.uint8))
    return root


UCF_CLIPS = {
    "ApplyEyeMakeup/v_ApplyEyeMakeup_g08_c01.avi": 40,
    "YoYo/v_YoYo_g25_c05.avi": 120,
    "HandstandPushups/v_HandStandPushups_g01_c01.avi": 200,  # the folder and file spell it differently
}


def ucf101(root: Path) -> Path:
    """UCF101.rar's UCF-101/<Class>/<clip>.avi and the RecognitionTask zip's ucfTrainTestlist/."""
    for clip, red in UCF_CLIPS.items():
        frames = [Image.new("RGB", (32, 24), (red, 10 * i, 0)) for i in range(5)]  # middle: frame 2
        (root / "UCF-101" / clip).parent.mkdir(parents=True, exist_ok=True)
        (root / "UCF-101" / clip).write_bytes(mjpeg_avi(frames))
    lists = root / "ucfTrainTestlist"
    _lines(lists / "classInd.txt", ["1 ApplyEyeMakeup", "37 HandstandPushups", "101 YoYo"])
    _lines(
        lists / "trainlist01.txt",
        ["ApplyEyeMakeup/v_ApplyEyeMakeup_g08_c01.avi 1", "YoYo/v_YoYo_g25_c05.avi 101"],
    )
    _lines(lists / "testlist01.txt", ["HandstandPushups/v_HandStandPushups_g01_c01.avi"])
    _lines(lists / "testlist02.txt", ["YoYo/v_YoYo_g25_c05.avi"])  # split 2: not read
    return root


# -- each layout read with hand-written labels, class names and counts ---------------------------------------


def test_flowers102_from_its_mat_files(tmp_path):
    root = flowers(tmp_path)
    train, counts = load_benchmark("flowers", str(root), "train")
    assert row_class_names(train) == ["passion flower", "pink primrose"]  # ids 1, 3: classes 77, 1
    assert train["key"] == ["image_00001.jpg", "image_00003.jpg"]
    assert _official(counts) == (2, 1_020, 2, 102) and train.features["label"].num_classes == 102
    val, _ = load_benchmark("flowers", f"flowers:{root}", "val")
    assert row_class_names(val) == ["pink primrose", "passion flower"]  # ids 2, 6
    test, counts = load_benchmark("flowers", str(root), "test")
    assert row_class_names(test) == ["blackberry lily", "wild pansy"]  # ids 4, 5: classes 102, 52
    assert counts.official_images == 6_149
    validate_row(test[0])


def test_oxford_pets_breed_from_the_file_name(tmp_path):
    root = pets(tmp_path)
    train, counts = load_benchmark("pets", str(root), "trainval")
    assert row_class_names(train) == ["Abyssinian", "american bulldog", "Sphynx"]
    assert _official(counts) == (3, 3_680, 3, 37)
    test, counts = load_benchmark("pets", str(root), "test")
    assert row_class_names(test) == ["yorkshire terrier", "Abyssinian"] and counts.official_images == 3_669


def test_dtd_reads_split_one(tmp_path):
    root = dtd(tmp_path)
    expected = {"train": ["banded", "zigzagged"], "validation": ["banded"], "test": ["zigzagged"]}
    for split, names in expected.items():
        dataset, counts = load_benchmark("dtd", str(root), split)
        assert row_class_names(dataset) == names and counts.official_images == 1_880
    assert load_benchmark("dtd", str(root), "train")[0]["key"] == ["banded_0002.jpg", "zigzagged_0010.jpg"]


def test_food101_meta_lists(tmp_path):
    root = food(tmp_path)
    train, counts = load_benchmark("food101", str(root), "train")
    assert row_class_names(train) == ["apple pie", "waffles"] and _official(counts) == (2, 75_750, 2, 101)
    test, counts = load_benchmark("food101", str(root), "test")
    assert row_class_names(test) == ["apple pie"] and counts.official_images == 25_250


def test_sun397_partition_one(tmp_path):
    root = sun397(tmp_path)
    train, counts = load_benchmark("sun397", str(root), "train")
    assert row_class_names(train) == ["abbey", "bakery shop"] and _official(counts) == (2, 19_850, 2, 397)
    test, _ = load_benchmark("sun397", str(root / "SUN397"), "test")
    assert row_class_names(test) == ["apartment building outdoor"]
    shutil.rmtree(root / "Partitions")
    with pytest.raises(
        UserError, match=r"no Training_01.txt / Testing_01.txt \(the publisher's Partitions.zip\)"
    ):
        load_benchmark("sun397", str(root), "train")


def test_caltech101_thirty_a_class_for_train(tmp_path):
    root = caltech(tmp_path)
    train, counts = load_benchmark("caltech101", str(root), "train")
    test, test_counts = load_benchmark("caltech101", str(root), "test")
    assert _official(counts) == (90, 3_060, 3, 102)  # 30 of each class
    assert _official(test_counts) == (3, 6_084, 2, 102)  # the rest: 1 background, 2 faces, 0 cars
    assert sorted(set(row_class_names(train))) == ["background", "centered face", "side of a car"]
    assert row_class_names(test) == ["background", "centered face", "centered face"]
    keys = lambda d: [f"{n}/{k}" for n, k in zip(row_class_names(d), d["key"])]  # noqa: E731
    assert not set(keys(train)) & set(keys(test)) and len(set(keys(train)) | set(keys(test))) == 93
    shutil.rmtree(root / "caltech101" / "101_ObjectCategories" / "car_side")  # a class's draw is its own
    assert keys(load_benchmark("caltech101", str(root), "test")[0]) == keys(test)


def test_eurosat_archive_is_the_test_set(tmp_path):
    root = eurosat(tmp_path)
    test, counts = load_benchmark("eurosat", str(root), "test")
    assert row_class_names(test) == ["annual crop land", "lake or sea", "lake or sea"]
    assert _official(counts) == (3, 27_000, 2, 10)
    with pytest.raises(UserError, match="EuroSAT's publisher defines no split") as error:
        load_benchmark("eurosat", str(root), "train")
    assert len(str(error.value).splitlines()) == 1


def test_cifar_python_pickles(tmp_path):
    train, counts = load_benchmark("cifar10", str(cifar10(tmp_path)), "train")
    assert row_class_names(train) == ["airplane", "truck", "cat", "cat", "ship"]
    assert _official(counts) == (5, 50_000, 4, 10)
    test, _ = load_benchmark("cifar10", str(tmp_path), "test")
    assert row_class_names(test) == ["frog", "automobile"] and test["key"] == ["img_6.png", "img_1.png"]
    assert test[0]["image"].size == (32, 32) and test[0]["image"].getpixel((5, 5)) == (0, 0, 255)
    assert test[1]["image"].getpixel((31, 31)) == (0, 255, 0)  # planes: red, green, blue
    fine, counts = load_benchmark("cifar100", str(cifar100(tmp_path / "c100")), "train")
    assert row_class_names(fine) == ["maple tree", "apple"] and fine["label"] == [47, 0]  # by name, not row
    assert _official(counts) == (2, 50_000, 2, 100)
    assert row_class_names(load_benchmark("cifar100", str(tmp_path / "c100"), "test")[0]) == [
        "aquarium fish",
        "worm",
    ]


def test_cifar_pickles_run_no_code(tmp_path):
    class Exploit:
        def __reduce__(self):
            return (print, ("pwned",))

    _pickle(tmp_path / "cifar-10-batches-py" / "batches.meta", {"label_names": Exploit()})
    _pickle(tmp_path / "cifar-10-batches-py" / "test_batch", {})
    with pytest.raises(pickle.UnpicklingError, match="refusing to load builtins.print"):
        load_benchmark("cifar10", str(tmp_path), "test")


def test_mnist_idx_files(tmp_path):
    root = mnist(tmp_path)
    train, counts = load_benchmark("mnist", str(root), "train")
    assert row_class_names(train) == ["5", "0", "4"] and _official(counts) == (3, 60_000, 3, 10)
    assert train[0]["image"].getpixel((0, 0)) == (255, 255, 255) and train[0]["image"].size == (28, 28)
    test, counts = load_benchmark("mnist", str(root), "test")
    assert row_class_names(test) == ["7", "2"] and counts.official_images == 10_000


def test_ucf101_middle_frames_of_split_one(tmp_path):
    pytest.importorskip("decord")
    root = ucf101(tmp_path)
    train, counts = load_benchmark("ucf101", str(root), "train")
    assert row_class_names(train) == ["Apply Eye Makeup", "Yo Yo"] and _official(counts) == (2, 9_537, 2, 101)
    frame = train[1]["image"]
    assert frame.size == (32, 24) and abs(frame.getpixel((16, 12))[0] - 120) <= 3  # frame 2 of 5
    assert abs(frame.getpixel((16, 12))[1] - 20) <= 3
    test, counts = load_benchmark("ucf101", str(root / "UCF-101"), "test")
    assert row_class_names(test) == ["Hand Stand Pushups"] and counts.official_images == 3_783
    validate_row(test[0])


# -- partial copies: refused in one line, scored with --allow-partial ----------------------------------------


@pytest.mark.parametrize(
    ("key", "build", "split", "described"),
    [
        ("flowers", flowers, "test", "2 of 6,149 images, 2 of 102 classes"),
        ("pets", pets, "test", "2 of 3,669 images, 2 of 37 classes"),
        ("dtd", dtd, "test", "1 of 1,880 images, 1 of 47 classes"),
        ("food101", food, "test", "1 of 25,250 images, 1 of 101 classes"),
        ("sun397", sun397, "test", "1 of 19,850 images, 1 of 397 classes"),
        ("caltech101", caltech, "train", "90 of 3,060 images, 3 of 102 classes"),
        ("eurosat", eurosat, "test", "3 of 27,000 images, 2 of 10 classes"),
        ("cifar10", cifar10, "test", "2 of 10,000 images, 2 of 10 classes"),
        ("cifar100", cifar100, "test", "2 of 10,000 images, 2 of 100 classes"),
        ("mnist", mnist, "test", "2 of 10,000 images, 2 of 10 classes"),
    ],
)
def test_a_partial_copy_is_refused_or_scored_marked(tmp_path, key, build, split, described):
    name = f"{key}:{build(tmp_path)}"
    with pytest.raises(UserError, match="give the whole set, or pass --allow-partial") as error:
        load_counted_dataset(name, split=split)
    assert len(str(error.value).splitlines()) == 1 and described in str(error.value)
    dataset, record = load_counted_dataset(
        name, split=split, allow_partial=True
    )  # what `--allow-partial` does
    assert (
        record["complete"] is False and record["described"] == described and len(dataset) == record["images"]
    )


# -- a publisher's layout given as an image folder is read as its benchmark ----------------------------------


def test_annotated_layouts_given_as_image_folders_read_as_their_benchmark(tmp_path):
    """`imagefolder:` or a bare path of DTD would read all its images as one train split, and WILDS' FMoW as
    one class "images": both are read as their benchmark instead."""
    root = dtd(tmp_path / "textures")
    for name in (f"imagefolder:{root}", str(root)):
        assert row_class_names(load_dataset_by_name(name, split="train")) == ["banded", "zigzagged"]
    scored, record = load_counted_dataset(f"imagefolder:{root / 'dtd'}", split="test", allow_partial=True)
    assert row_class_names(scored) == ["zigzagged"] and record["official_images"] == 1_880  # hf-vrl eval's
    caltech_tree = caltech(tmp_path / "c") / "caltech101" / "101_ObjectCategories"  # a plain class tree
    assert (
        len(load_dataset_by_name(f"imagefolder:{caltech_tree}", split="train")) == 93
    )  # stays an image folder
