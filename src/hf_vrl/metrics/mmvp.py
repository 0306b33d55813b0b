"""MMVP-VLM (Tong et al. 2024, "Eyes Wide Shut?"): 150 pairs of CLIP-blind images, one statement per image.

Protocol of the official `scripts/evaluate_vlm.py` (also used by DIVA and DCR): the text is
"a photo of " + statement, each statement takes a softmax over the pair's two images and picks the first
image when its probability exceeds 0.5, and a pair counts only if both statements pick their own image.
Categories come from the `Type` column (the official script counts 15 pairs per category by row position,
which groups the official file identically). Scoring (`mmvp_score`) is separate from reading the official
folder (`load_mmvp_vlm`); the toy MMVP-style pairs use the same scorer.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

PROMPT_PREFIX = "a photo of "
IMAGE_DIRS = ("MLLM_VLM Images", "MLLM_VLM_Images")  # official name; DIVA's scripts use the underscore
CSV_COLUMNS = ("Question ID", "Type", "Statement")
MMVP_CATEGORIES = (
    "Orientation and Direction",
    "Presence of Specific Features",
    "State and Condition",
    "Quantity and Count",
    "Positional and Relational Context",
    "Color and Appearance",
    "Structural Characteristics",
    "Texts",
    "Viewpoint and Perspective",
)


def mmvp_score(logits: Any, categories: Sequence[str] | None = None) -> dict[str, Any]:
    """Score MMVP pairs from `logits[p, s, i]`: similarity of statement s of pair p with image i, where
    statement 0 describes image 0 and statement 1 describes image 1.

    Per statement a softmax over the two images; the prediction is image 0 iff its probability > 0.5
    (a tie goes to image 1, as in the official script). Returns {"accuracy" (pairs with both statements
    right), "mean_category_accuracy", "per_category", "statement_accuracy", "n_pairs"}.
    """
    if hasattr(logits, "detach"):
        logits = logits.detach().float().cpu().numpy()
    z = np.asarray(logits, dtype=np.float64)
    if z.ndim != 3 or z.shape[1:] != (2, 2) or z.shape[0] == 0:
        raise ValueError(f"logits must have shape [n_pairs, 2 statements, 2 images], got {z.shape}")
    cats = ["all"] * z.shape[0] if categories is None else [str(c) for c in categories]
    if len(cats) != z.shape[0]:
        raise ValueError(f"{len(cats)} categories for {z.shape[0]} pairs")
    z = z - z.max(axis=2, keepdims=True)
    probs = np.exp(z) / np.exp(z).sum(axis=2, keepdims=True)
    picks_first = probs[:, :, 0] > 0.5
    statement_ok = picks_first == np.array([True, False])
    pair_ok = statement_ok.all(axis=1)
    cat_arr = np.asarray(cats)
    per_category = {c: float(pair_ok[cat_arr == c].mean()) for c in dict.fromkeys(cats)}
    return {
        "accuracy": float(pair_ok.mean()),
        "mean_category_accuracy": float(np.mean(list(per_category.values()))),
        "per_category": per_category,
        "statement_accuracy": float(statement_ok.mean()),
        "n_pairs": int(z.shape[0]),
    }


def _image_root(directory: Path) -> Path:
    for name in IMAGE_DIRS:
        if (directory / name).is_dir():
            return directory / name
    raise FileNotFoundError(f"{directory} has no image folder; expected one of {list(IMAGE_DIRS)}")


def _read_questions(csv_path: Path) -> list[dict[str, str]]:
    if not csv_path.is_file():
        raise FileNotFoundError(f"MMVP-VLM questions file not found: {csv_path}")
    with csv_path.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        header = [h.strip() for h in reader.fieldnames or []]
        missing = [c for c in CSV_COLUMNS if c not in header]
        if missing:
            raise ValueError(
                f"{csv_path} lacks columns {missing}; found {header}, expected {list(CSV_COLUMNS)}"
            )
        return [{k.strip(): (v or "").strip() for k, v in row.items() if k} for row in reader]


def load_mmvp_vlm(directory: str | Path):
    """Read the official MMVP-VLM layout (`Questions.csv` + `MLLM_VLM Images/<Type>/<qid>.jpg`) into a
    `datasets.Dataset` of pairs: qid_a, qid_b, category, statement_a, statement_b, image_a, image_b.

    Consecutive rows form a pair (odd qid first): statement_a is true of image_a, statement_b of image_b.
    """
    import datasets

    directory = Path(directory)
    rows = _read_questions(directory / "Questions.csv")
    image_root = _image_root(directory)
    if len(rows) % 2:
        raise ValueError(f"Questions.csv has {len(rows)} rows; MMVP-VLM rows come in pairs")
    cols: dict[str, list] = {k: [] for k in ("qid_a", "qid_b", "category", "statement_a", "statement_b")}
    cols.update(image_a=[], image_b=[])
    for a, b in zip(rows[::2], rows[1::2]):
        qa, qb = int(a["Question ID"]), int(b["Question ID"])
        if qa % 2 != 1 or qb != qa + 1:
            raise ValueError(
                f"rows with qids {qa}, {qb} are not a pair (expected an odd qid followed by qid+1)"
            )
        if a["Type"] != b["Type"]:
            raise ValueError(f"pair {qa}/{qb} mixes categories {a['Type']!r} and {b['Type']!r}")
        for key, qid in (("image_a", qa), ("image_b", qb)):
            path = image_root / a["Type"] / f"{qid}.jpg"
            if not path.is_file():
                raise FileNotFoundError(f"MMVP-VLM image missing: {path}")
            cols[key].append(str(path))
        cols["qid_a"].append(qa)
        cols["qid_b"].append(qb)
        cols["category"].append(a["Type"])
        cols["statement_a"].append(a["Statement"])
        cols["statement_b"].append(b["Statement"])
    ds = datasets.Dataset.from_dict(cols)
    return ds.cast_column("image_a", datasets.Image()).cast_column("image_b", datasets.Image())
