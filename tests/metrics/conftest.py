"""Fixtures for the evaluation-suite tests: a fake MMVP-VLM folder in the official layout."""

import csv

import pytest
from PIL import Image

COLORS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255)}


def write_mmvp_dir(root, pairs, image_dir="MLLM_VLM Images"):
    """`pairs`: (category, (color_a, statement_a), (color_b, statement_b)); qids 1, 2, 3, ... in order."""
    with open(root / "Questions.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["Question ID", "Type", "Statement"])
        qid = 1
        for category, *members in pairs:
            (root / image_dir / category).mkdir(parents=True, exist_ok=True)
            for color, statement in members:
                Image.new("RGB", (16, 16), COLORS[color]).save(root / image_dir / category / f"{qid}.jpg")
                writer.writerow([qid, category, statement])
                qid += 1
    return root


@pytest.fixture
def mmvp_writer():
    """`write_mmvp_dir(root, pairs, image_dir=...)`, for tests that need their own pairs."""
    return write_mmvp_dir


@pytest.fixture
def mmvp_dir(tmp_path):
    """The first three pairs of the official file (qids 1-6: the Orientation pattern), a partial copy."""
    pairs = [
        ("Orientation", ("red", "a red square"), ("blue", "a blue square")),
        ("Orientation", ("green", "a green square"), ("red", "a red square")),
        ("Orientation", ("blue", "a blue square"), ("green", "a green square")),
    ]
    return write_mmvp_dir(tmp_path, pairs)
