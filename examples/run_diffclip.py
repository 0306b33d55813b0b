"""DiffCLIP vs CLIP: train both with `hf-vrl train diffclip` on the same data, seed and recipe, then compare.

    python examples/run_diffclip.py                        # toy world, tiny models, CPU
    python examples/run_diffclip.py --max-steps 50         # `hf-vrl train diffclip` options go to both runs

Without arguments it trains the `diffclip-tiny` preset (2 layers, 64 wide, 32 px) on the generated shapes
world, first as the CLIP baseline (the same network with plain attention), then as DiffCLIP, and prints
zero-shot
accuracy and retrieval recall before and after training side by side. `<output-dir>/diffclip/figures/
attention.png` shows where each model looks for the first test image's caption (DiffCLIP Fig. 2: image | CLIP
|
DiffCLIP). Both runs resume when interrupted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hf_vrl.run import main
from hf_vrl.run.report import compare_table, load_report


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--output-dir", default="runs/diffclip-example", help="one sub-folder per arch")
    args, train_args = parser.parse_known_args(argv)
    out = Path(args.output_dir)
    clip, diffclip = out / "clip", out / "diffclip"
    common = [*train_args, "--resume", "auto"]
    if main("diffclip", [*common, "--arch", "clip", "--output-dir", str(clip), "--no-figures"]):
        return 1
    if main("diffclip", [*common, "--output-dir", str(diffclip), "--compare-with", str(clip / "final")]):
        return 1
    reports = {"CLIP": load_report(clip), "DiffCLIP": load_report(diffclip)}
    print("\nCLIP vs DiffCLIP (percent, same data, seed and recipe):")
    print(compare_table(reports))
    print(f"attention maps (image | CLIP | DiffCLIP): {diffclip / 'figures' / 'attention.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(run())
