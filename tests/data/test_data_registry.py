import datasets
import pytest
from data_fixtures import MIXED_KEPT, noise

from hf_vrl.data.offline import DatasetUnavailableError
from hf_vrl.data.registry import load_dataset_by_name
from hf_vrl.data.schema import validate_row

pytestmark = pytest.mark.filterwarnings("ignore::hf_vrl.data.images.SkippedSampleWarning")


@pytest.mark.parametrize(
    ("name", "classes"), [("shapes", 5), ("digits", 10), ("fashion_mnist", 10), ("animal_mnist", 10)]
)
def test_named_offline_sets(name, classes):
    if name == "animal_mnist":
        pytest.importorskip("animal_mnist.data")
    try:
        ds = load_dataset_by_name(name, "test", limit=12, image_size=24)
    except DatasetUnavailableError as error:  # Fashion-MNIST needs apt-get as root at set-up
        pytest.skip(str(error))
    assert isinstance(ds, datasets.Dataset) and len(ds) == 12
    assert len(ds.features["label"].names) == classes
    validate_row(ds[0])
    assert ds[0]["image"].size == (24, 24)
    streamed = load_dataset_by_name(name, "test", limit=12, streaming=True)
    assert isinstance(streamed, datasets.IterableDataset) and len(list(streamed)) == 12


def test_default_sizes_when_image_size_is_none():
    assert load_dataset_by_name("shapes", "test", limit=2, image_size=None)[0]["image"].size == (32, 32)
    assert len(load_dataset_by_name("shapes", "test")) == 500


def test_prefixes_and_bare_paths(mixed_shard, cub_root, tmp_path):
    for name in (f"webdataset:{mixed_shard}", str(mixed_shard), f"webdataset:{mixed_shard.parent}/*.tar"):
        ds = load_dataset_by_name(name, "train")
        assert isinstance(ds, datasets.IterableDataset) and len(list(ds)) == MIXED_KEPT
    assert len(list(load_dataset_by_name(str(mixed_shard), limit=4))) == 4
    for name in (f"cub:{cub_root}", str(cub_root)):
        ds = load_dataset_by_name(name, "test", bbox_crop=True)
        assert len(ds) == 6 and ds[0]["image"].size == (30, 20)
    with pytest.raises(ValueError, match="drop streaming=True"):
        load_dataset_by_name(f"cub:{cub_root}", streaming=True)
    for sub in ("Blue_Things", "Red_Things"):
        folder = tmp_path / "folder" / sub
        folder.mkdir(parents=True)
        noise((16, 16)).save(folder / "a.png")
    for name in (f"imagefolder:{folder.parent}", str(folder.parent)):
        ds = load_dataset_by_name(name, cache_dir=str(tmp_path / "cache"))
        assert ds.features["label"].names == ["blue things", "red things"] and ds[1]["caption"].endswith(
            "red things."
        )
    datasets.Dataset.from_dict({"image": [str(folder / "a.png")], "text": ["a red thing"]}).cast_column(
        "image", datasets.Image()
    ).save_to_disk(tmp_path / "saved")
    for name in (f"hf:{tmp_path / 'saved'}", str(tmp_path / "saved")):
        row = load_dataset_by_name(name)[0]
        assert row["caption"] == "a red thing" and row["label"] == -1


def test_unknown_name_is_explained():
    with pytest.raises(FileNotFoundError, match="not a registered name"):
        load_dataset_by_name("cifar_ten")
    with pytest.raises(ValueError, match="shapes splits"):
        load_dataset_by_name("shapes", "validation")
