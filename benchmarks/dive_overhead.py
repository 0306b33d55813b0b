"""DiVE's cost against FLYP's: time per training step and peak memory, as ratios measured in one run.

Variants (each one full DiVETrainer step: forward, backward, AdamW step; the same model and batches):
  flyp                the baseline: the contrastive loss on the target batch
  dive_paper          DiVE as the paper runs it: frozen model forward every step, one backward of the sum
  dive                + the reference term back-propagated before the target forward (separate_backward)
  dive_cache          + the frozen embeddings from the cache (steady state: the cache is full)
  dive_bf16_frozen    separate backward, frozen model in bfloat16 (not exact: see the precision check)
  dive_cache_quarter  cache, separate backward, B' = B/4
Each variant runs in its own process (peak memory is per process), one after the other, for `--rounds`
rounds; the ratios use each variant's fastest step over all rounds and its largest peak. Time: on CUDA the
wall clock of a step (synchronised); on the CPU the process's user CPU time of a step (one thread), which a
machine shared with other jobs disturbs far less than the wall clock (system time is left out: the mmap
setting below makes every large allocation a system call, which the memory measurement needs).
Memory: on CUDA the peak allocated (weights, optimizer, frozen copy, activations, cache); on the CPU the
peak resident memory above the process's size before the model was built (large allocations forced to mmap,
MALLOC_MMAP_THRESHOLD_=65536, so freed activations leave the resident set).
The precision check compares the frozen model's embeddings in bfloat16 / float16 with float32 ones (mean norm
of the difference of L2-normalised embeddings), the error a reduced-precision frozen model puts into every
difference vector u = f_ft - f_pre.

    python benchmarks/dive_overhead.py            # tiny CLIP on the CPU
    python benchmarks/dive_overhead.py --real     # CLIP ViT-B/16 (random weights), B = 512, bf16 autocast

Writes benchmarks/results/dive_overhead.json (dive_overhead_real.json with --real).
"""

from __future__ import annotations

import argparse
import json
import math
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

BASELINE = "flyp"
VARIANTS = {
    "flyp": dict(objective="flyp"),
    "dive_paper": dict(separate_backward=False),
    "dive": dict(),
    "dive_cache": dict(frozen_embeddings="cache"),
    "dive_bf16_frozen": dict(frozen_dtype="bfloat16"),
    "dive_cache_quarter": dict(frozen_embeddings="cache", quarter=True),
}


def worker(args: argparse.Namespace) -> dict:
    """One variant in this process: warm-up steps (filling the cache), then timed steps and peak memory."""
    from transformers import TrainingArguments

    from hf_vrl.methods.dive.settings import DiVESettings
    from hf_vrl.methods.dive.trainer import DiVETrainer

    torch.set_num_threads(args.threads)
    device = args.device
    options = dict(VARIANTS[args.worker])
    quarter = options.pop("quarter", False)
    reference_batch = args.batch_size // 4 if quarter else args.batch_size
    settings = DiVESettings(
        **({"reference_dataset": "tensor rows", "reference_batch_size": reference_batch} | options)
    )
    reference_size = 2 * args.batch_size
    warmup = math.ceil(reference_size / reference_batch) + 1
    target = tensor_rows(args.batch_size * (warmup + args.steps), args.real, 1, args.text_length)
    reference = tensor_rows(reference_size, args.real, 2, args.text_length)
    base = start_memory(device)
    model = build_model(args.real).to(device)
    training_args = TrainingArguments(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=args.batch_size, learning_rate=1e-5,
        weight_decay=0.1, report_to="none", use_cpu=device == "cpu", bf16=args.real, save_strategy="no",
        remove_unused_columns=False, disable_tqdm=True,
    )  # fmt: skip
    trainer = DiVETrainer(
        model=model, args=training_args, train_dataset=target, data_collator=stack, settings=settings,
        reference_dataset=reference, reference_collator=stack,
    )  # fmt: skip
    trainer.create_optimizer_and_scheduler(num_training_steps=warmup + args.steps)
    trainer.current_gradient_accumulation_steps = 1
    seconds = []
    for step in range(warmup + args.steps):
        batch = stack(target[step * args.batch_size : (step + 1) * args.batch_size])
        start = clock(device)
        trainer.training_step(trainer.model, batch)
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        if step >= warmup:
            seconds.append(clock(device) - start)
    peak = peak_memory(device, base)
    cached = trainer.frozen.cached if trainer.frozen is not None else 0
    return {
        "seconds": seconds,
        "memory_bytes": peak,
        "reference_batch_size": reference_batch,
        "cached": cached,
    }


def run_variant(name: str, args: argparse.Namespace) -> dict:
    """`worker` in a fresh process (its peak memory is its own)."""
    argv = ["--batch-size", str(args.batch_size), "--steps", str(args.steps), "--threads", str(args.threads)]
    argv += ["--device", args.device, "--text-length", str(args.text_length)] + (
        ["--real"] if args.real else []
    )
    return run_in_process(__file__, name, argv)


@torch.no_grad()
def precision_errors(args: argparse.Namespace) -> dict[str, float]:
    """Mean ||n(f_pre in dtype) - n(f_pre in float32)|| over a reference batch, images and texts."""
    from hf_vrl.methods.dive.frozen import embed_pair

    model = build_model(args.real).to(args.device).eval()
    batch = stack(tensor_rows(min(args.batch_size, 64), args.real, 3, args.text_length))
    batch = {k: v.to(args.device) for k, v in batch.items()}
    exact = [torch.nn.functional.normalize(e.float(), dim=-1) for e in embed_pair(model, batch)]
    errors = {}
    for name, dtype in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        low = model.to(dtype)
        inputs = batch | {"pixel_values": batch["pixel_values"].to(dtype)}
        reduced = [torch.nn.functional.normalize(e.float(), dim=-1) for e in embed_pair(low, inputs)]
        errors[name] = float(sum((r - x).norm(dim=-1).mean() for r, x in zip(reduced, exact)) / 2)
    return errors


def run(args: argparse.Namespace) -> dict:
    runs: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    for _ in range(args.rounds):
        for name in VARIANTS:
            runs[name].append(run_variant(name, args))
            print(f"  {name}: {runs[name][-1].get('error') or min(runs[name][-1]['seconds']):.4}", flush=True)
    results = summarise(runs, BASELINE, keep=("reference_batch_size",))
    device = device_name(args.device)
    return {
        "setup": {
            "model": "CLIP ViT-B/16 (random weights), bf16 autocast"
            if args.real
            else "tiny CLIP (4 layers, 128 wide, 32 px)",
            "batch_size": args.batch_size,
            "steps": args.steps,
            "rounds": args.rounds,
            "threads": args.threads,
            "device": device,
            "time": "wall clock per step" if args.device.startswith("cuda") else "user CPU time per step",
            "memory": "peak CUDA allocated"
            if args.device.startswith("cuda")
            else "peak RSS above the pre-model size",
            "torch": torch.__version__,
        },
        "frozen_precision_error": precision_errors(args),
        "results": results,
    }


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--real", action="store_true", help="CLIP ViT-B/16, batch 512, bf16 autocast (GPU)")
    parser.add_argument("--batch-size", type=int, default=None, help="B (tiny 64, real 512); B' = B or B/4")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per variant (tiny 5, real 5)")
    parser.add_argument("--rounds", type=int, default=None, help="runs of every variant (tiny 2, real 1)")
    add_common_arguments(parser, VARIANTS)
    args = parser.parse_args(argv)
    resolve_common(args)
    args.batch_size = args.batch_size or (512 if args.real else 64)
    args.steps = args.steps or 5
    args.rounds = args.rounds or (1 if args.real else 2)
    if args.worker:
        args.worker_output.write_text(json.dumps(worker(args)))
        return None
    report = run(args)
    output = args.output or RESULTS / ("dive_overhead_real.json" if args.real else "dive_overhead.json")
    write_report(report, output)
    for name, r in report["results"].items():
        if "error" in r:
            print(f"{name:<20} {r['error'][:200]}")
            continue
        print(
            f"{name:<20} B'={r['reference_batch_size']:<4} {r['seconds_min']:8.3f} s  "
            f"x{r['time_vs_flyp']:5.2f} time  {r['memory_mb']:9.1f} MB  x{r['memory_vs_flyp']:5.2f} memory"
        )
    print(f"frozen-embedding error (mean ||n(low) - n(fp32)||): {report['frozen_precision_error']}")
    print(f"written to {output}")
    return report


if __name__ == "__main__":
    main()
