"""The numbers DiVE's paper reports (Suzuki et al., AAAI 2026), as data: Tables 2, 3, 4 and 8, by table,
row and column, in percent, for `examples/reproduce_dive.py`, which prints them beside measured ones.

Transcribed from the paper's text; Table 3's "Vanilla FT" row is garbled in the text extraction and was read
as 78.8, 16.0, 37.3, 39.3, 29.7, 4.7, 10.8, 80.2, 15.4, 44.3 (their mean is the printed 35.7). The row
hf_vrl does not train (ARF; "FLYP + replay" is its proxy) maps to None in `ROW_OBJECTIVES`.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "PAPER_TABLES",
    "ROW_OBJECTIVES",
    "PaperTable",
    "comparison_table",
    "paired_p_value",
    "paired_tests",
]

# paper row -> DiVE objective that reproduces it ("pretrained": the model before fine-tuning; None: not here)
ROW_OBJECTIVES: dict[str, str | None] = {
    "Pre-trained": "pretrained",
    "Vanilla FT": "ft",
    "LP-FT": "lp_ft",
    "FLYP": "flyp",
    "ARF": None,
    "FLYP + replay": "flyp_replay",
    "SnD": "snd",
    "DiVE": "dive",
}


@dataclass(frozen=True)
class PaperTable:
    number: int
    title: str
    columns: tuple[str, ...]
    rows: Mapping[str, tuple[float, ...]]

    def __post_init__(self) -> None:
        for row, values in self.rows.items():
            if len(values) != len(self.columns):
                raise ValueError(
                    f"Table {self.number}, {row}: {len(values)} values, {len(self.columns)} columns"
                )


ZERO_SHOT_SETS = ("Caltech", "Flowers", "Food", "SUN", "DTD", "Aircraft", "Cars", "Pets", "EuroSAT", "UCF")

PAPER_TABLES: dict[int, PaperTable] = {
    2: PaperTable(
        2,
        "ID and OOD top-1 accuracy, CLIP ViT-B/16 fine-tuned on ImageNet",
        (
            "ImageNet (ID)",
            "ImageNet-V2",
            "ImageNet-R",
            "ImageNet-A",
            "ImageNet-Sketch",
            "ObjectNet",
            "OOD avg.",
        ),
        {
            "Pre-trained": (68.3, 61.9, 77.7, 50.0, 48.3, 55.4, 58.7),
            "Vanilla FT": (81.3, 71.2, 66.1, 37.8, 46.1, 53.3, 54.9),
            "LP-FT": (81.7, 72.1, 73.5, 47.6, 50.3, 58.2, 60.3),
            "FLYP": (82.2, 73.0, 71.5, 48.4, 49.7, 54.8, 59.5),
            "ARF": (82.7, 72.8, 75.6, 50.3, 51.8, 55.8, 61.3),
            "SnD": (82.4, 73.2, 74.3, 50.0, 51.4, 54.5, 60.7),
            "DiVE": (82.5, 73.8, 77.3, 54.9, 52.9, 56.9, 63.2),
        },
    ),
    3: PaperTable(
        3,
        "zero-shot top-1 accuracy on ten sets, CLIP ViT-B/16 fine-tuned on ImageNet",
        (*ZERO_SHOT_SETS, "ZS avg."),
        {
            "Pre-trained": (88.0, 71.0, 88.5, 65.3, 44.7, 24.3, 64.7, 89.0, 55.3, 68.7, 66.0),
            "Vanilla FT": (78.8, 16.0, 37.3, 39.3, 29.7, 4.7, 10.8, 80.2, 15.4, 44.3, 35.7),
            "LP-FT": (84.0, 44.3, 68.8, 49.9, 37.9, 15.8, 37.7, 81.9, 30.4, 59.5, 51.0),
            "FLYP": (87.6, 39.7, 63.3, 52.6, 36.8, 8.0, 32.3, 77.2, 38.2, 59.0, 49.5),
            "ARF": (88.6, 46.4, 74.5, 63.8, 40.4, 13.9, 44.7, 83.1, 35.8, 64.6, 55.6),
            "SnD": (89.1, 49.5, 69.6, 58.7, 38.7, 11.0, 42.5, 79.6, 42.7, 62.6, 54.4),
            "DiVE": (88.4, 66.0, 84.3, 64.7, 47.0, 22.1, 55.5, 88.4, 51.4, 68.9, 63.7),
        },
    ),
    4: PaperTable(
        4,
        "iWildCam (macro F1) and FMoW (ID top-1, OOD worst-region top-1); ZS: mean zero-shot top-1 of ten "
        "sets",
        ("iWildCam ID", "iWildCam OOD", "iWildCam ZS", "FMoW ID", "FMoW OOD", "FMoW ZS"),
        {
            "Pre-trained": (8.7, 11.2, 66.0, 20.4, 18.7, 66.0),
            "Vanilla FT": (48.1, 35.0, 50.2, 68.5, 39.2, 44.6),
            "LP-FT": (49.7, 34.7, 51.6, 68.4, 40.4, 57.9),
            "FLYP": (52.2, 35.6, 51.0, 68.6, 41.3, 45.1),
            "FLYP + replay": (48.5, 35.8, 62.3, 68.7, 41.2, 63.0),
            "SnD": (50.6, 37.0, 60.4, 67.0, 41.4, 56.6),
            "DiVE": (53.1, 37.2, 65.3, 69.9, 42.3, 65.1),
        },
    ),
    8: PaperTable(
        8,
        "CLIP ViT-L/14 fine-tuned on ImageNet (B' = 256)",
        ("ID", "OOD avg.", "ZS avg."),
        {
            "Pre-trained": (75.2, 70.9, 72.7),
            "FLYP": (86.0, 71.5, 55.4),
            "FLYP + replay": (85.8, 72.6, 65.9),
            "SnD": (86.0, 73.2, 61.2),
            "DiVE": (86.1, 74.5, 70.1),
        },
    ),
}


def _mean_std(value: float | Sequence[float] | None) -> float | tuple[float, float] | None:
    """A measured cell: a number as it is; per-seed values as (mean, sample std), the mean alone for one."""
    if value is None or isinstance(value, (int, float)):
        return value
    if not value:
        return None
    return statistics.mean(value) if len(value) == 1 else (statistics.mean(value), statistics.stdev(value))


def comparison_table(
    table: PaperTable,
    measured: Mapping[str, Mapping[str, Any]],
    *,
    marked: Sequence[str] = (),
    paper: bool = True,
) -> str:
    """The paper's numbers beside the measured ones (`hf_vrl.paper_eval.paper_comparison`): one line per
    paper row, "paper / measured" per column ("-" where nothing was measured). `measured` is {row: {column:
    percent, or a list of percents, one per seed (shown as mean ± sample std)}}; `marked` columns were
    measured on partial sets; `paper=False` leaves the paper's numbers out (another protocol: toy data)."""
    from hf_vrl.paper_eval import paper_comparison

    cells = {row: {c: _mean_std(v) for c, v in columns.items()} for row, columns in measured.items()}
    rows = table.rows if paper else {}
    return paper_comparison(table.columns, rows, {r: c for r, c in cells.items() if c}, marked=marked)


def paired_p_value(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Two-sided p-value of the paired t-test of `a` against `b` (one pair per seed, App. F of the paper);
    None with fewer than two pairs or when every difference is the same (no spread to test against)."""
    from scipy.stats import ttest_rel

    if len(a) != len(b):
        raise ValueError(f"paired samples need one value per seed on both sides, got {len(a)} and {len(b)}")
    differences = [x - y for x, y in zip(a, b)]
    if len(a) < 2 or max(differences) == min(differences):
        return None
    return float(ttest_rel(a, b).pvalue)


def paired_tests(
    table: PaperTable, measured: Mapping[str, Mapping[str, Sequence[float]]], reference: str = "DiVE"
) -> str:
    """Per measured row other than `reference`, per column: `reference` - row, mean over seeds (percentage
    points), and the paired t-test's p-value (Table 13 of the paper; "-" where undefined or unmeasured)."""
    from hf_vrl.evaluation import text_table

    ours = measured.get(reference, {})
    lines: list[Sequence[str]] = [[f"{reference} vs", *table.columns]]
    for row, columns in measured.items():
        if row == reference or not columns:
            continue
        cells = []
        for column in table.columns:
            a, b = list(ours.get(column) or []), list(columns.get(column) or [])
            if not a or len(a) != len(b):
                cells.append("-")
                continue
            p = paired_p_value(a, b)
            delta = statistics.mean(a) - statistics.mean(b)
            cells.append(f"{delta:+.1f} (p {'-' if p is None else f'{p:.3f}'})")
        lines.append([row, *cells])
    return text_table(lines, left_columns=1)
