"""Hub datasets and shard folders streamed for training (`hf_vrl.data.registry`, `webdataset`, `splits`):
local Hub-cache copies of `pixparse/cc3m-wds` and `timm/imagenet-1k-wds` in their published structure, read
offline through huggingface_hub; bad samples skipped and counted, train and validation never mixed, shard
URLs, bounded tar members, data that trains nothing refused."""

from __future__ import annotations

import io
import subprocess
import tarfile
import tracemalloc
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasets import IterableDataset
from datasets.distributed import split_dataset_by_node
from hub_fixtures import (
    SHA,
    cc3m_wds_files,
    hub_cache_repo,
    imagenet_wds_files,
    jpeg,
    tar_bytes,
    write_files,
)

from hf_vrl.data.images import SampleFilter
from hf_vrl.data.registry import check_dataset_name, is_streamed, load_dataset_by_name
from hf_vrl.data.webdataset import MAX_MEMBER_BYTES, OVERSIZED_MEMBER, iter_tar, load_image_text
from hf_vrl.errors import UserError

# pixparse/cc3m-wds in miniature: train shards of 5 and 4 samples (keys 0-8, key 1's caption not UTF-8),
# one validation shard of 3 (keys 9-11)
TRAIN_KEYS = [f"{k:09d}" for k in (0, 2, 3, 4, 5, 6, 7, 8)]
VALIDATION_KEYS = [f"{k:09d}" for k in (9, 10, 11)]


def keys(dataset) -> list[str]:
    return sorted(row["key"] for row in dataset)


@pytest.fixture
def cc3m_hub(hub_cache: Path) -> Path:
    return hub_cache_repo(hub_cache, "pixparse/cc3m-wds", cc3m_wds_files([5, 4], [3], bad_caption=True))


def test_a_hub_webdataset_streams_its_train_split_with_the_bad_caption_counted(cc3m_hub):
    counted = SampleFilter("cc3m")
    data = load_dataset_by_name("hf:pixparse/cc3m-wds", "train", sample_filter=counted)
    assert isinstance(data, IterableDataset) and is_streamed("hf:pixparse/cc3m-wds")
    assert keys(data) == TRAIN_KEYS
    assert counted.counts == {"undecodable_caption": 1}


@pytest.mark.parametrize(
    ("name", "split", "expected"),
    [
        ("hf:pixparse/cc3m-wds", "validation", VALIDATION_KEYS),
        ("hf:pixparse/cc3m-wds", "val", VALIDATION_KEYS),
        (f"hf:pixparse/cc3m-wds@{SHA}", "validation", VALIDATION_KEYS),
        ("hf://datasets/pixparse/cc3m-wds/cc3m-validation-*.tar", "train", VALIDATION_KEYS),  # as named
        ("hf:pixparse/cc3m-wds/cc3m-train-0001.tar", "train", TRAIN_KEYS[4:]),
        ("cc3m:hf:pixparse/cc3m-wds", "train", TRAIN_KEYS),
        ("webdataset:hf://datasets/pixparse/cc3m-wds/cc3m-train-*.tar", "train", TRAIN_KEYS),
    ],
)
def test_a_hub_repo_gives_each_split_its_own_shards(cc3m_hub, name, split, expected):
    assert keys(load_dataset_by_name(name, split)) == expected


@pytest.mark.parametrize("spelling", ["cc3m:{}", "{}", "webdataset:{}", "hf:{}"])
def test_a_local_pixparse_folder_never_mixes_train_and_validation(tmp_path, spelling):
    """The published layout on disk: 8 trainable of 9 training samples, 3 validation samples."""
    folder = write_files(tmp_path / "cc3m-wds", cc3m_wds_files([5, 4], [3], bad_caption=True))
    name = spelling.format(folder)
    assert keys(load_dataset_by_name(name, "train")) == TRAIN_KEYS
    assert keys(load_dataset_by_name(name, "validation")) == VALIDATION_KEYS
    with pytest.raises(UserError, match="no test split: its files are named for train, validation"):
        load_dataset_by_name(name, "test")


def test_each_process_reads_its_own_hub_shards(cc3m_hub):
    data = load_dataset_by_name("hf:pixparse/cc3m-wds", "train")
    shares = [keys(split_dataset_by_node(data, rank=rank, world_size=2)) for rank in (0, 1)]
    assert shares == [TRAIN_KEYS[:4], TRAIN_KEYS[4:]]  # one whole shard each


def test_split_folders_give_their_own_files(tmp_path):
    files = {"train/0.tar": cc3m_wds_files([2], [])["cc3m-train-0000.tar"]}
    files["test/0.tar"] = cc3m_wds_files([1], [])["cc3m-train-0000.tar"]
    folder = write_files(tmp_path / "mirror", files)
    assert len(list(load_dataset_by_name(f"webdataset:{folder}", "train"))) == 2
    assert len(list(load_dataset_by_name(f"webdataset:{folder}", "test"))) == 1


def test_imagenet_wds_repo_has_no_caption_and_is_refused_before_training(hub_cache):
    hub_cache_repo(hub_cache, "timm/imagenet-1k-wds", imagenet_wds_files([6, 6], [4]))
    for name in ("hf:timm/imagenet-1k-wds", "hf://datasets/timm/imagenet-1k-wds/imagenet1k-train-*.tar"):
        with pytest.raises(
            UserError, match="none of its first 12 samples .*missing_caption 12.*--caption-column"
        ):
            load_dataset_by_name(name, "train", stream_options={"require_trainable": True})


def test_columns_named_for_shards_read_json_fields_and_cls(hub_cache):
    hub_cache_repo(hub_cache, "timm/imagenet-1k-wds", imagenet_wds_files([6, 6], [4]))
    options = {"caption_column": "json:filename", "label_column": "cls", "require_trainable": True}
    rows = list(load_dataset_by_name("hf:timm/imagenet-1k-wds", "validation", stream_options=options))
    assert [row["label"] for row in rows] == [12 % 10, 13 % 10, 14 % 10, 15 % 10]
    assert rows[0]["caption"] == "n0144076_12.JPEG"
    options["label_column"] = "json:label"
    rows = list(load_dataset_by_name("hf:timm/imagenet-1k-wds", "validation", stream_options=options))
    assert [row["label"] for row in rows] == [2, 3, 4, 5]


def test_a_parquet_repo_streams_through_datasets_from_the_cache(hub_cache):
    table = pa.table(
        {
            "image": [{"bytes": jpeg(i), "path": None} for i in range(3)],
            "caption": ["one", "two", "three"],
        }
    )
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    files = {"data/train-00000-of-00001.parquet": buffer.getvalue(), "data/test-00000-of-00001.parquet": b""}
    hub_cache_repo(hub_cache, "someone/pairs", files)
    data = load_dataset_by_name("hf:someone/pairs", "train", streaming=True)
    assert isinstance(data, IterableDataset) and is_streamed("hf:someone/pairs", True)
    # a run's own way (streaming=None) streams it; map-style (DiVE's, CLUE's labelled sets) when asked
    assert isinstance(load_dataset_by_name("hf:someone/pairs", "train", streaming=None), IterableDataset)
    assert is_streamed("hf:someone/pairs", None) and not is_streamed("hf:someone/pairs")
    rows = list(data)
    assert [row["caption"] for row in rows] == ["one", "two", "three"] and rows[0]["image"].size == (48, 40)


def test_an_image_repo_streams_through_datasets_from_the_cache(hub_cache):
    files = {f"train/{i}.jpg": jpeg(i) for i in range(3)}
    lines = "".join(f'{{"file_name": "{i}.jpg", "text": "picture {i}"}}\n' for i in range(3))
    files["train/metadata.jsonl"] = lines.encode()
    hub_cache_repo(hub_cache, "someone/pictures", files)
    data = load_dataset_by_name("hf:someone/pictures", "train", streaming=True)
    assert isinstance(data, IterableDataset)
    assert sorted(row["caption"] for row in data) == ["picture 0", "picture 1", "picture 2"]


def test_a_repo_missing_offline_is_one_line_before_anything_is_read(hub_cache):
    for call in (check_dataset_name, lambda name: load_dataset_by_name(name, "train")):
        with pytest.raises(UserError) as raised:
            call("hf:pixparse/cc3m-wds")
        assert "\n" not in str(raised.value) and "not in the local Hub cache" in str(raised.value)


def test_shard_urls_are_shard_specs(cc3m_hub, tmp_path):
    resolve = "https://huggingface.co/datasets/pixparse/cc3m-wds/resolve/main/cc3m-validation-0000.tar"
    assert keys(load_dataset_by_name(f"webdataset:{resolve}", "train")) == VALIDATION_KEYS
    shard = cc3m_hub / "cc3m-validation-0000.tar"
    assert keys(load_dataset_by_name(f"pipe:cat {shard}", "train")) == VALIDATION_KEYS
    check_dataset_name(f"webdataset:{resolve}")


def test_a_failing_pipe_is_counted_as_a_truncated_shard():
    counted = SampleFilter("pipe")
    assert list(iter_tar("pipe:exit 3", counted)) == []
    assert counted.counts == {"truncated_shard": 1}


def test_an_oversized_member_is_skipped_unread_and_counted(tmp_path):
    shard = tmp_path / "big.tar"
    shard.write_bytes(
        tar_bytes([("a.jpg", jpeg(1)), ("a.txt", b"x" * 2048), ("b.jpg", jpeg(2)), ("b.txt", b"ok")])
    )
    counted = SampleFilter("big")
    samples = list(iter_tar(str(shard), counted, max_member_bytes=1024))
    assert [(s["key"], s["caption"]) for s in samples] == [("a", None), ("b", b"ok")]
    assert counted.counts == {OVERSIZED_MEMBER: 1}


def test_a_gzip_shard_streams_and_its_bomb_member_never_fills_memory(tmp_path):
    """A gzip shard (read streaming) holding a 96 MiB member of zeros (about 100 KB compressed) beside a
    good sample: the member is skipped unread; memory holds one decompressed chunk, never the member."""
    shard = tmp_path / "bomb.tar.gz"
    with tarfile.open(shard, "w:gz", compresslevel=1) as tar:
        for name, data in (("a.jpg", jpeg(1)), ("a.txt", b"a good caption")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo("b.jpg")
        info.size = 96 * 2**20
        tar.addfile(info, _Zeros(info.size))
    counted = SampleFilter("bomb")
    tracemalloc.start()
    try:
        samples = list(iter_tar(str(shard), counted))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert MAX_MEMBER_BYTES < 96 * 2**20 and peak < 48 * 2**20  # the decompressor's chunk, not the member
    assert [s["key"] for s in samples] == ["a", "b"] and counted.counts == {OVERSIZED_MEMBER: 1}
    assert len(list(load_image_text(str(shard)))) == 1  # .tar.gz is a shard


def test_a_sparse_member_is_not_read_whole(tmp_path):
    """GNU tar's sparse member of 12 GB (a few KB in the shard): skipped by its size, never read."""
    (tmp_path / "src").mkdir()
    with open(tmp_path / "src/x.jpg", "wb") as handle:
        handle.truncate(12 * 10**9)
    (tmp_path / "src/y.txt").write_text("caption")
    shard = tmp_path / "sparse.tar"
    subprocess.run(
        ["tar", "--sparse", "-cf", str(shard), "-C", str(tmp_path / "src"), "x.jpg", "y.txt"], check=True
    )
    assert shard.stat().st_size < 100_000
    counted = SampleFilter("sparse")
    samples = list(iter_tar(str(shard), counted))
    assert [s["key"] for s in samples] == ["x", "y"] and counted.counts == {OVERSIZED_MEMBER: 1}


class _Zeros(io.RawIOBase):
    """`size` zero bytes, produced as read (a member's data without holding it)."""

    def __init__(self, size: int):
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = min(len(buffer), self.left)
        buffer[:n] = bytes(n)
        self.left -= n
        return n


@pytest.mark.parametrize("kind", ["tar", "csv"])
def test_empty_data_is_refused_before_training(tmp_path, kind):
    path = tmp_path / ("empty.tar" if kind == "tar" else "empty.csv")
    if kind == "tar":
        path.write_bytes(tar_bytes([]))
    else:
        path.write_text("filepath,caption\n")
    with pytest.raises(UserError, match="holds no samples"):
        load_dataset_by_name(f"webdataset:{path}", "train", stream_options={"require_trainable": True})
