import tarfile
import warnings

import numpy as np
import pytest
import torch
from data_fixtures import (
    CORRUPT,
    MIXED_KEPT,
    MIXED_SKIPPED,
    add_member,
    encode,
    good_images,
    noise,
    write_plain_shard,
)
from datasets import IterableDataset
from datasets.distributed import split_dataset_by_node

from hf_vrl.data.images import SampleFilter, SkippedSampleWarning
from hf_vrl.data.schema import validate_row
from hf_vrl.data.webdataset import load_image_text, resolve_files

pytestmark = pytest.mark.filterwarnings("ignore::hf_vrl.data.images.SkippedSampleWarning")


def test_mixed_shard_keeps_the_good_and_counts_every_bad_kind(mixed_shard):
    sample_filter = SampleFilter("test")
    ds = load_image_text(str(mixed_shard), sample_filter=sample_filter)
    assert isinstance(ds, IterableDataset)
    rows = list(ds)
    assert len(rows) == MIXED_KEPT == sample_filter.kept
    assert dict(sample_filter.counts) == MIXED_SKIPPED
    sizes = [size for _, size in good_images().values()]
    for row, size in zip(rows, sizes):
        validate_row(row)
        assert row["image"].size == size and row["label"] == -1
    assert rows[-1]["caption"] == "caption from the json"
    assert [r["key"] for r in rows] == [f"{i:09d}" for i in range(9)]


def test_warns_once_per_kind(mixed_shard):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        list(load_image_text(str(mixed_shard)))
    kinds = [str(w.message).split("(")[1].split(")")[0] for w in caught if w.category is SkippedSampleWarning]
    assert sorted(kinds) == sorted(MIXED_SKIPPED)


def test_truncated_shard_keeps_what_was_read_and_counts_it(tmp_path):
    path = write_plain_shard(tmp_path / "t.tar", 0, 6, size=(64, 64))
    data = path.read_bytes()
    with tarfile.open(path) as tar:
        offsets = [m.offset for m in tar.getmembers()]
    path.write_bytes(data[: offsets[8] + 512 + 100])  # cut inside the 5th sample's JPEG data
    sample_filter = SampleFilter("trunc")
    rows = list(load_image_text(str(path), sample_filter=sample_filter))
    assert [r["caption"] for r in rows] == [f"caption {i}" for i in range(4)]
    assert sample_filter.counts["truncated_shard"] == 1


def test_parquet_and_tsv_with_relative_paths(image_table):
    for source in (image_table["parquet"], image_table["tsv"]):
        sample_filter = SampleFilter("table")
        rows = list(load_image_text(str(source), sample_filter=sample_filter))
        assert [r["caption"] for r in rows] == [f"picture number {i}" for i in range(4)]
        assert all(r["image"].size == (32, 24) and r["image"].mode == "RGB" for r in rows)
        assert dict(sample_filter.counts) == {"corrupt_image": 1, "missing_image": 1, "empty_caption": 1}


def test_table_column_errors_are_raised_at_load(image_table, tmp_path):
    with pytest.raises(KeyError, match="no caption column 'nope'"):
        load_image_text(str(image_table["parquet"]), caption_column="nope")
    odd = tmp_path / "odd.csv"
    odd.write_text("filepath,words\nimages/0.jpg,hello\n")
    with pytest.raises(KeyError, match="pass caption_column="):
        load_image_text(str(odd))
    rows = list(load_image_text(str(odd), caption_column="words"))
    assert rows == []  # images/0.jpg does not exist next to odd.csv: skipped, not raised


def test_resolve_files(tmp_path):
    for i in range(3):
        write_plain_shard(tmp_path / f"s-{i:03d}.tar", i * 2, 2)
    assert [p.rsplit("/", 1)[1] for p in resolve_files(str(tmp_path / "s-*.tar"))] == [
        f"s-{i:03d}.tar" for i in range(3)
    ]
    assert len(resolve_files(tmp_path)) == 3
    with pytest.raises(FileNotFoundError, match="no data files match"):
        resolve_files(str(tmp_path / "nothing-*.tar"))


def _keys(ds):
    return [row["key"] for row in ds]


@pytest.mark.parametrize("n_shards", [4, 3])  # whole shards per rank / every world_size-th sample
def test_split_dataset_by_node_gives_disjoint_covering_parts(tmp_path, n_shards):
    for i in range(n_shards):
        write_plain_shard(tmp_path / f"s-{i:03d}.tar", i * 5, 5)
    pattern = str(tmp_path / "s-*.tar")
    everything = set(_keys(load_image_text(pattern)))
    parts = [set(_keys(load_image_text(pattern, rank=r, world_size=2))) for r in range(2)]
    assert not parts[0] & parts[1] and parts[0] | parts[1] == everything and len(everything) == 5 * n_shards
    again = [
        set(_keys(split_dataset_by_node(load_image_text(pattern), rank=r, world_size=2))) for r in range(2)
    ]
    assert again == parts


def test_shuffle_is_seeded_and_epoch_dependent(tmp_path):
    for i in range(2):
        write_plain_shard(tmp_path / f"s-{i:03d}.tar", i * 6, 6)
    pattern = str(tmp_path / "s-*.tar")
    plain = _keys(load_image_text(pattern))
    first = _keys(load_image_text(pattern, shuffle_buffer=4, seed=1))
    assert first == _keys(load_image_text(pattern, shuffle_buffer=4, seed=1))
    assert first != plain and sorted(first) == sorted(plain)
    ds = load_image_text(pattern, shuffle_buffer=4, seed=1)
    ds.set_epoch(1)
    assert _keys(ds) != first


def test_dataloader_workers_split_shards(tmp_path):
    for i in range(2):
        write_plain_shard(tmp_path / f"s-{i:03d}.tar", i * 4, 4)
    ds = load_image_text(str(tmp_path / "s-*.tar"))
    loader = torch.utils.data.DataLoader(
        ds, batch_size=3, num_workers=2, collate_fn=lambda rows: [r["key"] for r in rows]
    )
    keys = [k for batch in loader for k in batch]
    assert sorted(keys) == [f"{i:06d}" for i in range(8)]


def test_cls_labels_and_reduced_scale_decoding(tmp_path):
    with tarfile.open(tmp_path / "cls.tar", "w") as tar:
        for i in range(3):
            add_member(tar, f"{i:04d}.jpg", encode(noise((256, 128), seed=i), "JPEG"))
            add_member(tar, f"{i:04d}.txt", b"a caption")
            add_member(tar, f"{i:04d}.cls", str(i * 2).encode())
    rows = list(load_image_text(str(tmp_path / "cls.tar"), decode_size=32))
    assert [r["label"] for r in rows] == [0, 2, 4]
    assert all(r["image"].size == (64, 32) for r in rows)  # JPEG draft: 1/4 keeps the short side >= 32


def test_brace_patterns_expand_like_webdataset(tmp_path):
    from hf_vrl.data.webdataset import expand_braces, resolve_files

    assert expand_braces("cc3m-{00008..00011}.tar") == [f"cc3m-{i:05d}.tar" for i in range(8, 12)]
    assert expand_braces("{train,val}-{0..1}.tar") == ["train-0.tar", "train-1.tar", "val-0.tar", "val-1.tar"]
    assert expand_braces("plain.tar") == ["plain.tar"]
    with pytest.raises(ValueError, match="two integers"):
        expand_braces("x-{a..b}.tar")
    for i in range(3):
        (tmp_path / f"{i:05d}.tar").write_bytes(b"")
    assert resolve_files(str(tmp_path / "{00000..00002}.tar")) == [
        str(tmp_path / f"{i:05d}.tar") for i in range(3)
    ]
    with pytest.raises(FileNotFoundError):
        resolve_files(str(tmp_path / "{00000..00003}.tar"))


@pytest.mark.parametrize("inside", [100, 0])
def test_a_shard_cut_inside_or_before_a_header_is_counted(tmp_path, inside):
    """tarfile reads a shard cut inside a member's header (or just before it) as a clean end: still a cut."""
    path = write_plain_shard(tmp_path / "t.tar", 0, 6, size=(64, 64))
    data = path.read_bytes()
    with tarfile.open(path) as tar:
        offsets = [m.offset for m in tar.getmembers()]
    path.write_bytes(data[: offsets[8] + inside])  # the 5th sample's first header
    sample_filter = SampleFilter("cut")
    rows = list(load_image_text(str(path), sample_filter=sample_filter))
    assert len(rows) <= 4 and sample_filter.counts["truncated_shard"] == 1


def test_a_file_that_is_no_image_is_a_corrupt_image_not_a_truncated_one():
    """What crawls save as .jpg when the server sent something else (an error page, random bytes): no image
    format's signature, so nothing was cut; a JPEG cut inside its header is test_data_damaged's case."""
    from hf_vrl.data.images import ImageDecodeError, decode_image

    for data in (
        b"<!DOCTYPE html><html><body>404 Not Found</body></html>",
        np.random.default_rng(0).bytes(300),
    ):
        with pytest.raises(ImageDecodeError) as info:
            decode_image(data)
        assert info.value.kind == "corrupt_image"


def test_brace_patterns_steps_nesting_and_literal_braces():
    from hf_vrl.data.webdataset import expand_braces

    assert expand_braces("s-{0..10..5}.tar") == ["s-0.tar", "s-5.tar", "s-10.tar"]
    assert expand_braces("{a,b{1..2}}.tar") == ["a.tar", "b1.tar", "b2.tar"]  # nested groups, no repeats
    assert expand_braces("odd{dir/x.tar") == ["odd{dir/x.tar"]  # unbalanced: a literal path
    assert expand_braces(r"C:\shards\{0..1}.tar") == [r"C:\shards\0.tar", r"C:\shards\1.tar"]
    with pytest.raises(ValueError, match="two integers"):
        expand_braces("x-{1..c..2}.tar")


def _builder_rows(files):
    """What datasets' own `webdataset` builder streams from `files` (explicit features, images kept as
    bytes): (its rows up to the error that ends the run, that error or None)."""
    from datasets import Features, Image, Value, load_dataset

    features = Features(
        {
            "jpg": Image(decode=False),
            "txt": Value("string"),
            "cls": Value("int64"),
            "__key__": Value("string"),
            "__url__": Value("string"),
        }
    )
    ds = load_dataset(
        "webdataset",
        data_files={"train": [str(f) for f in files]},
        split="train",
        streaming=True,
        features=features,
    )
    rows = []
    try:
        for row in ds:
            rows.append(row)
    except Exception as error:  # the point: which error ends the builder's run
        return rows, error
    return rows, None


@pytest.mark.parametrize("cut", ["inside_data", "at_header"])
def test_datasets_builder_loses_what_a_truncated_shard_costs_us_nothing_of(tmp_path, cut):
    """A shard cut short, then a good shard: the builder's run ends at a cut inside a member (the good shard
    is lost) and passes a cut at a header quietly; ours counts the cut and goes on to the good shard (at a
    header cut it drops the sample before the cut, which may have lost members)."""
    cut_shard = write_plain_shard(tmp_path / "s-000.tar", 0, 6, size=(64, 64))
    data = cut_shard.read_bytes()
    with tarfile.open(cut_shard) as tar:
        fifth = [m.offset for m in tar.getmembers()][8]  # the 5th sample's first header
    cut_shard.write_bytes(data[: fifth + (512 + 100 if cut == "inside_data" else 100)])
    good_shard = write_plain_shard(tmp_path / "s-001.tar", 6, 6)
    rows, error = _builder_rows([cut_shard, good_shard])
    if cut == "inside_data":
        assert isinstance(error, tarfile.ReadError)
        assert [r["__key__"] for r in rows] == [f"{i:06d}" for i in range(4)]  # s-001.tar never read
    else:
        assert error is None and len(rows) == 10  # the cut goes unnoticed
    sample_filter = SampleFilter("cut")
    ours = _keys(load_image_text([str(cut_shard), str(good_shard)], sample_filter=sample_filter))
    complete = 4 if cut == "inside_data" else 3
    assert ours == [f"{i:06d}" for i in range(complete)] + [f"{i:06d}" for i in range(6, 12)]
    assert sample_filter.counts["truncated_shard"] == 1


@pytest.mark.parametrize(
    "member, data, error_type, kept",
    [
        ("txt", b"\xff\xfe not utf-8", UnicodeDecodeError, ["0", "2"]),  # ours: one undecodable_caption skip
        ("cls", b"n/a", ValueError, ["0", "1", "2"]),  # ours: label -1
    ],
)
def test_datasets_builder_ends_the_run_at_one_undecodable_member(tmp_path, member, data, error_type, kept):
    """The builder decodes .txt (UTF-8) and .cls (int) inside its iterator: one bad member ends the run."""
    path = tmp_path / "s.tar"
    with tarfile.open(path, "w") as tar:
        for i in range(3):
            fields = {"jpg": encode(noise(seed=i), "JPEG"), "txt": f"caption {i}".encode(), "cls": b"3"}
            if i == 1:
                fields[member] = data
            for ext, payload in fields.items():
                add_member(tar, f"{i}.{ext}", payload)
    rows, error = _builder_rows([path])
    assert isinstance(error, error_type) and [r["__key__"] for r in rows] == ["0"]
    assert _keys(load_image_text(str(path))) == kept


def test_datasets_builder_keeps_a_missing_caption_and_a_corrupt_jpeg_with_explicit_features(tmp_path):
    """What the builder does handle (explicit features, undecoded images): None for a missing caption, the
    corrupt JPEG's bytes kept. Ours skips and counts both after the shuffle."""
    path = tmp_path / "s.tar"
    with tarfile.open(path, "w") as tar:
        add_member(tar, "0.jpg", encode(noise(seed=0), "JPEG"))
        add_member(tar, "1.jpg", CORRUPT)
        add_member(tar, "1.txt", b"a corrupt image")
    rows, error = _builder_rows([path])
    assert error is None and [r["txt"] for r in rows] == [None, "a corrupt image"]
    assert rows[1]["jpg"]["bytes"] == CORRUPT
    sample_filter = SampleFilter("builder")
    assert list(load_image_text(str(path), sample_filter=sample_filter)) == []
    assert dict(sample_filter.counts) == {"missing_caption": 1, "corrupt_image": 1}
