"""MMVP-VLM (Tong et al. 2024, "Eyes Wide Shut?"): 135 pairs of CLIP-blind images, one statement per image,
15 pairs in each of nine visual patterns.

Protocol of the official `scripts/evaluate_vlm.py` (also used by DIVA and DCR): the text is
"a photo of " + statement, each statement takes a softmax over the pair's two images and picks the first
image when its probability exceeds 0.5, and a pair counts only if both statements pick their own image. A
pair's category is its position, as the official script assigns it (`categories[num_pairs // 15]` over the
official category list): here the pair of question ids (2p + 1, 2p + 2) is in pattern p // 15, which is the
script's position in the official file and stays right for a partial copy. The file's own `Type` spellings
only name the image folders; a file whose Type does not stay the same within a pattern (or repeats across
patterns), or whose pairs are not the official 135, is refused (`allow_partial` reads a partial copy).
Scoring (`mmvp_score`, one copy shared with the `evaluate` module) is separate from reading the folder.
"""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

from hf_vrl.errors import UserError
from hf_vrl.metrics.evaluate_modules.mmvp.scores import (
    MMVP_CATEGORIES,
    PAIRS_PER_CATEGORY,
    category_of_pair,
    mmvp_score,
)

__all__ = ["MMVP_CATEGORIES", "MMVP_PAIRS", "PROMPT_PREFIX", "load_mmvp_vlm", "mmvp_score"]

PROMPT_PREFIX = "a photo of "
# the official script's folder name; the README's tree and DIVA's scripts write it with underscores
IMAGE_DIRS = ("MLLM_VLM Images", "MLLM_VLM_Images", "MMVP_VLM_Images", "MMVP_VLM Images")
CSV_COLUMNS = ("Question ID", "Type", "Statement")
MMVP_PAIRS = len(MMVP_CATEGORIES) * PAIRS_PER_CATEGORY  # 135


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
            raise UserError(
                f"{csv_path} lacks columns {missing}; found {header}, expected {list(CSV_COLUMNS)}"
            )
        return [{k.strip(): (v or "").strip() for k, v in row.items() if k} for row in reader]


def _pairs(rows: list[dict[str, str]]) -> list[tuple[int, dict[str, str], dict[str, str]]]:
    """(pair position in the official file, row a, row b) per pair; consecutive rows with question ids
    (2p + 1, 2p + 2), in increasing order."""
    if len(rows) % 2:
        raise UserError(f"Questions.csv has {len(rows)} rows; MMVP-VLM rows come in pairs")
    pairs, last = [], -1
    for a, b in zip(rows[::2], rows[1::2]):
        qa, qb = int(a["Question ID"]), int(b["Question ID"])
        if qa % 2 != 1 or qb != qa + 1:
            raise UserError(
                f"rows with qids {qa}, {qb} are not a pair (expected an odd qid followed by qid+1)"
            )
        position = (qa - 1) // 2
        if position <= last or position >= MMVP_PAIRS:
            raise UserError(
                f"pair {qa}/{qb}: question ids must increase and stay within the official {2 * MMVP_PAIRS}"
            )
        if a["Type"] != b["Type"]:
            raise UserError(f"pair {qa}/{qb} mixes categories {a['Type']!r} and {b['Type']!r}")
        pairs.append((position, a, b))
        last = position
    return pairs


def _check_categories(pairs: list[tuple[int, dict[str, str], dict[str, str]]]) -> None:
    """Each official pattern keeps one Type spelling (its pairs' most common one: a pair that differs is named
    by its question ids), and no spelling spans two patterns (a UserError otherwise, as for every malformed
    file)."""
    types: dict[str, Counter] = {}
    for position, a, _ in pairs:
        types.setdefault(category_of_pair(position), Counter())[a["Type"]] += 1
    spelling = {}
    for category, counts in types.items():
        (common, n), *others = counts.most_common()
        if others and others[0][1] == n:
            raise UserError(
                f"the pairs of '{category}' disagree on its Type ({', '.join(map(repr, counts))}, as many "
                "pairs each): not MMVP-VLM's file"
            )
        spelling[category] = common
    for position, a, b in pairs:
        known = spelling[category_of_pair(position)]
        if a["Type"] != known:
            raise UserError(
                f"pair {a['Question ID']}/{b['Question ID']}: Type {a['Type']!r} where the other pairs of "
                f"'{category_of_pair(position)}' ({PAIRS_PER_CATEGORY} pairs a pattern, as the official file "
                f"orders them) say {known!r}"
            )
    repeated = [t for t in set(spelling.values()) if list(spelling.values()).count(t) > 1]
    if repeated:
        raise UserError(f"Type {repeated[0]!r} spans several of the official patterns: not MMVP-VLM's file")


def _with_images(
    directory: Path, pairs: list[tuple[int, dict[str, str], dict[str, str]]], allow_partial: bool
) -> list[tuple[int, dict[str, str], dict[str, str], Path, Path]]:
    """The pairs with their two image paths; a pair missing an image is refused in one line, or, with
    `allow_partial`, left out (the counts then say how many pairs were scored)."""
    image_root = _image_root(directory)
    found, missing = [], []
    for position, a, b in pairs:
        paths = [image_root / a["Type"] / f"{row['Question ID']}.jpg" for row in (a, b)]
        absent = [path for path in paths if not path.is_file()]
        missing += absent
        if not absent:
            found.append((position, a, b, *paths))
    if missing and not allow_partial:
        raise UserError(
            f"MMVP-VLM at {directory}: {len(missing)} of {2 * len(pairs)} images missing (first: "
            f"{missing[0]}); give the whole folder, or pass --allow-partial to score the pairs whose images "
            "are there, marked as partial"
        )
    if not found:
        raise UserError(f"MMVP-VLM at {directory}: no pair has both its images (first missing: {missing[0]})")
    return found


def load_mmvp_vlm(directory: str | Path, *, allow_partial: bool = False):
    """Read the official MMVP-VLM layout (`Questions.csv` + `MLLM_VLM Images/<Type>/<qid>.jpg`) into a
    `datasets.Dataset` of pairs: qid_a, qid_b, category (the official pattern, module docstring),
    statement_a, statement_b, image_a, image_b. Consecutive rows form a pair (odd qid first): statement_a is
    true of image_a, statement_b of image_b. A file of other than the 135 pairs, or a folder missing an
    image, is refused in one line unless `allow_partial` (the pairs missing an image are then left out)."""
    import datasets

    directory = Path(directory)
    pairs = _pairs(_read_questions(directory / "Questions.csv"))
    _check_categories(pairs)
    categories = {category_of_pair(position) for position, _, _ in pairs}
    if len(pairs) != MMVP_PAIRS and not allow_partial:
        raise UserError(
            f"MMVP-VLM at {directory}: {len(pairs)} of {MMVP_PAIRS} pairs, {len(categories)} of "
            f"{len(MMVP_CATEGORIES)} categories; give the official Questions.csv, or pass --allow-partial to "
            "score it marked as partial"
        )
    cols: dict[str, list] = {k: [] for k in ("qid_a", "qid_b", "category", "statement_a", "statement_b")}
    cols.update(image_a=[], image_b=[])
    for position, a, b, image_a, image_b in _with_images(directory, pairs, allow_partial):
        cols["image_a"].append(str(image_a))
        cols["image_b"].append(str(image_b))
        cols["qid_a"].append(int(a["Question ID"]))
        cols["qid_b"].append(int(b["Question ID"]))
        cols["category"].append(category_of_pair(position))
        cols["statement_a"].append(a["Statement"])
        cols["statement_b"].append(b["Statement"])
    ds = datasets.Dataset.from_dict(cols)
    return ds.cast_column("image_a", datasets.Image()).cast_column("image_b", datasets.Image())
