"""A run reads one commit of each Hub dataset, and its resume the same one (`hf_vrl.data.hub.pinned_commits`):
two snapshots of `pixparse/cc3m-wds` and of a parquet repo in a local Hub cache whose refs/main moves between
them, read offline through huggingface_hub and datasets; a recorded commit the cache lost is one line; a shard
the cache lacks in the middle of a stream is retried, then skipped and counted with one line naming it."""

from __future__ import annotations

import io
import logging
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hub_fixtures import SHA, cc3m_wds_files, cub_copy_files, hub_cache_repo, jpeg

from hf_vrl.data import hub, webdataset
from hf_vrl.data.hub import dataset_file, pinned_commits
from hf_vrl.data.images import SampleFilter
from hf_vrl.data.registry import load_dataset_by_name
from hf_vrl.errors import UserError

NEWER = "9c1f0e2d3b4a5968778695a4b3c2d1e0f9a8b7c6"  # a later commit of main
CC3M = "pixparse/cc3m-wds"


def keys(dataset) -> list[str]:
    return sorted(row["key"] for row in dataset)


def move_main(cache: Path, repo_id: str, sha: str) -> None:
    (cache / f"datasets--{repo_id.replace('/', '--')}" / "refs" / "main").write_text(sha)


@pytest.fixture
def two_commits(hub_cache: Path) -> Path:
    """cc3m-wds at SHA (train keys 0-8) and at NEWER (one train shard of keys 0-1), main at SHA."""
    hub_cache_repo(hub_cache, CC3M, cc3m_wds_files([2], [1]), sha=NEWER)
    hub_cache_repo(hub_cache, CC3M, cc3m_wds_files([5, 4], [3]))
    return hub_cache


def test_a_pinned_run_reads_the_commit_it_recorded_after_main_moved_on(two_commits):
    with pinned_commits() as pins:
        first = keys(load_dataset_by_name(f"hf:{CC3M}", "train"))
        readme = dataset_file(CC3M, "README.md")
    assert pins == {CC3M: SHA} and len(first) == 9 and readme.parent.name == SHA
    move_main(two_commits, CC3M, NEWER)
    assert keys(load_dataset_by_name(f"hf:{CC3M}", "train")) == ["000000000", "000000001"]  # a new run
    with pinned_commits(pins) as resumed:  # the resume: what the run read, not what main holds now
        assert keys(load_dataset_by_name(f"hf:{CC3M}", "train")) == first
        validation = keys(load_dataset_by_name(f"cc3m:hf:{CC3M}", "validation"))
        assert validation == ["000000009", "000000010", "000000011"]
        assert dataset_file(CC3M, "README.md").parent.name == SHA
    assert resumed == {CC3M: SHA}


def parquet_repo(cache: Path, captions: list[str], sha: str) -> None:
    buffer = io.BytesIO()
    images = [{"bytes": jpeg(i), "path": None} for i in range(len(captions))]
    pq.write_table(pa.table({"image": images, "caption": captions}), buffer)
    hub_cache_repo(cache, "someone/pairs", {"data/train-00000-of-00001.parquet": buffer.getvalue()}, sha=sha)


@pytest.mark.parametrize("streaming", [False, True])
def test_a_parquet_repo_read_by_datasets_is_read_at_the_recorded_commit(hub_cache, streaming):
    parquet_repo(hub_cache, ["newer 0"], NEWER)
    parquet_repo(hub_cache, ["older 0", "older 1"], SHA)
    with pinned_commits() as pins:
        load_dataset_by_name("hf:someone/pairs", "train", streaming=streaming)
    move_main(hub_cache, "someone/pairs", NEWER)
    with pinned_commits(pins):
        data = load_dataset_by_name("hf:someone/pairs", "train", streaming=streaming)
        assert sorted(row["caption"] for row in data) == ["older 0", "older 1"]


def test_a_recorded_commit_the_cache_no_longer_holds_is_one_line(two_commits):
    shutil.rmtree(two_commits / "datasets--pixparse--cc3m-wds" / "snapshots" / SHA)
    move_main(two_commits, CC3M, NEWER)
    for read in (
        lambda: load_dataset_by_name(f"hf:{CC3M}", "train"),
        lambda: dataset_file(CC3M, "README.md"),
        lambda: hub.local_snapshot(CC3M),
    ):
        with pinned_commits({CC3M: SHA}), pytest.raises(UserError) as raised:
            read()
        message = str(raised.value)
        assert "\n" not in message and f"at commit {SHA}" in message and "start a new run" in message


def test_a_shard_the_cache_lacks_mid_stream_is_retried_then_skipped_with_one_line(
    two_commits, monkeypatch, caplog
):
    monkeypatch.setattr(webdataset, "FETCH_BACKOFF_S", 0.0)
    tries: list[str] = []

    def counted(repo_id: str, filename: str, revision: str | None = None) -> Path:
        tries.append(filename)
        return dataset_file(repo_id, filename, revision)

    counts = SampleFilter("cc3m")
    data = load_dataset_by_name(f"hf:{CC3M}", "train", sample_filter=counts)  # the shards are listed
    (two_commits / "datasets--pixparse--cc3m-wds" / "snapshots" / SHA / "cc3m-train-0000.tar").unlink()
    monkeypatch.setattr(hub, "dataset_file", counted)
    with caplog.at_level(logging.WARNING, logger="hf_vrl.data.webdataset"):
        assert keys(data) == [f"{k:09d}" for k in (5, 6, 7, 8)]  # the second shard's samples
    assert counts.counts == {webdataset.UNFETCHABLE_SHARD: 1}
    assert tries.count("cc3m-train-0000.tar") == webdataset.FETCH_TRIES
    lines = [r.getMessage() for r in caplog.records if "cc3m-train-0000.tar" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0] and "not fetched after 3 tries" in lines[0]


def cub_copy(cache: Path, train_labels: list[int], sha: str) -> None:
    hub_cache_repo(cache, "efekankavalci/CUB_200_2011", cub_copy_files(train_labels, [1, 0]), sha=sha)


def test_a_benchmark_copy_read_by_datasets_is_read_at_the_recorded_commit(hub_cache):
    cub_copy(hub_cache, [1], NEWER)
    cub_copy(hub_cache, [0, 1, 1], SHA)
    with pinned_commits() as pins:
        assert len(load_dataset_by_name("cub:hf:efekankavalci/CUB_200_2011", "train")) == 3
    assert pins == {"efekankavalci/CUB_200_2011": SHA}
    move_main(hub_cache, "efekankavalci/CUB_200_2011", NEWER)
    with pinned_commits(pins):
        assert len(load_dataset_by_name("cub:hf:efekankavalci/CUB_200_2011", "train")) == 3
    assert len(load_dataset_by_name("cub:hf:efekankavalci/CUB_200_2011", "train")) == 1
