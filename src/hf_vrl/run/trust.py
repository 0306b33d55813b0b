"""Remote code only with the flag, wherever it comes from: an `auto_map` (a model's, tokenizer's or
processor's pointer to Python code) in a folder the user gives is honoured only with --trust-remote-code
(`hf_vrl.run.preflight.check_remote_code`; loads without the flag pass trust_remote_code=False), and never
copied into what hf_vrl writes unless the code it names was written with it: hf_vrl's own remote code
(DiffCLIP, DCR, CLUE, a LLaVA with an hf_vrl tower), whose modules sit beside the config in the folder hf_vrl
saved (`drop_foreign_auto_maps`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["AUTO_MAP_FILES", "drop_foreign_auto_maps", "local_auto_map"]

# the saved files transformers reads an `auto_map` from
AUTO_MAP_FILES = (
    "config.json",
    "tokenizer_config.json",
    "preprocessor_config.json",
    "processor_config.json",
    "image_processor_config.json",
    "video_preprocessor_config.json",
    "feature_extractor_config.json",
)


def _references(value: Any) -> list[str]:
    """The `module.Class` references of one auto_map entry (a tokenizer's is a [slow, fast] pair)."""
    values = value if isinstance(value, (list, tuple)) else [value]
    return [ref for ref in values if isinstance(ref, str) and ref]


def _written_with(folder: Path, reference: str) -> bool:
    """Whether `reference` ("module.Class") names a module file in `folder` itself (not "repo--module.Class",
    code in another repository, nor a path out of the folder)."""
    module = reference.rsplit(".", 1)[0]
    if "--" in reference or not module or "/" in module or os.sep in module or module.startswith("."):
        return False
    return (folder / f"{module}.py").is_file()


def local_auto_map(folder: Path, auto_map: Any) -> dict[str, Any]:
    """The entries of `auto_map` whose code is in `folder` (`_written_with`); the others left out."""
    if not isinstance(auto_map, dict):
        return {}
    return {
        key: value
        for key, value in auto_map.items()
        if _references(value) and all(_written_with(folder, ref) for ref in _references(value))
    }


def drop_foreign_auto_maps(folder: str | os.PathLike) -> list[str]:
    """Rewrite the files of `folder` and its subfolders (`AUTO_MAP_FILES`) whose `auto_map` names code that
    is not beside them (a pretrained model's, carried over by `save_pretrained`): hf_vrl did not write that
    code, so what it saved must not run it. Returns the paths rewritten, relative to `folder`."""
    folder = Path(folder)
    rewritten = []
    for parent, _, names in os.walk(folder):
        rewritten += [
            str(Path(parent, name).relative_to(folder))
            for name in AUTO_MAP_FILES
            if name in names and _drop_foreign_auto_map(Path(parent) / name)
        ]
    return rewritten


def _drop_foreign_auto_map(file: Path) -> bool:
    """Rewrite `file` without the auto_map entries whose code is not beside it; whether it was rewritten."""
    data = _read(file)
    if not isinstance(data, dict) or "auto_map" not in data:
        return False
    kept = local_auto_map(file.parent, data["auto_map"])
    if kept == data["auto_map"]:
        return False
    if kept:
        data["auto_map"] = kept
    else:
        del data["auto_map"]
    if file.is_symlink():  # a staged link: the file it points to stays as it is
        file.unlink()
    file.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    return True


def _read(file: Path) -> Any:
    if not file.is_file():
        return None
    try:
        return json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
