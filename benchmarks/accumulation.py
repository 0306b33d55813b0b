"""Whole-batch accumulation (GradCache) against plain accumulation and against one large batch: time per
optimiser step and peak memory, as ratios measured in one run (`clip_steps` says how each is measured).

Variants (ContrastiveTrainer.training_step on the same CLIP and the same k x B pairs; no optimiser step):
  one_batch     the baseline: all k x B pairs in one forward / backward (the loss of the whole batch)
  whole_batch   k micro-batches of B, the loss of the whole batch (embed without gradient, loss, recompute)
  micro_batch   k micro-batches of B, each with its own loss (the Trainer's plain accumulation)

With --data, the memory the *data* takes instead (whole_batch against micro_batch, a tiny CLIP trained
through `Trainer.train` on 224-px images, so that pixels are what a batch weighs): the peak bytes of batch
tensors alive at once on the host (what the DataLoader collated, in this process) and on the device (what was
placed there: by accelerate's loader or by the Trainer's `_prepare_input`). On a machine without an
accelerator every placement is emulated as a copy, as a transfer to a GPU makes one, and the copies count as
device memory. Batches a DataLoader's workers have in flight come on top of the host figure: num_workers x
prefetch_factor loader batches (`loader_batch_mb`, one micro-batch in both variants).

    python benchmarks/accumulation.py                 # tiny CLIP on the CPU, B = 16, k = 4
    python benchmarks/accumulation.py --real          # CLIP ViT-B/16 (random weights), B = 256, k = 4, bf16
    python benchmarks/accumulation.py --data          # data memory, B = 16, k = 4, 224 px

Writes benchmarks/results/accumulation.json (accumulation_real.json with --real, accumulation_data.json with
--data).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import weakref
from collections.abc import Mapping

import torch
from clip_steps import (
    RESULTS,
    TINY,
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
DATA_BASELINE = "micro_batch"
DATA_VARIANTS = ("whole_batch", "micro_batch")


def worker(args: argparse.Namespace) -> dict:
    """One variant in this process: one warm-up step, then timed steps and the peak memory."""
    from hf_vrl.trainer import ContrastiveTrainer

    torch.set_num_threads(args.threads)
    device, k, b = args.device, args.chunks, args.batch_size
    per_call = k * b if args.worker == BASELINE else b
    rows = tensor_rows(k * b, args.real, 1, args.text_length)
    base = start_memory(device)
    model = build_model(args.real).to(device)
    trainer = ContrastiveTrainer(model=model, args=training_arguments(args, args.worker), data_collator=stack)
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps  # as Trainer.train
    seconds = []
    for step in range(1 + args.steps):
        start = clock(device)
        for i in range(0, k * b, per_call):
            trainer.training_step(trainer.model, stack(rows[i : i + per_call]))
        if step:
            seconds.append(clock(device) - start)
        trainer.model.zero_grad(set_to_none=True)
    return {"seconds": seconds, "memory_bytes": peak_memory(device, base)}


def training_arguments(args: argparse.Namespace, variant: str, **overrides):
    """k micro-batches of B per optimiser step (one batch of k x B for one_batch)."""
    from hf_vrl.trainer import VRLTrainingArguments

    one = variant == BASELINE
    batch, steps = (args.batch_size * args.chunks, 1) if one else (args.batch_size, args.chunks)
    return VRLTrainingArguments(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=batch, gradient_accumulation_steps=steps,
        accumulation="whole_batch" if variant == "whole_batch" else "micro_batch", report_to="none",
        use_cpu=args.device == "cpu", bf16=args.real, save_strategy="no", remove_unused_columns=False,
        disable_tqdm=True, **overrides,
    )  # fmt: skip


class TensorBytes:
    """Bytes of registered tensors alive at once, and their peak (a tensor counts once; a finaliser frees)."""

    def __init__(self) -> None:
        self.live: set[int] = set()
        self.current = self.peak = 0

    def add(self, tensor: torch.Tensor) -> torch.Tensor:
        if id(tensor) not in self.live:
            size = tensor.numel() * tensor.element_size()
            self.live.add(id(tensor))
            self.current += size
            self.peak = max(self.peak, self.current)
            weakref.finalize(tensor, self._free, id(tensor), size)
        return tensor

    def _free(self, key: int, size: int) -> None:
        self.live.discard(key)
        self.current -= size


def _tensors(value, fn):
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, Mapping):
        return type(value)({key: _tensors(item, fn) for key, item in value.items()})
    return value


def data_worker(args: argparse.Namespace) -> dict:
    """`Trainer.train` over 2 steps of k micro-batches of B: the peak data bytes on the host and device."""
    import accelerate.data_loader as accelerate_loader
    from transformers import CLIPConfig, CLIPModel

    from hf_vrl.trainer import ContrastiveTrainer

    torch.set_num_threads(args.threads)
    host, device = TensorBytes(), TensorBytes()
    emulate = not args.device.startswith("cuda")  # no accelerator: a placement is a copy, as to a GPU

    def place(tensor: torch.Tensor) -> torch.Tensor:
        if id(tensor) in device.live:
            return tensor
        return device.add(tensor.clone() if emulate else tensor)

    send = accelerate_loader.send_to_device
    accelerate_loader.send_to_device = lambda batch, *a, **kw: _tensors(send(batch, *a, **kw), place)

    def collate(rows):
        return _tensors(stack(rows), host.add)

    size = args.image_size
    vision = TINY["vision_config"] | {"image_size": size, "patch_size": size // 7}
    text = TINY["text_config"] | dict(bos_token_id=0, eos_token_id=1, pad_token_id=2)
    torch.manual_seed(0)
    model = CLIPModel(CLIPConfig(**(TINY | {"vision_config": vision, "text_config": text})))
    rows = tensor_rows(2 * args.chunks * args.batch_size, False, 1, args.text_length)
    rows = [row | {"pixel_values": torch.randn(3, size, size)} for row in rows]
    trainer = ContrastiveTrainer(
        model=model,
        args=training_arguments(args, args.worker, max_steps=2, learning_rate=1e-4, optim="sgd"),
        train_dataset=rows,
        data_collator=collate,
    )
    prepare = trainer._prepare_input
    trainer._prepare_input = lambda data: _tensors(prepare(data), place)
    trainer.train()
    micro = stack(rows[: args.batch_size])
    return {
        "host_bytes": host.peak,
        "device_bytes": device.peak,
        "micro_batch_bytes": sum(t.numel() * t.element_size() for t in micro.values()),
    }


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


def run_data(args: argparse.Namespace) -> dict:
    argv = ["--data", "--batch-size", str(args.batch_size), "--chunks", str(args.chunks)]
    argv += ["--threads", str(args.threads), "--device", args.device, "--text-length", str(args.text_length)]
    argv += ["--image-size", str(args.image_size)]
    measured = {name: run_in_process(__file__, name, argv) for name in DATA_VARIANTS}
    results: dict[str, dict] = {}
    for name, m in measured.items():
        if "error" in m:
            results[name] = m
            continue
        micro = m["micro_batch_bytes"]
        results[name] = {
            "host_mb": m["host_bytes"] / 2**20,
            "device_mb": m["device_bytes"] / 2**20,
            "host_micro_batches": m["host_bytes"] / micro,
            "device_micro_batches": m["device_bytes"] / micro,
            "loader_batch_mb": micro / 2**20,
        }
    base = results[DATA_BASELINE]
    for r in results.values():
        if "error" not in r and "error" not in base:
            r[f"host_vs_{DATA_BASELINE}"] = r["host_mb"] / base["host_mb"]
            r[f"device_vs_{DATA_BASELINE}"] = r["device_mb"] / base["device_mb"]
    device = device_name(args.device)
    return {
        "setup": {
            "model": f"tiny CLIP (4 layers, 128 wide), {args.image_size}-px images",
            "micro_batch": args.batch_size,
            "micro_batches": args.chunks,
            "steps": 2,
            "device": device if args.device.startswith("cuda") else f"{device} (device placements emulated)",
            "torch": torch.__version__,
        },
        "results": results,
    }


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--real", action="store_true", help="CLIP ViT-B/16, bf16 autocast (GPU)")
    parser.add_argument("--data", action="store_true", help="the data's host and device memory (tiny CLIP)")
    parser.add_argument("--batch-size", type=int, default=None, help="B, the micro-batch (tiny 16, real 256)")
    parser.add_argument("--chunks", type=int, default=4, help="k, micro-batches per step")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per variant")
    parser.add_argument("--rounds", type=int, default=2, help="runs of every variant")
    parser.add_argument("--image-size", type=int, default=224, help="--data: image side in pixels")
    add_common_arguments(parser, VARIANTS)
    args = parser.parse_args(argv)
    resolve_common(args)
    args.batch_size = args.batch_size or (256 if args.real else 16)
    if args.worker:
        args.worker_output.write_text(json.dumps((data_worker if args.data else worker)(args)))
        return None
    report = run_data(args) if args.data else run(args)
    name = (
        "accumulation_data.json"
        if args.data
        else "accumulation_real.json"
        if args.real
        else "accumulation.json"
    )
    output = args.output or RESULTS / name
    write_report(report, output)
    for variant, r in report["results"].items():
        if "error" in r:
            print(f"{variant:<12} {r['error'][:300]}")
        elif args.data:
            host, device = (
                r.get("host_vs_micro_batch", float("nan")),
                r.get("device_vs_micro_batch", float("nan")),
            )
            print(
                f"{variant:<12} host {r['host_mb']:7.1f} MB ({r['host_micro_batches']:4.1f} micro-batches, "
                f"x{host:4.2f})  device {r['device_mb']:7.1f} MB ({r['device_micro_batches']:4.1f} "
                f"micro-batches, x{device:4.2f})"
            )
        else:
            time, memory = (
                r.get("time_vs_one_batch", float("nan")),
                r.get("memory_vs_one_batch", float("nan")),
            )
            print(
                f"{variant:<12} {r['seconds_min']:8.3f} s  x{time:5.2f} time  "
                f"{r['memory_mb']:9.1f} MB  x{memory:5.2f} memory"
            )
    print(f"written to {output}")
    return report


if __name__ == "__main__":
    main()
