"""Markdown pieces the model cards are assembled from."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["table"]


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(header: Sequence[str], rows: Sequence[Sequence[object]], align: str = "") -> str:
    """A GitHub-flavoured Markdown table; `align` holds one of l / r per column (default: all left)."""
    marks = [{"l": "---", "r": "---:"}[a] for a in (align or "l" * len(header))]
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |", "| " + " | ".join(marks) + " |"]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)
