"""DiVE vs FLYP: fine-tune one pre-trained CLIP with `hf-vrl train dive` both ways, then compare.

    python examples/run_dive.py                          # toy world (dive-tiny), CPU, about 90 s
    python examples/run_dive.py --max-steps 30           # `hf-vrl train dive` options go to both runs

Without arguments it runs the `dive-tiny` preset: the FLYP run first pre-trains a tiny CLIP on the offline
image-caption mix (into `<output-dir>/flyp/inputs/pretrained`), both runs fine-tune that model on five
Fashion-MNIST classes, and the table shows ID accuracy (zero_shot.top1), OOD accuracy on style-shifted test
images, zero-shot transfer accuracy and RSA before and after. Both runs resume when interrupted.
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
    parser.add_argument("--output-dir", default="runs/dive-example", help="one sub-folder per objective")
    args, train_args = parser.parse_known_args(argv)
    out = Path(args.output_dir)
    flyp, dive = out / "flyp", out / "dive"
    common = [*train_args, "--resume", "auto"]
    if main("dive", [*common, "--objective", "flyp", "--output-dir", str(flyp)]):
        return 1
    pretrained = ["--pretrained", str(flyp / "inputs" / "pretrained"), "--pretrain-steps", "0"]
    if main("dive", [*common, *pretrained, "--output-dir", str(dive)]):
        return 1
    print("\nFLYP vs DiVE (percent, same pre-trained model, data, seed and recipe):")
    print(compare_table({"FLYP": load_report(flyp), "DiVE": load_report(dive)}))
    return 0


if __name__ == "__main__":
    sys.exit(run())
