"""The numbers of CLUE's Tables 2 and 3 (ResNet-50; linear-probe top-1 and image retrieval Rank-1 / Rank-5,
%), shipped as data so `examples/reproduce_clue.py` prints them beside the measured ones.

Table 2 is the ablation of Eq. 8's terms (#1 InfoNCE, #2 text only, #3 global soft, #4 + part, #5 + text);
Table 3 varies the number of part centroids K. Its caption names CUB200 and FGVC-Aircraft, but its columns
hold all three datasets. Its K = 3 row repeats Table 2's #3 (global soft alone, no part term) number for
number, and its K = 8 classification cells on CUB200 / Cars equal #4's; the rows here are as printed.
"""

from __future__ import annotations

__all__ = ["DATASETS", "METRICS", "PAPER_TABLES", "TABLE_ROWS"]

DATASETS = ("CUB200", "Cars", "Aircraft")
METRICS = ("top1", "R@1", "R@5")  # linear probe top-1, retrieval Rank-1, Rank-5


def _row(cub: tuple, cars: tuple, aircraft: tuple) -> dict[str, dict[str, float]]:
    return {name: dict(zip(METRICS, values)) for name, values in zip(DATASETS, (cub, cars, aircraft))}


# table -> row -> dataset -> metric; rows keyed as printed (Table 2's ids, Table 3's K)
PAPER_TABLES: dict[int, dict[str, dict[str, dict[str, float]]]] = {
    2: {
        "#1": _row((62.29, 37.74, 57.07), (60.20, 31.74, 56.05), (51.13, 31.74, 52.07)),
        "#2": _row((64.63, 42.06, 67.43), (64.46, 35.75, 60.69), (52.29, 35.97, 59.77)),
        "#3": _row((65.82, 42.53, 71.31), (64.76, 34.92, 60.46), (56.70, 34.64, 58.84)),
        "#4": _row((66.95, 43.56, 72.21), (65.58, 35.27, 62.16), (57.76, 36.42, 60.24)),
        "#5": _row((69.62, 48.53, 74.71), (72.66, 43.45, 69.49), (58.59, 40.66, 63.56)),
    },
    3: {
        "K = 2": _row((64.60, 42.46, 71.47), (63.20, 34.27, 59.16), (55.93, 33.74, 56.07)),
        "K = 3": _row((65.82, 42.53, 71.31), (64.76, 34.92, 60.46), (56.70, 34.64, 58.84)),
        "K = 4": _row((66.10, 43.48, 71.52), (65.91, 34.57, 59.11), (56.76, 33.31, 57.28)),
        "K = 8": _row((66.95, 43.66, 71.31), (65.58, 33.44, 56.95), (57.03, 36.42, 59.54)),
    },
}
# table -> row -> the rung of `miniature.RUNGS` that trains it
TABLE_ROWS: dict[int, dict[str, str]] = {
    2: {"#1": "InfoNCE", "#2": "text only", "#3": "+ global soft", "#4": "+ part", "#5": "+ text"},
    3: {row: row for row in PAPER_TABLES[3]},
}
