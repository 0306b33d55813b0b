"""The paper metrics as `evaluate` modules, one folder each (`<name>/<name>.py`), shipped in the wheel.

    import evaluate, hf_vrl.metrics
    clustering = evaluate.load(hf_vrl.metrics.evaluate_module("clustering"))

They load offline by path and compute with `hf_vrl.metrics`, so their results equal the report's.
"""

from __future__ import annotations

from pathlib import Path

from hf_vrl.errors import UserError

__all__ = ["EVALUATE_MODULES", "evaluate_module"]

EVALUATE_MODULES = ("clustering", "granularity", "mmvp", "rsa")


def evaluate_module(name: str) -> str:
    """The folder of the `evaluate` module `name` (one of `EVALUATE_MODULES`), for `evaluate.load`."""
    if name not in EVALUATE_MODULES:
        raise UserError(f"no evaluate module named {name!r}; choose one of: {', '.join(EVALUATE_MODULES)}")
    return str(Path(__file__).parent / name)
