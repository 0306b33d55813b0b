"""The paper metrics as `evaluate` modules, one folder each (`<name>/<name>.py`), shipped in the wheel.

    from hf_vrl.metrics import evaluate_module
    clustering = evaluate_module("clustering")  # = evaluate.load(evaluate_module_path("clustering"))

Each folder stands alone, as `evaluate-cli create` lays out a Hub Space: the module (it imports `evaluate`,
`datasets`, `numpy` and, where needed, `scikit-learn` / `scipy`, never hf_vrl), a `README.md` metric card,
a `requirements.txt` and an `app.py` widget. Copied elsewhere or pushed to the Hub, a module loads without
hf_vrl. The computation is a plain-numpy `scores.py` beside the module, which the module imports relatively
(`evaluate` copies it along) and `hf_vrl.metrics` imports too: one copy, so the module's results are the
report's on the same inputs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hf_vrl.errors import UserError

__all__ = ["EVALUATE_MODULES", "evaluate_module", "evaluate_module_path"]

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
