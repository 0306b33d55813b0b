"""Whole-batch accumulation (GradCache) against plain accumulation and against one large batch: time per
optimiser step and peak memory, as ratios measured in one run (`clip_steps` says how each is measured).

Variants (ContrastiveTrainer.training_step on the same CLIP and the same k x B pairs; no optimiser step):
  one_batch     the baseline: all k x B pairs in one forward / backward (the loss of the whole batch)
  whole_batch   k micro-batches of B, the loss of the whole batch (embed without gradient, loss, recompute)
  micro_batch   k micro-batches of B, each with its own loss (the Trainer's plain accumulation)

    python benchmarks/accumulation.py                 # tiny CLIP on the CPU, B = 16, k = 4
    python benchmarks/accumulation.py --real          # CLIP ViT-B/16 (random weights), B = 256, k = 4, bf16

Writes benchmarks/results/accumulation.json (accumulation_real.json with --real).
"""

from __future__ import annotations

import argparse
import json
import tempfile

import torch
from clip_steps import (
    RESULTS,
    add_common_arguments,
    build_model,
    clock,
    device_name,
    peak_memory,
    resolve_common,
    run_in_process,
    stack,
    start_memory,
    summarise,
    tensor_rows,
    write_report,
)

BASELINE = "one_batch"
VARIANTS = ("one_batch", "whole_batch", "micro_batch")


def worker(args: argparse.Namespace) -> dict:
    """One variant in this process: one warm-up step, then timed steps and the peak memory."""
    from hf_vrl.trainer import ContrastiveTrainer, VRLTrainingArguments

    torch.set_num_threads(args.threads)
    device, k, b = args.device, args.chunks, args.batch_size
    per_call = b if args.worker == "micro_batch" else k * b
    rows = tensor_rows(k * b, args.real, 1, args.text_length)
    base = start_memory(device)
    model = build_model(args.real).to(device)
    training_args = VRLTrainingArguments(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=per_call,
        gradient_accumulation_steps=k if args.worker == "micro_batch" else 1,
        micro_batch_size=b if args.worker == "whole_batch" else None, report_to="none",
        use_cpu=device == "cpu", bf16=args.real, save_strategy="no", remove_unused_columns=False,
        disable_tqdm=True,
    )  # fmt: skip
    trainer = ContrastiveTrainer(model=model, args=training_args, data_collator=stack)
    trainer.current_gradient_accumulation_steps = training_args.gradient_accumulation_steps
    seconds = []
    for step in range(1 + args.steps):
        start = clock(device)
        for i in range(0, k * b, per_call):
            trainer.training_step(trainer.model, stack(rows[i : i + per_call]))
        if step:
            seconds.append(clock(device) - start)
        trainer.model.zero_grad(set_to_none=True)
    return {"seconds": seconds, "memory_bytes": peak_memory(device, base)}


def run(args: argparse.Namespace) -> dict:
    argv = ["--batch-size", str(args.batch_size), "--chunks", str(args.chunks), "--steps", str(args.steps)]
    argv += ["--threads", str(args.threads), "--device", args.device, "--text-length", str(args.text_length)]
    argv += ["--real"] if args.real else []
    runs: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    for _ in range(args.rounds):
        for name in VARIANTS:
            runs[name].append(run_in_process(__file__, name, argv))
    results = summarise(runs, BASELINE)
    return {
        "setup": {
            "model": "CLIP ViT-B/16 (random weights), bf16 autocast"
            if args.real
            else "tiny CLIP (4 layers, 128 wide)",
            "micro_batch": args.batch_size,
            "micro_batches": args.chunks,
            "steps": args.steps,
            "rounds": args.rounds,
            "threads": args.threads,
            "device": device_name(args.device),
            "torch": torch.__version__,
        },
        "results": results,
    }


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--real", action="store_true", help="CLIP ViT-B/16, bf16 autocast (GPU)")
    parser.add_argument("--batch-size", type=int, default=None, help="B, the micro-batch (tiny 16, real 256)")
    parser.add_argument("--chunks", type=int, default=4, help="k, micro-batches per step")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per variant")
    parser.add_argument("--rounds", type=int, default=2, help="runs of every variant")
    add_common_arguments(parser, VARIANTS)
    args = parser.parse_args(argv)
    resolve_common(args)
    args.batch_size = args.batch_size or (256 if args.real else 16)
    if args.worker:
        args.worker_output.write_text(json.dumps(worker(args)))
        return None
    report = run(args)
    output = args.output or RESULTS / ("accumulation_real.json" if args.real else "accumulation.json")
    write_report(report, output)
    for name, r in report["results"].items():
        if "error" in r:
            print(f"{name:<12} {r['error'][:300]}")
            continue
        print(
            f"{name:<12} {r['seconds_min']:8.3f} s  x{r.get('time_vs_one_batch', float('nan')):5.2f} time  "
            f"{r['memory_mb']:9.1f} MB  x{r.get('memory_vs_one_batch', float('nan')):5.2f} memory"
        )
    print(f"written to {output}")
    return report


if __name__ == "__main__":
    main()
