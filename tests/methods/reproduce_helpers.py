"""Synthetic benchmarks in the layouts the reproduce examples read (image folders, parquet, the official
MMVP-VLM folder, local lmms-eval tasks) and tiny models to evaluate on them."""

from __future__ import annotations

import csv
import importlib.util
import io
import re
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from hf_vrl.metrics.mmvp import MMVP_CATEGORIES

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


def image_folder(root: Path, splits=("train", "test"), classes=("red", "green", "blue"), per_class=4) -> Path:
    """root/<split>/<class>/<i>.png, each class one noisy colour."""
    rng = np.random.default_rng(0)
    for split in splits:
        for name, colour in zip(classes, COLOURS):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(per_class):
                _image(colour, rng).save(folder / f"{i}.png")
    return root


def retrieval_parquet(root: Path, n: int = 6) -> Path:
    """root/test-00000-of-00001.parquet: image + caption (two per image), as datasets writes a split."""
    import datasets

    rng = np.random.default_rng(1)
    rows = {"image": [], "caption": []}
    for i in range(n):
        colour = COLOURS[i % 3]
        buffer = io.BytesIO()
        _image(colour, rng).save(buffer, format="PNG")
        rows["image"].append({"bytes": buffer.getvalue(), "path": None})
        rows["caption"].append([f"a photo of colour {i}", f"picture number {i}"])
    features = datasets.Features(
        {"image": datasets.Image(), "caption": datasets.Sequence(datasets.Value("string"))}
    )
    root.mkdir(parents=True)
    datasets.Dataset.from_dict(rows, features=features).to_parquet(root / "test-00000-of-00001.parquet")
    return root


def mmvp_folder(root: Path) -> Path:
    """The official MMVP-VLM layout: Questions.csv and MLLM_VLM Images/<Type>/<qid>.jpg, one pair a type."""
    rng = np.random.default_rng(2)
    rows = []
    for n, category in enumerate(MMVP_CATEGORIES):
        folder = root / "MLLM_VLM Images" / category
        folder.mkdir(parents=True)
        for qid, colour in ((2 * n + 1, COLOURS[0]), (2 * n + 2, COLOURS[2])):
            _image(colour, rng).save(folder / f"{qid}.jpg")
            rows.append({"Question ID": qid, "Type": category, "Statement": f"the thing is {colour}"})
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
