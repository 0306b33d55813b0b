"""The one prepared GPU check: every figure hf_vrl needs from a GPU, in one command of at most 9 minutes.

    bash benchmarks/gpu_check.sh                                   # on the bare GPU machine (see the .sh)
    python benchmarks/gpu_check.py --output "$OUT"                  # the same, the stack already installed
    python benchmarks/gpu_check.py --device cpu --quick --output /tmp/check   # every part at toy size, CPU

Parts, in this order, each in a process of its own with its own time box; a part that fails or runs out of
time is recorded with the tail of its log and the others still run. Every figure goes to
<output>/gpu_check.json (each part's own file in <output>/parts/, its log in <output>/logs/); models and run
folders go to a temporary folder (--work), never to <output>:
  cuda_tests     the device-parametrised tests of the default suite on CUDA (TORCH_DEVICE=cuda, -k "cuda or
                 gpu"); --quick: tests/test_devices.py on the given device
  diffclip_step  DiffCLIP vs transformers' CLIPModel training step, ViT-B/16, batch 256, bf16, eager and
                 torch.compile'd (benchmarks/diffclip_attention.py --part step)
  dcr_command    `hf-vrl train dcr --config dcr-openai-l14-224` at its batch 16: real-size models with random
                 weights, generated data, STEPS steps of each stage; step time and peak memory from the run's
                 own step log (hf_vrl.run.probe), against the targets <= 0.20 s/step and <= 40 GB
  dive_command   `hf-vrl train dive --config dive-b16` at its real batch (512 = 2 x 256), the same way
  clue_command   `hf-vrl train clue --config clue-r50` at its real batch (512 = 4 x 128), the same way
  accumulation   whole-batch vs plain accumulation vs one batch (benchmarks/accumulation.py --real)
  dcr_presets    the other DCR presets as dcr_command, at their batch 16 with their memory settings, as many
                 as the time left allows (each written as it finishes); every DCR run's measured peak per
                 stage beside the one predicted from the step's parts (hf_vrl.methods.dcr.footprint) goes to
                 gpu_check.json's dcr_prediction_vs_measured
  dry_runs       `--dry-run` of every paper preset on this device (hf_vrl.run.dry_run), cheapest first, as
                 many as the time left allows
--quick swaps the commands' presets for the tiny ones (their toy inputs trained for 2 steps) and the
benchmarks' sizes for their CPU sizes, so the whole check runs on a CPU in a few minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PARTS = (
    "cuda_tests",
    "diffclip_step",
    "dcr_command",
    "dive_command",
    "clue_command",
    "accumulation",
    "dcr_presets",
    "dry_runs",
)
BOXES = {  # seconds each part may take on a GPU (the dry runs get what is left)
    "cuda_tests": 100,
    "diffclip_step": 90,
    "dcr_command": 150,
    "dcr_presets": 200,  # what is left before the dry runs, at most this
    "dive_command": 60,
    "clue_command": 50,
    "accumulation": 40,
    "dry_runs": 540,
}
# part -> (preset, overrides) for the real check, and for --quick (tiny presets, toy inputs for 2 steps)
COMMANDS = {
    "dcr_command": (
        ("dcr-openai-l14-224", {}),
        (
            "dcr-tiny",
            {"model.clip_pretrain_steps": 2, "dcr.diffusion_pretrain_steps": 2, "optim.batch_size": 4},
        ),
    ),
    "dive_command": (("dive-b16", {}), ("dive-tiny", {"model.pretrain_steps": 2, "dive.val_size": 0})),
    "clue_command": (
        ("clue-r50", {}),
        ("clue-tiny", {"model.backbone_pretrain_steps": 2, "model.text_encoder_pretrain_steps": 2}),
    ),
}
DCR_TARGETS = {"step_s": 0.20, "peak_gb": 40.0}
DCR_PRESETS = (  # dcr_presets' order: the cheapest first (dcr_command measures dcr-openai-l14-224)
    "dcr-metaclip-l14",
    "dcr-siglip-so400m-224",
    "dcr-metaclip-h14",
    "dcr-openai-l14-336",
    "dcr-siglip-so400m-384",
)
QUICK_DCR = COMMANDS["dcr_command"][1]
STEPS = 6  # optimiser steps per stage of the commands; the first two (warm-up, compilation) are not timed


# -- the parts, each run by `gpu_check.py --part NAME` in a process of its own ------------------------------


def _command_part(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """A preset's real command at its own batch sizes (`_run_command`); DCR's against its targets."""
    preset, overrides = COMMANDS[name][1 if args.quick else 0]
    figures = _run_command(preset, overrides, args.work / name, args)
    if name == "dcr_command":
        last = list(figures["stages"].values())[-1] if figures["stages"] else None
        figures["targets"] = DCR_TARGETS
        figures["meets_targets"] = bool(last) and (
            last["step_s_median"] <= DCR_TARGETS["step_s"] and last["peak_gb"] <= DCR_TARGETS["peak_gb"]
        )
    return figures


def _dcr_presets_part(args: argparse.Namespace) -> None:
    """Each DCR preset at its batch of 16 with its memory settings (`_run_command`); each preset's figures are
    written to parts/dcr_presets/ as soon as it is done."""
    folder = args.output / "parts" / "dcr_presets"
    folder.mkdir(parents=True, exist_ok=True)
    for preset, overrides in [QUICK_DCR] if args.quick else [(name, {}) for name in DCR_PRESETS]:
        figures = _run_command(preset, overrides, args.work / "dcr-presets" / preset, args)
        (folder / f"{preset}.json").write_text(json.dumps(figures, indent=2) + "\n")
        shutil.rmtree(args.work / "dcr-presets" / preset, ignore_errors=True)


def _run_command(
    preset: str, overrides: dict[str, Any], out: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """A preset's real command at its own batch sizes (hf_vrl.run.dry_run without the kill, the second
    process or the memory probe), measured from its step log; beside each stage's peak the one predicted
    from the step's parts where the method has them (DCR with real-size models: not the tiny preset)."""
    from hf_vrl.run.dry_run import DryRunOptions, dry_run, preset_config
    from hf_vrl.run.memory import component_prediction, has_components

    method_class, config = preset_config(preset, overrides)
    options = DryRunOptions(
        micro_batch=None,
        steps=args.steps,
        processes=(1,),
        kill=False,
        memory_fit=False,
        threads=_threads(args),
    )
    report = dry_run(method_class, config, out, options, preset=preset)
    stages = _timed_stages(out / "logs" / "one-process.steps.jsonl")
    predicted = component_prediction(config, report["stages"]) if has_components(config) else None
    for stage, figures in stages.items():
        if predicted and stage in predicted["stages"]:
            figures["predicted_gb"] = round(predicted["stages"][stage]["peak"] * 2**30 / 1e9, 2)
    return {"preset": preset, "passed": report["passed"], "problems": report["problems"], "stages": stages}


def _timed_stages(record: Path) -> dict[str, Any]:
    """Per stage: the median step time after the first two steps and the peak memory (GPU: the allocator's
    peak; CPU: the process's resident peak), in GB (10^9 bytes, as the targets)."""
    from hf_vrl.run.probe import read_records

    stages: dict[str, Any] = {}
    records = read_records(record)
    for stage in dict.fromkeys(r["stage"] for r in records):
        mine = [r for r in records if r["stage"] == stage]
        timed = [r["step_s"] for r in mine[2:]] or [r["step_s"] for r in mine]
        peak = max(r.get("device_peak_bytes") or r.get("host_peak_bytes") or 0 for r in mine)
        stages[stage] = {
            "step_s": [round(r["step_s"], 4) for r in mine],
            "step_s_median": round(statistics.median(timed), 4),
            "peak_gb": round(peak / 1e9, 2),
            "peak_kind": "CUDA allocated" if mine[0]["device"] == "cuda" else "host resident",
        }
    return stages


def _dry_runs_part(args: argparse.Namespace) -> None:
    """Dry runs of the paper presets, cheapest first; each report is written as soon as it is done."""
    from hf_vrl.run.dry_run import DryRunOptions, dry_run, paper_presets, portable, preset_config

    folder = args.output / "parts" / "dry_runs"
    folder.mkdir(parents=True, exist_ok=True)
    for preset in ["diffclip-tiny"] if args.quick else paper_presets():
        method_class, config = preset_config(preset)
        out = args.work / "dry-runs" / preset
        report = dry_run(method_class, config, out, DryRunOptions(threads=_threads(args)), preset=preset)
        (folder / f"{preset}.json").write_text(json.dumps(portable(report, out), indent=2) + "\n")
        shutil.rmtree(out, ignore_errors=True)


def _threads(args: argparse.Namespace) -> int | None:
    """One torch thread per run on a CPU (a shared machine's cores are oversubscribed otherwise)."""
    return 1 if args.device == "cpu" else None


def _external(name: str, args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The command and extra environment of a part another script measures."""
    json_out = str(args.output / "parts" / f"{name}.json")
    device = args.device
    if name == "cuda_tests":
        xml = str(args.output / "parts" / "cuda_tests.xml")
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml", xml]
        if args.quick:
            return [*command, "tests/test_devices.py"], {"TORCH_DEVICE": device}
        parallel = ["-n", "8"] if _has_xdist() else []
        return [*command, *parallel, "-m", "not slow", "-k", "cuda or gpu", "tests"], {"TORCH_DEVICE": "cuda"}
    if name == "diffclip_step":
        command = [sys.executable, str(HERE / "diffclip_attention.py"), "--part", "step", "--device", device]
        if args.quick:
            return [
                *command,
                "--iterations",
                "1",
                "--warmup",
                "0",
                "--threads",
                "1",
                "--output",
                json_out,
            ], {}
        return [*command, "--dtype", "bfloat16", "--batch-size", "256", "--compile", "--output", json_out], {}
    command = [sys.executable, str(HERE / "accumulation.py"), "--device", device, "--rounds", "1"]
    if args.quick:
        return [*command, "--steps", "1", "--batch-size", "4", "--chunks", "2", "--output", json_out], {}
    return [*command, "--real", "--steps", "2", "--output", json_out], {}


def _has_xdist() -> bool:
    import importlib.util

    return importlib.util.find_spec("xdist") is not None


def run_part(name: str, args: argparse.Namespace, seconds: float) -> dict[str, Any]:
    """Part `name` in a process of its own, stopped (its whole process group) after `seconds`."""
    log = args.output / "logs" / f"{name}.log"
    if name in ("cuda_tests", "diffclip_step", "accumulation"):
        command, extra = _external(name, args)
    else:
        command, extra = [sys.executable, __file__, "--part", name, *_forwarded(args)], {}
    env = dict(os.environ) | {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"} | extra
    env["HF_VRL_REAL_SIZE_HOME"] = str(args.work / "real-size")
    started = time.perf_counter()
    with open(log, "w") as handle:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = process.wait(timeout=seconds)
            status = "ok" if code == 0 else "failed"
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            code, status = process.wait(), "timeout"
    result = {"status": status, "returncode": code, "seconds": round(time.perf_counter() - started, 1)}
    result["log"] = str(log.relative_to(args.output))
    if status != "ok":
        result["log_tail"] = log.read_text(errors="replace")[-3000:]
    return result | {"figures": _figures(name, args)}


def _forwarded(args: argparse.Namespace) -> list[str]:
    flags = ["--device", args.device, "--output", str(args.output), "--work", str(args.work)]
    return flags + ["--steps", str(args.steps)] + (["--quick"] if args.quick else [])


def _figures(name: str, args: argparse.Namespace) -> Any:
    """What part `name` left in <output>/parts/ (whatever it finished, after a timeout too)."""
    parts = args.output / "parts"
    if name == "cuda_tests":
        return _junit(parts / "cuda_tests.xml")
    if name == "dry_runs":
        folder = parts / "dry_runs"
        return {path.stem: _dry_run_figures(path) for path in sorted(folder.glob("*.json"))}
    if name == "dcr_presets":
        return {path.stem: json.loads(path.read_text()) for path in sorted((parts / name).glob("*.json"))}
    path = parts / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _junit(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    suite = ElementTree.parse(path).getroot()
    suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
    failed = [
        f"{case.get('classname')}::{case.get('name')}"
        for case in suite.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    return counts | {"seconds": float(suite.get("time", 0)), "failed": failed}


def _dry_run_figures(path: Path) -> dict[str, Any]:
    report = json.loads(path.read_text())
    keys = ("passed", "problems", "micro_batch", "runs", "steps", "prediction", "wall_s")
    return {key: report.get(key) for key in keys}


def _prediction_vs_measured(parts: dict[str, Any]) -> dict[str, Any]:
    """Per DCR preset run (dcr_command, dcr_presets) and stage: the peak it measured (GPU: the allocator's;
    CPU: the host's, not comparable) and the peak predicted from its parts, in GB, and their ratio."""
    runs = [parts.get("dcr_command", {}).get("figures") or {}]
    runs += list((parts.get("dcr_presets", {}).get("figures") or {}).values())
    found = {}
    for run in runs:
        for stage, figures in run.get("stages", {}).items():
            if figures.get("predicted_gb"):
                found.setdefault(run["preset"], {})[stage] = {
                    "measured_gb": figures["peak_gb"],
                    "measured_kind": figures["peak_kind"],
                    "predicted_gb": figures["predicted_gb"],
                    "measured_over_predicted": round(figures["peak_gb"] / figures["predicted_gb"], 3),
                }
    return found


def machine(device: str) -> dict[str, Any]:
    import torch
    import transformers

    from hf_vrl.run.dry_run import machine as dry_run_machine

    info = dry_run_machine() | {"device": device, "transformers": transformers.__version__}
    if torch.cuda.is_available():
        info["gpu_memory_gb"] = round(torch.cuda.get_device_properties(0).total_memory / 1e9, 1)
    return info


def check(args: argparse.Namespace) -> dict[str, Any]:
    """Every part within `args.budget_s` seconds; the report is rewritten after each part."""
    deadline = time.perf_counter() + args.budget_s
    for sub in ("parts", "logs"):
        (args.output / sub).mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"machine": machine(args.device), "quick": args.quick, "budget_s": args.budget_s}
    report["parts"] = parts = {}
    for name in args.parts:
        left = deadline - time.perf_counter()
        if left < 15:
            parts[name] = {"status": "not run", "reason": "no time left in the budget"}
            continue
        box = args.box_s or BOXES[name] * (4 if args.quick else 1)
        parts[name] = run_part(name, args, min(box, left))
        report["dcr_prediction_vs_measured"] = _prediction_vs_measured(parts)
        report["wall_s"] = round(args.budget_s - (deadline - time.perf_counter()), 1)
        (args.output / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None, help="cuda (default where present) or cpu")
    parser.add_argument(
        "--quick", action="store_true", help="every part at toy size (a CPU check of the check)"
    )
    parser.add_argument("--output", type=Path, default=None, help="where the figures go (default: $OUT)")
    parser.add_argument(
        "--work", type=Path, default=None, help="models and run folders (default: a temp dir)"
    )
    parser.add_argument("--budget-s", type=float, default=480.0, help="seconds for all parts (default 480)")
    parser.add_argument("--steps", type=int, default=STEPS, help="optimiser steps per stage of the commands")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--box-s", type=float, default=None, help="one time box for every part (seconds)")
    parser.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)  # one part, in its own process
    args = parser.parse_args(argv)
    import torch

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.output = (args.output or Path(os.environ.get("OUT", "gpu_check"))).resolve()
    if args.part == "dry_runs":
        _dry_runs_part(args)
        return 0
    if args.part == "dcr_presets":
        _dcr_presets_part(args)
        return 0
    if args.part:
        figures = _command_part(args.part, args)
        (args.output / "parts" / f"{args.part}.json").write_text(json.dumps(figures, indent=2) + "\n")
        return 0 if figures["passed"] else 1
    temporary = args.work is None
    args.work = (args.work or Path(tempfile.mkdtemp(prefix="hf_vrl_gpu_check_"))).resolve()
    try:
        report = check(args)
    finally:
        if temporary:
            shutil.rmtree(args.work, ignore_errors=True)
    for name, part in report["parts"].items():
        print(f"{name:<14} {part['status']:<8} {part.get('seconds', 0):7.1f} s")
    print(f"figures: {args.output / 'gpu_check.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
