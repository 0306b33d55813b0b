"""Shared pieces of the CLIP step benchmarks (`dive_overhead.py`, `accumulation.py`): the model sizes, tensor
rows, and a step's clock and peak memory, each variant measured in a process of its own.

Time: on CUDA the wall clock (synchronised); on the CPU the process's user CPU time (one thread), which a
shared machine disturbs far less than the wall clock. Memory: on CUDA the peak allocated; on the CPU the
peak resident memory above the process's size before the model was built, with large allocations forced to
mmap (MALLOC_MMAP_THRESHOLD_=65536) so that freed activations leave the resident set.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).parent / "results"

# OpenAI CLIP ViT-B/16 (openai/clip-vit-base-patch16) and a tiny CLIP for the CPU
VIT_B16 = dict(
    projection_dim=512,
    vision_config=dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                       image_size=224, patch_size=16),
    text_config=dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=8,
                     max_position_embeddings=77, vocab_size=49408),
)  # fmt: skip
TINY = dict(
    projection_dim=64,
    vision_config=dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                       image_size=32, patch_size=4),
    text_config=dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                     max_position_embeddings=32, vocab_size=1000),
)  # fmt: skip


def build_model(real: bool, seed: int = 0):
    from transformers import CLIPConfig, CLIPModel

    sizes = VIT_B16 if real else TINY
    text = sizes["text_config"] | dict(bos_token_id=0, eos_token_id=1, pad_token_id=2)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return CLIPModel(CLIPConfig(**(sizes | {"text_config": text})))


def tensor_rows(n: int, real: bool, seed: int, text_length: int) -> list[dict[str, torch.Tensor]]:
    """Pre-collated rows (data loading is the same for every variant and not what is measured)."""
    sizes = VIT_B16 if real else TINY
    image, vocab = sizes["vision_config"]["image_size"], sizes["text_config"]["vocab_size"]
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (n, text_length), generator=gen)
    ids[:, -1] = 1  # eos
    pixels = torch.randn(n, 3, image, image, generator=gen)
    mask = torch.ones(text_length, dtype=torch.long)
    return [{"pixel_values": pixels[i], "input_ids": ids[i], "attention_mask": mask} for i in range(n)]


def stack(rows):
    return {key: torch.stack([row[key] for row in rows]) for key in rows[0]}


def _status(key: str) -> int:
    return int(re.search(rf"{key}:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024


def clock(device: str) -> float:
    """Wall clock after a CUDA synchronisation; user CPU time of this process on the CPU."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        return time.perf_counter()
    return resource.getrusage(resource.RUSAGE_SELF).ru_utime


def start_memory(device: str) -> int:
    """Reset the peak; returns the baseline the peak is measured above (0 on CUDA)."""
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        return 0
    base = _status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak resident size
    return base


def peak_memory(device: str, base: int) -> int:
    return torch.cuda.max_memory_allocated() if device.startswith("cuda") else _status("VmHWM") - base


def run_in_process(script: str, name: str, argv: list[str]) -> dict:
    """`script --worker NAME --worker-output F ARGV` in a fresh process (its peak memory is its own)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        command = [sys.executable, script, "--worker", name, "--worker-output", str(out), *argv]
        env = os.environ | {"MALLOC_MMAP_THRESHOLD_": "65536"}
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            oom = "out of memory" in done.stderr.lower()
            return {"error": "out of memory" if oom else done.stderr[-2000:]}
        return json.loads(out.read_text())


def device_name(device: str) -> str:
    import platform

    return torch.cuda.get_device_name() if device.startswith("cuda") else platform.processor() or "cpu"


def add_common_arguments(parser: argparse.ArgumentParser, variants) -> None:
    """--threads, --text-length, --device, --output and the hidden worker arguments."""
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--text-length", type=int, default=None, help="caption tokens (tiny 16, real 77)")
    parser.add_argument("--device", default=None)
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--worker", choices=list(variants), help=argparse.SUPPRESS)
    parser.add_argument("--worker-output", type=Path, help=argparse.SUPPRESS)


def resolve_common(args: argparse.Namespace) -> None:
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.text_length = args.text_length or (77 if args.real else 16)


def write_report(report: dict, output: Path) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2) + "\n")


def summarise(runs: dict[str, list[dict]], baseline: str, keep: tuple[str, ...] = ()) -> dict[str, dict]:
    """Each variant's fastest and median step over all rounds, its largest peak, and both as ratios to
    `baseline`'s (`time_vs_<baseline>`, `memory_vs_<baseline>`); `keep`: fields copied from its run."""
    results: dict[str, dict] = {}
    for name, measured in runs.items():
        good = [m for m in measured if "error" not in m]
        if not good:
            results[name] = {"error": measured[0]["error"]}
            continue
        seconds = sorted(s for m in good for s in m["seconds"])
        results[name] = {
            "seconds_min": seconds[0],
            "seconds_median": seconds[len(seconds) // 2],
            "memory_mb": max(m["memory_bytes"] for m in good) / 2**20,
            **{key: good[0][key] for key in keep},
        }
    base = results[baseline]
    for r in results.values():
        if "error" not in r and "error" not in base:
            r[f"time_vs_{baseline}"] = r["seconds_min"] / base["seconds_min"]
            r[f"memory_vs_{baseline}"] = r["memory_mb"] / base["memory_mb"]
    return results
