"""examples/reproduce_dcr.py end to end on tiny hand-made copies of the official layouts (Table 3: a tiny
exported LLaVA on local lmms-eval tasks, against a hand count): counts checked before any model loads,
partial copies refused or scored and marked, cells resumed; and the paper's numbers it ships
(hf_vrl.methods.dcr.paper) with Table 3's lmms-eval columns."""

from __future__ import annotations

import json
import re

import pytest
from PIL import Image
from reproduce_helpers import (
    POPE_TASK,
    class_folders,
    example,
    imagenet_val,
    karpathy,
    llava_tasks,
    lmms_task_metrics,
    mmvp_folder,
    tiny_clip_folder,
)

from hf_vrl.errors import UserError
from hf_vrl.methods.dcr.paper import BACKBONE_PRESETS, PAPER_TABLES, TABLE3_COLUMNS, TABLE3_LMMS
from hf_vrl.paper_eval import CellCache, LmmsColumn, llava_table, paper_comparison
from hf_vrl.presets import preset_path


def test_the_paper_numbers_are_consistent():
    assert sorted(PAPER_TABLES) == [1, 2, 3, 6]
    for table in PAPER_TABLES[1].values():  # Avg: the mean of the nine patterns (15 pairs each)
        for row, values in table.rows.items():
            assert abs(sum(values[:-1]) / 9 - values[-1]) <= 0.051, row
    assert PAPER_TABLES[1]["OpenAI ViT-L-14 224"].rows["Ours"][-1] == 33.3
    assert PAPER_TABLES[2]["SigLIP ViT-SO-14 224"].rows["Ours"][-3:] == (0.83, 0.76, 0.65)
    assert PAPER_TABLES[6]["unstated"].rows["Original"] == (
        76.4,
        95.6,
        60.1,
        86.6,
        55.4,
        75.5,
        87.2,
        61.1,
        97.4,
        79.2,
    )
    assert set(PAPER_TABLES[2]) <= set(PAPER_TABLES[1]) == set(BACKBONE_PRESETS)
    for preset in BACKBONE_PRESETS.values():
        assert preset_path(preset).is_file()


def test_paper_comparison_puts_models_beside_the_paper_rows():
    text = paper_comparison(
        ("a", "b"), {"Original": (1.0, 2.0), "Ours": (3.0, None)}, {"Ours": {"a": 2.5}, "x": {"b": 7}}
    )
    lines = [re.split(r"\s{2,}", line.strip()) for line in text.splitlines()]
    assert lines == [
        ["a", "b"],
        ["Original", "1.0 / -", "2.0 / -"],
        ["Ours", "3.0 / 2.5", "- / -"],
        ["x", "- / -", "- / 7.0"],
    ]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Every benchmark of the three tables as a tiny copy of its official layout; a tiny CLIP and a DCR
    export of it."""
    from hf_vrl.models.dcr import DCRModel

    root = tmp_path_factory.mktemp("data")
    for key in ("mnist", "cifar10", "eurosat", "caltech101", "dtd"):
        class_folders(root / key, key)
    imagenet_val(root / "imagenet")
    for key in ("flickr30k", "mscoco"):
        karpathy(root / key, key)
    mmvp_folder(root / "mmvp_vlm")
    models = tmp_path_factory.mktemp("models")
    clip = tiny_clip_folder(models / "clip")
    from transformers import AutoImageProcessor

    DCRModel.from_clip(str(clip), condition_dim=16, num_condition_tokens=4).save_pretrained(models / "dcr")
    AutoImageProcessor.from_pretrained(clip).save_pretrained(models / "dcr")
    return root, clip, models / "dcr"


def _rows(out: str) -> dict[str, list[str]]:
    lines = [re.split(r"\s{2,}", line.strip()) for line in out.split("paper / measured\n")[-1].splitlines()]
    return {line[0]: line[1:] for line in lines[1:] if len(line) > 2}


@pytest.mark.parametrize("table", [1, 2, 6])
def test_each_table_runs_end_to_end(setup, table, tmp_path, capsys):
    """The copies of Tables 2 and 6 are partial (scored with --allow-partial, their cells marked, their
    counts printed and written); Table 1's MMVP-VLM file is whole (unmarked)."""
    root, clip, dcr = setup
    argv = ["--table", str(table), "--data-root", str(root), "--model", f"Original={clip}", "--allow-partial"]
    argv += ["--model", f"Ours={dcr}", "--text-model", str(clip), "--output", str(tmp_path / "m.json")]
    if table == 6:  # zero-shot ImageNet prompts 1,000 classes x 80 templates: Table 2 covers its copy
        argv += ["--sets", "mnist", "cifar10", "eurosat", "caltech101", "dtd", "flickr30k", "mscoco"]
    assert example("reproduce_dcr").main([*argv, "--output-dir", str(tmp_path / "cells")]) == 0
    out = capsys.readouterr().out
    rows = _rows(out.split("\n† ")[0])
    record = json.loads((tmp_path / "m.json").read_text())
    measured = record["measured"]
    columns = PAPER_TABLES[table]["OpenAI ViT-L-14 224" if table != 6 else "unstated"].columns
    if table == 6:
        columns = tuple(c for c in columns if c != "IN-1K")
    assert set(measured["Ours"]) == set(columns) == set(measured["Original"])
    mark = "" if table == 1 else "†"
    for label in ("Original", "Ours"):
        cells = [cell for cell in rows[label] if not cell.endswith("/ -")]  # Table 6: ImageNet left out
        assert len(cells) == len(columns)
        assert all(re.fullmatch(rf"\d+\.\d+ / \d+\.\d+{mark}", cell) for cell in cells), rows[label]
    if table == 2:  # the DCR export is the same tower: the same clustering
        assert measured["Ours"] == measured["Original"]
        assert record["counts"]["mnist/test"]["described"] == "12 of 10,000 images, 3 of 10 classes"
        assert "† mnist/test: 12 of 10,000 images, 3 of 10 classes (not the paper's set)" in out
        assert "imagenet/validation: 12 of 50,000 images, 3 of 1,000 classes" in out  # the header
    if table == 1:
        assert record["counts"]["mmvp_vlm/test"]["complete"] and "not the paper's set" not in out
    if table == 6:
        assert record["counts"]["flickr30k/test"]["described"] == "6 of 1,000 images, 12 of 5,000 captions"


def test_a_partial_copy_is_refused_in_one_line_before_any_model_loads(setup, tmp_path, capsys):
    root, clip, _ = setup
    argv = ["--table", "2", "--data-root", str(root), "--model", str(clip), "--output-dir", str(tmp_path)]
    assert example("reproduce_dcr").main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: MNIST test at ")
    assert (
        "12 of 10,000 images, 3 of 10 classes (missing 3, 4, 5, 6, 7 and 2 more)" in err
        and "--allow-partial" in err
    )
    assert not (tmp_path / "cells").exists()


def test_cells_are_kept_and_a_stopped_table_resumes(setup, tmp_path, capsys, monkeypatch):
    """A second run reads every cell back and loads no model; a cell removed is measured again alone."""
    import hf_vrl.paper_eval

    root, clip, _ = setup
    argv = ["--table", "2", "--data-root", str(root), "--model", f"Original={clip}", "--allow-partial"]
    argv += ["--sets", "mnist", "dtd", "--output-dir", str(tmp_path)]
    assert example("reproduce_dcr").main(argv) == 0
    first = _rows(capsys.readouterr().out.split("\n† ")[0])
    cells = tmp_path / "cells" / "table2-OpenAI-ViT-L-14-224" / "Original"
    assert sorted(p.name for p in cells.iterdir()) == ["dtd.json", "mnist.json"]

    def no_model(*args, **kwargs):
        raise AssertionError("a cached table loaded a model")

    monkeypatch.setattr(hf_vrl.paper_eval, "load_model", no_model)
    assert example("reproduce_dcr").main(argv) == 0
    assert _rows(capsys.readouterr().out.split("\n† ")[0]) == first
    (cells / "dtd.json").unlink()
    monkeypatch.undo()
    assert example("reproduce_dcr").main(argv) == 0
    assert _rows(capsys.readouterr().out.split("\n† ")[0]) == first and (cells / "dtd.json").is_file()


def test_a_model_re_saved_in_place_is_scored_again(setup, tmp_path, capsys, monkeypatch):
    """Cells are keyed by the model's contents, not its path: the same folder holding other weights is
    measured again; a folder re-written with the same contents (a new mtime) is not."""
    import shutil

    import torch
    from transformers import CLIPModel

    import hf_vrl.paper_eval

    root, clip, _ = setup
    model = tmp_path / "model"
    shutil.copytree(clip, model)
    argv = ["--table", "2", "--data-root", str(root), "--model", f"Ours={model}", "--allow-partial"]
    argv += ["--sets", "dtd", "--output-dir", str(tmp_path / "out")]
    assert example("reproduce_dcr").main(argv) == 0
    first = _rows(capsys.readouterr().out.split("\n† ")[0])["Ours"]
    cell = tmp_path / "out" / "cells" / "table2-OpenAI-ViT-L-14-224" / "Ours" / "dtd.json"
    made_by = json.loads(cell.read_text())["settings"]["model"]
    loaded, load_model = [], hf_vrl.paper_eval.load_model
    monkeypatch.setattr(
        hf_vrl.paper_eval, "load_model", lambda *a, **k: loaded.append(a) or load_model(*a, **k)
    )

    (model / "model.safetensors").write_bytes((model / "model.safetensors").read_bytes())  # same bytes
    assert example("reproduce_dcr").main(argv) == 0
    assert _rows(capsys.readouterr().out.split("\n† ")[0])["Ours"] == first and not loaded

    torch.manual_seed(1)
    other = CLIPModel.from_pretrained(model)
    for parameter in other.parameters():
        parameter.data.normal_()
    other.save_pretrained(model)  # re-saved in place: the same path, other weights
    assert example("reproduce_dcr").main(argv) == 0
    assert loaded == [(str(model), None, None)]
    assert json.loads(cell.read_text())["settings"]["model"]["sha256"] != made_by["sha256"]


def test_retrieval_on_fewer_than_5_images_reports_the_recalls_that_exist(setup, tmp_path, capsys):
    """A 3-image subset has no R@5: its cells are "-" and a line says which R@K are not reported and why
    (no KeyError)."""
    root, clip, _ = setup
    argv = ["--table", "6", "--data-root", str(root), "--model", f"Original={clip}", "--allow-partial"]
    argv += ["--sets", "flickr30k", "--limit", "3", "--output-dir", str(tmp_path)]
    assert example("reproduce_dcr").main(argv) == 0
    out = capsys.readouterr().out
    cells = _rows(out.split("\n† ")[0])["Original"]
    assert all(cell.endswith("/ -") for cell in cells)  # Table 6 on Flickr30k alone: its R@5 columns
    assert "flickr30k: R@5, R@10: 3 images and 6 texts (K must not exceed them)" in out


def test_a_hub_model_is_keyed_by_its_commit(tmp_path, monkeypatch):
    """A Hub id's cells are keyed by the snapshot commit loading it reads (a local Hub cache, offline)."""
    import huggingface_hub.constants

    commit = "a" * 40
    repo = tmp_path / "hub" / "models--org--clip"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text("{}")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert CellCache(tmp_path, "t").model_key("org/clip") == {"name": "org/clip", "commit": commit}
    with pytest.raises(UserError, match="'org/other' is neither a folder nor a Hub model"):
        CellCache(tmp_path, "t").model_key("org/other")


def test_missing_data_or_a_wrong_layout_is_one_line(setup, tmp_path, capsys):
    _, clip, _ = setup
    argv = ["--table", "2", "--data-root", str(tmp_path), "--model", str(clip)]
    assert example("reproduce_dcr").main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith("error: ")
        and "mnist is missing: put mnist there as MNIST as published: {train,t10k}-" in err
    )
    assert "or <split>/<class>/<image> folders" in err
    assert len(err.splitlines()) == 1
    (tmp_path / "imagenet" / "val").mkdir(parents=True)
    (tmp_path / "imagenet" / "val" / "ILSVRC2012_val_00000001.JPEG").write_bytes(b"")
    argv = ["--table", "2", "--sets", "imagenet", "--data-root", str(tmp_path), "--model", str(clip)]
    assert example("reproduce_dcr").main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "flat validation folder: put the devkit" in err and len(err.splitlines()) == 1


def test_an_unknown_backbone_is_refused(setup, capsys):
    root, clip, _ = setup
    argv = ["--table", "1", "--data-root", str(root), "--model", str(clip), "--backbone", "ViT-Z"]
    assert example("reproduce_dcr").main(argv) == 2
    assert "--backbone 'ViT-Z': Table 1 has OpenAI ViT-L-14 224" in capsys.readouterr().err


def test_help_lists_the_layouts(capsys):
    with pytest.raises(SystemExit):
        example("reproduce_dcr").main(["--help"])
    text = capsys.readouterr().out
    assert "imagenet: ILSVRC-2012 as published" in text and "LOC_val_solution.csv" in text
    assert (
        "flickr30k: Karpathy's dataset_<name>.json" in text
        and "mmvp_vlm: the official MMVP-VLM folder" in text
    )


def test_sources_name_a_benchmark_with_its_split(setup, tmp_path):
    """--source KEY=NAME[@SPLIT]: a datasets copy (save_to_disk here), split after @, relabelled in the
    benchmark's classes."""
    import datasets

    from hf_vrl.paper_eval import TableData

    rows = {"img": [datasets.Image().encode_example(Image.new("RGB", (8, 8)))] * 3, "label": [2, 0, 2]}
    features = datasets.Features(
        {"img": datasets.Image(), "label": datasets.ClassLabel(names=["cat", "dog", "bird"])}
    )
    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows, features=features)}).save_to_disk(saved)
    data = TableData(None, {"cifar10": f"{saved}@train"}, allow_partial=True)
    dataset = data.load("cifar10")
    names = dataset.features["label"].names
    assert [names[i] for i in dataset["label"]] == ["bird", "cat", "bird"] and len(names) == 10
    assert data.counts["cifar10/train"]["described"] == "3 of 50,000 images, 2 of 10 classes"


def test_table3_is_shipped_as_printed():
    table = PAPER_TABLES[3]["Vicuna-7B"]
    assert table.columns == TABLE3_COLUMNS and list(table.rows) == [
        "Original",
        "DIVA",
        "GenHancer",
        "un2CLIP",
        "Ours",
    ]
    cell = dict(zip(TABLE3_COLUMNS, table.rows["Ours"]))
    assert (cell["MMVP-MLLM"], cell["NaturalBench G-Acc"], cell["POPE adv"], cell["Hallusion Avg."]) == (
        31.3,
        25.3,
        85.8,
        28.6,
    )
    assert table.rows["Original"][:5] == (24.7, 76.4, 53.6, 56.4, 17.6)
    assert table.rows["un2CLIP"][1:5] == (None,) * 4  # "-": NaturalBench in another setting
    assert dict(zip(TABLE3_COLUMNS, table.rows["GenHancer"]))["CV-Bench 3D"] == 63.2
    assert "- / -" in paper_comparison(TABLE3_COLUMNS, table.rows, {})  # un2CLIP's "-"


def test_table3_columns_name_tasks_and_metrics_of_the_installed_lmms_eval():
    assert list(TABLE3_LMMS) == list(TABLE3_COLUMNS)
    assert TABLE3_LMMS["MMVP-MLLM"] == LmmsColumn("mmvp", ("mmvp_pair_accuracy",))  # MMVP's pair accuracy
    assert TABLE3_LMMS["POPE pop"] == LmmsColumn("pope_pop", ("pope_f1_score",))  # LLaVA-1.5's POPE F1
    assert TABLE3_LMMS["CV-Bench 2D COCO"] == LmmsColumn("cv_bench_2d", ("cv_bench_acc",), source="COCO")
    assert TABLE3_LMMS["Hallusion Avg."] == LmmsColumn(
        "hallusion_bench_image", ("aAcc", "fAcc", "qAcc"), scale=1.0
    )  # lmms-eval gives HallusionBench in percent
    pytest.importorskip("lmms_eval", reason="lmms-eval is not installed")
    for column in TABLE3_LMMS.values():
        assert set(column.metrics) <= lmms_task_metrics(column.task), column
    from lmms_eval.tasks.cv_bench import utils  # its per-sample record carries the source (ADE20K / COCO)

    record = utils.cv_bench_process_results(
        {"answer": "(A)", "idx": 0, "type": "Count", "task": "Count", "source": "ADE20K"}, ["A"]
    )["cv_bench_acc"]
    assert record["source"] == "ADE20K" and record["is_correct"]


def test_a_source_column_counts_the_logged_samples_of_that_source(tmp_path, monkeypatch):
    """CV-Bench 2D's ADE20K / COCO: the accuracy over lmms-eval's logged samples of each source."""
    from hf_vrl.integrations import llava_eval

    out = tmp_path / "eval" / "Ours"
    results = out / "lmms_eval" / "run" / "2025_results.json"
    results.parent.mkdir(parents=True)
    results.write_text("{}")
    marks = [("ADE20K", True), ("COCO", False), ("ADE20K", False), ("COCO", False), ("ADE20K", True)]
    samples = [
        {"doc_id": i, "cv_bench_acc": {"source": s, "is_correct": c}} for i, (s, c) in enumerate(marks)
    ]
    (results.parent / "2025_samples_cv_bench_2d.jsonl").write_text("\n".join(map(json.dumps, samples)))
    report = {
        "tasks": {"cv_bench_2d": {"cv_bench_acc": 0.4}},
        "lmms_eval_results": str(results.relative_to(out)),
    }

    llava = tmp_path / "llava"  # the folder the cells are keyed by (its contents)
    (llava / "config.json").parent.mkdir()
    (llava / "config.json").write_text("{}")

    def fake_main(argv):
        assert argv[:3] == [str(llava), "--tasks", "cv_bench_2d"]
        (out / llava_eval.RESULTS_FILE).write_text(json.dumps(report))
        return 0

    monkeypatch.setattr(llava_eval, "main", fake_main)
    columns = {name: TABLE3_LMMS[name] for name in ("CV-Bench 2D ADE20K", "CV-Bench 2D COCO")}
    columns["2D"] = LmmsColumn("cv_bench_2d", ("cv_bench_acc",))
    measured = llava_table(columns, {"Ours": str(llava)}, tmp_path / "eval")
    assert measured == {
        "Ours": {"CV-Bench 2D ADE20K": pytest.approx(200 / 3), "CV-Bench 2D COCO": 0.0, "2D": 40.0}
    }
    with pytest.raises(
        UserError, match=r"^Ours: lmms-eval gave cv_bench_2d no pope_f1_score \(it gave \['cv_bench_acc'\]\)$"
    ):
        llava_table(
            {"x": LmmsColumn("cv_bench_2d", ("pope_f1_score",))}, {"Ours": str(llava)}, tmp_path / "eval"
        )


def test_table3_checks_everything_before_lmms_eval_runs(setup, tmp_path, capsys, monkeypatch):
    """A folder that is not a LLaVA, and HallusionBench without OPENAI_API_KEY: one line each, nothing run."""
    pytest.importorskip("lmms_eval", reason="lmms-eval is not installed")
    _, clip, _ = setup
    argv = ["--table", "3", "--model", f"Ours={clip}", "--output-dir", str(tmp_path)]
    assert example("reproduce_dcr").main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"error: --model Ours={clip} is a 'clip' folder, not a LLaVA: the LLaVA tables score folders from "
        "hf-vrl export-llava / llava-align"
    )
    llava = tmp_path / "llava"
    llava.mkdir()
    (llava / "config.json").write_text('{"model_type": "llava"}')
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert example("reproduce_dcr").main(["--table", "3", "--model", f"Ours={llava}"]) == 2
    assert (
        "hallusion_bench_image is graded by GPT through lmms-eval: set OPENAI_API_KEY"
        in capsys.readouterr().err
    )
    assert not (tmp_path / "cells").exists()


def test_an_unknown_table3_column_is_one_line(capsys):
    assert example("reproduce_dcr").main(["--table", "3", "--model", "Ours=a", "--task", "POPE=x"]) == 2
    assert "--task 'POPE=x': no column 'POPE'" in capsys.readouterr().err


@pytest.mark.slow
def test_table3_scores_an_exported_llava_through_lmms_eval_as_a_hand_count(tmp_path, monkeypatch, capsys):
    """POPE rand on a local task with lmms-eval's POPE metrics (--task COLUMN=TASK: still F1), SciQA-IMG on
    the local yes/no task (--task COLUMN=TASK:METRIC): the hand count's F1 and accuracy."""
    pytest.importorskip("lmms_eval", reason="lmms-eval is not installed (pip install 'hf-vrl[llava-eval]')")
    for name, value in {"HF_DATASETS_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "cache")}.items():
        monkeypatch.setenv(name, value)
    built = llava_tasks(tmp_path)
    hand = built["hand"]
    assert (hand["pope_f1_score"], hand["pope_accuracy"]) == (pytest.approx(0.8), pytest.approx(5 / 6))
    argv = ["--table", "3", "--model", f"Ours={built['model']}", "--device", "cpu", "--sets", "POPE rand"]
    argv += ["SciQA-IMG", "--include-path", str(built["tasks"]), "--task", f"POPE rand={POPE_TASK}"]
    argv += ["--task", f"SciQA-IMG={built['yes_no_task']}:exact_match", "--eval-dir", str(tmp_path / "eval")]
    assert example("reproduce_dcr").main([*argv, "--output", str(tmp_path / "m.json")]) == 0
    record = json.loads((tmp_path / "m.json").read_text())
    assert (record["table"], record["backbone"]) == (3, "Vicuna-7B")
    assert record["measured"]["Ours"] == {
        "POPE rand": pytest.approx(100 * hand["pope_f1_score"]),
        "SciQA-IMG": pytest.approx(100 * hand["yes/no accuracy"]),
    }
    out = capsys.readouterr().out
    assert f"POPE rand = {POPE_TASK}:pope_f1_score" in out
    rows = _rows(out)
    assert rows["Ours"] == ["88.0 / -", "67.5 / -"]  # other tasks than the paper's: not beside its numbers
    assert rows["Ours (POPE rand, SciQA-IMG from other tasks)"] == [
        f"- / {100 * hand['pope_f1_score']:.1f}",
        f"- / {100 * hand['yes/no accuracy']:.1f}",
    ]
    assert rows["un2CLIP"] == ["88.0 / -", "68.4 / -"]
