"""The remote code of a published hf_vrl model: `configuration_<name>.py` / `modeling_<name>.py` (with the
files they import relatively, such as DiffCLIP's `differential_attention.py`) and the `auto_map` that lets
`AutoModel.from_pretrained(repo, trust_remote_code=True)` load it without hf_vrl.

`save_pretrained` writes both for hf_vrl's models (they call `register_for_auto_class`); `write_remote_code`
supplies them for a folder saved without (an older hf_vrl, a model re-saved after a remote-code load).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["auto_map_modules", "code_complete", "code_files", "hf_vrl_model_type", "write_remote_code"]


def hf_vrl_model_type(config: dict[str, Any]) -> bool:
    """Whether the model's `config.json` is of a model type hf_vrl defines (DiffCLIP, DCRModel, ...)."""
    from hf_vrl.models.auto import AUTO_CONFIGS

    return config.get("model_type") in {c.model_type for c in AUTO_CONFIGS}


def auto_map_modules(config: dict[str, Any]) -> set[str]:
    """The module files (`modeling_x.py`) the `auto_map` names, code in other repos ("repo--x.C") aside."""
    modules = set()
    for reference in config.get("auto_map", {}).values():
        for ref in filter(None, reference if isinstance(reference, list) else [reference]):
            if "--" not in ref:
                modules.add(ref.rsplit(".", 1)[0] + ".py")
    return modules


def code_files(path: Path, config: dict[str, Any]) -> set[str]:
    """The module files the `auto_map` names and, recursively, those they import relatively (`from .x
    import`), which transformers fetches with them."""
    from transformers.dynamic_module_utils import get_relative_imports

    pending, found = sorted(auto_map_modules(config)), set()
    while pending:
        module = pending.pop()
        if module not in found:
            found.add(module)
            if (path / module).is_file():
                pending += [f"{name}.py" for name in get_relative_imports(path / module)]
    return found


def code_complete(path: Path, config: dict[str, Any], require_auto_map: bool = True) -> bool:
    """Every module the `auto_map` names, and every file those import relatively, is in `path` (and, with
    `require_auto_map`, the `auto_map` maps AutoModel)."""
    if require_auto_map and "AutoModel" not in config.get("auto_map", {}):
        return False
    return all((path / module).is_file() for module in code_files(path, config))


def write_remote_code(model_dir: Path, target: Path) -> list[str]:
    """Write the code files of the hf_vrl model in `model_dir` and its `config.json` with the `auto_map` (the
    rest as it was) into `target`; returns the file names written. The model is built on the meta device."""
    import torch
    from transformers import AutoConfig, AutoModel
    from transformers.dynamic_module_utils import custom_object_save

    import hf_vrl.models  # noqa: F401  (registers hf_vrl's model types)

    config = AutoConfig.from_pretrained(model_dir)
    config.auto_map = {}  # the folder's own names missing files
    with torch.device("meta"):
        model = AutoModel.from_config(config)
    recorded = {**json.loads((model_dir / "config.json").read_text()), "auto_map": {}}
    written = custom_object_save(model, target, config=recorded) + custom_object_save(
        config, target, recorded
    )
    for auto_class in getattr(model, "extra_auto_classes", ()):  # DiffCLIP: the zero-shot pipeline's class
        recorded["auto_map"].setdefault(auto_class, recorded["auto_map"]["AutoModel"])
    (target / "config.json").write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n")
    return sorted({Path(f).name for f in written} | {"config.json"})
