"""Which split a data file belongs to, by the names its publisher gave it: a folder (`train/`, `test/`) or a
word in the file name (`cc3m-train-0000.tar`, `imagenet1k-validation-0003.tar`), with the keywords `datasets`
itself infers splits from (`datasets.data_files.SPLIT_KEYWORDS`: validation is also `val`, `valid`, `dev`).

A set of files whose names carry no split is one split: every file is read whatever split is asked for (an
img2dataset folder, `00000.tar`...). A set where some files carry a split gives each split its own files, so
training never reads validation shards and a validation split never reads training ones (files without a
split name beside named ones belong to none and are not read).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from datasets.data_files import SPLIT_KEYWORDS

from hf_vrl.errors import UserError

__all__ = ["canonical_split", "files_of_split", "split_of"]

_KEYWORDS = {str(split): tuple(words) for split, words in SPLIT_KEYWORDS.items()}
_SEP = r"[-._ 0-9]"


def canonical_split(split: str) -> str:
    """`train`, `validation` or `test` for any of their keywords ("val" -> "validation"); others as given."""
    lowered = split.lower()
    return next((name for name, words in _KEYWORDS.items() if lowered in words), split)


def _named(part: str, word: str) -> bool:
    """Whether `part` (a folder or file name) names `word` as a word of its own (`cc3m-train-0000.tar`)."""
    return re.search(rf"(?:^|{_SEP}){re.escape(word)}(?:{_SEP}|$)", part.lower()) is not None


def split_of(path: str) -> str | None:
    """The split a file's folders (first) or name say it belongs to; None when they name none."""
    parts = path.replace("\\", "/").split("/")
    for part in [*parts[:-1], parts[-1]]:
        for name, words in _KEYWORDS.items():
            if part.lower() in words or any(_named(part, word) for word in words):
                return name
    return None


def files_of_split(
    files: Sequence[str], split: str | None, source: str, *, relative_to: str = ""
) -> list[str]:
    """The files of `split` among `files` (all of them when none carries a split name, or `split` is None);
    a one-line UserError when the files have splits but not this one. Split names are read from each path
    after `relative_to` (a folder's own path does not choose a split)."""
    if split is None:
        return list(files)
    named = {
        f: split_of(f[len(relative_to) :].lstrip("/") if f.startswith(relative_to) else f) for f in files
    }
    found = sorted({s for s in named.values() if s is not None})
    if not found:
        return list(files)
    wanted = canonical_split(split)
    chosen = [f for f, s in named.items() if s == wanted]
    if not chosen:
        raise UserError(f"{source} has no {split} split: its files are named for {', '.join(found)}")
    return chosen
