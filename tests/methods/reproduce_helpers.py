"""Tiny hand-made copies of the benchmarks in the layouts their publishers ship (class folders named as the
publishers name them, ILSVRC-2012's flat validation folder with Kaggle's LOC_val_solution.csv, the ImageNet-R,
-A, -Sketch, -V2 archives, the FGVC-Aircraft archive, Karpathy's caption splits, the official MMVP-VLM
folder), local lmms-eval tasks, and tiny models to evaluate on them."""

from __future__ import annotations

import csv
import importlib.util
import json
import re
import sys
from pathlib import Path

import numpy as np
from PIL import Image

EXAMPLES = Path(__file__).parents[2] / "examples"
INTEGRATIONS = Path(__file__).parents[1] / "integrations"
POPE_TASK = "hfvrl_toy_pope"
POPE_ANSWERS = ["yes", "yes", "no", "no", "no", "no"]
# lmms-eval's POPE task (utils and metrics) on local_task's parquet, answers of one token as the yes/no task
POPE_YAML = """\
task: {task}
dataset_path: parquet
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_visual: !function pope_utils.pope_doc_to_visual
doc_to_text: !function pope_utils.pope_doc_to_text
doc_to_target: answer
generation_kwargs:
  max_new_tokens: 1
  temperature: 0
  do_sample: false
process_results: !function pope_utils.pope_process_results
metric_list:
  - metric: pope_accuracy
    aggregation: !function pope_utils.pope_aggregate_accuracy
    higher_is_better: true
  - metric: pope_precision
    aggregation: !function pope_utils.pope_aggregate_precision
    higher_is_better: true
  - metric: pope_recall
    aggregation: !function pope_utils.pope_aggregate_recall
    higher_is_better: true
  - metric: pope_f1_score
    aggregation: !function pope_utils.pope_aggregate_f1_score
    higher_is_better: true
lmms_eval_specific_kwargs:
  default:
    pre_prompt: ""
    post_prompt: "\\nAnswer the question using a single word or phrase."
metadata:
  version: 0.0
"""
COLOURS = [(220, 30, 30), (30, 200, 40), (40, 60, 230)]


def example(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _image(colour: tuple[int, int, int], rng: np.random.Generator, size: int = 16) -> Image.Image:
    noise = rng.integers(-30, 30, (size, size, 3))
    return Image.fromarray(np.clip(np.array(colour) + noise, 0, 255).astype(np.uint8))


# three classes of each classification set, named as the publisher's folders (or OpenAI's list) name them
CLASSES = {
    "mnist": ("0", "1", "2"),
    "cifar10": ("airplane", "automobile", "bird"),
    "cifar100": ("apple", "aquarium_fish", "baby"),
    "eurosat": ("AnnualCrop", "Forest", "SeaLake"),
    "caltech101": ("Faces_easy", "Leopards", "accordion"),
    "dtd": ("banded", "blotchy", "braided"),
    "pets": ("Abyssinian", "Bengal", "american_bulldog"),
    "flowers": ("1", "2", "3"),  # Flowers-102's label ids (imagelabels.mat), 1-based
    "sun397": ("abbey", "airplane_cabin", "airport_terminal"),
    "food101": ("apple_pie", "baby_back_ribs", "baklava"),
    "ucf101": ("ApplyEyeMakeup", "ApplyLipstick", "Archery"),  # mid-frame folders, named as UCF-101's clips
    "cars": ("AM General Hummer SUV 2000", "Acura RL Sedan 2012", "Acura TL Sedan 2012"),
}
IMAGENET = ("n01440764", "n01443537", "n01484850")  # tench, goldfish, great white shark
IMAGENET_A = ("n01498041", "n01531178", "n01534433")  # of ImageNet-A's 200
IMAGENET_R = ("n01443537", "n01484850", "n01494475")  # of ImageNet-R's 200
AIRCRAFT = (
    ("707-320", "Boeing 707", "Boeing"),
    ("A380", "A380", "Airbus"),
    ("Cessna 172", "Cessna 172", "Cessna"),
)


def _write(
    folder: Path, count: int, colour: tuple[int, int, int], rng: np.random.Generator, ext="jpg"
) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        _image(colour, rng).save(folder / f"{i}.{ext}")


def class_folders(root: Path, key: str, splits=("test",), per_class: int = 4) -> Path:
    """root/<split>/<class>/<i>.jpg with `key`'s classes, each class one noisy colour."""
    rng = np.random.default_rng(0)
    for split in splits:
        for name, colour in zip(CLASSES[key], COLOURS):
            _write(root / split / name, per_class, colour, rng)
    return root


def imagenet_val(root: Path, per_class: int = 4) -> Path:
    """Kaggle's ImageNet: ILSVRC/Data/CLS-LOC/val/ (flat) with LOC_val_solution.csv (the WNID first)."""
    rng = np.random.default_rng(1)
    val = root / "ILSVRC" / "Data" / "CLS-LOC" / "val"
    val.mkdir(parents=True)
    rows, number = ["ImageId,PredictionString"], 0
    for wnid, colour in zip(IMAGENET, COLOURS):
        for _ in range(per_class):
            number += 1
            _image(colour, rng).save(val / f"ILSVRC2012_val_{number:08d}.JPEG", format="JPEG")
            rows.append(f"ILSVRC2012_val_{number:08d},{wnid} 1 1 10 10")
    (root / "LOC_val_solution.csv").write_text("\n".join(rows) + "\n")
    return root


def objectnet(root: Path, per_class: int = 2) -> Path:
    """objectnet-1.0/images/<folder>/<image>.png: three mapped folders and one without an ImageNet class."""
    rng = np.random.default_rng(6)
    for folder, colour in zip(("alarm_clock", "backpack", "banana", "squeegee"), (*COLOURS, COLOURS[0])):
        _write(root / "objectnet-1.0" / "images" / folder, per_class, colour, rng, ext="png")
    return root


def cc3m_shards(root: Path) -> Path:
    """img2dataset's output: 00000.tar (jpg, txt, json per sample) with 00000.parquet and 00000_stats.json."""
    import io
    import tarfile

    root.mkdir(parents=True)
    with tarfile.open(root / "00000.tar", "w") as tar:
        buffer = io.BytesIO()
        Image.new("RGB", (32, 32), COLOURS[0]).save(buffer, "JPEG")
        for ext, data in (("jpg", buffer.getvalue()), ("txt", b"a red square"), ("json", b"{}")):
            info = tarfile.TarInfo(f"000000000.{ext}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    (root / "00000.parquet").write_bytes(b"PAR1 metadata, not data")
    (root / "00000_stats.json").write_text('{"successes": 1}')
    return root


def imagenet_shift(root: Path, key: str, per_class: int = 4) -> Path:
    """An ImageNet shift as its archive extracts: <wnid>/ folders (R, A, Sketch) or <label id>/ (V2)."""
    rng = np.random.default_rng(2)
    folders = {
        "imagenet-r": ("imagenet-r", IMAGENET_R),
        "imagenet-a": ("imagenet-a", IMAGENET_A),
        "imagenet-sketch": ("sketch", IMAGENET),
        "imagenet-v2": ("imagenetv2-matched-frequency-format-val", ("0", "1", "2")),
    }
    top, classes = folders[key]
    for name, colour in zip(classes, COLOURS):
        _write(root / top / name, per_class, colour, rng)
    return root


def aircraft_archive(root: Path, per_variant: int = 6) -> Path:
    """fgvc-aircraft-2013b/data: images/<id>.jpg and images_<level>_{trainval,test}.txt."""
    rng = np.random.default_rng(3)
    data = root / "fgvc-aircraft-2013b" / "data"
    (data / "images").mkdir(parents=True)
    image_id = 1000000
    for split in ("trainval", "test"):
        lines = {"variant": [], "family": [], "manufacturer": []}
        for (variant, family, maker), colour in zip(AIRCRAFT, COLOURS):
            for _ in range(per_variant):
                image_id += 1
                _image(colour, rng).save(data / "images" / f"{image_id}.jpg")
                for level, name in (("variant", variant), ("family", family), ("manufacturer", maker)):
                    lines[level].append(f"{image_id} {name}")
        for level, rows in lines.items():
            (data / f"images_{level}_{split}.txt").write_text("\n".join(rows) + "\n")
    return root


def karpathy(root: Path, key: str, n: int = 6) -> Path:
    """Karpathy's dataset_<name>.json (two captions an image, the test split) beside the image folder."""
    rng = np.random.default_rng(4)
    file, folder = {
        "flickr30k": ("dataset_flickr30k.json", "flickr30k-images"),
        "flickr8k": ("dataset_flickr8k.json", "Flicker8k_Dataset"),
        "mscoco": ("dataset_coco.json", "val2014"),
    }[key]
    images = []
    for i in range(n):
        name = f"COCO_val2014_{i:012d}.jpg" if key == "mscoco" else f"{1000 + i}.jpg"
        (root / folder).mkdir(parents=True, exist_ok=True)
        _image(COLOURS[i % 3], rng).save(root / folder / name)
        sentences = [{"raw": f"a photo of colour {i}"}, {"raw": f"picture number {i}"}]
        entry = {"filename": name, "split": "test", "sentences": sentences}
        images.append(entry | ({"filepath": "val2014"} if key == "mscoco" else {}))
    images.append({"filename": "elsewhere.jpg", "split": "train", "sentences": [{"raw": "not read"}]})
    (root / file).write_text(json.dumps({"images": images, "dataset": key}))
    return root


MMVP_TYPES = ("Orientation", "Presence", "State", "Quantity", "Spatial", "Color", "Structural_Character",
              "Text", "Camera_Perspective")  # fmt: skip


def mmvp_folder(root: Path) -> Path:
    """The official MMVP-VLM folder: Questions.csv (9 patterns x 15 pairs, qids 1..270 in order) and
    MLLM_VLM Images/<Type>/<qid>.jpg, the Type spellings of the official file (its image folders)."""
    rng = np.random.default_rng(5)
    rows, qid = [], 0
    for kind in MMVP_TYPES:
        (root / "MLLM_VLM Images" / kind).mkdir(parents=True)
        for _ in range(15):
            for colour in (COLOURS[0], COLOURS[2]):
                qid += 1
                _image(colour, rng, size=8).save(root / "MLLM_VLM Images" / kind / f"{qid}.jpg")
                rows.append({"Question ID": qid, "Type": kind, "Statement": f"the thing is {colour}"})
    with (root / "Questions.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["Question ID", "Type", "Statement"])
        writer.writeheader()
        writer.writerows(rows)
    return root


def tiny_clip_folder(out: Path) -> Path:
    """A random tiny CLIP (hub_configs/tiny-clip) saved with its processor and tokenizer."""
    import torch
    from transformers import AutoConfig, AutoImageProcessor, AutoTokenizer, CLIPModel

    from hf_vrl.presets import HUB_CONFIGS

    torch.manual_seed(0)
    config = HUB_CONFIGS / "tiny-clip"
    CLIPModel(AutoConfig.from_pretrained(config)).save_pretrained(out)
    AutoImageProcessor.from_pretrained(config).save_pretrained(out)
    AutoTokenizer.from_pretrained(config).save_pretrained(out)
    return out


def hub_fixtures():
    """tests/data/hub_fixtures.py as a module: local Hub-cache copies of dataset repos, read offline."""
    spec = importlib.util.spec_from_file_location(
        "hub_fixtures", Path(__file__).parents[1] / "data/hub_fixtures.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def llava_eval_builders():
    """tests/integrations/test_llava_eval.py as a module: its tiny yes/no LLaVA (yes_no_llava), rows, hand
    count and local lmms-eval task (local_task)."""
    if str(INTEGRATIONS) not in sys.path:
        sys.path.insert(0, str(INTEGRATIONS))  # its llava_helpers
    spec = importlib.util.spec_from_file_location("llava_eval_builders", INTEGRATIONS / "test_llava_eval.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def llava_tasks(root: Path) -> dict:
    """A tiny exported yes/no LLaVA and local lmms-eval tasks on its six rows: the yes/no task (exact_match)
    and a POPE task (lmms-eval's POPE metrics; truths POPE_ANSWERS, so that its four metrics differ); the hand
    count (plain transformers) of the answers and the metrics it gives."""
    builders = llava_eval_builders()
    rows = builders.yes_no_rows()
    model = builders.yes_no_llava(root, rows)
    tasks = builders.local_task(root / "tasks", [{**row} for row in rows])
    pope = builders.local_task(root / "pope", [{**row, "answer": a} for row, a in zip(rows, POPE_ANSWERS)])
    (tasks / f"{POPE_TASK}.yaml").write_text(POPE_YAML.format(task=POPE_TASK, data=pope / "data.parquet"))
    (tasks / "pope_utils.py").write_text("from lmms_eval.tasks.pope.utils import *  # noqa: F403\n")
    said = builders.hand_count(model, rows)
    both = sum(s == t == "yes" for s, t in zip(said, POPE_ANSWERS))
    precision, recall = both / said.count("yes"), both / POPE_ANSWERS.count("yes")
    hand = {
        "yes/no accuracy": sum(s == t for s, t in zip(said, builders.ANSWERS)) / len(rows),
        "pope_accuracy": sum(s == t for s, t in zip(said, POPE_ANSWERS)) / len(rows),
        "pope_precision": precision,
        "pope_recall": recall,
        "pope_f1_score": 2 * precision * recall / (precision + recall),
    }
    return dict(model=model, tasks=tasks, yes_no_task=builders.TASK, said=said, hand=hand)


def lmms_task_metrics(task: str) -> set[str]:
    """The metrics of the installed lmms-eval's task TASK (its YAML and the templates it includes); empty when
    no YAML names it."""
    import lmms_eval

    metric = re.compile(r"^\s*- metric:\s*(\S+)", re.M)
    for path in (Path(lmms_eval.__file__).parent / "tasks").rglob("*.yaml"):
        text = path.read_text(errors="replace")
        if re.search(rf'^task:\s*"?{re.escape(task)}"?\s*(#.*)?$', text, re.M):
            for include in re.findall(r"^include:\s*(\S+)", text, re.M):
                text += (path.parent / include).read_text()
            return set(metric.findall(text))
    return set()
