"""The `hf-vrl` command: a thin dispatcher; each subcommand is a `main(argv)` in its own module."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module with main(argv), one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("hf_vrl.demo", "train tiny models on the embedded toy data and evaluate before/after"),
    "eval": (
        "hf_vrl.evaluation",
        "evaluate a CLIP-like model or vision tower; writes report.json and figures",
    ),
    "export-llava": (
        "hf_vrl.integrations.llava_export",
        "put an enhanced vision tower into a LLaVA (LlavaForConditionalGeneration) and save it",
    ),
    "llava-align": (
        "hf_vrl.integrations.llava_align",
        "relearn a LLaVA's projector for a new vision tower (LLaVA stage 1, trl SFTTrainer)",
    ),
}
# method -> (module with main(argv), one-line help)
TRAIN_METHODS: dict[str, tuple[str, str]] = {
    "diffclip": ("hf_vrl.methods.diffclip.train", "CLIP / DiffCLIP from scratch with the CLIP loss"),
    "dcr": (
        "hf_vrl.methods.dcr.train",
        "enhance a CLIP vision encoder with a frozen diffusion model (2 stages)",
    ),
}


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-vrl",
        description="Visual representation learning on the Hugging Face stack: DiffCLIP, DCR, DiVE, CLUE.",
        epilog="Run `hf-vrl <command> --help` for the options of a command.",
    )
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    train = sub.add_parser("train", help="train one method: " + ", ".join(TRAIN_METHODS), add_help=False)
    train.add_argument("method", nargs="?", choices=sorted(TRAIN_METHODS))
    return parser


def _train_help() -> str:
    lines = ["usage: hf-vrl train <method> [options]", "", "methods:"]
    lines += [f"  {name:<10} {help_text}" for name, (_, help_text) in TRAIN_METHODS.items()]
    lines += ["", "Run `hf-vrl train <method> --help` for the options of a method."]
    return "\n".join(lines)


def _run(module: str, argv: list[str]) -> int:
    return int(importlib.import_module(module).main(argv) or 0)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _build_parser()
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    command, rest = argv[0], argv[1:]
    if command in COMMANDS:
        return _run(COMMANDS[command][0], rest)
    if command == "train":
        if not rest or rest[0] in ("-h", "--help"):
            print(_train_help())
            return 0
        if rest[0] not in TRAIN_METHODS:
            parser.error(f"unknown method {rest[0]!r}; choose one of: {', '.join(TRAIN_METHODS)}")
        return _run(TRAIN_METHODS[rest[0]][0], rest[1:])
    parser.error(f"unknown command {command!r}; choose one of: {', '.join([*COMMANDS, 'train'])}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
