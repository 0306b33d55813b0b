"""DiVE and its baselines from one pre-trained CLIP, over seeds: one table of mean ± std.

    python examples/run_dive.py                     # dive-tiny: FLYP, FLYP + replay, SnD, WiSE-FT, DiVE
    python examples/run_dive.py --seeds 0 1 2       # three seeds: mean ± std (sample std over seeds), and
                                                    # DiVE's paired t-tests against each method (App. F)
    python examples/run_dive.py --objectives flyp dive --max-steps 30   # other options go to every run

Without arguments it runs the `dive-tiny` preset with each objective (`wise_ft` is the WiSE-FT ensemble of
the FLYP run, from its `exports/wise-ft/wise_ft.json`): the first run pre-trains a tiny CLIP on the offline
image-caption mix (into `<output-dir>/seed<s>/<objective>/inputs/pretrained`), every run fine-tunes that model
on five Fashion-MNIST classes, and the table shows ID accuracy (zero_shot.top1), OOD accuracy on
style-shifted test images, zero-shot transfer accuracy and RSA (image), in percent. `--objectives` takes
DiVESettings' names (ft, lp_ft, flyp, flyp_replay, snd, dive, dive_avl, dive_pvl, dive_cosine) and wise_ft.
Runs resume when interrupted, and finished ones are read back.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from hf_vrl.evaluation import text_table
from hf_vrl.methods.dive.paper import paired_p_value
from hf_vrl.methods.dive.settings import OBJECTIVES
from hf_vrl.run import main
from hf_vrl.run.report import load_report

NAMES = {
    "flyp": "FLYP",
    "flyp_replay": "FLYP + replay",
    "snd": "SnD",
    "wise_ft": "WiSE-FT (FLYP)",
    "dive": "DiVE",
}
COLUMNS = {"ID": "zero_shot.top1", "OOD": "ood.top1", "transfer": "transfer.top1", "RSA image": "rsa.image"}


def value(section: dict, metric: str) -> float:
    """`metric` ("group.key") of a report section, in percent."""
    group, key = metric.split(".")
    return 100 * section[group][key]


def cell(values: list[float]) -> str:
    """Mean ± sample std over seeds (the mean alone for one seed)."""
    mean = f"{statistics.mean(values):.1f}"
    return mean if len(values) == 1 else f"{mean} ± {statistics.stdev(values):.1f}"


def seed_table(rows: dict[str, list[dict]]) -> str:
    """{row name: a report section per seed} as one row per name, one "mean ± std" column per metric."""
    table = [["", *COLUMNS]]
    for name, sections in rows.items():
        table.append([name, *(cell([value(s, m) for s in sections]) for m in COLUMNS.values())])
    return text_table(table, left_columns=1)


def paired_table(rows: dict[str, list[dict]], reference: str = "DiVE") -> str:
    """Per method other than `reference`, per metric: the mean difference `reference` - method over seeds
    (percentage points) and the paired t-test's two-sided p-value ("-" where it is undefined)."""
    table = [["vs", *COLUMNS]]
    for name, sections in rows.items():
        if name == reference:
            continue
        cells = []
        for metric in COLUMNS.values():
            ours = [value(s, metric) for s in rows[reference]]
            theirs = [value(s, metric) for s in sections]
            p = paired_p_value(ours, theirs)
            delta = statistics.mean(ours) - statistics.mean(theirs)
            cells.append(f"{delta:+.1f} (p {'-' if p is None else f'{p:.3f}'})")
        table.append([name, *cells])
    return text_table(table, left_columns=1)


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--output-dir", default="runs/dive-example", help="one sub-folder per seed and objective"
    )
    parser.add_argument("--objectives", nargs="+", choices=[*OBJECTIVES, "wise_ft"], default=list(NAMES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    args, train_args = parser.parse_known_args(argv)
    if "wise_ft" in args.objectives and "flyp" not in args.objectives:
        parser.error("wise_ft is the WiSE-FT ensemble of the FLYP run: add flyp to --objectives")
    trained = [o for o in args.objectives if o != "wise_ft"]
    out = Path(args.output_dir)
    pretrained = out / f"seed{args.seeds[0]}" / trained[0] / "inputs" / "pretrained"
    rows: dict[str, list[dict]] = {"pre-trained": [], **{NAMES.get(o, o): [] for o in args.objectives}}
    for seed in args.seeds:
        for objective in trained:
            folder = out / f"seed{seed}" / objective
            command = [*train_args, "--resume", "auto", "--seed", str(seed), "--objective", objective]
            command += ["--output-dir", str(folder), "--eval-before", str(objective == trained[0]).lower()]
            if (seed, objective) != (args.seeds[0], trained[0]):  # the first run pre-trains
                command += ["--pretrained", str(pretrained), "--pretrain-steps", "0"]
            if objective == "flyp" and "wise_ft" in args.objectives:
                command += ["--wise-ft", "true"]
            if main("dive", command):
                return 1
            report = load_report(folder)
            rows[NAMES.get(objective, objective)].append(report["after"])
            if objective == trained[0]:
                rows["pre-trained"].append(report["before"])
            if objective == "flyp" and "wise_ft" in args.objectives:
                wise_ft = json.loads((folder / "exports" / "wise-ft" / "wise_ft.json").read_text())
                rows[NAMES["wise_ft"]].append(wise_ft["evaluation"])
    print(f"\nOne pre-trained model, seeds {args.seeds}; percent, mean ± std over seeds:")
    print(seed_table(rows))
    if "dive" in args.objectives and len(args.seeds) > 1:
        print(f"\nDiVE against each, paired over seeds {args.seeds}: mean difference, paired t-test p-value:")
        print(paired_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(run())
