"""Images/s through decode + preprocessing from local webdataset shards: hf_vrl's pipeline (streaming
`load_image_text` + `ImageTextCollator` in a DataLoader) against a plain PIL loop (open each member,
convert, resize, center crop, normalise with numpy), both measured in the same run.

    python benchmarks/data_loading.py              # 2,000 JPEGs at 256 px, CLIP preprocessing at 224 px
    python benchmarks/data_loading.py --n 200      # quick check

Writes benchmarks/results/data_loading.json. The ratio is pipeline images/s over baseline images/s.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import tarfile
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from hf_vrl.data.collate import ImageTextCollator
from hf_vrl.data.tokenizer import TOY_TOKENIZER_DIR, load_toy_tokenizer
from hf_vrl.data.toy import render_scene, sample_scene
from hf_vrl.data.webdataset import load_image_text

RESULTS = Path(__file__).parent / "results" / "data_loading.json"
CLIP_MEAN = np.array([0.48145466, 0.4578275, 0.40821073], dtype=np.float32)
CLIP_STD = np.array([0.26862954, 0.26130258, 0.27577711], dtype=np.float32)


def write_shards(folder: Path, n: int, size: int, n_shards: int, seed: int = 0) -> list[str]:
    """`n` JPEG samples (a shapes scene over a colour gradient with noise) + captions in `n_shards` tars."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] / size
    paths = [str(folder / f"bench-{s:05d}.tar") for s in range(n_shards)]
    tars = [tarfile.open(p, "w") for p in paths]
    for i in range(n):
        scene = sample_scene(rng)
        image = np.asarray(render_scene(scene, size)).astype(np.float32)
        tint = np.stack([xx, yy, 1 - xx], -1) * rng.uniform(40, 120, 3) + rng.normal(0, 6, (size, size, 3))
        pixels = np.clip(image * 0.7 + tint, 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
        for ext, data in (("jpg", buffer.getvalue()), ("txt", scene.caption().encode())):
            info = tarfile.TarInfo(f"{i:09d}.{ext}")
            info.size = len(data)
            tars[i % n_shards].addfile(info, io.BytesIO(data))
    for tar in tars:
        tar.close()
    return paths


def plain_pil_loop(paths: list[str], size: int) -> int:
    """Baseline: decode, convert, resize the shortest edge (bicubic), center crop, normalise."""
    count = 0
    for path in paths:
        with tarfile.open(path) as tar:
            for member in tar:
                if not member.name.endswith(".jpg"):
                    continue
                image = Image.open(io.BytesIO(tar.extractfile(member).read())).convert("RGB")
                scale = size / min(image.size)
                w, h = max(size, round(image.width * scale)), max(size, round(image.height * scale))
                image = image.resize((w, h), Image.BICUBIC)
                left, top = (w - size) // 2, (h - size) // 2
                array = np.asarray(image.crop((left, top, left + size, top + size)), dtype=np.float32) / 255.0
                _ = ((array - CLIP_MEAN) / CLIP_STD).transpose(2, 0, 1)
                count += 1
    return count


def pipeline(
    paths: list[str], collator: ImageTextCollator, workers: int, batch_size: int, decode_size
) -> int:
    ds = load_image_text(paths, decode_size=decode_size)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch_size, num_workers=workers, collate_fn=collator)
    return sum(batch["pixel_values"].shape[0] for batch in loader)


def timed(fn, *args) -> tuple[int, float]:
    start = time.perf_counter()
    count = fn(*args)
    return count, time.perf_counter() - start


def measure(paths: list[str], n: int, image_size: int, workers: int, batch_size: int) -> dict:
    """Images/s of the baseline and of the pipeline (0 / `workers` workers, with and without JPEG draft)."""
    from transformers import CLIPImageProcessor

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "CLIPImageProcessor requires torchvision": the PIL backend is used
        processor = CLIPImageProcessor(
            size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size}
        )
    collator = ImageTextCollator(processor, load_toy_tokenizer(TOY_TOKENIZER_DIR))
    plain_pil_loop(paths[:1], image_size)  # warm the page cache and PIL
    runs = {"baseline_plain_pil": timed(plain_pil_loop, paths, image_size)}
    for w in (0, workers):
        runs[f"pipeline_workers{w}"] = timed(pipeline, paths, collator, w, batch_size, None)
        runs[f"pipeline_workers{w}_draft"] = timed(pipeline, paths, collator, w, batch_size, image_size)
    base = n / runs["baseline_plain_pil"][1]
    return {
        name: {"images": count, "seconds": round(seconds, 3), "images_per_s": round(count / seconds, 1),
               "ratio_vs_baseline": round(count / seconds / base, 3)}
        for name, (count, seconds) in runs.items()
    }  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="number of JPEGs to generate (default 2000)")
    parser.add_argument("--stored-size", type=int, default=256, help="side of the stored JPEGs (default 256)")
    parser.add_argument(
        "--image-sizes", type=int, nargs="+", default=[224, 32], help="model input sizes (default: 224 32)"
    )
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers for the parallel run")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    n_shards = max(1, args.workers) * 2
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_shards(Path(tmp), args.n, args.stored_size, n_shards)
        results = {
            str(size): measure(paths, args.n, size, args.workers, args.batch_size)
            for size in args.image_sizes
        }
    report = {
        "benchmark": "data_loading",
        "n": args.n,
        "stored_size": args.stored_size,
        "batch_size": args.batch_size,
        "shards": n_shards,
        "cpu_count": os.cpu_count(),
        "load_average_1min": round(os.getloadavg()[0], 2),
        "machine": platform.machine(),
        "torch": torch.__version__,
        "notes": "results[image_size][run]. pipeline = streaming load_image_text + ImageTextCollator "
        "(CLIPImageProcessor, PIL backend, + tokenization); draft = JPEG decoded at reduced scale "
        "(decode_size=image_size); baseline = single-process PIL decode/convert/resize/crop + numpy "
        "normalise, images only, no draft",
        "results": results,
    }
    for size, runs in results.items():
        for name, row in runs.items():
            rate, ratio = row["images_per_s"], row["ratio_vs_baseline"]
            print(f"{size:>4} px  {name:28s} {rate:9.1f} images/s   ratio {ratio:.2f}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
