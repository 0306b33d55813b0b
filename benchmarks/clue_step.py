"""Time of one CLUE training step with and without the part and text terms, as ratios against the global term
alone (ReSA's soft-InfoNCE), measured in the same run.

Variants (same backbone and heads, same batch of two views; each model built only with what its terms need):
  global         Eq. 5 only: online and momentum branch on 2 views each, Sinkhorn targets (the baseline)
  global+part    + Eq. 6: the VLAD part extractor on both branches, the part-level soft-InfoNCE
  global+text    + Eq. 7: the text head and the alignment with (precomputed) description embeddings
  clue           Eq. 8: all three terms
A step is what CLUETrainer does per batch without data loading: both forward passes, the loss, backward, the
SGD update and the momentum update. Rounds are interleaved (the variants see the same load); ratios use the
fastest round of each variant, medians are recorded too. On the CPU the ratios use the process's CPU time
(`time.process_time`), which other processes on a shared machine disturb far less than the wall clock (both
are recorded); on CUDA the wall clock after synchronising.

    python benchmarks/clue_step.py                       # ResNet-18 backbone, 64 px, batch 32 (a CPU check)
    python benchmarks/clue_step.py --backbone resnet-50 --image-size 224 --batch-size 64   # the paper's model

Writes benchmarks/results/clue_step.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from hf_vrl.methods.clue.loss import clue_objective
from hf_vrl.models.clue import CLUEConfig, CLUEModel

RESULTS = Path(__file__).parent / "results" / "clue_step.json"
BASELINE = "global"
BACKBONES = {
    "resnet-18": {"model_type": "resnet", "layer_type": "basic", "depths": [2, 2, 2, 2]}
    | {"hidden_sizes": [64, 128, 256, 512]},
    "resnet-50": {"model_type": "resnet"},  # transformers' ResNetConfig default is ResNet-50
}
TEXT_DIM = 512  # CLIP ViT-B text embeddings
VARIANTS = {  # name: (num_parts, text head, beta, gamma)
    "global": (0, False, 0.0, 0.0),
    "global+part": (3, False, 1.0, 0.0),
    "global+text": (0, True, 0.0, 1.0),
    "clue": (3, True, 1.0, 1.0),
}


def build(backbone: str, variant: str, device: str) -> tuple[CLUEModel, torch.optim.Optimizer]:
    num_parts, text, _, _ = VARIANTS[variant]
    torch.manual_seed(0)
    config = CLUEConfig(
        backbone_config=dict(BACKBONES[backbone]),
        num_parts=num_parts,
        text_embed_dim=TEXT_DIM if text else None,
    )
    model = CLUEModel(config).to(device).train()
    params = [p for p in model.parameters() if p.requires_grad]
    return model, torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=1e-5)


def step(
    model: CLUEModel, optimizer: torch.optim.Optimizer, views: torch.Tensor, text: torch.Tensor, variant: str
):
    _, _, beta, gamma = VARIANTS[variant]
    online = model(views)
    with torch.no_grad():
        momentum = model(views, momentum=True)
    loss = clue_objective(online, momentum, text_embeds=text, beta=beta, gamma=gamma, world_size=1, rank=0)[
        "loss"
    ]
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.update_momentum(0.999)
    return loss


def timed(model, optimizer, views, text, variant, device) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of one step."""
    if device == "cuda":
        torch.cuda.synchronize()
    start, cpu = time.perf_counter(), time.process_time()
    step(model, optimizer, views, text, variant)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, time.process_time() - cpu


def run(args: argparse.Namespace) -> dict:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    views = torch.randn(args.batch_size, 2, 3, args.image_size, args.image_size, generator=gen).to(device)
    text = torch.nn.functional.normalize(torch.randn(args.batch_size, TEXT_DIM, generator=gen), dim=-1).to(
        device
    )
    models = {name: build(args.backbone, name, device) for name in VARIANTS}
    for name, (model, optimizer) in models.items():  # warm-up
        step(model, optimizer, views, text, name)
    wall: dict[str, list[float]] = {name: [] for name in VARIANTS}
    cpu: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(args.rounds):
        for name, (model, optimizer) in models.items():
            seconds, cpu_seconds = timed(model, optimizer, views, text, name, device)
            wall[name].append(seconds)
            cpu[name].append(cpu_seconds)
    clock = wall if device == "cuda" else cpu
    results = {
        name: {
            "seconds_min": min(wall[name]),
            "seconds_median": statistics.median(wall[name]),
            "cpu_seconds_min": min(cpu[name]),
            "cpu_seconds_median": statistics.median(cpu[name]),
            "ratio_vs_global": min(clock[name]) / min(clock[BASELINE]),
            "trainable_parameters": sum(p.numel() for p in models[name][0].parameters() if p.requires_grad),
        }
        for name in VARIANTS
    }
    return {
        "setup": {
            "backbone": args.backbone,
            "image_size": args.image_size,
            "batch_size": args.batch_size,
            "views": 2,
            "rounds": args.rounds,
            "threads": args.threads,
            "ratio_clock": "wall" if device == "cuda" else "process CPU time",
            "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
            "torch": torch.__version__,
        },
        "results": results,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backbone", choices=sorted(BACKBONES), default="resnet-18")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default=None)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    report = run(args)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    for name, result in report["results"].items():
        wall, cpu = 1000 * result["seconds_min"], 1000 * result["cpu_seconds_min"]
        print(f"{name:12s} {wall:9.1f} ms wall {cpu:9.1f} ms CPU  x{result['ratio_vs_global']:.2f} vs global")
    return report


if __name__ == "__main__":
    main()
