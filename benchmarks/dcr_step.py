"""Time and memory of one DCR training step: the batched B^2 grid against Algorithm 1's per-anchor loop.

Variants, measured in the same run on the same weights and the same random draws (interleaved rounds; ratios
use the fastest round of each variant, the least disturbed by other load; medians are recorded too):
  algorithm1_loop     the baseline: for each anchor i, one UNet call on x_t^i with [c_1..c_B, c_i^+]
                      (B+1 passes), Eq. 12 for that row, then the mean (Algorithm 1, lines 4-20)
  batched             hf_vrl's DCRTask: all B^2+B (latent, condition) pairs in one UNet call
  batched_chunked     the same grid in UNet calls of `--chunk-size` pairs
  chunked_recompute   chunked, each chunk recomputed in backward (`gradient_checkpointing="chunks"`)
Every variant must give the same loss (checked, `losses_match`).

    python benchmarks/dcr_step.py                  # tiny CLIP + tiny UNet on the CPU (a quick check)
    python benchmarks/dcr_step.py --real           # ViT-L/14 @224 + the SD-2.1-base UNet/VAE architectures
                                                   # (random weights), batch 16, bf16 UNet, on the GPU

Stage 2 (LoRA on the encoder) by default, the heavier stage; `--stage projector` for stage 1.
Memory: on CUDA the peak allocated during forward+backward; on CPU (no allocator statistics) the bytes of the
tensors saved for backward (the activation memory, which is what differs between variants).
Writes benchmarks/results/dcr_step.json; ratios are against algorithm1_loop.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from hf_vrl.methods.dcr.diffusion import FrozenDiffusion, load_diffusion, sd_ddpm_scheduler, tiny_diffusion
from hf_vrl.methods.dcr.loss import dcr_loss
from hf_vrl.methods.dcr.task import DCRTask, DCRTaskConfig
from hf_vrl.methods.dcr.toy import tiny_clip
from hf_vrl.methods.dcr.trainer import LoraSettings, prepare_stage
from hf_vrl.models.dcr import DCRModel

RESULTS = Path(__file__).parent / "results" / "dcr_step.json"
BASELINE = "algorithm1_loop"

# SD-2.1-base (stabilityai/stable-diffusion-2-1-base unet/ and vae/ configs) and OpenAI ViT-L/14 @224
SD21_UNET = dict(
    sample_size=64,
    in_channels=4,
    out_channels=4,
    down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
    block_out_channels=(320, 640, 1280, 1280),
    layers_per_block=2,
    attention_head_dim=(5, 10, 20, 20),
    cross_attention_dim=1024,
    use_linear_projection=True,
)
SD21_VAE = dict(
    in_channels=3,
    out_channels=3,
    down_block_types=("DownEncoderBlock2D",) * 4,
    up_block_types=("UpDecoderBlock2D",) * 4,
    block_out_channels=(128, 256, 512, 512),
    layers_per_block=2,
    latent_channels=4,
    sample_size=512,
)
VIT_L14 = dict(
    hidden_size=1024,
    intermediate_size=4096,
    num_hidden_layers=24,
    num_attention_heads=16,
    patch_size=14,
    image_size=224,
    projection_dim=768,
)


def build_real(device: str) -> tuple[DCRModel, FrozenDiffusion]:
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    tower = CLIPVisionModelWithProjection(CLIPVisionConfig(**VIT_L14))
    model = DCRModel.from_clip(tower, condition_dim=1024, num_condition_tokens=77)
    null = torch.randn(1, 77, 1024)
    diffusion = FrozenDiffusion(
        UNet2DConditionModel(**SD21_UNET),
        AutoencoderKL(**SD21_VAE),
        sd_ddpm_scheduler(),
        null,
        torch.bfloat16,
    )
    return model.to(device), diffusion.to(device)


def build_tiny(device: str, image_size: int) -> tuple[DCRModel, FrozenDiffusion]:
    folder = tiny_diffusion(tempfile.mkdtemp(), image_size=image_size, text_context_length=8)
    model = DCRModel.from_clip(tiny_clip(image_size=image_size), condition_dim=16, num_condition_tokens=8)
    return model.to(device), load_diffusion(folder, dtype="float32", device=device)


def algorithm1_loss(task: DCRTask, pixel_values: torch.Tensor) -> torch.Tensor:
    """Algorithm 1, lines 4-20: one UNet call per anchor on x_t^i with [c_1..c_B, c_i^+], Eq. 12 per row."""
    step = task.prepare_step(pixel_values)
    batch = len(step.noisy)
    conditions, positives = step.conditions[:batch], step.conditions[batch:]
    losses = []
    for i in range(batch):
        noisy = step.noisy[i : i + 1].expand(batch + 1, *step.noisy.shape[1:])
        timesteps = step.timesteps[i : i + 1].expand(batch + 1)
        pred = task.diffusion.predict(noisy, timesteps, torch.cat([conditions, positives[i : i + 1]]))
        row = dcr_loss(pred[None, :batch], pred[batch:], step.target[i : i + 1], task.config.temperature, i)
        losses.append(row)
    return torch.stack(losses).mean()


def make_variants(task: DCRTask, chunk: int) -> dict:
    """Each variant sets the task's chunking/recompute settings itself (they share one task)."""

    def batched(chunk_size, recompute):
        def run(pixel_values):
            task.config.unet_chunk_size = chunk_size
            task.diffusion.gradient_checkpointing = "chunks" if recompute else "none"
            return task(pixel_values)["loss"]

        return run

    def loop(pixel_values):
        task.diffusion.gradient_checkpointing = "none"
        return algorithm1_loss(task, pixel_values)

    return {
        BASELINE: loop,
        "batched": batched(None, False),
        "batched_chunked": batched(chunk, False),
        "chunked_recompute": batched(chunk, True),
    }


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed_step(fn, model, pixel_values, device: str, seed: int) -> tuple[float, float]:
    """(seconds, loss) of forward + backward from a fixed RNG state."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    synchronize(device)
    start = time.perf_counter()
    loss = fn(pixel_values)
    loss.backward()
    synchronize(device)
    return time.perf_counter() - start, loss.item()


def memory_bytes(fn, model, pixel_values, device: str, seed: int) -> int:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn(pixel_values).backward()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    seen: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = fn(pixel_values)
    loss.backward()
    return sum(seen.values())


def run(args: argparse.Namespace) -> dict:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    if args.real:
        model, diffusion = build_real(device)
    else:
        model, diffusion = build_tiny(device, args.image_size)
    task = DCRTask(model, diffusion, DCRTaskConfig()).to(device).train()
    trainable = prepare_stage(model, args.stage, LoraSettings())
    trainable.train()
    size = model.config.vision_config.image_size
    pixel_values = torch.rand(args.batch_size, 3, size, size, device=device)
    chunk = args.chunk_size or args.batch_size + 1
    variants = make_variants(task, chunk)
    times: dict[str, list[float]] = {name: [] for name in variants}
    losses: dict[str, float] = {}
    for fn in variants.values():  # warm-up
        timed_step(fn, model, pixel_values, device, args.seed)
    for _ in range(args.rounds):
        for name, fn in variants.items():
            seconds, losses[name] = timed_step(fn, model, pixel_values, device, args.seed)
            times[name].append(seconds)
    memory = {name: memory_bytes(fn, model, pixel_values, device, args.seed) for name, fn in variants.items()}
    reference = losses[BASELINE]
    results = {
        name: {
            "seconds_min": min(times[name]),
            "seconds_median": statistics.median(times[name]),
            "memory_mb": memory[name] / 2**20,
            "loss": losses[name],
        }
        for name in variants
    }
    for r in results.values():
        r["speedup_vs_algorithm1"] = results[BASELINE]["seconds_min"] / r["seconds_min"]
        r["memory_vs_algorithm1"] = r["memory_mb"] / results[BASELINE]["memory_mb"]
    return {
        "setup": {
            "model": "ViT-L/14@224 + SD-2.1-base UNet/VAE (random weights, bf16 UNet/VAE)"
            if args.real
            else "tiny",
            "stage": args.stage,
            "batch_size": args.batch_size,
            "unet_passes_per_step": args.batch_size**2 + args.batch_size,
            "chunk_size": chunk,
            "rounds": args.rounds,
            "device": torch.cuda.get_device_name()
            if device.startswith("cuda")
            else platform.processor() or "cpu",
            "memory": "peak CUDA allocated" if device.startswith("cuda") else "bytes saved for backward",
            "torch": torch.__version__,
        },
        "losses_match": all(abs(v - reference) <= 1e-3 * max(1.0, abs(reference)) for v in losses.values()),
        "results": results,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--real", action="store_true", help="ViT-L/14@224 + SD-2.1-base sizes, batch 16 (GPU)"
    )
    parser.add_argument("--batch-size", type=int, default=None, help="images per step (tiny 4, real 16)")
    parser.add_argument("--chunk-size", type=int, default=None, help="UNet pairs per call (default B+1)")
    parser.add_argument("--image-size", type=int, default=16, help="tiny mode only")
    parser.add_argument("--stage", choices=("projector", "encoder"), default="encoder")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    args.batch_size = args.batch_size or (16 if args.real else 4)
    report = run(args)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    for name, r in report["results"].items():
        print(
            f"{name:<18} {r['seconds_min']:8.3f} s  x{r['speedup_vs_algorithm1']:5.2f} speed  "
            f"{r['memory_mb']:9.1f} MB  x{r['memory_vs_algorithm1']:5.2f} memory  loss {r['loss']:.5f}"
        )
    print(f"losses match: {report['losses_match']}; written to {args.output}")
    return report


if __name__ == "__main__":
    main()
