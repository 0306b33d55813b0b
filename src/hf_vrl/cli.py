"""The `hf-vrl` command: a thin dispatcher; each subcommand is a `main(argv)` in its own module.

Expected mistakes (`hf_vrl.errors.UserError`, and the library errors `hf_vrl.errors.explain` recognises: a
missing path, an unreachable Hub id, a damaged weight file) print one or two lines and exit with status 2;
`--debug` anywhere on the command line shows the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module with main(argv), one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": (
        "hf_vrl.demo",
        "train tiny models of each method on the embedded data and evaluate before/after",
    ),
    "eval": (
        "hf_vrl.eval_command",
        "evaluate a CLIP-like model or vision tower; writes report.json and figures",
    ),
    "compare": ("hf_vrl.run.report", "print and plot the reports of several runs side by side"),
    "export-llava": (
        "hf_vrl.integrations.llava_export",
        "put an enhanced vision tower into a LLaVA (LlavaForConditionalGeneration) and save it",
    ),
    "llava-align": (
        "hf_vrl.integrations.llava_align",
        "relearn a LLaVA's projector for a new vision tower (LLaVA stage 1, trl SFTTrainer)",
    ),
    "llava-eval": (
        "hf_vrl.integrations.llava_eval",
        "score a LLaVA on lmms-eval benchmarks (POPE, MMVP, ..., local task YAMLs); needs hf-vrl[llava-eval]",
    ),
    "push": (
        "hf_vrl.hub.push",
        "publish a run's model, or a model folder hf_vrl saved, to the Hugging Face Hub with its model card",
    ),
    "convert": (
        "hf_vrl.methods.diffclip.convert_cli",
        "convert a released DiffCLIP checkpoint or a transformers CLIP into a DiffCLIP model folder",
    ),
}


def _train_methods() -> dict[str, str]:
    """{method: summary}; imports every method (`hf-vrl train --help` only)."""
    from hf_vrl.run import METHODS, get_method

    return {name: get_method(name).summary for name in METHODS}


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-vrl",
        description="Visual representation learning on the Hugging Face stack: DiffCLIP, DCR, DiVE, CLUE.",
        epilog="Run `hf-vrl <command> --help` for the options of a command; add --debug to see tracebacks.",
    )
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    from hf_vrl.run import METHODS  # the names only: the top-level help imports no method

    sub.add_parser("train", help="train one method: " + ", ".join(METHODS), add_help=False)
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def _train_help() -> str:
    lines = ["usage: hf-vrl train <method> [options]", "", "methods:"]
    lines += [f"  {name:<10} {summary}" for name, summary in _train_methods().items()]
    lines += ["", "Run `hf-vrl train <method> --help` for the options of a method."]
    return "\n".join(lines)


def _dispatch(argv: list[str]) -> int:
    parser = _build_parser()
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    command, rest = argv[0], argv[1:]
    if (
        command in COMMANDS
    ):  # every flag in either spelling, as `train` lists them: --output-dir, --output_dir
        from hf_vrl.run.parser import dashed_flags

        return int(importlib.import_module(COMMANDS[command][0]).main(dashed_flags(rest)) or 0)
    if command == "train":
        if not rest or rest[0] in ("-h", "--help"):
            print(_train_help())
            return 0
        from hf_vrl.run import main as train_main

        return train_main(rest[0], rest[1:])
    parser.error(f"unknown command {command!r}; choose one of: train, {', '.join(COMMANDS)}")
    return 2


def main(argv: list[str] | None = None) -> int:
    from hf_vrl.errors import explain

    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [arg for arg in argv if arg != "--debug"]
    try:
        return _dispatch(argv)
    except KeyboardInterrupt:  # Ctrl-C outside a run (a run handles it: hf_vrl.run.signals)
        if debug:
            raise
        print("hf-vrl: interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        message = explain(error)
        if message is None or debug:
            raise
        print(f"hf-vrl: {'stopped' if hasattr(error, 'exit_code') else 'error'}: {message}", file=sys.stderr)
        if hasattr(error, "exit_code"):  # hf_vrl.run.signals.RunInterrupted: 128 + the signal
            return int(error.exit_code)
        print("(run with --debug for the traceback)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
