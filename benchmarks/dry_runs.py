"""The dry run of every paper preset on this machine (`hf-vrl train <method> --config <preset> --dry-run`, one
after the other): real-size models with random weights, two steps per stage in one and two processes, a kill
and resume, load back; time per step, peak memory, and the memory predicted on a GPU at the preset's batch.

    python benchmarks/dry_runs.py                                  # every paper preset, cheapest first
    python benchmarks/dry_runs.py clue-r50 dive-b16                # some of them
    python benchmarks/dry_runs.py --memory-budget-gb 10 --threads 1
    python benchmarks/dry_runs.py dcr-metaclip-h14 --micro-batch 1 --no-memory-fit    # where 2 does not fit
    python benchmarks/dry_runs.py --recompute     # the predictions again from the step records kept

After either, the package's `hf_vrl/run/memory_predictions.json` (what --print-config and the README's table
show) is written again from the results, and the table printed. Each preset's report is merged into the
results file (default benchmarks/results/dry_runs.json) as soon as it is done; its run folder is deleted, the
real-size model folders are kept ($HF_VRL_REAL_SIZE_HOME) for the next preset. `hf_vrl.run.dry_run` says what
each figure is and how the prediction is made.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "dry_runs.json"
PACKAGED = Path(__file__).parents[1] / "src" / "hf_vrl" / "run" / "memory_predictions.json"
KEPT = (
    "passed",
    "problems",
    "micro_batch",
    "global_batch",
    "stages",
    "models",
    "runs",
    "steps",
    "prediction",
    "load_back",
    "records",
)


def main(argv: list[str] | None = None) -> int:
    from hf_vrl.run.dry_run import DryRunOptions, dry_run, machine, paper_presets, portable, preset_config
    from hf_vrl.run.memory import prediction_lines

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("presets", nargs="*", help="default: every paper preset, cheapest first")
    parser.add_argument("--memory-budget-gb", type=float, default=None, help="host memory the runs may use")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads of each run")
    parser.add_argument("--micro-batch", type=int, default=2, help="the dry run's micro-batch (default 2)")
    parser.add_argument("--no-memory-fit", dest="memory_fit", action="store_false", help="no memory probe")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--recompute", action="store_true", help="redo the predictions from the records kept")
    args = parser.parse_args(argv)
    if args.recompute:
        return recompute(args.output)
    options = DryRunOptions(
        micro_batch=args.micro_batch,
        memory_fit=args.memory_fit,
        memory_budget_gb=args.memory_budget_gb,
        threads=args.threads,
    )
    results = json.loads(args.output.read_text()) if args.output.is_file() else {"presets": {}}
    results["machine"] = machine()
    results["figures"] = (
        "step_s: wall clock of each optimiser step (forward, backward, optimiser step) under the machine's "
        "load at the time (each preset's machine.load_average_at_start); host_peak_gib: the process's peak "
        "resident memory in the step; cpu_s: the process's CPU time in it; prediction: hf_vrl.run.dry_run."
        "predicted (DCR: from the step's parts, hf_vrl.methods.dcr.footprint, validated against the run's "
        "measured step; the others: fitted through the micro-batches measured); dry_run_wall_s: each "
        "preset's whole dry run, from its own record"
    )
    work = Path(tempfile.mkdtemp(prefix="hf_vrl_dry_runs_"))
    try:
        for preset in args.presets or paper_presets():
            method_class, config = preset_config(preset)
            report = dry_run(method_class, config, work / preset, options, preset=preset)
            kept = {key: report.get(key) for key in KEPT}
            kept |= {key: report[key] for key in ("options", "machine", "wall_s")}
            results["presets"][preset] = portable(kept, work / preset, options.home)
            results["dry_run_wall_s"] = wall_times(results["presets"])
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(json.dumps(results, indent=2) + "\n")
            print(f"{preset}: {'passed' if report['passed'] else 'FAILED'} in {report['wall_s']:.0f} s")
            print(*(f"  {line}" for line in prediction_lines(report.get("prediction"))), sep="\n")
            shutil.rmtree(work / preset, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    package(results)
    return 0


def package(results: dict) -> None:
    """The package's memory_predictions.json from `results`, and the README's table of it."""
    from hf_vrl.run.dry_run import package_predictions
    from hf_vrl.run.memory import memory_table

    packaged = package_predictions(results)
    source = "benchmarks/dry_runs.py from benchmarks/results/dry_runs.json (hf_vrl.run.memory's docstring)"
    PACKAGED.write_text(json.dumps({"source": source, "presets": packaged}, indent=2) + "\n")
    print(memory_table(packaged))


def wall_times(presets: dict) -> dict:
    """Each preset's whole dry run (seconds, wall clock), beside the machine's load when it started."""
    return {
        name: {
            "wall_s": kept["wall_s"],
            "micro_batch": kept["micro_batch"],
            "load_average_at_start": kept["machine"]["load_average_at_start"],
        }
        for name, kept in presets.items()
    }


def recompute(output: Path) -> int:
    """Each preset's memory prediction again with its present settings (hf_vrl.run.dry_run.predicted): DCR's
    from the step's parts, checked against the steps its dry run measured (with the settings it ran,
    `measured_with`; the fit through those runs kept beside it), the others fitted through their runs."""
    from hf_vrl.run.dry_run import (
        DryRunOptions,
        fit_runs,
        grows_with_square,
        predict_memory,
        predicted,
        preset_config,
    )
    from hf_vrl.run.memory import has_components, prediction_lines, validate

    results = json.loads(output.read_text())
    for preset, kept in results["presets"].items():
        config = preset_config(preset)[1]
        options = DryRunOptions(micro_batch=kept["options"]["micro_batch"])
        prediction = predicted(config, kept["stages"], options, kept["records"])
        if prediction and has_components(config):
            ran = preset_config(preset, kept.get("measured_with") or {})[1]
            sizes = {"one-process": kept["micro_batch"]}
            sizes |= {
                name: int(name.rsplit("-", 1)[1]) for name in kept["records"] if "memory-probe-" in name
            }
            prediction["validation"] = {
                name: validate(ran, kept["stages"], kept["records"][name], size)
                for name, size in sizes.items()
            }
            fit = fit_runs(ran, options, kept["records"])
            if len(fit) > 1:
                measured = predict_memory(fit, ran.batch_plan(1), grows_with_square(ran))
                prediction["fit_of_the_runs_measured"] = measured
        kept["prediction"] = prediction
        print(preset, *prediction_lines(prediction), sep="\n  ")
    results["dry_run_wall_s"] = wall_times(results["presets"])
    output.write_text(json.dumps(results, indent=2) + "\n")
    package(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
