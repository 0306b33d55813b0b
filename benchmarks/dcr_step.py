"""Time, memory and FLOP rate of one DCR training step (B^2 + B UNet passes), before and after the speed-ups.

Variants, measured in the same run on the same weights and random draws (interleaved rounds; ratios use the
fastest round of each variant, the least disturbed by other load; medians are recorded too). All but the last
two run the UNet as before this benchmark's levers: under the step's autocast, keeping what autograd keeps.
  plain               the baseline ("before"): every (latent, condition) pair a whole UNet pass, one call
  prefix              the UNet prefix before the first cross-attention once per latent (`reuse_prefix`)
  plain_chunks        before: UNet calls of `--chunk-size` pairs, each recomputed whole in backward
  prefix_chunks       prefix reuse + whole-chunk recompute
  prefix_pointwise    prefix reuse + recompute of norms / activations / element-wise ops only
  prefix_selective    prefix reuse + recompute of those and the linear layers (conv, attention kept)
  prefix_auto         prefix reuse + selective recompute, chunk size from the free CUDA memory (CUDA only)
  own_dtype           prefix reuse, the UNet outside the step's autocast in its own dtype (unet_autocast off)
  lean                own_dtype + the lean UNet (`lean_activations`): the run's default
  lean_feedforward    lean + each GEGLU projection recomputed (`gradient_checkpointing="feedforward"`)
  *_compiled          the same with `compile_unet` (`--compile`)
  algorithm1_loop     Algorithm 1's per-anchor loop, one UNet call per anchor (`--loop`)
Every variant must give the same loss (checked, `losses_match`).

    python benchmarks/dcr_step.py                  # a mid-size CLIP + SD-style UNet on the CPU
    python benchmarks/dcr_step.py --real --compile --tf32 --autocast
                                                   # ViT-L/14 @224 + the SD-2.1-base UNet/VAE architectures
                                                   # (random weights), batch 16, bf16 UNet, on the GPU
    python benchmarks/dcr_step.py --real-unet-flops
                                                   # the FLOPs of the real step's UNet grid per variant,
                                                   # counted on the meta device (no GPU, no compute)
    python benchmarks/dcr_step.py --real-unet-memory
                                                   # what one real UNet pass keeps for backward, per
                                                   # precision / lean setting, on the CPU (a few minutes)
    python benchmarks/dcr_step.py --memory-settings
                                                   # the run's default step against each memory setting a
                                                   # preset may choose (UNet chunks, feed-forward or whole-
                                                   # chunk recompute, tower gradient checkpointing), alone
                                                   # and as the presets combine them: time and peak memory
                                                   # at the same batch, in one run (dcr_step_memory.json)

Stage 2 (LoRA on the encoder) by default, the heavier stage; `--stage projector` for stage 1.
Memory: on CUDA the peak allocated during the step (absolute, weights included, and the step's own part); on
the CPU (no allocator statistics) the peak bytes of the tensors the step creates (`memory.LiveMemory`).
FLOPs: counted with `torch.utils.flop_counter.FlopCounterMode` on one eager step of each variant (recompute
included: `flops_executed`); `model_tflops_per_s` divides the plain step's count (the work a step needs) by
the variant's time. Compiled variants execute their eager twin's FLOPs. On the CPU the attention kernel has
no FLOP formula, so the CPU counts leave attention out. Writes benchmarks/results/dcr_step.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map_only
from torch.utils.flop_counter import FlopCounterMode

from hf_vrl.methods.dcr.diffusion import FrozenDiffusion, sd_ddpm_scheduler
from hf_vrl.methods.dcr.loss import dcr_loss
from hf_vrl.methods.dcr.memory import LiveMemory
from hf_vrl.methods.dcr.task import DCRTask, DCRTaskConfig
from hf_vrl.methods.dcr.trainer import LoraSettings, prepare_stage
from hf_vrl.models.dcr import DCRModel

RESULTS = Path(__file__).parent / "results" / "dcr_step.json"
BASELINE = "plain"

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
# The mid size: the same layouts, 1/10 of the UNet's widths, 112-px images (14 x 14 latents: like SD at 224
# px, not a multiple of 2^3, so the UNet passes its upsample sizes), a 4-layer ViT
MID_UNET = SD21_UNET | dict(block_out_channels=(32, 64, 128, 128), attention_head_dim=(2, 4, 8, 8))
MID_UNET |= dict(cross_attention_dim=128, norm_num_groups=16)
MID_VAE = SD21_VAE | dict(block_out_channels=(16, 32, 64, 64), norm_num_groups=8, layers_per_block=1)
MID_VIT = dict(
    hidden_size=128,
    intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=4,
    patch_size=16,
    image_size=112,
    projection_dim=128,
)


def build(real: bool, device: str, dtype: torch.dtype) -> tuple[DCRModel, dict]:
    """The encoder and the frozen parts (UNet, VAE, scheduler, empty-prompt embedding), random weights."""
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    vit, unet, vae = (VIT_L14, SD21_UNET, SD21_VAE) if real else (MID_VIT, MID_UNET, MID_VAE)
    width = unet["cross_attention_dim"]
    tower = CLIPVisionModelWithProjection(CLIPVisionConfig(**vit))
    model = DCRModel.from_clip(tower, condition_dim=width, num_condition_tokens=77).to(device)
    parts = dict(
        unet=UNet2DConditionModel(**unet).to(device, dtype),
        vae=AutoencoderKL(**vae).to(device, dtype),
        scheduler=sd_ddpm_scheduler(),
        null_text_embeds=torch.randn(1, 77, width, device=device),
        dtype=dtype,
    )
    return model, parts


# the UNet as before the precision and lean levers: under the step's autocast, keeping what autograd keeps
BEFORE = dict(unet_autocast=True, lean_activations=False)


def variant_settings(chunk: int, device: str, compile_unet: bool, loop: bool) -> dict[str, dict]:
    """name -> FrozenDiffusion settings and the task's unet_chunk_size."""
    variants = {
        "plain": dict(reuse_prefix=False, gradient_checkpointing="none", chunk=None),
        "prefix": dict(reuse_prefix=True, gradient_checkpointing="none", chunk=None),
        "plain_chunks": dict(reuse_prefix=False, gradient_checkpointing="chunks", chunk=chunk),
        "prefix_chunks": dict(reuse_prefix=True, gradient_checkpointing="chunks", chunk=chunk),
        "prefix_pointwise": dict(reuse_prefix=True, gradient_checkpointing="pointwise", chunk=chunk),
        "prefix_selective": dict(reuse_prefix=True, gradient_checkpointing="selective", chunk=chunk),
    }
    if device.startswith("cuda"):
        variants["prefix_auto"] = dict(reuse_prefix=True, gradient_checkpointing="selective", chunk="auto")
    variants = {name: BEFORE | settings for name, settings in variants.items()}
    variants["own_dtype"] = variants["prefix"] | dict(unet_autocast=False)
    variants["lean"] = variants["own_dtype"] | dict(lean_activations=True)
    variants["lean_feedforward"] = variants["lean"] | dict(gradient_checkpointing="feedforward")
    if compile_unet:
        for name in ("prefix", "prefix_selective", "lean"):
            variants[f"{name}_compiled"] = variants[name] | dict(compile_unet=True)
    if loop:
        variants["algorithm1_loop"] = BEFORE | dict(
            reuse_prefix=True, gradient_checkpointing="none", chunk=None
        )
    return variants


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


def make_step(task: DCRTask, loop: bool, autocast: bool, device: str):
    def step(pixel_values: torch.Tensor) -> torch.Tensor:
        context = (
            torch.autocast(device.split(":")[0], torch.bfloat16) if autocast else contextlib.nullcontext()
        )
        with context:
            loss = algorithm1_loss(task, pixel_values) if loop else task(pixel_values)["loss"]
        loss.backward()
        return loss

    return step


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(step, model, pixel_values, device: str, seed: int) -> tuple[float, float]:
    """(seconds, loss) of forward + backward from a fixed RNG state."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    synchronize(device)
    start = time.perf_counter()
    loss = step(pixel_values)
    synchronize(device)
    return time.perf_counter() - start, loss.item()


def memory(step, model, pixel_values, device: str, seed: int) -> dict[str, float]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    if device.startswith("cuda"):
        synchronize(device)
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        step(pixel_values)
        synchronize(device)
        peak = torch.cuda.max_memory_allocated()
        return {"peak_gb": peak / 2**30, "step_peak_gb": (peak - before) / 2**30}
    with LiveMemory() as live:
        step(pixel_values)
    return {"step_peak_gb": live.peak / 2**30}


def flops(step, model, pixel_values, seed: int) -> int:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    with FlopCounterMode(display=False) as counter:
        step(pixel_values)
    return counter.get_total_flops()


def run(args: argparse.Namespace) -> dict:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.tf32:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    dtype = torch.bfloat16 if args.real else torch.float32
    model, parts = build(args.real, device, dtype)
    trainable = prepare_stage(model, args.stage, LoraSettings())
    trainable.train()
    size = model.config.vision_config.image_size
    pixel_values = torch.rand(args.batch_size, 3, size, size, device=device)
    chunk = args.chunk_size or args.batch_size + 1
    steps, eager_twin = {}, {}
    for name, settings in variant_settings(chunk, device, args.compile, args.loop).items():
        settings = dict(settings)
        task_config = DCRTaskConfig(unet_chunk_size=settings.pop("chunk"))
        diffusion = FrozenDiffusion(**settings, **parts)
        task = DCRTask(model, diffusion, task_config).to(device).train()
        steps[name] = make_step(task, name == "algorithm1_loop", args.autocast, device)
        eager_twin[name] = name.removesuffix("_compiled")
    times: dict[str, list[float]] = {name: [] for name in steps}
    losses: dict[str, float] = {}
    for step in steps.values():  # warm-up (and compilation)
        timed(step, model, pixel_values, device, args.seed)
    for _ in range(args.rounds):
        for name, step in steps.items():
            seconds, losses[name] = timed(step, model, pixel_values, device, args.seed)
            times[name].append(seconds)
    mem = {name: memory(step, model, pixel_values, device, args.seed) for name, step in steps.items()}
    counted = {
        name: flops(step, model, pixel_values, args.seed)
        for name, step in steps.items()
        if eager_twin[name] == name
    }
    model_flops = counted[BASELINE]
    results = {}
    for name in steps:
        seconds = min(times[name])
        executed = counted[eager_twin[name]]
        results[name] = {
            "seconds_min": seconds,
            "seconds_median": statistics.median(times[name]),
            **mem[name],
            "tflop_executed": executed / 1e12,
            "tflops_per_s": executed / seconds / 1e12,
            "model_tflops_per_s": model_flops / seconds / 1e12,
            "loss": losses[name],
        }
    base = results[BASELINE]
    for r in results.values():
        r["speedup_vs_plain"] = base["seconds_min"] / r["seconds_min"]
        r["memory_vs_plain"] = r["step_peak_gb"] / base["step_peak_gb"]
    reference = losses[BASELINE]
    return {
        "setup": {
            "model": "ViT-L/14@224 + SD-2.1-base UNet/VAE (random weights, bf16 UNet/VAE)"
            if args.real
            else "mid: 4-layer 128-wide ViT/16 @112 + the SD-2.1 UNet/VAE layouts at 1/10 width (fp32)",
            "stage": args.stage,
            "batch_size": args.batch_size,
            "unet_passes_per_step": args.batch_size**2 + args.batch_size,
            "chunk_size": chunk,
            "rounds": args.rounds,
            "tf32_cudnn_benchmark": args.tf32,
            "autocast_bf16": args.autocast,
            "threads": torch.get_num_threads(),
            "device": torch.cuda.get_device_name()
            if device.startswith("cuda")
            else platform.processor() or "cpu",
            "memory": "peak CUDA allocated" if device.startswith("cuda") else "peak bytes of step tensors",
            "torch": torch.__version__,
        },
        "losses_match": all(abs(v - reference) <= 2e-3 * max(1.0, abs(reference)) for v in losses.values()),
        "results": results,
    }


# the run's defaults (the UNet outside autocast, lean, prefix reused) and the memory settings on top of them
DEFAULT = dict(reuse_prefix=True, gradient_checkpointing="none", unet_autocast=False, lean_activations=True)
MEMORY_VARIANTS = {
    "default": dict(chunk=None, tower=False),
    "unet_chunks": dict(chunk="size", tower=False),
    "feedforward": dict(gradient_checkpointing="feedforward", chunk=None, tower=False),
    "chunks_recompute": dict(gradient_checkpointing="chunks", chunk="size", tower=False),
    "tower_checkpointing": dict(chunk=None, tower=True),
    "tower_and_chunks_recompute": dict(gradient_checkpointing="chunks", chunk="size", tower=True),
}


def memory_settings(args: argparse.Namespace) -> dict:
    """Each memory setting a preset may choose against the run's default step, at the same batch and on the
    same weights and draws: seconds (fastest of the interleaved rounds, and the median) and peak memory."""
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    dtype = torch.bfloat16 if args.real else torch.float32
    model, parts = build(args.real, device, dtype)
    trainable = prepare_stage(model, "encoder", LoraSettings())
    trainable.train()
    size = model.config.vision_config.image_size
    pixel_values = torch.rand(args.batch_size, 3, size, size, device=device)
    passes = args.batch_size**2 + args.batch_size
    chunk = args.chunk_size or -(-passes // 4)  # a quarter of the grid a call
    steps = {}
    for name, variant in MEMORY_VARIANTS.items():
        settings = DEFAULT | {k: v for k, v in variant.items() if k not in ("chunk", "tower")}
        task_config = DCRTaskConfig(unet_chunk_size=chunk if variant["chunk"] else None)
        task = DCRTask(model, FrozenDiffusion(**settings, **parts), task_config).to(device).train()
        steps[name] = _with_tower_checkpointing(
            model, variant["tower"], make_step(task, False, args.autocast, device)
        )
    times: dict[str, list[float]] = {name: [] for name in steps}
    cpu: dict[str, list[float]] = {name: [] for name in steps}
    losses: dict[str, float] = {}
    for step in steps.values():  # warm-up
        timed(step, model, pixel_values, device, args.seed)
    for _ in range(args.rounds):
        for name, step in steps.items():
            started = time.process_time()
            seconds, losses[name] = timed(step, model, pixel_values, device, args.seed)
            times[name].append(seconds)
            cpu[name].append(time.process_time() - started)
    results = {
        name: {
            "settings": MEMORY_VARIANTS[name] | {"chunk_size": chunk},
            "seconds_min": min(times[name]),
            "seconds_median": statistics.median(times[name]),
            "cpu_seconds_min": min(cpu[name]),
            **memory(step, model, pixel_values, device, args.seed),
            "loss": losses[name],
        }
        for name, step in steps.items()
    }
    # on a shared CPU the process's CPU time is what other load disturbs least; on CUDA the wall clock
    timing = "seconds_min" if device.startswith("cuda") else "cpu_seconds_min"
    base = results["default"]
    for r in results.values():
        r["time_vs_default"] = r[timing] / base[timing]
        r["memory_vs_default"] = r["step_peak_gb"] / base["step_peak_gb"]
    reference = losses["default"]
    return {
        "setup": {
            "model": "ViT-L/14@224 + SD-2.1-base UNet/VAE (random weights, bf16 UNet/VAE)"
            if args.real
            else "mid: 4-layer 128-wide ViT/16 @112 + the SD-2.1 UNet/VAE layouts at 1/10 width (fp32)",
            "stage": "encoder (stage 2, LoRA)",
            "batch_size": args.batch_size,
            "unet_passes_per_step": passes,
            "chunk_size": chunk,
            "rounds": args.rounds,
            "autocast_bf16": args.autocast,
            "threads": torch.get_num_threads(),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
            "device": torch.cuda.get_device_name()
            if device.startswith("cuda")
            else platform.processor() or "cpu",
            "memory": "peak CUDA allocated" if device.startswith("cuda") else "peak bytes of step tensors",
            "time_ratios_from": timing,
            "torch": torch.__version__,
        },
        "losses_match": all(abs(v - reference) <= 2e-3 * max(1.0, abs(reference)) for v in losses.values()),
        "results": results,
    }


def _with_tower_checkpointing(model: DCRModel, enabled: bool, step):
    """`step` with the tower's gradient checkpointing on or off (the variants share one model)."""

    def wrapped(pixel_values: torch.Tensor) -> torch.Tensor:
        if enabled:
            model.activation_checkpointing_enable({"use_reentrant": False})
        else:
            model.activation_checkpointing_disable()
        return step(pixel_values)

    return wrapped


def real_unet_flops(batch_size: int) -> dict:
    """FLOPs of the B^2+B UNet passes of a real step (SD-2.1-base UNet at 28 x 28 latents, bf16), forward and
    forward + backward, per variant; counted on the meta device, where attention runs as matmuls."""
    from diffusers import AutoencoderKL, UNet2DConditionModel

    with torch.device("meta"):
        parts = dict(
            unet=UNet2DConditionModel(**SD21_UNET).to(torch.bfloat16),
            vae=AutoencoderKL(**SD21_VAE).to(torch.bfloat16),
            scheduler=sd_ddpm_scheduler(),
            null_text_embeds=torch.zeros(1, 77, 1024),
            dtype=torch.bfloat16,
        )
    rows = torch.arange(batch_size, device="meta")
    latent_index = torch.cat([rows.repeat_interleave(batch_size), rows])
    condition_index = torch.cat([rows.repeat(batch_size), rows + batch_size])
    noisy = torch.randn(batch_size, 4, 28, 28, device="meta")
    timesteps = torch.zeros(batch_size, dtype=torch.long, device="meta")
    report = {}
    for name, settings in variant_settings(batch_size + 1, "cpu", False, False).items():
        settings = dict(settings)
        chunk = settings.pop("chunk")
        diffusion = FrozenDiffusion(**settings, **parts).to("meta")
        conditions = torch.randn(2 * batch_size, 77, 1024, device="meta", requires_grad=True)
        with FlopCounterMode(display=False) as counter:
            out = diffusion.predict(noisy, timesteps, conditions, latent_index, condition_index, chunk)
            forward = counter.get_total_flops()
            out.sum().backward()
        report[name] = {
            "forward_tflop": forward / 1e12,
            "forward_backward_tflop": counter.get_total_flops() / 1e12,
        }
    base = report[BASELINE]["forward_backward_tflop"]
    for r in report.values():
        r["vs_plain"] = r["forward_backward_tflop"] / base
    return {
        "setup": {"batch_size": batch_size, "unet_passes": batch_size**2 + batch_size},
        "unet_grid": report,
    }


class CudaAutocastNorms(TorchFunctionMode):
    """On the CPU, CUDA autocast's policy for GroupNorm and LayerNorm (run in fp32 on fp32 copies of their
    inputs), which CPU autocast does not follow; active only while autocast is."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (F.group_norm, F.layer_norm) and torch.is_autocast_enabled("cpu"):
            args, kwargs = tree_map_only(torch.Tensor, lambda t: t.float(), (args, kwargs))
            with torch.autocast("cpu", enabled=False):
                return func(*args, **kwargs)
        return func(*args, **kwargs)


def real_unet_memory() -> dict:
    """Bytes one UNet pass of the real step keeps for backward (SD-2.1-base UNet at 28 x 28 latents, bf16,
    cross-attention on a [77, 1024] condition), x (B^2 + B) for batch 16; CPU with its flash-attention
    kernel (keeps what CUDA's keeps: q, k, v, output, log-sum-exp). `before`: the UNet under the step's bf16
    autocast with CUDA's fp32 norms; `own_dtype`: outside the autocast; `lean`: + `lean_activations`;
    `lean_feedforward`: + the GEGLU projections recomputed."""
    from diffusers import UNet2DConditionModel

    with torch.device("meta"):
        unet = UNet2DConditionModel(**SD21_UNET)
    unet = unet.to_empty(device="cpu").to(torch.bfloat16)
    generator = torch.Generator().manual_seed(0)
    for tensor in unet.parameters():  # random weights; only the shapes matter here
        tensor.data.normal_(0.0, 0.02, generator=generator)
    null = torch.zeros(1, 77, 1024)
    noisy, timesteps = torch.randn(1, 4, 28, 28, generator=generator), torch.tensor([500])
    passes = 16**2 + 16
    report = {}
    variants = {
        "before": BEFORE,
        "own_dtype": BEFORE | dict(unet_autocast=False),
        "lean": dict(unet_autocast=False, lean_activations=True),
        "lean_feedforward": dict(unet_autocast=False, gradient_checkpointing="feedforward"),
    }
    for name, settings in variants.items():
        diffusion = FrozenDiffusion(
            unet, torch.nn.Conv2d(1, 1, 1), sd_ddpm_scheduler(), null, torch.bfloat16, **settings
        )
        condition = torch.randn(1, 77, 1024, generator=generator, requires_grad=True)
        with torch.autocast("cpu", torch.bfloat16), CudaAutocastNorms(), LiveMemory() as live:
            out = diffusion.predict(noisy, timesteps, condition)
            kept = live.live - out.untyped_storage().nbytes()
        report[name] = {"kept_mb_per_pass": kept / 1e6, "kept_gib_per_step": kept * passes / 2**30}
    base = report["before"]["kept_mb_per_pass"]
    for r in report.values():
        r["vs_before"] = r["kept_mb_per_pass"] / base
    return {
        "setup": {"batch_size": 16, "unet_passes": passes, "torch": torch.__version__},
        "unet_pass": report,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--real", action="store_true", help="ViT-L/14@224 + SD-2.1-base sizes, batch 16 (GPU)"
    )
    parser.add_argument(
        "--real-unet-flops", action="store_true", help="count the real UNet grid's FLOPs on the meta device"
    )
    parser.add_argument(
        "--real-unet-memory", action="store_true", help="what one real UNet pass keeps, per setting (CPU)"
    )
    parser.add_argument(
        "--memory-settings", action="store_true", help="time and memory of each preset memory setting"
    )
    parser.add_argument("--batch-size", type=int, default=None, help="images per step (mid 8, real 16)")
    parser.add_argument("--chunk-size", type=int, default=None, help="UNet pairs per recomputed call (B+1)")
    parser.add_argument("--stage", choices=("projector", "encoder"), default="encoder")
    parser.add_argument("--compile", action="store_true", help="also the compile_unet variants")
    parser.add_argument("--loop", action="store_true", help="also Algorithm 1's per-anchor loop")
    parser.add_argument("--tf32", action="store_true", help="TF32 matmuls/convolutions and cudnn.benchmark")
    parser.add_argument("--autocast", action="store_true", help="bf16 autocast around the step (the encoder)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    args.batch_size = args.batch_size or (16 if args.real or args.real_unet_flops else 8)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.real_unet_flops:
        report = real_unet_flops(args.batch_size)
        output = args.output.with_name("dcr_step_real_unet_flops.json")
        output.write_text(json.dumps(report, indent=2) + "\n")
        for name, r in report["unet_grid"].items():
            print(f"{name:<18} {r['forward_backward_tflop']:7.2f} TFLOP  x{r['vs_plain']:5.3f}")
        print(f"written to {output}")
        return report
    if args.real_unet_memory:
        report = real_unet_memory()
        output = args.output.with_name("dcr_step_real_unet_memory.json")
        output.write_text(json.dumps(report, indent=2) + "\n")
        for name, r in report["unet_pass"].items():
            print(
                f"{name:<16} {r['kept_mb_per_pass']:7.1f} MB a pass  "
                f"{r['kept_gib_per_step']:6.2f} GiB a step  x{r['vs_before']:5.3f}"
            )
        print(f"written to {output}")
        return report
    if args.memory_settings:
        report = memory_settings(args)
        output = args.output.with_name("dcr_step_memory.json")
        output.write_text(json.dumps(report, indent=2) + "\n")
        for name, r in report["results"].items():
            print(
                f"{name:<28} {r['seconds_min']:8.3f} s  {r['cpu_seconds_min']:8.3f} s CPU  "
                f"x{r['time_vs_default']:5.2f} time  "
                f"{r['step_peak_gb'] * 1024:9.1f} MB  x{r['memory_vs_default']:5.2f} memory"
            )
        print(f"losses match: {report['losses_match']}; written to {output}")
        return report
    report = run(args)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    for name, r in report["results"].items():
        print(
            f"{name:<26} {r['seconds_min']:8.3f} s  x{r['speedup_vs_plain']:5.2f} speed  "
            f"{r['step_peak_gb'] * 1024:9.1f} MB  x{r['memory_vs_plain']:5.2f} memory  "
            f"{r['tflops_per_s'] * 1e3:8.1f} GFLOP/s  loss {r['loss']:.5f}"
        )
    print(f"losses match: {report['losses_match']}; written to {args.output}")
    return report


if __name__ == "__main__":
    main()
