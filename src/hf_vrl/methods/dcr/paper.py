"""The numbers DCR's paper reports (arXiv 2603.04803), as data: Table 1 (MMVP-VLM per visual pattern), Table 2
(zero-shot clustering on six benchmarks), Table 3 (LLaVA-1.5 with Vicuna-7B on MLLM benchmarks) and Table 6
(zero-shot classification and retrieval), by table, backbone and row, for `examples/reproduce_dcr.py`, which
prints them beside measured ones; `TABLE3_LMMS` says which lmms-eval task and metric gives each Table 3
column.

Transcribed from the paper's text as printed (GenHancer's SigLIP-224 "Texts" cell reads 13.0 there; un2CLIP
has no MetaCLIP and SigLIP-224 rows in Table 1, none but OpenAI's in Table 2). Tables 1 and 6 are percent,
Table 2 fractions (NMI, ACC, ARI). Table 6 does not name its backbone; its "Original" row is kept under
"unstated". Table 3's block is its LLM, "Vicuna-7B"; un2CLIP's NaturalBench cells ("-") are None.
"""

from __future__ import annotations

from hf_vrl.methods.dive.paper import PaperTable
from hf_vrl.paper_eval import MMVP_SHORT_NAMES, LmmsColumn

__all__ = [
    "BACKBONE_PRESETS",
    "CLUSTERING_SETS",
    "MMVP_COLUMNS",
    "PAPER_TABLES",
    "TABLE3_COLUMNS",
    "TABLE3_LMMS",
    "TABLE6_CLASSIFICATION",
    "TABLE6_RETRIEVAL",
]

# Table 1's backbone names (Table 2's O-1 / M-1 / S-1 are the 224 px rows) -> the hf_vrl preset of each
BACKBONE_PRESETS: dict[str, str] = {
    "OpenAI ViT-L-14 224": "dcr-openai-l14-224",
    "OpenAI ViT-L-14 336": "dcr-openai-l14-336",
    "MetaCLIP ViT-L-14 224": "dcr-metaclip-l14",
    "MetaCLIP ViT-H-14 224": "dcr-metaclip-h14",
    "SigLIP ViT-SO-14 224": "dcr-siglip-so400m-224",
    "SigLIP ViT-SO-14 384": "dcr-siglip-so400m-384",
}

MMVP_COLUMNS = (*MMVP_SHORT_NAMES.values(), "Avg")  # the paper's order of the nine patterns
_T1 = "MMVP-VLM accuracy per visual pattern (P-ability), %"
TABLE1: dict[str, PaperTable] = {
    "OpenAI ViT-L-14 224": PaperTable(
        1,
        _T1,
        MMVP_COLUMNS,
        {
            "Original": (13.3, 13.3, 20.0, 20.0, 13.3, 53.3, 20.0, 6.7, 13.3, 19.2),
            "DIVA": (13.3, 20.0, 40.0, 6.7, 20.0, 53.3, 46.7, 20.0, 13.3, 25.9),
            "GenHancer": (13.3, 33.3, 33.3, 20.0, 6.7, 73.3, 46.7, 20.0, 40.0, 31.8),
            "un2CLIP": (0.0, 33.3, 46.7, 26.7, 13.3, 80.0, 40.0, 20.0, 33.3, 32.6),
            "Ours": (13.3, 33.3, 33.3, 26.7, 6.7, 73.3, 46.7, 20.0, 46.7, 33.3),
        },
    ),
    "OpenAI ViT-L-14 336": PaperTable(
        1,
        _T1,
        MMVP_COLUMNS,
        {
            "Original": (0.0, 20.0, 40.0, 20.0, 6.7, 20.0, 33.3, 6.7, 33.3, 20.0),
            "DIVA": (26.7, 20.0, 33.3, 13.3, 13.3, 46.7, 26.7, 6.7, 40.0, 25.2),
            "GenHancer": (6.7, 20.0, 33.3, 20.0, 6.7, 73.3, 53.3, 26.7, 26.7, 29.6),
            "un2CLIP": (6.7, 33.3, 46.7, 13.3, 13.3, 80.0, 40.0, 20.0, 20.0, 30.4),
            "Ours": (13.3, 26.7, 33.3, 20.0, 6.7, 73.3, 46.7, 33.3, 26.7, 31.1),
        },
    ),
    "MetaCLIP ViT-L-14 224": PaperTable(
        1,
        _T1,
        MMVP_COLUMNS,
        {
            "Original": (13.3, 6.7, 66.7, 6.7, 33.3, 46.7, 20.0, 6.7, 13.3, 23.7),
            "DIVA": (6.7, 6.7, 60.0, 0.0, 26.7, 66.7, 20.0, 20.0, 40.0, 27.4),
            "GenHancer": (13.3, 20.0, 53.3, 13.3, 26.7, 80.0, 33.3, 13.3, 33.3, 31.8),
            "Ours": (20.0, 20.0, 53.3, 13.3, 26.7, 80.0, 33.3, 13.3, 33.3, 32.6),
        },
    ),
    "MetaCLIP ViT-H-14 224": PaperTable(
        1,
        _T1,
        MMVP_COLUMNS,
        {
            "Original": (6.7, 13.3, 60.0, 13.3, 6.7, 53.3, 26.7, 13.3, 33.3, 25.2),
            "DIVA": (13.3, 20.0, 53.3, 33.3, 13.3, 66.7, 33.3, 13.3, 40.0, 31.8),
            "GenHancer": (20.0, 20.0, 66.7, 26.7, 26.7, 66.7, 33.3, 20.0, 53.3, 37.0),
            "Ours": (20.0, 20.0, 66.7, 26.7, 26.7, 66.7, 33.3, 26.7, 53.3, 37.8),
        },
    ),
    "SigLIP ViT-SO-14 224": PaperTable(
        1,
        _T1,
        MMVP_COLUMNS,
        {
            "Original": (26.7, 20.0, 53.3, 40.0, 20.0, 66.7, 40.0, 20.0, 53.3, 37.8),
            "DIVA": (13.3, 26.7, 60.0, 46.7, 13.3, 73.3, 53.3, 26.7, 53.3, 40.7),
            "GenHancer": (20.0, 20.0, 66.7, 60.0, 20.0, 86.7, 40.0, 13.0, 53.3, 42.2),
            "Ours": (13.3, 26.7, 73.3, 60.0, 20.0, 80.0, 40.0, 20.0, 53.3, 43.0),
        },
    ),
    "SigLIP ViT-SO-14 384": PaperTable(
        1,
        _T1,
        MMVP_COLUMNS,
        {
            "Original": (20.0, 26.7, 60.0, 33.3, 13.3, 66.7, 33.3, 26.7, 53.3, 37.0),
            "DIVA": (26.7, 33.3, 53.3, 26.7, 13.3, 80.0, 40.0, 26.7, 46.7, 38.5),
            "GenHancer": (26.7, 20.0, 66.7, 33.3, 13.3, 86.7, 40.0, 26.7, 46.7, 40.0),
            "un2CLIP": (20.0, 20.0, 60.0, 46.7, 26.7, 73.3, 40.0, 26.7, 60.0, 41.5),
            "Ours": (26.7, 33.3, 60.0, 33.3, 26.7, 80.0, 40.0, 33.3, 46.7, 42.2),
        },
    ),
}

CLUSTERING_SETS = ("MNIST", "CIFAR-10", "Eurosat", "Caltech-101", "DTD", "ImageNet-1K", "Avg")
CLUSTERING_COLUMNS = tuple(f"{name} {metric}" for name in CLUSTERING_SETS for metric in ("NMI", "ACC", "ARI"))
_T2 = "zero-shot clustering (D-ability): k-means on image embeddings, NMI / ACC / ARI (fractions)"
TABLE2: dict[str, PaperTable] = {
    "OpenAI ViT-L-14 224": PaperTable(  # O-1
        2,
        _T2,
        CLUSTERING_COLUMNS,
        {
            "Original": (
                *(0.63, 0.63, 0.50, 0.82, 0.82, 0.76, 0.71, 0.72, 0.61, 0.78, 0.53, 0.35),
                *(0.55, 0.45, 0.30, 0.79, 0.53, 0.41, 0.71, 0.61, 0.49),
            ),
            "DIVA": (
                *(0.66, 0.60, 0.49, 0.81, 0.82, 0.75, 0.70, 0.72, 0.61, 0.78, 0.52, 0.34),
                *(0.51, 0.41, 0.26, 0.79, 0.52, 0.40, 0.71, 0.60, 0.48),
            ),
            "GenHancer": (
                *(0.69, 0.73, 0.60, 0.58, 0.65, 0.49, 0.61, 0.67, 0.56, 0.81, 0.54, 0.38),
                *(0.56, 0.45, 0.31, 0.64, 0.26, 0.14, 0.65, 0.55, 0.41),
            ),
            "un2CLIP": (
                *(0.67, 0.70, 0.53, 0.81, 0.82, 0.74, 0.64, 0.75, 0.60, 0.80, 0.55, 0.41),
                *(0.55, 0.46, 0.31, 0.73, 0.41, 0.28, 0.70, 0.62, 0.48),
            ),
            "Ours": (
                *(0.73, 0.74, 0.62, 0.89, 0.86, 0.80, 0.68, 0.73, 0.61, 0.83, 0.57, 0.43),
                *(0.58, 0.48, 0.33, 0.84, 0.66, 0.45, 0.76, 0.67, 0.54),
            ),
        },
    ),
    "MetaCLIP ViT-L-14 224": PaperTable(  # M-1
        2,
        _T2,
        CLUSTERING_COLUMNS,
        {
            "Original": (
                *(0.59, 0.62, 0.47, 0.79, 0.73, 0.67, 0.59, 0.56, 0.46, 0.79, 0.52, 0.40),
                *(0.56, 0.51, 0.36, 0.81, 0.56, 0.44, 0.69, 0.58, 0.47),
            ),
            "DIVA": (
                *(0.60, 0.65, 0.49, 0.77, 0.79, 0.72, 0.65, 0.75, 0.56, 0.80, 0.56, 0.39),
                *(0.60, 0.52, 0.36, 0.81, 0.56, 0.44, 0.71, 0.64, 0.49),
            ),
            "GenHancer": (
                *(0.76, 0.73, 0.77, 0.70, 0.70, 0.60, 0.62, 0.72, 0.65, 0.81, 0.55, 0.41),
                *(0.59, 0.49, 0.34, 0.64, 0.27, 0.15, 0.69, 0.58, 0.49),
            ),
            "Ours": (
                *(0.78, 0.79, 0.68, 0.80, 0.82, 0.76, 0.72, 0.77, 0.67, 0.82, 0.57, 0.42),
                *(0.60, 0.54, 0.37, 0.84, 0.69, 0.45, 0.76, 0.70, 0.56),
            ),
        },
    ),
    "SigLIP ViT-SO-14 224": PaperTable(  # S-1
        2,
        _T2,
        CLUSTERING_COLUMNS,
        {
            "Original": (
                *(0.68, 0.74, 0.56, 0.94, 0.97, 0.95, 0.64, 0.69, 0.55, 0.89, 0.61, 0.43),
                *(0.66, 0.55, 0.40, 0.85, 0.63, 0.52, 0.78, 0.70, 0.57),
            ),
            "DIVA": (
                *(0.63, 0.61, 0.46, 0.94, 0.98, 0.95, 0.66, 0.73, 0.57, 0.90, 0.66, 0.48),
                *(0.66, 0.55, 0.41, 0.85, 0.63, 0.52, 0.77, 0.69, 0.57),
            ),
            "GenHancer": (
                *(0.80, 0.78, 0.70, 0.72, 0.69, 0.61, 0.65, 0.70, 0.57, 0.88, 0.64, 0.48),
                *(0.62, 0.55, 0.42, 0.77, 0.48, 0.35, 0.74, 0.64, 0.52),
            ),
            "Ours": (
                *(0.85, 0.89, 0.78, 0.95, 0.98, 0.95, 0.76, 0.81, 0.69, 0.89, 0.66, 0.48),
                *(0.67, 0.59, 0.44, 0.88, 0.65, 0.55, 0.83, 0.76, 0.65),
            ),
        },
    ),
}

TABLE6_CLASSIFICATION = ("MNIST", "C10", "Eur", "C101", "DTD", "IN-1K")
TABLE6_RETRIEVAL = ("Image@5 Flickr30k", "Image@5 COCO", "Text@5 Flickr30k", "Text@5 COCO")
TABLE6: dict[str, PaperTable] = {
    "unstated": PaperTable(
        6,
        "zero-shot classification top-1 and retrieval R@5, %",
        (*TABLE6_CLASSIFICATION, *TABLE6_RETRIEVAL),
        {
            "Original": (76.4, 95.6, 60.1, 86.6, 55.4, 75.5, 87.2, 61.1, 97.4, 79.2),
            "Genhancer": (69.7, 73.7, 58.5, 71.5, 48.4, 73.8, 81.6, 51.1, 87.3, 61.4),
            "Ours": (76.5, 95.6, 60.3, 86.7, 55.4, 75.6, 87.3, 61.1, 97.3, 79.3),
        },
    ),
}

TABLE3_COLUMNS = (
    "MMVP-MLLM",
    "NaturalBench Acc",
    "NaturalBench Q-Acc",
    "NaturalBench I-Acc",
    "NaturalBench G-Acc",
    "CV-Bench 2D ADE20K",
    "CV-Bench 2D COCO",
    "CV-Bench 3D",
    "POPE rand",
    "POPE pop",
    "POPE adv",
    "SciQA-IMG",
    "Hallusion Avg.",
)
TABLE3: dict[str, PaperTable] = {
    "Vicuna-7B": PaperTable(
        3,
        "LLaVA-1.5 (Vicuna-7B) on vision-centric and conventional MLLM benchmarks, %",
        TABLE3_COLUMNS,
        {
            "Original": (24.7, 76.4, 53.6, 56.4, 17.6, 49.6, 60.9, 58.7, 87.3, 86.1, 84.2, 66.8, 27.6),
            "DIVA": (31.3, 75.3, 51.7, 56.1, 22.3, 51.3, 63.4, 60.2, 87.9, 87.0, 84.6, 66.3, 28.6),
            "GenHancer": (30.7, 77.3, 55.6, 59.1, 24.4, 52.9, 63.6, 63.2, 88.1, 86.7, 84.6, 66.5, 28.4),
            "un2CLIP": (31.3, None, None, None, None, 53.9, 65.1, 61.2, 88.0, 87.4, 85.4, 68.4, 28.4),
            "Ours": (31.3, 78.6, 57.8, 61.2, 25.3, 54.1, 65.5, 63.5, 88.0, 87.4, 85.8, 67.5, 28.6),
        },
    ),
}
# Each Table 3 column in lmms-eval 0.7 (metrics are fractions unless said; the table prints percent). Where
# the paper leaves the metric open, the one that gives its "Original" row (LLaVA-1.5-7B's published numbers):
# MMVP-MLLM is MMVP's pair accuracy (both questions of a pair right: 24.7), not lmms-eval's per-question
# mmvp_accuracy; POPE is F1 (LLaVA-1.5-7B's F1 is 87.3 / 86.1 / 84.2, its paper's POPE 85.9 their mean), not
# accuracy; Hallusion Avg. is taken as the mean of HallusionBench's aAcc, fAcc and qAcc (percent already;
# lmms-eval judges answers with GPT, so it needs OPENAI_API_KEY). CV-Bench 2D's ADE20K and COCO are the
# accuracy over cv_bench_2d's logged samples of each source (lmms-eval reports the 2D set as one).
# NaturalBench's aggregation wants all 7600 samples (no --limit).
TABLE3_LMMS: dict[str, LmmsColumn] = {
    "MMVP-MLLM": LmmsColumn("mmvp", ("mmvp_pair_accuracy",)),
    "NaturalBench Acc": LmmsColumn("naturalbench", ("naturalbench_ACC",)),
    "NaturalBench Q-Acc": LmmsColumn("naturalbench", ("naturalbench_Q_ACC",)),
    "NaturalBench I-Acc": LmmsColumn("naturalbench", ("naturalbench_I_ACC",)),
    "NaturalBench G-Acc": LmmsColumn("naturalbench", ("naturalbench_G_ACC",)),
    "CV-Bench 2D ADE20K": LmmsColumn("cv_bench_2d", ("cv_bench_acc",), source="ADE20K"),
    "CV-Bench 2D COCO": LmmsColumn("cv_bench_2d", ("cv_bench_acc",), source="COCO"),
    "CV-Bench 3D": LmmsColumn("cv_bench_3d", ("cv_bench_acc",)),
    "POPE rand": LmmsColumn("pope_random", ("pope_f1_score",)),
    "POPE pop": LmmsColumn("pope_pop", ("pope_f1_score",)),
    "POPE adv": LmmsColumn("pope_adv", ("pope_f1_score",)),
    "SciQA-IMG": LmmsColumn("scienceqa_img", ("exact_match",)),
    "Hallusion Avg.": LmmsColumn("hallusion_bench_image", ("aAcc", "fAcc", "qAcc"), scale=1.0),
}

# table number -> backbone (Table 3: the LLM) -> the paper's rows
PAPER_TABLES: dict[int, dict[str, PaperTable]] = {1: TABLE1, 2: TABLE2, 3: TABLE3, 6: TABLE6}
