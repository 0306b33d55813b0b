"""The Hub as a data source (`hf_vrl.data.hub`): specs parsed, a dataset repo's files listed and fetched from
a local Hub-cache copy offline through the real huggingface_hub functions, one-line errors otherwise."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hub_fixtures import SHA, cc3m_wds_files, hub_cache_repo
from huggingface_hub import constants

from hf_vrl.data.hub import HubSpec, dataset_file, dataset_repo_files, dataset_snapshot, parse_hub_spec
from hf_vrl.data.webdataset import hub_shards
from hf_vrl.errors import UserError


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("hf:pixparse/cc3m-wds", HubSpec("pixparse/cc3m-wds")),
        ("hf:pixparse/cc3m-wds@v1.0", HubSpec("pixparse/cc3m-wds", "v1.0")),
        ("hf:pixparse/cc3m-wds/cc3m-train-*.tar", HubSpec("pixparse/cc3m-wds", None, "cc3m-train-*.tar")),
        (
            "hf:clip-benchmark/wds_cars@abc/test/0.tar",
            HubSpec("clip-benchmark/wds_cars", "abc", "test/0.tar"),
        ),
        (
            "hf://datasets/pixparse/cc3m-wds/cc3m-validation-*.tar",
            HubSpec("pixparse/cc3m-wds", None, "cc3m-validation-*.tar"),
        ),
        (
            "hf://datasets/pixparse/cc3m-wds@refs%2Fconvert%2Fparquet/default/partial-train/0000.parquet",
            HubSpec("pixparse/cc3m-wds", "refs/convert/parquet", "default/partial-train/0000.parquet"),
        ),
    ],
)
def test_parse_hub_spec(spec: str, expected: HubSpec) -> None:
    assert parse_hub_spec(spec) == expected


def test_parse_hub_spec_refuses_a_name_without_org() -> None:
    with pytest.raises(UserError, match="hf:<org>/<name>"):
        parse_hub_spec("hf://datasets/cc3m")


def test_repo_files_and_one_file_come_from_the_local_cache_offline(hub_cache: Path) -> None:
    files = cc3m_wds_files([3, 3], [2])
    hub_cache_repo(hub_cache, "pixparse/cc3m-wds", files)
    listed = dataset_repo_files("pixparse/cc3m-wds")
    assert listed == sorted(files) and dataset_snapshot("pixparse/cc3m-wds") == (SHA, listed)
    assert hub_shards(parse_hub_spec("hf:pixparse/cc3m-wds"), "validation") == [
        f"hf://datasets/pixparse/cc3m-wds@{SHA}/cc3m-validation-0000.tar"  # the commit read now, pinned
    ]
    path = dataset_file("pixparse/cc3m-wds", "cc3m-validation-0000.tar")
    assert path.read_bytes() == files["cc3m-validation-0000.tar"]
    assert Path(constants.HF_HUB_CACHE) in path.parents


def test_a_named_revision_is_read_from_its_ref(hub_cache: Path) -> None:
    hub_cache_repo(hub_cache, "pixparse/cc3m-wds", {"a.tar": b"x"}, ref="v2", sha="1" * 40)
    assert dataset_repo_files("pixparse/cc3m-wds", revision="v2") == ["a.tar"]
    with pytest.raises(UserError):
        dataset_repo_files("pixparse/cc3m-wds")  # no main in the cache


def test_a_repo_missing_from_the_cache_offline_is_one_line(hub_cache: Path) -> None:
    for call in (
        lambda: dataset_repo_files("pixparse/cc3m-wds"),
        lambda: dataset_file("pixparse/cc3m-wds", "cc3m-train-0000.tar"),
    ):
        with pytest.raises(UserError) as raised:
            call()
        message = str(raised.value)
        assert "\n" not in message
        assert "pixparse/cc3m-wds is not in the local Hub cache" in message and "HF_HUB_OFFLINE=1" in message


def test_a_file_missing_from_a_cached_repo_is_one_line(hub_cache: Path) -> None:
    hub_cache_repo(hub_cache, "pixparse/cc3m-wds", cc3m_wds_files([2], []))
    with pytest.raises(UserError, match="not its file 'cc3m-train-0099.tar'"):
        dataset_file("pixparse/cc3m-wds", "cc3m-train-0099.tar")
    assert os.environ["HF_HUB_OFFLINE"] == "1"
