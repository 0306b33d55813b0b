"""MMVP-VLM pair scoring as the official `scripts/evaluate_vlm.py` (tsb0601/MMVP) scores it, with numpy only:
the one copy that `hf_vrl.metrics` and the `evaluate` module beside it (`mmvp.py`, which `evaluate` loads
with this file) share.

The official script walks Questions.csv two rows at a time and names each pair's category by its position,
`categories[num_pairs // 15]`: nine visual patterns of 15 pairs, 135 pairs in all.
"""

import numpy as np

MMVP_CATEGORIES = (  # the official script's list, in the file's order
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
PAIRS_PER_CATEGORY = 15


def category_of_pair(index):
    """The official category of the pair at position `index` (0-based) of the full file."""
    return MMVP_CATEGORIES[index // PAIRS_PER_CATEGORY]


def mmvp_score(logits, categories=None):
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
    z = z - z.max(axis=2, keepdims=True)  # softmax over the pair's two images, per statement
    probs = np.exp(z) / np.exp(z).sum(axis=2, keepdims=True)
    picks_first = probs[:, :, 0] > 0.5  # a tie goes to image 1, as in the official script
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
