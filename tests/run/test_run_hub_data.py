"""Runs on Hub datasets and streamed shards (issues 34, 37): a Hub repo from the local Hub cache trains,
counts its bad samples and resumes exactly; data that trains nothing, a repo missing offline and a streamed
reference set DiVE cannot use are refused before anything is written; DCR trains on CC3M's shards."""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hub_fixtures import (
    SHA,
    cc3m_wds_files,
    hub_cache_repo,
    imagenet_wds_files,
    jpeg,
    offline_hub_cache,
    write_files,
)
from test_run_refusals import refused
from test_run_resume import QUIET, assert_identical, hf_vrl, kill_then_resume, ok

from hf_vrl.cli import main
from hf_vrl.methods.clue.method import CLUERunConfig
from hf_vrl.methods.dcr.method import DCRRunConfig
from hf_vrl.methods.diffclip.method import DiffCLIPRunConfig
from hf_vrl.methods.dive.method import DiVERunConfig

SHORT = ["--max-steps", "2", "--batch-size", "4", "--no-eval-before", "--no-eval-after", "--no-figures"]


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return offline_hub_cache(tmp_path, monkeypatch)


@pytest.fixture
def cc3m_folder(tmp_path: Path) -> Path:
    """pixparse/cc3m-wds's layout on disk: 16 + 16 training samples (one caption not UTF-8), 8 validation."""
    return write_files(tmp_path / "cc3m-wds", cc3m_wds_files([16, 16], [8], bad_caption=True))


def test_data_without_captions_is_refused_before_the_run_folder_is_written(tmp_path, capsys):
    folder = write_files(tmp_path / "imagenet-1k-wds", imagenet_wds_files([32, 32], [8]))
    dataset = f"webdataset:{folder}/imagenet1k-train-*.tar"
    argv = ["train", "diffclip", "--config", "diffclip-tiny", "--dataset", dataset, "--max-steps", "3"]
    message = refused([*argv, "--output-dir", str(tmp_path / "run")], tmp_path, capsys)
    assert "none of its first 64 samples can be trained on (missing_caption 64)" in message
    assert "--caption-column" in message


def test_an_empty_table_is_refused_before_the_run_folder_is_written(tmp_path, capsys):
    (tmp_path / "pairs.csv").write_text("filepath,caption\n")
    argv = ["train", "diffclip", "--config", "diffclip-tiny", "--dataset", "csv:pairs.csv", *SHORT]
    message = refused([*argv, "--output-dir", str(tmp_path / "run")], tmp_path, capsys)
    assert "holds no samples" in message


def test_a_hub_dataset_missing_offline_is_one_line_before_writing(hub_cache, tmp_path, capsys):
    for argv in (
        ["train", "diffclip", "--config", "diffclip-tiny", "--dataset", "hf:pixparse/cc3m-wds", *SHORT],
        ["train", "dcr", "--config", "dcr-openai-l14-224"],  # the preset's data: CC3M from the Hub
    ):
        message = refused([*argv, "--output-dir", str(tmp_path / "run")], tmp_path, capsys)
        assert "pixparse/cc3m-wds is not in the local Hub cache" in message


def test_dive_refuses_a_streamed_reference_set_before_writing(cc3m_folder, tmp_path, capsys):
    reference = f"dive.reference_dataset=webdataset:{cc3m_folder}/cc3m-train-*.tar"
    argv = [
        "train",
        "dive",
        "--config",
        "dive-tiny",
        "--set",
        reference,
        "--output-dir",
        str(tmp_path / "run"),
    ]
    message = refused(argv, tmp_path, capsys)
    assert "streams: frozen_embeddings='cache' needs a map-style reference set" in message
    argv[4:4] = ["--set", "dive.frozen_embeddings=forward"]  # the 31 good samples: not one batch of 64
    message = refused(argv, tmp_path, capsys)
    assert "streams 31 samples, fewer than one reference batch (64)" in message


def test_dcr_trains_on_cc3m_shards(cc3m_folder, tmp_path):
    out = tmp_path / "run"
    argv = ["train", "dcr", "--config", "dcr-tiny", "--dataset", f"webdataset:{cc3m_folder}/cc3m-train-*.tar"]
    argv += ["--stage1-steps", "1", "--clip-pretrain-steps", "1", "--diffusion-pretrain-steps", "1", *SHORT]
    assert main([*argv, "--output-dir", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["train"]["stages"]["stage2"]["steps"] == 2 and (out / "final").is_dir()


def test_a_hub_repo_trains_from_the_cache_and_counts_its_bad_caption(hub_cache, tmp_path):
    hub_cache_repo(hub_cache, "pixparse/cc3m-wds", cc3m_wds_files([16, 16], [8], bad_caption=True))
    out = tmp_path / "run"
    argv = ["train", "diffclip", "--config", "diffclip-tiny", "--dataset", "hf:pixparse/cc3m-wds", *SHORT]
    assert main([*argv, "--output-dir", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["train"]["skipped"] == {"undecodable_caption": 1}, report["train"]
    skipped = (out / "logs/skips").glob("*.tsv")
    assert {line.split("\t")[1] for path in skipped for line in path.read_text().splitlines()} == {
        "000000001"
    }


# DiffCLIP-tiny on a Hub repo, a loader worker, checkpoints every 2 steps
HUB_DIFFCLIP = [
    "train",
    "diffclip",
    "--dataset",
    "hf:pixparse/cc3m-wds",
    "--batch-size",
    "8",
    "--max-steps",
    "6",
]
HUB_DIFFCLIP += ["--save-steps", "2", "--num-workers", "1", "--shuffle-buffer", "16", *QUIET]


@pytest.mark.slow
def test_a_hub_stream_killed_resumes_exactly(tmp_path, monkeypatch):
    cache = offline_hub_cache(tmp_path, monkeypatch)  # HF_HUB_CACHE reaches the runs' processes
    hub_cache_repo(cache, "pixparse/cc3m-wds", cc3m_wds_files([16, 16], [8], bad_caption=True))
    assert os.environ["HF_HUB_CACHE"] == str(cache)
    full = tmp_path / "full"
    ok(hf_vrl([*HUB_DIFFCLIP, "--output-dir", str(full)]))
    kill_then_resume(HUB_DIFFCLIP, tmp_path / "run", "step:train:3")
    assert_identical(tmp_path / "run/final", full / "final")


def _interrupted_after_step_one(out: Path) -> None:
    """`out` as a run killed after its first checkpoint leaves it."""
    shutil.rmtree(out / "final")
    shutil.rmtree(out / "checkpoints/train/checkpoint-2")
    (out / "report.json").unlink()


def test_a_resume_reads_the_hub_commit_its_run_read_after_main_moved_on(hub_cache, tmp_path, capsys):
    """The run reads cc3m-wds at SHA and records it; main then moves to a commit whose shards hold no caption
    (a run reading it is refused): the resume still reads SHA; once the cache lost SHA, one line says so."""
    hub_cache_repo(hub_cache, "pixparse/cc3m-wds", cc3m_wds_files([16, 16], [8]))
    out = tmp_path / "run"
    argv = ["train", "diffclip", "--config", "diffclip-tiny", "--dataset", "hf:pixparse/cc3m-wds", *SHORT]
    argv += ["--save-steps", "1", "--output-dir", str(out)]
    assert main(argv) == 0
    assert json.loads((out / "config.json").read_text())["hub_commits"] == {"pixparse/cc3m-wds": SHA}
    newer = "9c1f0e2d3b4a5968778695a4b3c2d1e0f9a8b7c6"
    hub_cache_repo(hub_cache, "pixparse/cc3m-wds", imagenet_wds_files([16, 16], [8]), sha=newer)
    names = {f"cc3m-{split}-0000.tar": f"imagenet1k-{split}-0000.tar" for split in ("train", "validation")}
    snapshot = hub_cache / "datasets--pixparse--cc3m-wds/snapshots" / newer
    for cc3m, imagenet in names.items():  # the newer commit: caption-less shards under cc3m's names
        (snapshot / imagenet).rename(snapshot / cc3m)
    _interrupted_after_step_one(out)
    assert main([*argv, "--resume"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["train"]["stages"]["train"]["steps"] == 2 and report["hub_commits"] == {
        "pixparse/cc3m-wds": SHA
    }
    assert json.loads((out / "config.json").read_text())["hub_commits"] == {"pixparse/cc3m-wds": SHA}
    _interrupted_after_step_one(out)
    shutil.rmtree(hub_cache / "datasets--pixparse--cc3m-wds/snapshots" / SHA)
    message = refused([*argv, "--resume"], tmp_path, capsys)
    assert f"read dataset pixparse/cc3m-wds at commit {SHA}" in message


def test_a_hub_parquet_repo_streams_in_a_run_of_a_method_that_takes_streams(hub_cache, tmp_path, capsys):
    """DiffCLIP takes streams: a Hub parquet repo streams in its run (so it needs --max-steps, as shards do)
    and trains; DiVE and CLUE read theirs map-style (`RunConfig.map_style_data`)."""
    table = pa.table(
        {
            "image": [{"bytes": jpeg(i), "path": None} for i in range(8)],
            "caption": [f"c {i}" for i in range(8)],
        }
    )
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    hub_cache_repo(hub_cache, "someone/pairs", {"data/train-00000-of-00001.parquet": buffer.getvalue()})
    argv = ["train", "diffclip", "--config", "diffclip-tiny", "--dataset", "hf:someone/pairs"]
    argv += ["--batch-size", "4", "--no-eval-before", "--no-eval-after", "--no-figures"]
    message = refused([*argv, "--output-dir", str(tmp_path / "run")], tmp_path, capsys)
    assert "hf:someone/pairs is streamed (its length is unknown): give --max-steps" in message
    out = tmp_path / "run"
    assert main([*argv, "--max-steps", "2", "--output-dir", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["train"]["stages"]["train"]["steps"] == 2
    assert DiVERunConfig.map_style_data and CLUERunConfig.map_style_data
    assert not DiffCLIPRunConfig.map_style_data and not DCRRunConfig.map_style_data
