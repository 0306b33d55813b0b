"""Forward+backward time and memory of a DiffCLIP vision tower against a CLIP vision tower of the same size.

Variants, all measured in the same run on the same weights and inputs (interleaved rounds; the ratios use the
fastest round of each variant, the least disturbed by other load; medians are recorded too):
  clip_sdpa / clip_eager          transformers CLIPVisionModel
  diffclip_sdpa / diffclip_eager  hf_vrl DiffCLIPVisionModel (SDPA: one kernel call over H heads, paired V)
  official_eager                  the same DiffCLIP tower, each attention replaced by a plain copy of the
                                  released DiffAttention math: matmul, softmax, pairs, λ, RMSNorm, ×(1−λ_init)

    python benchmarks/diffclip_attention.py                  # ViT-B/16: 768 wide, 12 layers, 12 heads, 224 px
    python benchmarks/diffclip_attention.py --small          # a quick CPU check on a tiny tower
    python benchmarks/diffclip_attention.py --device cuda --dtype bfloat16 --batch-size 64
    python benchmarks/diffclip_attention.py --threads 1 --batch-size 1  # a shared CPU (times are CPU time)

Memory: on CUDA the peak allocated during forward+backward; on CPU (no allocator statistics) the bytes of
tensors saved for backward, i.e. the activation memory, which is what differs between the variants.
Writes benchmarks/results/diffclip_attention.json; ratios are against clip_sdpa.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from torch import nn
from transformers import CLIPVisionConfig, CLIPVisionModel

from hf_vrl.models.diffclip import DiffCLIPVisionConfig, DiffCLIPVisionModel
from hf_vrl.models.diffclip.modeling_diffclip import DiffCLIPAttention

RESULTS = Path(__file__).parent / "results" / "diffclip_attention.json"
BASELINE = "clip_sdpa"


class ReleasedDiffAttention(nn.Module):
    """The released DiffCLIP `DiffAttention` forward, written plainly; shares the weights of `source`."""

    def __init__(self, source: DiffCLIPAttention):
        super().__init__()
        self.source = source

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs):
        s = self.source
        batch, tokens, width = hidden_states.shape
        heads, head_dim = s.num_heads, s.head_dim
        q = s.q_proj(hidden_states).view(batch, tokens, heads, head_dim).transpose(1, 2) * head_dim**-0.5
        k = s.k_proj(hidden_states).view(batch, tokens, heads, head_dim).transpose(1, 2)
        v = s.v_proj(hidden_states).view(batch, tokens, heads // 2, 2 * head_dim).transpose(1, 2)
        attn = torch.softmax(q @ k.transpose(-1, -2), dim=-1).view(batch, heads // 2, 2, tokens, tokens)
        lambda_1 = torch.exp(torch.sum(s.lambda_q1 * s.lambda_k1, dim=-1).float()).type_as(q)
        lambda_2 = torch.exp(torch.sum(s.lambda_q2 * s.lambda_k2, dim=-1).float()).type_as(q)
        lambda_full = lambda_1 - lambda_2 + s.lambda_init
        out = (attn[:, :, 0] - lambda_full * attn[:, :, 1]) @ v
        normed = out.float() * torch.rsqrt(out.float().pow(2).mean(-1, keepdim=True) + s.diff_norm.eps)
        out = normed.type_as(out) * s.diff_norm.weight * (1 - s.lambda_init)
        return s.out_proj(out.transpose(1, 2).reshape(batch, tokens, width)), None


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo where available."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    return next(
        (line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), platform.machine()
    )


def tower_kwargs(args: argparse.Namespace) -> dict:
    if args.small:
        return {
            "hidden_size": 64,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "image_size": 64,
            "patch_size": 8,
        }
    return {
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": args.layers,
        "num_attention_heads": 12,
        "image_size": 224,
        "patch_size": 16,
    }


def build_variants(args: argparse.Namespace) -> dict[str, nn.Module]:
    kwargs = tower_kwargs(args)
    torch.manual_seed(0)
    clip_state = CLIPVisionModel(CLIPVisionConfig(**kwargs)).state_dict()
    diffclip_state = DiffCLIPVisionModel(DiffCLIPVisionConfig(**kwargs)).state_dict()
    variants = {}
    for implementation in ("sdpa", "eager"):
        for name, model_class, config_class, state in (
            ("clip", CLIPVisionModel, CLIPVisionConfig, clip_state),
            ("diffclip", DiffCLIPVisionModel, DiffCLIPVisionConfig, diffclip_state),
        ):
            model = model_class(config_class(**kwargs))
            model.load_state_dict(state)
            model.set_attn_implementation(implementation)
            variants[f"{name}_{implementation}"] = model
    official = DiffCLIPVisionModel(DiffCLIPVisionConfig(**kwargs))
    official.load_state_dict(diffclip_state)
    for layer in official.encoder.layers:
        layer.self_attn = ReleasedDiffAttention(layer.self_attn)
    variants["official_eager"] = official
    dtype = getattr(torch, args.dtype)
    return {name: model.to(args.device, dtype).train() for name, model in variants.items()}


def step(model: nn.Module, pixel_values: torch.Tensor) -> None:
    model.zero_grad(set_to_none=True)
    model(pixel_values=pixel_values).pooler_output.float().pow(2).mean().backward()


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def activation_bytes(model: nn.Module, pixel_values: torch.Tensor) -> int:
    """Bytes of the distinct storages autograd saves for backward during one forward."""
    storages = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(pixel_values=pixel_values).pooler_output.float().pow(2).mean().backward()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(size for pointer, size in storages.items() if pointer not in params)


def peak_cuda_bytes(model: nn.Module, pixel_values: torch.Tensor) -> int:
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step(model, pixel_values)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def run(args: argparse.Namespace) -> dict:
    variants = build_variants(args)
    kwargs = tower_kwargs(args)
    pixel_values = torch.randn(
        args.batch_size,
        3,
        kwargs["image_size"],
        kwargs["image_size"],
        device=args.device,
        dtype=getattr(torch, args.dtype),
    )
    with torch.no_grad():
        reference = variants["diffclip_eager"](pixel_values=pixel_values).pooler_output.float()
        agreement = {
            name: (variants[name](pixel_values=pixel_values).pooler_output.float() - reference)
            .abs()
            .max()
            .item()
            for name in ("diffclip_sdpa", "official_eager")
        }
    for model in variants.values():
        for _ in range(args.warmup):
            step(model, pixel_values)
    clock = time.process_time if args.timer == "cpu" else time.perf_counter
    times = {name: [] for name in variants}
    for _ in range(args.iterations):
        for name, model in variants.items():
            synchronize(args.device)
            start = clock()
            step(model, pixel_values)
            synchronize(args.device)
            times[name].append(clock() - start)
    memory_kind = "peak_allocated" if args.device.startswith("cuda") else "saved_activations"
    measure = peak_cuda_bytes if args.device.startswith("cuda") else activation_bytes
    memory = {name: measure(model, pixel_values) for name, model in variants.items()}
    best = {name: min(values) for name, values in times.items()}
    median = {name: statistics.median(values) for name, values in times.items()}
    return {
        "benchmark": "diffclip_attention",
        "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else cpu_name(),
        "threads": torch.get_num_threads(),
        "timer": "process CPU time" if args.timer == "cpu" else "wall clock",
        "dtype": args.dtype,
        "batch_size": args.batch_size,
        "iterations": args.iterations,
        "tower": kwargs,
        "torch": torch.__version__,
        "baseline": BASELINE,
        "max_abs_diff_vs_diffclip_eager": agreement,
        "time_ms": {name: round(1000 * value, 2) for name, value in best.items()},
        "time_ratio": {name: round(value / best[BASELINE], 3) for name, value in best.items()},
        "median_time_ms": {name: round(1000 * value, 2) for name, value in median.items()},
        "median_time_ratio": {name: round(value / median[BASELINE], 3) for name, value in median.items()},
        "memory_kind": memory_kind,
        "memory_mb": {name: round(value / 2**20, 1) for name, value in memory.items()},
        "memory_ratio": {name: round(value / memory[BASELINE], 3) for name, value in memory.items()},
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument(
        "--batch-size", type=int, default=None, help="default: 64 on CUDA, 2 on CPU, 8 with --small"
    )
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--layers", type=int, default=12, help="encoder depth of the ViT-B/16 tower")
    parser.add_argument("--small", action="store_true", help="a tiny tower, for a quick CPU check")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)"
    )
    parser.add_argument(
        "--timer",
        choices=["wall", "cpu"],
        default=None,
        help="wall clock, or this process's CPU time (robust when the CPU is shared); default wall on CUDA",
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.timer is None:
        args.timer = "wall" if args.device.startswith("cuda") else "cpu"
    if args.batch_size is None:
        args.batch_size = 8 if args.small else (64 if args.device.startswith("cuda") else 2)
    result = run(args)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(
        json.dumps(
            {k: result[k] for k in ("time_ms", "time_ratio", "memory_kind", "memory_mb", "memory_ratio")},
            indent=2,
        )
    )
    return result


if __name__ == "__main__":
    main()
