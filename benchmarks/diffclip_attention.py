"""DiffCLIP at the cost of CLIP: the full two-tower training step against transformers' CLIPModel, and the
differential-attention layer against timm's `DiffAttention`.

Step (`--part step`): forward + backward of the contrastive loss of both towers, same sizes (ViT-B/16 image
tower, CLIP's 12-layer 512-wide text tower, 77 padded tokens), same inputs; variants measured in the same run:
  clip              transformers CLIPModel                                        (the baseline)
  diffclip          hf_vrl DiffCLIPModel: two kernel calls per layer, fused tail, fused q/k/v
  diffclip_plain    the same model with the plain (unfused) differential tail
  open_clip         open_clip ViT-B-16, where open_clip is installed
each eager and, with `--compile`, `torch.compile`d (names suffixed `_compiled`; not the plain-tail variant).
Layer (`--part layer`): one attention layer, 768 wide, 12 heads (6 differential), 197 tokens, same weights:
  timm              timm's `timm.layers.diff_attention.DiffAttention` (the baseline)
  diffclip          hf_vrl DiffCLIPAttention (fused tail, fused q/k/v)
  diffclip_plain    the same with the plain tail

    python benchmarks/diffclip_attention.py                       # CPU: both parts, batch 2 / 8, eager
    python benchmarks/diffclip_attention.py --compile             # adds the torch.compile'd step variants
    python benchmarks/diffclip_attention.py --device cuda --dtype bfloat16 --batch-size 256 --compile

Rounds are interleaved; ratios use the fastest round of each variant (the least disturbed by other load),
medians are recorded too. Time: wall clock on CUDA, this process's CPU time on the CPU (robust on a shared
machine). Memory: on CUDA the peak allocated during forward+backward (eager and compiled); on the CPU, which
has no allocator statistics, the bytes of the tensors autograd saves for backward (eager variants only; a
compiled graph keeps its own). With `--dtype bfloat16` the step runs under autocast with float32 weights.
Writes benchmarks/results/diffclip_attention.json.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import platform
import statistics
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from transformers import CLIPConfig, CLIPModel

from hf_vrl.models.diffclip import DiffCLIPConfig, DiffCLIPModel, DiffCLIPVisionConfig
from hf_vrl.models.diffclip.modeling_diffclip import DiffCLIPAttention

RESULTS = Path(__file__).parent / "results" / "diffclip_attention.json"
VISION = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12}
VISION |= {"image_size": 224, "patch_size": 16}
TEXT = {"hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 8}
TEXT |= {"max_position_embeddings": 77}


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo where available."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    return next(
        (line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), platform.machine()
    )


def set_fused_tail(model: nn.Module, fused: bool) -> nn.Module:
    for module in model.modules():
        if isinstance(module, DiffCLIPAttention):
            module.fused_tail = fused
    return model


def open_clip_model() -> nn.Module | None:
    """open_clip's ViT-B-16 (random weights), or None where open_clip cannot be imported."""
    try:
        import open_clip
    except Exception:  # not installed, or its torchvision does not match this torch
        return None
    return open_clip.create_model("ViT-B-16")


def step_batch(batch_size: int, device: str) -> dict[str, torch.Tensor]:
    """Images and captions padded to 77 tokens (lengths from 12 up), EOS (49407) at each caption's end."""
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(1, 49406, (batch_size, 77), generator=generator)
    attention_mask = torch.zeros_like(input_ids)
    for row in range(batch_size):
        length = 12 + (row * 23) % 60
        input_ids[row, 0], input_ids[row, length - 1], input_ids[row, length:] = 49406, 49407, 0
        attention_mask[row, :length] = 1
    pixel_values = torch.randn(batch_size, 3, 224, 224, generator=generator)
    return {
        "input_ids": input_ids.to(device),
        "attention_mask": attention_mask.to(device),
        "pixel_values": pixel_values.to(device),
    }


def step_variants(args: argparse.Namespace) -> dict[str, tuple[nn.Module, Callable]]:
    """name -> (model, loss function of a batch)."""
    kwargs = {"text_config": TEXT, "vision_config": VISION, "projection_dim": 512}
    torch.manual_seed(0)
    models = {"clip": CLIPModel(CLIPConfig(**kwargs)), "diffclip": DiffCLIPModel(DiffCLIPConfig(**kwargs))}
    models["diffclip_plain"] = set_fused_tail(DiffCLIPModel(DiffCLIPConfig(**kwargs)), False)
    models["diffclip_plain"].load_state_dict(models["diffclip"].state_dict())
    for name in ("clip", "diffclip", "diffclip_plain"):
        models[name].set_attn_implementation("sdpa")
    losses = dict.fromkeys(models, lambda model, batch: model(**batch, return_loss=True).loss)
    if (open_clip := open_clip_model()) is not None:
        from open_clip.loss import ClipLoss

        loss = ClipLoss()
        models["open_clip"] = open_clip
        losses["open_clip"] = lambda model, batch: loss(
            *model(batch["pixel_values"], batch["input_ids"])[:2], model.logit_scale.exp()
        )
    variants = {name: (model.to(args.device).train(), losses[name]) for name, model in models.items()}
    if args.compile:
        for name in [name for name in variants if name != "diffclip_plain"]:
            model, loss = variants[name]
            variants[f"{name}_compiled"] = (torch.compile(model), loss)
    return variants


def timm_diff_attention() -> type | None:
    """timm's `DiffAttention` class, imported from its layer file without running `timm/__init__` (which
    needs torchvision); None where timm is not installed."""
    spec = importlib.util.find_spec("timm")
    if spec is None:
        return None
    root = spec.submodule_search_locations[0]
    for package, folder in (("timm", root), ("timm.layers", f"{root}/layers")):
        if package not in sys.modules:
            module = types.ModuleType(package)
            module.__path__ = [folder]
            sys.modules[package] = module
    return importlib.import_module("timm.layers.diff_attention").DiffAttention


def layer_variants(args: argparse.Namespace) -> dict[str, tuple[nn.Module, Callable]]:
    """name -> (attention layer, loss of a batch); the timm layer carries the DiffCLIP layer's weights."""
    config = DiffCLIPVisionConfig(**VISION)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    ours = DiffCLIPAttention(config)
    with torch.no_grad():
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            getattr(ours, name).normal_(0, 0.1)
    plain = set_fused_tail(DiffCLIPAttention(config), False)
    plain.load_state_dict(ours.state_dict())
    variants = {"diffclip": ours, "diffclip_plain": plain}
    diff_attention = timm_diff_attention()
    if diff_attention is not None:
        timm = diff_attention(config.hidden_size, num_heads=config.num_attention_heads // 2, qkv_bias=True)
        timm.lambda_init = ours.lambda_init
        with torch.no_grad():
            timm.qkv.weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
            timm.qkv.bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
            timm.proj.load_state_dict(ours.out_proj.state_dict())
            timm.sub_norm.weight.copy_(ours.diff_norm.weight)
            for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
                getattr(timm, name).copy_(getattr(ours, name))
        variants = {"timm": timm, **variants}

    def loss(layer: nn.Module, batch: dict) -> torch.Tensor:
        output = layer(batch["hidden_states"])
        return (output[0] if isinstance(output, tuple) else output).float().pow(2).mean()

    return {name: (layer.to(args.device).train(), loss) for name, layer in variants.items()}


def layer_batch(batch_size: int, device: str) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(batch_size, 197, VISION["hidden_size"], generator=generator)
    return {"hidden_states": hidden.to(device)}


def autocast(args: argparse.Namespace):
    if args.dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=args.device.split(":")[0], dtype=getattr(torch, args.dtype))


def run_step(model: nn.Module, loss: Callable, batch: dict, args: argparse.Namespace) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    with autocast(args):
        value = loss(model, batch)
    value.backward()
    return value.detach()


def saved_bytes(model: nn.Module, loss: Callable, batch: dict, args: argparse.Namespace) -> int:
    """Bytes of the distinct storages autograd saves for backward during one forward (parameters excluded)."""
    storages = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run_step(model, loss, batch, args)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(size for pointer, size in storages.items() if pointer not in params)


def peak_cuda_bytes(model: nn.Module, loss: Callable, batch: dict, args: argparse.Namespace) -> int:
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    run_step(model, loss, batch, args)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def measure(variants: dict, batch: dict, baseline: str, args: argparse.Namespace) -> dict:
    cuda = args.device.startswith("cuda")
    losses = {name: run_step(model, loss, batch, args).item() for name, (model, loss) in variants.items()}
    for _ in range(args.warmup):
        for model, loss in variants.values():
            run_step(model, loss, batch, args)
    clock = time.perf_counter if cuda else time.process_time
    times = {name: [] for name in variants}
    for _ in range(args.iterations):
        for name, (model, loss) in variants.items():
            if cuda:
                torch.cuda.synchronize()
            start = clock()
            run_step(model, loss, batch, args)
            if cuda:
                torch.cuda.synchronize()
            times[name].append(clock() - start)
    if cuda:
        memory = {name: peak_cuda_bytes(model, loss, batch, args) for name, (model, loss) in variants.items()}
    else:
        memory = {
            name: saved_bytes(model, loss, batch, args)
            for name, (model, loss) in variants.items()
            if not name.endswith("_compiled")
        }
    best = {name: min(values) for name, values in times.items()}
    median = {name: statistics.median(values) for name, values in times.items()}

    def ratios(values: dict, base: str) -> dict:
        return {name: round(value / values[base], 3) for name, value in values.items()}

    result = {
        "baseline": baseline,
        "batch_size": next(iter(batch.values())).shape[0],
        "loss": {name: round(value, 5) for name, value in losses.items()},
        "time_ms": {name: round(1000 * value, 2) for name, value in best.items()},
        "time_ratio": ratios(best, baseline),
        "median_time_ms": {name: round(1000 * value, 2) for name, value in median.items()},
        "median_time_ratio": ratios(median, baseline),
        "memory_kind": "peak_allocated" if cuda else "saved_activations",
        "memory_mb": {name: round(value / 2**20, 1) for name, value in memory.items()},
        "memory_ratio": ratios(memory, baseline),
    }
    if f"{baseline}_compiled" in best:
        compiled = {name: value for name, value in best.items() if name.endswith("_compiled")}
        result["compiled_time_ratio"] = ratios(compiled, f"{baseline}_compiled")
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--part", choices=["step", "layer", "both"], default="both")
    parser.add_argument("--batch-size", type=int, default=None, help="step batch; default 256 CUDA, 2 CPU")
    parser.add_argument("--layer-batch-size", type=int, default=None, help="default 256 CUDA, 8 CPU")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--compile", action="store_true", help="also time torch.compile'd step variants")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    cuda = args.device.startswith("cuda")
    step_size = args.batch_size or (256 if cuda else 2)
    layer_size = args.layer_batch_size or (256 if cuda else 8)
    result = {
        "benchmark": "diffclip_attention",
        "device": args.device,
        "device_name": torch.cuda.get_device_name() if cuda else cpu_name(),
        "threads": torch.get_num_threads(),
        "timer": "wall clock" if cuda else "process CPU time",
        "dtype": args.dtype,
        "iterations": args.iterations,
        "torch": torch.__version__,
    }
    if args.part in ("step", "both"):
        variants = step_variants(args)
        result["step"] = measure(variants, step_batch(step_size, args.device), "clip", args)
        result["step"]["open_clip"] = "measured" if "open_clip" in variants else "not importable here"
        del variants
    if args.part in ("layer", "both"):
        variants = layer_variants(args)
        batch = layer_batch(layer_size, args.device)
        with torch.no_grad(), autocast(args):
            outputs = {name: layer(batch["hidden_states"]) for name, (layer, _) in variants.items()}
        outputs = {name: (out[0] if isinstance(out, tuple) else out).float() for name, out in outputs.items()}
        baseline = "timm" if "timm" in variants else "diffclip_plain"
        result["layer"] = measure(variants, batch, baseline, args)
        result["layer"]["max_abs_diff_vs_baseline"] = {
            name: (out - outputs[baseline]).abs().max().item() for name, out in outputs.items()
        }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
