"""The command line of `hf-vrl train <method>`, generated from the method's run configuration.

Every setting is a flag in both spellings (`--batch-size` and `--batch_size`), grouped in `--help` by section,
with the preset's value shown as the default. Booleans take `--x`, `--no-x` or `--x false`; lists take several
values. `--set section.key=value` reaches anything, including keys inside mapping settings
(`--set model.architecture.text_config.num_hidden_layers=4`). Old spellings of earlier releases still work and
say what replaced them.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import logging
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf_vrl.errors import UserError
from hf_vrl.run.config import MAX_DEPTH, RunConfig, leaf_fields, load_config_file, nesting_depth, resolve

logger = logging.getLogger(__name__)

__all__ = ["COMMON_ALIASES", "ParsedRun", "build_parser", "dashed_flags", "parse_run_args"]

# old flag (either spelling) -> the tokens that replace it (its value, if any, follows unchanged)
COMMON_ALIASES: dict[str, list[str]] = {
    "--resume-from-checkpoint": ["--resume"],
    "--bf16": ["--precision", "bf16"],
    "--no-bf16": ["--precision", "no"],
    "--fp16": ["--precision", "fp16"],
    "--mixed-precision": ["--precision"],
    "--dataloader-num-workers": ["--num-workers"],
    "--no-eval": ["--no-eval-before", "--no-eval-after"],
    "--figure": ["--figures"],
    "--no-figure": ["--no-figures"],
}


@dataclass
class ParsedRun:
    """A resolved configuration and the options that steer this invocation (not part of the run)."""

    config: RunConfig
    source: str  # the preset or file the configuration came from
    resume: str | None  # None (a new run), "auto", or a checkpoint folder
    threads: int | None
    print_config: bool
    dry_run: bool = False


def _flag_names(name: str) -> list[str]:
    dashed = "--" + name.replace("_", "-")
    return list(dict.fromkeys([dashed, "--" + name]))


def _default_text(value: Any) -> str:
    if isinstance(value, (dict, list)) and len(str(value)) > 40:
        return "(see --print-config)"
    return repr(value)


def _add_setting(group: Any, dest: str, f: dataclasses.Field, tp: Any, shown: Any) -> None:
    help_text = f"{f.metadata.get('help', '')} (default: {_default_text(shown)})".replace("%", "%%")
    origin = typing.get_origin(tp)
    is_bool = tp is bool or (
        origin is not None and bool in typing.get_args(tp) and type(None) in typing.get_args(tp)
    )
    is_list = origin is list or any(typing.get_origin(a) is list for a in typing.get_args(tp))
    choices = None
    literals = [a for a in (tp, *typing.get_args(tp)) if typing.get_origin(a) is typing.Literal]
    if literals:
        choices = [str(c) for c in typing.get_args(literals[0])]
    names = _flag_names(f.name)
    if is_bool:
        group.add_argument(*names, dest=dest, nargs="?", const="true", metavar="BOOL", help=help_text)
        negated = [n.replace("--", "--no-", 1) for n in names]
        group.add_argument(*negated, dest=dest, action="store_const", const="false", help=argparse.SUPPRESS)
    elif is_list:
        group.add_argument(*names, dest=dest, nargs="+", metavar="VALUE", help=help_text)
    else:
        metavar = "{" + ",".join(choices) + "}" if choices else f.name.upper()
        group.add_argument(*names, dest=dest, metavar=metavar, help=help_text)


def _section_title(cls: type[RunConfig], section: str | None) -> tuple[str, str | None]:
    if section is None:
        return "run", None
    tp = typing.get_type_hints(cls)[section]
    doc = (tp.__doc__ or "").strip().splitlines()
    return section, doc[0] if doc else None


def build_parser(
    cls: type[RunConfig], shown: RunConfig, presets: Sequence[tuple[str, str]] = ()
) -> argparse.ArgumentParser:
    """The parser of `hf-vrl train <cls.method>`; `shown` supplies the defaults displayed in --help."""
    epilog = ""
    if presets:
        epilog = "presets:\n" + "\n".join(f"  {name:<26} {text}" for name, text in presets)
    parser = argparse.ArgumentParser(
        prog=f"hf-vrl train {cls.method}",
        usage=f"hf-vrl train {cls.method} [--config PRESET_OR_FILE] [--resume [auto|CHECKPOINT]] [options]",
        description=inspect.cleandoc(cls.__doc__ or ""),
        epilog=epilog + "\n\nAny setting also: --set section.key=value. Old flag spellings still work.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
        argument_default=argparse.SUPPRESS,
    )
    run = parser.add_argument_group("run", "what to run and how")
    run.add_argument(
        "--config",
        metavar="PRESET_OR_FILE",
        help=f"a preset name or a JSON/YAML file (default: {cls.preset})",
    )
    run.add_argument(
        "--resume",
        nargs="?",
        const="auto",
        metavar="auto|CHECKPOINT",
        help="continue the run in --output-dir: 'auto' (the bare flag) from its newest complete "
        "checkpoint, or from the given checkpoint folder; a finished stage is never trained again",
    )
    run.add_argument("--set", action="append", metavar="KEY=VALUE", help="set any setting by its dotted path")
    run.add_argument("--print-config", action="store_true", help="print the resolved configuration and exit")
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="check the configuration at its real size on this machine instead of training: random weights "
        "from the real model configurations, generated data, 2 steps per stage in 1 and 2 processes, a kill "
        "and resume, load back; reports time, memory and the memory predicted at the real batch on a GPU "
        "(hf_vrl.run.dry_run); with --print-config prints the configuration it runs",
    )
    run.add_argument("--threads", type=int, help="torch CPU threads for this process (default: torch's)")
    groups: dict[str | None, Any] = {None: run}
    for section, f, tp in leaf_fields(cls):
        if section not in groups:
            title, description = _section_title(cls, section)
            groups[section] = parser.add_argument_group(title, description)
        value = getattr(getattr(shown, section) if section else shown, f.name)
        _add_setting(groups[section], f"{section}.{f.name}" if section else f.name, f, tp, value)
    return parser


def dashed_flags(argv: Sequence[str]) -> list[str]:
    """`--a_b` / `--a_b=v` -> `--a-b` / `--a-b=v`: how the commands other than `train` (whose parser lists
    both) take a flag in either spelling. Values are left as they are."""
    out = []
    for token in argv:
        name, eq, value = token.partition("=")
        out.append(name.replace("_", "-") + eq + value if name.startswith("--") else token)
    return out


def _rewrite_aliases(argv: list[str], aliases: dict[str, list[str]]) -> list[str]:
    out = []
    for token in argv:
        name, eq, value = token.partition("=")
        key = name.replace("_", "-") if name.startswith("--") else name
        if key in aliases:
            replacement = aliases[key]
            logger.warning("%s is deprecated: use %s", name, " ".join(replacement))
            out += replacement[:-1] + [replacement[-1] + (eq + value if eq else "")]
        else:
            out.append(token)
    return out


def _preset_values(cls: type[RunConfig], source: str | None) -> tuple[dict[str, Any], str]:
    from hf_vrl.presets import preset_path

    name = source or cls.preset
    try:
        path = preset_path(name)
    except FileNotFoundError as error:
        raise UserError(str(error)) from None
    return load_config_file(path), str(name)


def _parse_set(items: Sequence[str], leaves: set[str]) -> dict[str, Any]:
    """{dotted path: value}; a value inside a mapping setting (deeper than any setting) is read as JSON when
    it parses (`4`, `true`, `[1, 2]`), since no declared type says what it is."""
    overrides: dict[str, Any] = {}
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise UserError(f"--set {item!r}: write --set section.key=value (e.g. --set optim.batch_size=16)")
        inside_mapping = not any(key == leaf for leaf in leaves) and any(
            key.startswith(leaf + ".") for leaf in leaves
        )
        if inside_mapping:
            try:
                value = json.loads(value)
                deep = nesting_depth(value) > MAX_DEPTH
            except json.JSONDecodeError:
                deep = False
            except RecursionError:
                deep = True
            if deep:
                raise UserError(f"--set {key}: its value nests more than {MAX_DEPTH} levels deep")
        overrides[key] = value
    return overrides


def parse_run_args(
    cls: type[RunConfig],
    argv: Sequence[str] | None,
    aliases: dict[str, list[str]] | None = None,
    presets: Sequence[tuple[str, str]] = (),
) -> ParsedRun:
    """Parse a command line into a validated configuration (see the module docstring)."""
    argv = _rewrite_aliases(list(argv or []), {**COMMON_ALIASES, **(aliases or {})})
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    preset, source = _preset_values(cls, known.config)
    try:
        shown = resolve(cls, preset, source=source)
    except UserError:
        shown = cls()  # the preset's problems are reported below, after --help had its chance
    parser = build_parser(cls, shown, presets)
    namespace, unknown = parser.parse_known_args(argv)
    if unknown:
        _refuse_unknown(parser, unknown, cls.method)
    options = vars(namespace)
    overrides = {key: value for key, value in options.items() if "." in key or key in _top_level(cls)}
    overrides = {key: options[key] for key in overrides}
    leaves = {f"{section}.{f.name}" if section else f.name for section, f, _ in leaf_fields(cls)}
    overrides.update(_parse_set(options.get("set") or [], leaves))
    config = resolve(cls, preset, overrides, source=source)
    return ParsedRun(
        config=config,
        source=source if not Path(source).exists() else str(Path(source)),
        resume=options.get("resume"),
        threads=options.get("threads"),
        print_config=bool(options.get("print_config")),
        dry_run=bool(options.get("dry_run")),
    )


def _refuse_unknown(parser: argparse.ArgumentParser, unknown: list[str], method: str) -> None:
    """One line for flags the parser does not know, with the nearest known flag (as for config keys)."""
    import difflib

    flags = [flag for action in parser._actions for flag in action.option_strings if flag.startswith("--")]
    name = next((token for token in unknown if token.startswith("-")), unknown[0]).partition("=")[0]
    close = difflib.get_close_matches(name, flags, n=1)
    hint = f"did you mean {close[0]}?" if close else f"see `hf-vrl train {method} --help`"
    raise UserError(f"unknown option {name!r} ({' '.join(unknown)}): {hint}")


def _top_level(cls: type[RunConfig]) -> set[str]:
    return {f.name for section, f, _ in leaf_fields(cls) if section is None}
