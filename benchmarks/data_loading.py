"""Data loading, in one run on the same shards:

1. Readers, per process (one process, no loader workers): images per CPU second of the process delivered as
   (RGB image, caption) from the same CC3M-like webdataset shards (JPEGs with a 512 px shortest edge, as
   pixparse/cc3m-wds stores them) by hf_vrl's streamed run path (`webdataset:<folder>` as `hf-vrl train`
   loads it: shuffle buffer, JPEGs decoded at reduced scale for the model's 224 px), the same without the
   reduced decode, hf_vrl's Hub path (`hf:<repo>` from a local Hub-cache copy, offline, as `hf-vrl train`
   loads it), `datasets`' webdataset streaming, and the `webdataset` library (the baseline: ratios are
   against it). Best of `--rounds` interleaved rounds (CPU time: the machine may be shared).
2. Preprocessing: images/s through decode + preprocessing from local webdataset shards: hf_vrl's pipeline
   (streaming `load_image_text` + `ImageTextCollator` in a DataLoader) against a plain PIL loop (open each
   member, convert, resize, center crop, normalise with numpy).

    python benchmarks/data_loading.py --parts readers   # about a minute: 1,000 JPEGs, 3 rounds
    python benchmarks/data_loading.py              # and preprocessing: 2,000 JPEGs at 256 px
    python benchmarks/data_loading.py --n 200 --reader-n 200 --rounds 1   # quick check

Writes benchmarks/results/data_loading_readers.json and data_loading.json (`--parts` runs one of them; the
readers need the `webdataset` library: pip install webdataset, in the dev extra).
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

import datasets
import numpy as np
import torch
import webdataset as wds
from huggingface_hub import constants
from PIL import Image

from hf_vrl.data.collate import ImageTextCollator
from hf_vrl.data.registry import load_dataset_by_name
from hf_vrl.data.tokenizer import TOY_TOKENIZER_DIR, load_toy_tokenizer
from hf_vrl.data.toy import render_scene, sample_scene
from hf_vrl.data.webdataset import load_image_text

RESULTS = Path(__file__).parent / "results" / "data_loading.json"
CLIP_MEAN = np.array([0.48145466, 0.4578275, 0.40821073], dtype=np.float32)
CLIP_STD = np.array([0.26862954, 0.26130258, 0.27577711], dtype=np.float32)


def write_shards(
    folder: Path, n: int, size: int, n_shards: int, seed: int = 0, name: str = "bench-{:05d}.tar"
) -> list[str]:
    """`n` JPEG samples (a shapes scene over a colour gradient with noise) + captions in `n_shards` tars."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] / size
    paths = [str(folder / name.format(s)) for s in range(n_shards)]
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


# -- readers --------------------------------------------------------------------------------------------

HUB_REPO = "bench/cc3m-like"
RUN_OPTIONS = {"shuffle_buffer": 10_000, "decode_size": 224}  # as `hf-vrl train` loads at 224 px


def webdataset_library(paths: list[str]) -> int:
    """The baseline: webdataset's own pipeline, decoded to RGB PIL images and caption strings."""
    dataset = wds.WebDataset(paths, shardshuffle=False, empty_check=False).decode("pilrgb")
    return sum(1 for _image, _caption in dataset.to_tuple("jpg", "txt"))


def datasets_webdataset(paths: list[str]) -> int:
    """`datasets`' webdataset builder, streaming; images converted to RGB as the others give them."""
    stream = datasets.load_dataset("webdataset", data_files={"train": paths}, split="train", streaming=True)
    return sum(1 for row in stream if row["jpg"].convert("RGB") and row["txt"])


def hf_vrl_run_path(name: str, options: dict) -> int:
    """A registry name read as `hf-vrl train` reads its training data (split train, `options`)."""
    return sum(1 for _row in load_dataset_by_name(name, "train", stream_options=options))


def hub_copy(cache: Path, paths: list[str]) -> None:
    """The shards as a dataset repo in the Hub cache `cache` (read offline, as a downloaded repo is)."""
    repo = cache / f"datasets--{HUB_REPO.replace('/', '--')}"
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    for path in paths:
        os.link(path, snapshot / Path(path).name)


def cpu_timed(read) -> tuple[int, float, float]:
    """(count, CPU seconds of this process, wall seconds) of one read: CPU time is what a reader costs a
    process whatever else the (shared) machine runs."""
    cpu, wall = time.process_time(), time.perf_counter()
    count = read()
    return count, time.process_time() - cpu, time.perf_counter() - wall


def measure_readers(folder: Path, paths: list[str], rounds: int) -> dict:
    """Images per CPU second of each reader on the same shards, best of `rounds` interleaved rounds; ratio
    against the webdataset library."""
    readers = {
        "webdataset_library": lambda: webdataset_library(paths),
        "hf_vrl_stream_run_path": lambda: hf_vrl_run_path(f"webdataset:{folder}", RUN_OPTIONS),
        "hf_vrl_stream_full_decode": lambda: hf_vrl_run_path(f"webdataset:{folder}", {}),
        "hf_vrl_hub_run_path": lambda: hf_vrl_run_path(f"hf:{HUB_REPO}", RUN_OPTIONS),
        "datasets_webdataset": lambda: datasets_webdataset(paths),
    }
    best: dict[str, tuple[int, float, float]] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for read in readers.values():  # warm the page cache, PIL and each reader's imports
            read()
        for _ in range(rounds):
            for name, read in readers.items():
                measured = cpu_timed(read)
                if name not in best or measured[1] < best[name][1]:
                    best[name] = measured
    base = best["webdataset_library"][0] / best["webdataset_library"][1]
    return {
        name: {"images": count, "cpu_seconds": round(cpu, 3), "wall_seconds": round(wall, 3),
               "images_per_cpu_s": round(count / cpu, 1),
               "ratio_vs_webdataset_library": round(count / cpu / base, 3)}
        for name, (count, cpu, wall) in best.items()
    }  # fmt: skip


def readers_report(args: argparse.Namespace, tmp: Path) -> dict:
    """The readers part: CC3M-like shards, a Hub-cache copy of them, each reader measured."""
    shards = tmp / "cc3m-like"
    shards.mkdir()
    name = "cc3m-like-train-{:04d}.tar"
    paths = write_shards(shards, args.reader_n, args.reader_stored_size, 4, seed=1, name=name)
    constants.HF_HUB_CACHE, constants.HF_HUB_OFFLINE = str(tmp / "hub"), True
    hub_copy(tmp / "hub", paths)
    results = measure_readers(shards, paths, args.rounds)
    for reader, row in results.items():
        rate, ratio = row["images_per_cpu_s"], row["ratio_vs_webdataset_library"]
        print(
            f"readers  {reader:28s} {rate:9.1f} images/CPU s   ratio {ratio:.2f} (vs the webdataset library)"
        )
    return {
        "benchmark": "data_loading_readers",
        "n": args.reader_n,
        "stored_shortest_edge": args.reader_stored_size,
        "shards": 4,
        "rounds": args.rounds,
        "cpu_count": os.cpu_count(),
        "load_average_1min": round(os.getloadavg()[0], 2),
        "machine": platform.machine(),
        "webdataset": wds.__version__,
        "datasets": datasets.__version__,
        "notes": "one process, no loader workers, CPU time of the process (best of the rounds); each reader "
        "delivers (RGB PIL image, caption str) per sample; run path = the registry name as `hf-vrl train` "
        "loads it (split train, shuffle buffer 10000, JPEG decoded at reduced scale for 224 px input); full "
        "decode = the same without the reduced decode; hub = hf:<repo> from a local Hub-cache copy (offline, "
        "as after its download); baseline = the webdataset library's WebDataset(...).decode('pilrgb')",
        "results": results,
    }


def preprocessing_report(args: argparse.Namespace, tmp: Path) -> dict:
    """The preprocessing part: hf_vrl's pipeline against a plain PIL loop."""
    n_shards = max(1, args.workers) * 2
    paths = write_shards(tmp, args.n, args.stored_size, n_shards)
    results = {
        str(size): measure(paths, args.n, size, args.workers, args.batch_size) for size in args.image_sizes
    }
    for size, runs in results.items():
        for name, row in runs.items():
            rate, ratio = row["images_per_s"], row["ratio_vs_baseline"]
            print(f"{size:>4} px  {name:28s} {rate:9.1f} images/s   ratio {ratio:.2f}")
    return {
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


PARTS = {"readers": (readers_report, RESULTS.with_name("data_loading_readers.json")),
         "preprocessing": (preprocessing_report, RESULTS)}  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="+", choices=list(PARTS), default=list(PARTS), help="what to run")
    parser.add_argument("--n", type=int, default=2000, help="number of JPEGs to generate (default 2000)")
    parser.add_argument("--stored-size", type=int, default=256, help="side of the stored JPEGs (default 256)")
    parser.add_argument(
        "--image-sizes", type=int, nargs="+", default=[224, 32], help="model input sizes (default: 224 32)"
    )
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers for the parallel run")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--reader-n", type=int, default=1000, help="JPEGs the readers read (default 1000)")
    parser.add_argument("--reader-stored-size", type=int, default=512, help="their shortest edge (512)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the readers (best kept)")
    parser.add_argument("--output-dir", type=Path, default=RESULTS.parent)
    args = parser.parse_args(argv)

    reports = {}
    for part in args.parts:
        run, default = PARTS[part]
        with tempfile.TemporaryDirectory() as tmp:
            reports[part] = run(args, Path(tmp))
        output = args.output_dir / default.name
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(reports[part], indent=2) + "\n")
    return reports


if __name__ == "__main__":
    main()
