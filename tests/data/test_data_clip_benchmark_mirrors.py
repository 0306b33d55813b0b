"""clip_benchmark's Hub mirrors (`clip-benchmark/wds_*`, read as LAION-AI/CLIP_benchmark's `build_wds_dataset`
reads them) from local Hub-cache copies of their published file structure, offline, through the real
huggingface_hub code (issue 34): labels from the mirror's classnames.txt, its templates, its counts, every
caption of an image; one spelling per benchmark, never a path's name; the task decides the label level.

The copies: `classnames.txt` (class i = line i), `zeroshot_classification_templates.txt` (`{c}`),
`dataset_type.txt` ("retrieval" for caption sets), `<split>/nshards.txt` and `<split>/<i>.tar` with members
`<key>.webp|jpg` + `<key>.cls` (a class index) or `<key>.txt` (one caption a line)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hub_fixtures import hub_cache_repo, imagenet_wds_files, jpeg, tar_bytes
from huggingface_hub import constants
from PIL import Image

from hf_vrl import eval_command
from hf_vrl.data.registry import load_dataset_by_name
from hf_vrl.errors import UserError
from hf_vrl.eval_inputs import load_counted_dataset

# the EuroSAT copy's own class order (hand-written; the registry's eurosat: lists OpenAI's order)
EUROSAT_NAMES = [
    "forest",
    "river",
    "annual crop land",
    "lake or sea",
    "highway or road",
    "industrial buildings or commercial buildings",
    "pasture land",
    "permanent crop land",
    "residential buildings or homes or apartments",
    "brushland or shrubland",
]
EUROSAT_TEMPLATES = "a centered satellite photo of {c}.\na centered satellite photo of a {c}.\n"
EUROSAT_TEMPLATES += "a centered satellite photo of the {c}.\n"


def _classification_shard(labels: list[int], first: int = 0, suffix: str = "webp") -> bytes:
    """Label-only samples, as the mirrors hold them: `<key>.<image>` and `<key>.cls`, nothing else."""
    members = []
    for i, label in enumerate(labels, start=first):
        members += [(f"s{i:07d}.{suffix}", jpeg(i)), (f"s{i:07d}.cls", f"{label}\n".encode())]
    return tar_bytes(members)


def _text(lines: list[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode()


def eurosat_files() -> dict[str, bytes]:
    """wds_vtab-eurosat: classnames.txt, zeroshot_classification_templates.txt, train/ and test/ (no
    dataset_type.txt); two test shards."""
    return {
        "classnames.txt": _text(EUROSAT_NAMES),
        "zeroshot_classification_templates.txt": EUROSAT_TEMPLATES.encode(),
        "test/nshards.txt": b"2",
        "test/0.tar": _classification_shard([0, 2, 3]),
        "test/1.tar": _classification_shard([9, 2], first=3),
        "train/nshards.txt": b"1",
        "train/0.tar": _classification_shard([1, 1], first=100),
    }


def imagenet_files() -> dict[str, bytes]:
    """wds_imagenet1k: 1,000 class names (the first five written out; OpenAI's list names two classes
    "missile"), OpenAI-style templates, test/."""
    names = ["tench", "goldfish", "great white shark", "missile", "missile"]
    names += [f"class number {i}" for i in range(5, 1000)]
    return {
        "classnames.txt": _text(names),
        "zeroshot_classification_templates.txt": b"a bad photo of a {c}.\na photo of many {c}.\n",
        "test/nshards.txt": b"1",
        "test/0.tar": _classification_shard([2, 0, 1, 2], suffix="jpg"),
    }


FLICKR_CAPTIONS = [[f"image {i} caption {j}" for j in range(5)] for i in range(4)]


def flickr_files() -> dict[str, bytes]:
    """wds_flickr30k: dataset_type.txt "retrieval", test/ shards of `.jpg` + `.txt` (a caption a line)."""
    members = []
    for i, captions in enumerate(FLICKR_CAPTIONS):
        members += [(f"s{i:07d}.jpg", jpeg(i)), (f"s{i:07d}.txt", "\n".join(captions).encode())]
    return {"dataset_type.txt": b"retrieval\n", "test/nshards.txt": b"1", "test/0.tar": tar_bytes(members)}


def aircraft_files() -> dict[str, bytes]:
    return {
        "classnames.txt": _text(["707-320", "727-200", "A300B4"]),
        "zeroshot_classification_templates.txt": b"a photo of a {c}, a type of aircraft.\n",
        "test/nshards.txt": b"1",
        "test/0.tar": _classification_shard([2, 0]),
    }


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Hub cache (HF_HUB_CACHE=tmp) holding four clip_benchmark mirrors, offline (HF_HUB_OFFLINE=1)."""
    cache = tmp_path / "hub"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub_cache_repo(cache, "clip-benchmark/wds_vtab-eurosat", eurosat_files())
    hub_cache_repo(cache, "clip-benchmark/wds_imagenet1k", imagenet_files())
    hub_cache_repo(cache, "clip-benchmark/wds_flickr30k", flickr_files())
    hub_cache_repo(cache, "clip-benchmark/wds_fgvc_aircraft", aircraft_files())
    return cache


def _names(dataset) -> list[str]:
    return [dataset.features["label"].names[y] for y in dataset["label"]]


def test_eurosat_mirror_is_labelled_by_its_own_classnames(hub_cache):
    for name in ("eurosat:hf:clip-benchmark/wds_vtab-eurosat", "hf:clip-benchmark/wds_vtab-eurosat"):
        dataset, record = load_counted_dataset(name, split="test", allow_partial=True)
        assert _names(dataset) == [
            "forest",
            "annual crop land",
            "lake or sea",
            "brushland or shrubland",
            "annual crop land",
        ], name
        assert dataset.features["label"].names == EUROSAT_NAMES  # the mirror's order, not OpenAI's
        assert record["described"] == "5 of 5,400 images, 4 of 10 classes"  # VTAB's test split, its counts
        assert (
            record["source"].startswith("clip-benchmark/wds_vtab-eurosat") and "27,000" in record["differs"]
        )
        assert dataset[0]["image"].size == (48, 40)  # read from its place in the shard
    train = load_dataset_by_name("eurosat:hf:clip-benchmark/wds_vtab-eurosat", split="train")
    assert _names(train) == ["river", "river"]
    with pytest.raises(UserError, match="5 of 5,400 images") as error:  # a partial copy is refused
        load_counted_dataset("eurosat:hf:clip-benchmark/wds_vtab-eurosat", split="test")
    assert len(str(error.value).splitlines()) == 1


def test_eval_scores_the_imagenet_mirror_with_its_names_and_templates(hub_cache, tiny_clip, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["--model", str(tiny_clip), "--dataset", "imagenet:hf:clip-benchmark/wds_imagenet1k"]
    argv += ["--tasks", "zero_shot", "--allow-partial", "--no-figures", "--output-dir", str(out)]
    assert eval_command.main(argv) == 0
    report = json.loads((out / "report.json").read_text())
    zero_shot = report["zero_shot"]
    assert zero_shot["class_names"] == "hf:clip-benchmark/wds_imagenet1k/classnames.txt"
    assert zero_shot["templates"] == "hf:clip-benchmark/wds_imagenet1k/zeroshot_classification_templates.txt"
    assert zero_shot["n_templates"] == 2
    counts = report["counts"]["test"]
    assert counts["described"] == "4 of 50,000 images, 3 of 1,000 classes" and counts["split"] == "validation"
    assert counts["source"].startswith("clip-benchmark/wds_imagenet1k")
    assert "MIRROR test: scored on clip-benchmark/wds_imagenet1k" in capsys.readouterr().out
    dataset, _ = load_counted_dataset(
        "imagenet:hf:clip-benchmark/wds_imagenet1k", split="test", allow_partial=True
    )
    assert _names(dataset) == ["great white shark", "tench", "goldfish", "great white shark"]
    label_names = dataset.features[
        "label"
    ].names  # a ClassLabel needs distinct names; prompts keep the file's
    assert label_names[3:5] == ["missile (class 3)", "missile (class 4)"]
    from hf_vrl.eval_inputs import mirror_prompts

    assert mirror_prompts("imagenet:hf:clip-benchmark/wds_imagenet1k").class_names[3:5] == (
        "missile",
        "missile",
    )


def test_mirror_templates_are_filled_as_clip_benchmark_fills_them(hub_cache):
    from hf_vrl.eval_inputs import mirror_prompts
    from hf_vrl.evaluation import mirror_templates

    mirror = mirror_prompts("hf:clip-benchmark/wds_vtab-eurosat")
    prompts = mirror_templates(mirror)
    assert [t("river") for t in prompts.templates] == [
        "a centered satellite photo of river.",
        "a centered satellite photo of a river.",
        "a centered satellite photo of the river.",
    ]
    assert mirror.class_names == tuple(EUROSAT_NAMES)


def test_flickr_mirror_keeps_every_caption_and_records_the_counts(hub_cache, tiny_clip, tmp_path):
    out = tmp_path / "out"
    argv = ["--model", str(tiny_clip), "--dataset", "hf:clip-benchmark/wds_flickr30k", "--tasks", "retrieval"]
    argv += ["--allow-partial", "--no-figures", "--output-dir", str(out)]
    assert eval_command.main(argv) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["retrieval"]["n_texts"] == 20 and report["n_samples"] == 4
    assert report["counts"]["test"]["described"] == "4 of 1,000 images, 20 of 5,000 captions"
    dataset, _ = load_counted_dataset(
        "flickr30k:hf:clip-benchmark/wds_flickr30k", split="test", allow_partial=True
    )
    assert dataset["caption"] == FLICKR_CAPTIONS


def test_a_local_copy_reads_in_every_spelling(tmp_path):
    """`<key>:<folder>`, `hf:<folder>`, a bare folder and `webdataset:<folder>/test/*.tar` (which was refused
    as a missing FGVC-Aircraft, its path being named fgvc_aircraft)."""
    root = tmp_path / "fgvc_aircraft"
    for name, data in aircraft_files().items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    for name in (f"hf:{root}", str(root), f"webdataset:{root}/test/*.tar"):
        dataset = load_dataset_by_name(name, split="test")
        assert _names(dataset) == ["A300B4", "707-320"], name
    _, record = load_counted_dataset(f"webdataset:{root}/test/*.tar", split="test")
    assert record["described"] == "2 images" and "official_images" not in record  # a user's own copy
    dataset, record = load_counted_dataset(f"aircraft:{root}", split="test", allow_partial=True)
    assert (
        _names(dataset) == ["A300B4", "707-320"]
        and record["described"] == "2 of 3,333 images, 2 of 100 classes"
    )


def test_offline_without_the_mirror_in_the_cache_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match="not in the local Hub cache") as error:
        load_counted_dataset("imagenet:hf:clip-benchmark/wds_imagenet1k", split="test")
    assert len(str(error.value).splitlines()) == 1


def _car_folders(root: Path) -> Path:
    for name in ("Aston Martin V8 Vantage Coupe 2012", "Audi R8 Coupe 2012"):
        for split in ("train", "test"):
            (root / split / name).mkdir(parents=True)
            Image.new("RGB", (12, 10), (20, 40, 60)).save(root / split / name / "0.jpg")
    return root


def test_a_users_folder_named_cars_is_a_users_folder(tmp_path):
    """Class folders that happen to be Stanford Cars' under a path named cars: the user's own data (no
    official counts, its own folder names), unless the key says otherwise."""
    root = _car_folders(tmp_path / "cars")
    dataset, record = load_counted_dataset(f"imagefolder:{root}", split="test")
    assert record is None and len(dataset.features["label"].names) == 2


def test_the_task_decides_the_label_level_whatever_key_names_the_data(tmp_path):
    """`cars:` scored zero-shot labels the 196 models, as `stanford_cars:` does (the 49 makes were scored
    while the report said "of 196 classes"); granularity keeps the make in `label`."""
    root = _car_folders(tmp_path / "photos")
    for key in ("cars", "stanford_cars"):
        dataset, record = load_counted_dataset(
            f"{key}:{root}", split="test", allow_partial=True, tasks=["zero_shot"]
        )
        assert dataset.features["label"].num_classes == 196, key
        assert set(_names(dataset)) == {"Aston Martin V8 Vantage Coupe 2012", "Audi R8 Coupe 2012"}, key
        assert record["described"] == "2 of 8,041 images, 2 of 196 classes"
    coarse, _ = load_counted_dataset(f"cars:{root}", split="test", allow_partial=True, tasks=["granularity"])
    assert set(_names(coarse)) == {"Aston Martin", "Audi"}
    with pytest.raises(UserError, match="run granularity on its own"):
        load_counted_dataset(
            f"cars:{root}", split="test", allow_partial=True, tasks=["granularity", "zero_shot"]
        )


def test_reproduce_tables_read_the_hub_mirror_without_a_data_root(hub_cache, tmp_path, monkeypatch):
    """`reproduce_*.py --table N` with nothing on disk: each set from its Hub mirror (here the local Hub
    cache), scored with the mirror's names and noted beside the table; one line when the cache lacks it."""
    from hf_vrl.paper_eval import TableData

    data = TableData(None, {}, allow_partial=True)
    dataset = data.load("eurosat")
    assert _names(dataset)[:2] == ["forest", "annual crop land"]
    assert data.mirror("eurosat").class_names == tuple(EUROSAT_NAMES)
    note = [line for line in data.notes() if "Hub mirror" in line]
    assert note and "clip-benchmark/wds_vtab-eurosat" in note[0] and "27,000" in note[0]
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty"))
    with pytest.raises(UserError, match="not in the local Hub cache") as error:
        TableData(None, {}).load("cifar10")
    assert len(str(error.value).splitlines()) == 1


def test_timm_imagenet_wds_labels_each_sample_by_its_cls_and_keeps_splits_apart(hub_cache):
    """timm/imagenet-1k-wds (imagenet1k-{train,validation}-NNNN.tar, .cls = ImageNet's class index): the
    validation split reads only the validation shards, labelled in ImageNet's WordNet ids."""
    hub_cache_repo(hub_cache, "timm/imagenet-1k-wds", imagenet_wds_files(train=[4], validation=[3]))
    name = "imagenet:hf:timm/imagenet-1k-wds"
    validation, record = load_counted_dataset(name, split="validation", allow_partial=True)
    assert _names(validation) == [
        "n01494475",
        "n01496331",
        "n01498041",
    ]  # .cls 4, 5, 6: hammerhead, ray, stingray
    assert record["described"] == "3 of 50,000 images, 3 of 1,000 classes"
    assert record["source"].startswith("timm/imagenet-1k-wds")
    train = load_dataset_by_name(name, split="train")
    assert _names(train) == ["n01440764", "n01443537", "n01484850", "n01491361"]
    assert not set(train["key"]) & set(validation["key"])


def test_mmvp_vlm_from_the_hub(hub_cache, tiny_clip, tmp_path):
    """MMVP/MMVP_VLM holds the official layout (Questions.csv, 'MLLM_VLM Images/<Type>/<qid>.jpg')."""
    buffer = [("Orientation", "the dog faces left"), ("Orientation", "the dog faces right")]
    files = {"Questions.csv": b"Question ID,Type,Statement\n", "README.md": b"# MMVP-VLM\n"}
    for qid, (kind, statement) in enumerate(buffer, start=1):
        files["Questions.csv"] += f"{qid},{kind},{statement}\n".encode()
        files[f"MLLM_VLM Images/{kind}/{qid}.jpg"] = jpeg(qid)
    hub_cache_repo(hub_cache, "MMVP/MMVP_VLM", files)
    out = tmp_path / "out"
    argv = ["--model", str(tiny_clip), "--mmvp-dir", "hf:MMVP/MMVP_VLM", "--allow-partial", "--no-figures"]
    assert eval_command.main([*argv, "--output-dir", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["counts"]["mmvp"]["described"] == "1 of 135 pairs, 1 of 9 categories"
    assert report["counts"]["mmvp"]["source"].startswith("MMVP/MMVP_VLM") and "mmvp" in report


def test_cub_from_a_hub_copy(hub_cache):
    """`cub:hf:<copy>` (was refused): a parquet copy (data/train-*.parquet, data/test-*.parquet, a ClassLabel
    of the publisher's class folders) read offline from the Hub cache, counted against CUB's official
    split."""
    import io

    import datasets

    names = ["001.Black_footed_Albatross", "002.Laysan_Albatross"] + [
        f"{i:03d}.Bird_{i}" for i in range(3, 201)
    ]
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=names)})
    files = {"README.md": b"# CUB-200-2011\n"}
    for split, labels in (("train", [0, 1, 1]), ("test", [1, 0])):
        rows = {"image": [Image.new("RGB", (12, 10), (i * 40, 20, 20)) for i in range(len(labels))]}
        buffer = io.BytesIO()
        datasets.Dataset.from_dict(rows | {"label": labels}, features=features).to_parquet(buffer)
        files[f"data/{split}-00000-of-00001.parquet"] = buffer.getvalue()
    hub_cache_repo(hub_cache, "efekankavalci/CUB_200_2011", files)
    test, record = load_counted_dataset("cub:hf:efekankavalci/CUB_200_2011", split="test", allow_partial=True)
    assert _names(test) == ["laysan albatross", "black footed albatross"]
    assert record["described"] == "2 of 5,794 images, 2 of 200 classes"
    assert record["source"].startswith("efekankavalci/CUB_200_2011")
    train = load_dataset_by_name("cub:hf:efekankavalci/CUB_200_2011", split="train")
    assert _names(train) == ["black footed albatross", "laysan albatross", "laysan albatross"]
