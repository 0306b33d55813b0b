"""DCR end to end on a CPU in minutes (a paper preset on CC3M as img2dataset writes it: `--preset
dcr-openai-l14-224 --dataset cc3m:/data/cc3m`).

    python examples/run_dcr.py                         # the miniature where DCR has something to add
    python examples/run_dcr.py --preset dcr-tiny       # the tiny preset alone (any `hf-vrl train dcr` flag)

With no preset it runs `hf-vrl demo`'s DCR part (`hf_vrl.demo.dcr`): a toy CLIP blind to colour (its captions
never name it), a toy diffusion model that learned colour from full captions, then DCR and the paper's
reconstruction-only baseline (L_rec alone) from the same CLIP and diffusion model, and one table of
D-ability (shape clustering) and P-ability (colour pairs, MMVP against the original text tower) before and
after, for both. With `--preset` (or `--config`, or any other `hf-vrl train dcr` flag: the tiny preset then)
every argument goes to `hf-vrl train dcr`: both stages, the exports (a plain transformers vision tower, the
DCRModel, the base CLIP with the enhanced tower in final/) and a before/after table.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

DEFAULT_OUTPUT = "runs/dcr-miniature"
RUNS = {"dcr": "DCR", "reconstruction": "reconstruction only"}


def _parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        add_help=add_help,
        prog="python examples/run_dcr.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="`--preset dcr-tiny --help` lists every flag of `hf-vrl train dcr`.",
    )
    parser.add_argument(
        "--preset",
        metavar="PRESET_OR_FILE",
        help="run this `hf-vrl train dcr` preset instead of the miniature (e.g. dcr-tiny); "
        "every other argument then goes to `hf-vrl train dcr`",
    )
    parser.add_argument(
        "--output-dir", default=DEFAULT_OUTPUT, help="the miniature's runs: <dir>/{dcr,reconstruction}"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (tiny models run fastest on one)"
    )
    return parser


def _percent(section: Mapping[str, Any], metric: str) -> str:
    """`section`'s value at the dotted `metric` as a percent, "-" where absent."""
    value: Any = section
    for key in metric.split("."):
        value = value.get(key) if isinstance(value, Mapping) else None
    return "-" if not isinstance(value, (int, float)) else f"{100 * value:.1f}"


def _change(report: Mapping[str, Any], metric: str) -> str:
    return " → ".join(_percent(report.get(stage) or {}, metric) for stage in ("before", "after"))


def summary(reports: Mapping[str, Mapping[str, Any]]) -> str:
    """One line on what the miniature's table shows: each run's clustering and colour-pair changes."""
    parts = [
        f"{RUNS[name]}: shape clustering NMI {_change(report, 'clustering.nmi')}, "
        f"colour pairs {_change(report, 'pairs.per_category.colour')}"
        for name, report in reports.items()
    ]
    return (
        "; ".join(parts) + ". DCR's claim: P-ability (colour pairs) up while D-ability (clustering) is kept; "
        "reconstruction alone raises P-ability but may lose D-ability (DCR §1, Fig. 1d)."
    )


def miniature(output_dir: str | Path, seed: int = 0) -> dict[str, dict[str, Any]]:
    """Run the demo's DCR part into `output_dir` (resumes) and return {"dcr", "reconstruction"} reports."""
    from hf_vrl.demo import dcr

    return dcr(argparse.Namespace(seed=seed), Path(output_dir))


def _train_argv(argv: list[str]) -> list[str]:
    """`--preset X` -> `--config X`; everything else as given."""
    out, tokens = [], iter(argv)
    for token in tokens:
        name, eq, value = token.partition("=")
        if name == "--preset":
            out += ["--config", value if eq else next(tokens, "")]
        else:
            out.append(token)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    known, rest = _parser(add_help=False).parse_known_args(argv)
    if known.preset is not None or [token for token in rest if token not in ("-h", "--help")]:
        from hf_vrl.run import main as train_main

        return train_main("dcr", _train_argv(argv))
    args = _parser().parse_args(argv)
    import torch

    from hf_vrl.demo import DCR_METRICS, PARTS
    from hf_vrl.run.report import compare_table

    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("hf_vrl").setLevel(logging.INFO)
    print(f"== {PARTS['dcr'].shows}")
    reports = miniature(args.output_dir, args.seed)
    print(f"\n{PARTS['dcr'].table} (percent, before and after)")
    print(compare_table(reports, DCR_METRICS))
    print(f"\n{summary(reports)}")
    print(f"models and reports: {Path(args.output_dir)}/{{dcr,reconstruction}}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
