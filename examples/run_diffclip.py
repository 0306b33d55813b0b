"""DiffCLIP vs CLIP: train both with `hf-vrl train diffclip` on the same data, seed and recipe, then compare.

    python examples/run_diffclip.py                        # toy world, tiny models, CPU
    python examples/run_diffclip.py --max-steps 50         # `hf-vrl train diffclip` options go to both runs

Without arguments it trains the `diffclip-tiny` preset (2 layers, 64 wide, 32 px) on the generated shapes
world, first as the CLIP baseline, then as DiffCLIP, and prints zero-shot accuracy and retrieval recall
before and after training side by side. `<output-dir>/diffclip/attention.png` shows where each model looks
for the first test image's caption (DiffCLIP Fig. 2: image | CLIP | DiffCLIP).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hf_vrl.methods.diffclip.train import comparison_table, main


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--output-dir", default="runs/diffclip-example", help="one sub-folder per arch")
    args, train_args = parser.parse_known_args(argv)
    out = Path(args.output_dir)
    runs = {"CLIP": out / "clip", "DiffCLIP": out / "diffclip"}
    if main([*train_args, "--arch", "clip", "--output-dir", str(runs["CLIP"]), "--no-figure"]):
        return 1
    if main(
        [
            *train_args,
            "--arch",
            "diffclip",
            "--output-dir",
            str(runs["DiffCLIP"]),
            "--compare-with",
            str(runs["CLIP"]),
        ]
    ):
        return 1
    results = {name: json.loads((path / "results.json").read_text()) for name, path in runs.items()}
    reports = {
        f"{name} {stage}": result[stage]
        for name, result in results.items()
        for stage in ("before", "after")
        if stage in result
    }
    if reports:
        print("\nCLIP vs DiffCLIP (percent, same data, seed and recipe):")
        print(comparison_table(reports))
    if "figure" in results["DiffCLIP"]:
        print(f"attention maps (image | CLIP | DiffCLIP): {results['DiffCLIP']['figure']}")
    return 0


if __name__ == "__main__":
    sys.exit(run())
