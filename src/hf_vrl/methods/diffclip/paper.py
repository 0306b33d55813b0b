"""What the DiffCLIP authors report for their released checkpoints (`hammh0a/DiffCLIP_ViTB16_CC3M|CC12M`),
as data: the card of a converted checkpoint shows it, marked as the authors' figures (DiffCLIP, Table 2:
retrieval R@5 on Flickr30k, Flickr8k and MSCOCO, with LAION's CLIP_benchmark; zero-shot ImageNet top-1).
`PAPER_TABLES` holds the paper's Tables 1, 2 and 3 (POPE of TinyLLaVA with Qwen-2.5-0.5B, as printed) and
Figure 4's MMVP-VLM averages by row, for `examples/reproduce_diffclip.py`; `TABLE3_LMMS` says which lmms-eval
task and metric gives each Table 3 cell."""

from __future__ import annotations

import re
from typing import Any

from hf_vrl.methods.dive.paper import PaperTable
from hf_vrl.paper_eval import LmmsColumn

__all__ = [
    "CLASSIFICATION_SETS",
    "FIG3_COLUMNS",
    "PAPER_TABLES",
    "RELEASED",
    "RETRIEVAL_COLUMNS",
    "TABLE3_LMMS",
    "table3_by_model",
    "released_pretraining",
    "released_results",
]

_COLUMNS = (
    "image retrieval R@5, Flickr30k",
    "image retrieval R@5, Flickr8k",
    "image retrieval R@5, MSCOCO",
    "text retrieval R@5, Flickr30k",
    "text retrieval R@5, Flickr8k",
    "text retrieval R@5, MSCOCO",
    "zero-shot ImageNet top-1",
)
# pre-training data -> DiffCLIP-B/16's row of Table 2 (percent), in `_COLUMNS` order
RELEASED: dict[str, tuple[float, ...]] = {
    "CC3M": (32.9, 36.5, 20.9, 44.7, 47.8, 27.6, 14.4),
    "CC12M": (62.2, 61.5, 42.3, 77.4, 77.4, 55.5, 33.8),
}


def released_pretraining(source: str) -> str | None:
    """The pre-training data ("CC3M" / "CC12M") of the released checkpoint `source` (a path or Hub id)
    names, else None."""
    found = re.findall(r"cc(3|12)m", source.lower())
    return f"CC{found[-1]}M" if found else None


def released_results(pretraining: str) -> dict[str, Any]:
    """The authors' figures for the released checkpoint pre-trained on `pretraining` (a key of `RELEASED`)."""
    return {
        "source": "DiffCLIP (Hammoud & Ghanem, TMLR 2025), Table 2, DiffCLIP-B/16 pre-trained on "
        + pretraining,
        "percent": dict(zip(_COLUMNS, RELEASED[pretraining])),
    }


# -- the paper's tables as data, for examples/reproduce_diffclip.py ------------------------------------------
# Transcribed from the paper's text (DiffCLIP, Hammoud & Ghanem, TMLR 2025): Tables 1 and 2, CLIP-B/16 and
# DiffCLIP-B/16 pre-trained on CC3M and CC12M, percent. Table 1's linear probe and few-shot are single runs;
# Appendix B's Tables 4 and 5 repeat them over three seeds (mean ± sd). Figure 3 (zero-shot ImageNet and its
# four OOD variants) is given as bars only: the text states DiffCLIP's average OOD gain (+2.1) and no bar
# value, so no Figure 3 number ships. Figure 4 (MMVP-VLM, CC12M) gives the two averages in its caption.

CLASSIFICATION_SETS = (
    "Caltech-101",
    "DTD",
    "Pets",
    "Flowers",
    "SUN397",
    "Aircraft",
    "CIFAR10",
    "CIFAR100",
    "Food-101",
    "Avg.",
)
RETRIEVAL_COLUMNS = (
    "image R@5 Flickr30k",
    "image R@5 Flickr8k",
    "image R@5 MSCOCO",
    "image R@5 Avg.",
    "text R@5 Flickr30k",
    "text R@5 Flickr8k",
    "text R@5 MSCOCO",
    "text R@5 Avg.",
    "zero-shot ImageNet",
)
FIG3_COLUMNS = ("ImageNet", "ImageNet-V2", "ImageNet-A", "ImageNet-R", "ImageNet-Sketch", "OOD avg.")
FIG3_STATED_OOD_GAIN = 2.1  # "outperform standard CLIP by an average of 2.1%" (§4, Results of Fig. 3)

# Table 3 (§5.1): CLIP-CC12M and DiffCLIP-CC12M vision encoders in TinyLLaVA with Qwen-2.5-Instruct-0.5B,
# POPE, percent, as printed: rows the POPE split, columns encoder × metric (the "(+x)" gains left out).
POPE_SPLITS = ("Random", "Popular", "Adversarial")
POPE_METRICS = ("Accuracy", "Precision", "Recall")
TABLE3_ENCODERS = {"CLIP": "CLIP (CC12M)", "DiffCLIP": "DiffCLIP (CC12M)"}  # printed name -> row label
TABLE3_PRINTED = PaperTable(
    3,
    "POPE of TinyLLaVA (Qwen-2.5-0.5B) with CLIP or DiffCLIP (CC12M) vision encoders, %",
    tuple(f"{encoder} {metric}" for encoder in TABLE3_ENCODERS for metric in POPE_METRICS),
    {
        "Random": (50.14, 50.07, 98.21, 50.41, 50.21, 98.56),
        "Popular": (50.27, 50.13, 99.33, 50.27, 50.13, 99.47),
        "Adversarial": (50.17, 50.08, 99.33, 50.20, 50.10, 99.47),
    },
)
TABLE3_COLUMNS = tuple(f"{split} {metric}" for split in POPE_SPLITS for metric in POPE_METRICS)
# lmms-eval 0.7's POPE tasks per split; pope_* metrics are fractions (the paper's definitions: accuracy, and
# precision / recall of "yes"; lmms-eval counts an answer right only when it is exactly yes / no)
_POPE_TASKS = dict(zip(POPE_SPLITS, ("pope_random", "pope_pop", "pope_adv")))
TABLE3_LMMS: dict[str, LmmsColumn] = {
    f"{split} {metric}": LmmsColumn(_POPE_TASKS[split], (f"pope_{metric.lower()}",))
    for split in POPE_SPLITS
    for metric in POPE_METRICS
}


def table3_by_model() -> dict[str, tuple[float, ...]]:
    """Table 3 with a row per encoder ("CLIP (CC12M)", "DiffCLIP (CC12M)") in `TABLE3_COLUMNS` order."""
    printed = TABLE3_PRINTED
    return {
        label: tuple(
            printed.rows[split][printed.columns.index(f"{encoder} {metric}")]
            for split in POPE_SPLITS
            for metric in POPE_METRICS
        )
        for encoder, label in TABLE3_ENCODERS.items()
    }


PAPER_TABLES: dict[str, PaperTable] = {
    "1-linear": PaperTable(
        1,
        "linear probing top-1, %",
        CLASSIFICATION_SETS,
        {
            "CLIP (CC3M)": (72.5, 58.7, 61.0, 85.8, 54.1, 35.7, 83.5, 63.4, 59.1, 63.8),
            "DiffCLIP (CC3M)": (76.2, 60.2, 62.2, 86.6, 56.2, 34.6, 83.9, 63.7, 59.4, 64.8),
            "CLIP (CC12M)": (88.3, 71.2, 79.5, 92.6, 68.3, 48.8, 92.0, 74.7, 77.5, 77.0),
            "DiffCLIP (CC12M)": (89.5, 71.8, 83.0, 93.5, 69.4, 46.4, 90.7, 73.3, 77.7, 77.3),
        },
    ),
    "1-fewshot": PaperTable(
        1,
        "few-shot top-1, %",
        CLASSIFICATION_SETS,
        {
            "CLIP (CC3M)": (90.4, 72.9, 69.6, 92.5, 91.8, 44.6, 63.4, 72.8, 67.0, 73.9),
            "DiffCLIP (CC3M)": (91.6, 73.2, 71.6, 92.9, 92.8, 45.4, 62.4, 73.5, 68.3, 74.6),
            "CLIP (CC12M)": (97.4, 81.9, 86.3, 96.9, 96.5, 56.1, 81.3, 85.1, 86.0, 85.3),
            "DiffCLIP (CC12M)": (97.6, 82.2, 88.2, 97.3, 96.8, 55.2, 80.3, 83.3, 87.5, 85.4),
        },
    ),
    "2": PaperTable(
        2,
        "zero-shot retrieval R@5 and zero-shot ImageNet top-1, %",
        RETRIEVAL_COLUMNS,
        {
            "CLIP (CC3M)": (31.8, 35.4, 19.4, 28.9, 43.4, 46.2, 25.4, 38.3, 13.6),
            "DiffCLIP (CC3M)": (32.9, 36.5, 20.9, 30.1, 44.7, 47.8, 27.6, 40.1, 14.4),
            "CLIP (CC12M)": (62.5, 62.1, 41.3, 55.3, 76.8, 77.7, 53.8, 69.4, 31.8),
            "DiffCLIP (CC12M)": (62.2, 61.5, 42.3, 55.3, 77.4, 77.4, 55.5, 70.1, 33.8),
        },
    ),
    "fig3": PaperTable(
        3, "zero-shot ImageNet and OOD variants top-1, % (bars only in the paper)", FIG3_COLUMNS, {}
    ),
    "mmvp": PaperTable(
        4,
        "MMVP-VLM average accuracy, %, CC12M (Figure 4's caption)",
        ("Avg",),
        {"CLIP (CC12M)": (21.9,), "DiffCLIP (CC12M)": (27.6,)},
    ),
    "3": PaperTable(3, "POPE accuracy / precision / recall per split, %", TABLE3_COLUMNS, table3_by_model()),
}
