"""The paper metrics as `evaluate` modules, one folder each (`<name>/<name>.py`), shipped in the wheel.

    from hf_vrl.metrics import evaluate_module
    clustering = evaluate_module("clustering")  # = evaluate.load(evaluate_module_path("clustering"))

They load offline by path and compute with `hf_vrl.metrics`, so their results equal the report's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hf_vrl.errors import UserError

__all__ = ["EVALUATE_MODULES", "embedding_features", "evaluate_module", "evaluate_module_path"]

EVALUATE_MODULES = ("clustering", "granularity", "mmvp", "rsa")


def evaluate_module_path(name: str) -> str:
    """The folder of the `evaluate` module `name` (one of `EVALUATE_MODULES`), for `evaluate.load`."""
    if name not in EVALUATE_MODULES:
        raise UserError(f"no evaluate module named {name!r}; choose one of: {', '.join(EVALUATE_MODULES)}")
    return str(Path(__file__).parent / name)


def evaluate_module(name: str, **load_kwargs: Any) -> Any:
    """The `evaluate` module `name`, loaded (`evaluate.load(path, **load_kwargs)`; needs the `eval` extra)."""
    import evaluate

    return evaluate.load(evaluate_module_path(name), **load_kwargs)


def embedding_features(references: str = "label") -> Any:
    """The inputs of the embedding metrics: one embedding per row (`predictions`) and, per row, its class
    (`references="label"`) or a second embedding (`references="embedding"`, RSA)."""
    import datasets

    embedding = datasets.Sequence(datasets.Value("float64"))
    reference = embedding if references == "embedding" else datasets.Value("int64")
    return datasets.Features({"predictions": embedding, "references": reference})
