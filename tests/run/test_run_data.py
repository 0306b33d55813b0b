"""Data as the run feeds it: order and augmentation are functions of (seed, epoch, sample); streams give full,
equal batches per process; skipped samples are counted across workers and processes."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch
from data_fixtures import write_mixed_shard, write_plain_shard

from hf_vrl.data.registry import load_dataset_by_name
from hf_vrl.data.webdataset import load_image_text
from hf_vrl.run.data import SeededDataset, SeededSampler, SeededStream, SkipLog, sample_seed


def test_sample_seeds_depend_on_seed_epoch_and_sample_only():
    assert sample_seed(0, 1, "a") == sample_seed(0, 1, "a")
    assert (
        len({sample_seed(0, 1, "a"), sample_seed(1, 1, "a"), sample_seed(0, 2, "a"), sample_seed(0, 1, "b")})
        == 4
    )
    assert 0 <= sample_seed(123, 4, 99) < 2**63


def test_seeded_sampler_permutes_each_epoch_as_a_function_of_seed_and_epoch():
    sampler = SeededSampler(10, seed=3)
    first = list(sampler)
    assert sorted(i for i, _ in first) == list(range(10)) and {e for _, e in first} == {0}
    assert list(SeededSampler(10, seed=3)) == first  # a fresh sampler (a resumed run) repeats it
    sampler.set_epoch(1)
    second = list(sampler)
    assert {e for _, e in second} == {1} and [i for i, _ in second] != [i for i, _ in first]


def test_seeded_dataset_rows_carry_their_seed():
    data = load_dataset_by_name("shapes", split="train", limit=4, image_size=16)
    seeded = SeededDataset(data, seed=7)
    row = seeded[(2, 5)]
    assert row["sample_seed"] == sample_seed(7, 5, 2) and row["caption"] == data[2]["caption"]
    assert seeded[2]["sample_seed"] == sample_seed(7, 0, 2)


def _keys(stream, n):
    return [row["key"] for _, row in zip(range(n), stream)]


def test_streams_split_by_process_and_repeat_without_end(tmp_path):
    shards = [str(write_plain_shard(tmp_path / f"{i}.tar", 10 * i, 5)) for i in range(2)]
    data = load_image_text(shards, shuffle_buffer=4, seed=0)
    ranks = [SeededStream(data, seed=0, rank=r, world_size=2) for r in (0, 1)]
    parts = [_keys(stream, 5) for stream in ranks]
    assert set(parts[0]).isdisjoint(parts[1]) and len(set(parts[0]) | set(parts[1])) == 10
    three_passes = list(zip(range(15), ranks[0]))
    keys = [row["key"] for _, row in three_passes]
    assert sorted(keys[:5]) == sorted(keys[5:10]) == sorted(parts[0])  # every pass covers the same share
    assert keys[:5] != keys[5:10]  # reshuffled per pass
    seeds = {row["key"]: [] for _, row in three_passes}
    for _, row in three_passes:
        seeds[row["key"]].append(row["sample_seed"])
    assert all(len(set(s)) == 3 for s in seeds.values())  # a new augmentation seed each pass


def test_an_empty_share_ends_instead_of_spinning(tmp_path):
    stream = load_image_text(str(write_plain_shard(tmp_path / "a.tar", 0, 0)))
    assert list(SeededStream(stream, seed=0)) == []


def _record(folder, kind, key):
    SkipLog(folder).record(kind, key)


def test_skip_log_counts_distinct_samples_across_processes(tmp_path):
    log = SkipLog(tmp_path / "skips")
    log.record("corrupt_image", "001")
    log.record("corrupt_image", "001")  # read again on a later pass or after a resume
    ctx = mp.get_context("spawn")
    for args in (("corrupt_image", "002"), ("empty_caption", "003"), ("empty_caption", "003")):
        process = ctx.Process(target=_record, args=(tmp_path / "skips", *args))
        process.start()
        process.join()
    assert log.counts() == {"corrupt_image": 2, "empty_caption": 1}
    assert len(list((tmp_path / "skips").glob("*.tsv"))) == 4  # one file per process


def test_a_logged_filter_counts_once_and_warns_nothing(tmp_path, recwarn):
    from hf_vrl.data.images import SampleFilter

    log = SkipLog(tmp_path / "skips")
    stream = load_image_text(
        str(write_mixed_shard(tmp_path / "mixed.tar")), sample_filter=SampleFilter("t", log=log)
    )
    rows = [row for _, row in zip(range(30), SeededStream(stream, seed=0))]  # more than two passes
    assert len(rows) == 30
    assert log.counts() == {
        "corrupt_image": 1,
        "empty_caption": 1,
        "missing_caption": 1,
        "missing_image": 1,
        "too_small": 1,
        "truncated_image": 1,
        "undecodable_caption": 1,
    }
    assert not [w for w in recwarn if "skipping a sample" in str(w.message)]


@pytest.mark.parametrize("workers", [0, 2])
def test_trainer_batches_of_a_stream_are_always_full(tmp_path, workers):
    """13 + 6 samples in two shards, batches of 4: every training batch holds 4 (a pass ends mid-batch)."""
    from transformers import TrainingArguments

    from hf_vrl.trainer import VRLTrainer

    shards = [
        str(write_plain_shard(tmp_path / "a.tar", 0, 13)),
        str(write_plain_shard(tmp_path / "b.tar", 100, 6)),
    ]
    stream = SeededStream(load_image_text(shards, shuffle_buffer=8, seed=0), seed=0)
    sizes = []

    class Recorder(VRLTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            sizes.append(len(inputs["x"]))
            return model(inputs["x"]).sum()

    def collate(rows):
        return {"x": torch.tensor([[float(row["sample_seed"] % 7)] for row in rows])}

    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=12,
        per_device_train_batch_size=4,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        remove_unused_columns=False,
        dataloader_num_workers=workers,
        dataloader_drop_last=True,
    )
    Recorder(model=torch.nn.Linear(1, 1), args=args, train_dataset=stream, data_collator=collate).train()
    assert sizes == [4] * 12


def test_a_stream_needs_max_steps(tmp_path):
    import hf_vrl
    from hf_vrl.errors import UserError

    shard = write_plain_shard(tmp_path / "00000.tar", 0, 4, size=(32, 32))
    with pytest.raises(UserError, match="--max-steps"):
        hf_vrl.train(
            "diffclip", dataset=f"webdataset:{shard}", eval_before=False, output_dir=str(tmp_path / "o")
        )


def test_less_data_than_one_batch_is_refused(tmp_path):
    import hf_vrl
    from hf_vrl.errors import UserError

    with pytest.raises(UserError, match="fewer than one optimiser step of 64"):
        hf_vrl.train("diffclip", train_limit=10, eval_before=False, output_dir=str(tmp_path / "o"))


def test_the_report_counts_the_skipped_samples(tmp_path):
    """A streamed run over a shard of every bad kind and a clean one: the report counts each bad sample once,
    whatever the passes and workers."""
    import hf_vrl

    write_mixed_shard(tmp_path / "0.tar")
    write_plain_shard(tmp_path / "1.tar", 100, 20, size=(32, 32))
    report = hf_vrl.train(
        "diffclip", dataset=f"webdataset:{tmp_path}/{{0..1}}.tar", max_steps=6, batch_size=8, num_workers=2,
        eval_before=False, eval_after=False, figures=False, output_dir=str(tmp_path / "run"),
    )  # fmt: skip
    assert report["train"]["skipped"] == {
        "corrupt_image": 1, "empty_caption": 1, "missing_caption": 1, "missing_image": 1,
        "too_small": 1, "truncated_image": 1, "undecodable_caption": 1,
    }  # fmt: skip
    data = {"dataset": f"webdataset:{tmp_path}/{{0..1}}.tar", "split": "train", "drawn": "whole split"}
    assert report["train"]["data"] == data  # the record of the training data: a stream, read whole
