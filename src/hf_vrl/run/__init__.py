"""The shared run design: one configuration format, one command line, one folder layout, one report, one
resume, for every method. `hf_vrl.train("dcr", config="dcr-tiny", max_steps=10)` is `hf-vrl train dcr
--config dcr-tiny --max-steps 10` in Python.

Each method registers a `Method` subclass here (`METHODS`); see `hf_vrl.run.runner` for the lifecycle and
ARCHITECTURE.md for the design.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hf_vrl.errors import UserError

__all__ = ["METHODS", "get_method", "list_method_presets", "main", "train"]

# method name -> "module:Method subclass"
METHODS: dict[str, str] = {
    "diffclip": "hf_vrl.methods.diffclip.method:DiffCLIPMethod",
    "dcr": "hf_vrl.methods.dcr.method:DCRMethod",
    "dive": "hf_vrl.methods.dive.method:DiVEMethod",
    "clue": "hf_vrl.methods.clue.method:CLUEMethod",
}


def get_method(name: str) -> type:
    """The `Method` subclass registered under `name`."""
    if name not in METHODS:
        raise UserError(f"unknown method {name!r}; choose one of: {', '.join(METHODS)}")
    module, _, attribute = METHODS[name].partition(":")
    return getattr(importlib.import_module(module), attribute)


def list_method_presets(method: str) -> list[tuple[str, str]]:
    """(name, first sentence of the description) of the presets in hub_configs/ made for `method`."""
    from hf_vrl.presets import list_presets

    return [(name, text) for name, preset_method, text in list_presets() if preset_method == method]


def _flat_overrides(config_class: type, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """{setting name or dotted path: value} -> {dotted path: value}."""
    from hf_vrl.run.config import leaf_fields

    paths = {
        f.name: (f"{section}.{f.name}" if section else f.name) for section, f, _ in leaf_fields(config_class)
    }
    out = {}
    for key, value in overrides.items():
        if "." not in key and key not in paths:
            raise UserError(
                f"unknown setting {key!r} for {config_class.method}; "
                f"see `hf-vrl train {config_class.method} --help`"
            )
        out[paths.get(key, key)] = value
    return out


def train(
    method: str,
    config: str | Path | Mapping[str, Any] | None = None,
    *,
    resume: str | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """Run `method` as `hf-vrl train` would and return its report.

    `config`: a preset name, a JSON/YAML file, or a mapping in the preset format (default: the method's
    preset); `overrides`: settings by name (`batch_size=16`) or dotted path (`optim.batch_size=16`);
    `resume`: None, "auto" or a checkpoint folder.
    """
    from hf_vrl.run.config import load_config_file, resolve
    from hf_vrl.run.runner import execute

    method_class = get_method(method)
    config_class = method_class.config_class
    if isinstance(config, Mapping):
        preset, source = dict(config), "the given configuration"
    else:
        from hf_vrl.presets import preset_path

        name = config or config_class.preset
        preset, source = load_config_file(preset_path(name)), str(name)
    resolved = resolve(config_class, preset, _flat_overrides(config_class, overrides), source=source)
    _default_output(resolved, source)
    return execute(method_class, resolved, resume)


def _default_output(config: Any, source: str) -> None:
    if config.output.output_dir is None:
        config.output.output_dir = f"runs/{Path(str(source)).stem}"


def main(method: str, argv: Sequence[str] | None = None) -> int:
    """`hf-vrl train <method>`: parse, validate, run, print where the results are."""
    import json

    import torch

    from hf_vrl.run.parser import parse_run_args
    from hf_vrl.run.runner import execute

    method_class = get_method(method)
    parsed = parse_run_args(
        method_class.config_class, argv, method_class.aliases, list_method_presets(method)
    )
    if parsed.dry_run:
        from hf_vrl.run.dry_run import main as dry_run_main

        return dry_run_main(method_class, parsed)
    _default_output(parsed.config, parsed.source)
    if parsed.print_config:
        import sys

        from hf_vrl.run.batch import process_count
        from hf_vrl.run.dry_run import print_prediction

        print(json.dumps(parsed.config.to_dict(), indent=2))
        plan = parsed.config.batch_plan(process_count())
        print(plan.describe(parsed.config.loss_terms(plan)), file=sys.stderr)
        print_prediction(method_class, parsed.config, parsed.source)
        return 0
    if parsed.threads:
        torch.set_num_threads(parsed.threads)
    logging.basicConfig(format="%(message)s")
    logging.getLogger("hf_vrl").setLevel(logging.INFO)
    report = execute(method_class, parsed.config, parsed.resume)
    from accelerate import PartialState

    if not PartialState().is_main_process:
        return 0
    out = Path(parsed.config.output.output_dir)
    if "after" in report or "before" in report:
        from hf_vrl.run.report import compare_table

        print(compare_table({method: report}))
        print("(percent)")
    print(f"model: {out / 'final'}\nreport: {out / 'report.json'}")
    return 0
