"""CLUE vs its InfoNCE baseline: train both with `hf-vrl train clue` from the same start, data and seed, then
compare.

    python examples/run_clue.py                          # clue-tiny: toy world, CPU, about a minute a run
    python examples/run_clue.py --max-steps 50           # `hf-vrl train clue` options go to both runs

The baseline is the same network and recipe with InfoNCE targets and neither the part nor the text term
(CLUE Table 2, row 1). It prints linear-probe top-1, image retrieval Rank-1/5 and NCC on the fine classes
before and after training side by side; `<output-dir>/clue/figures/part_maps.png` shows the part clusters
(CLUE Fig. 6) and `<output-dir>/clue/exports/backbone` is the trained backbone as a stock ResNetModel. Both
runs resume when interrupted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hf_vrl.run import main
from hf_vrl.run.report import compare_table, load_report

BASELINE = ["--targets", "identity", "--beta", "0", "--gamma", "0", "--no-figures"]


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--output-dir", default="runs/clue-example", help="one sub-folder per run")
    args, train_args = parser.parse_known_args(argv)
    out = Path(args.output_dir)
    baseline, clue = out / "infonce", out / "clue"
    common = [*train_args, "--resume", "auto"]
    if main("clue", [*common, *BASELINE, "--output-dir", str(baseline)]):
        return 1
    if main("clue", [*common, "--output-dir", str(clue)]):
        return 1
    reports = {"InfoNCE": load_report(baseline), "CLUE": load_report(clue)}
    print("\nInfoNCE vs CLUE (percent, same start, data, seed and recipe):")
    print(compare_table(reports))
    print(f"part clusters (Fig. 6): {clue / 'figures' / 'part_maps.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(run())
