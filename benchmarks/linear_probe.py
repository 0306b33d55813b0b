"""Seconds for `hf_vrl.metrics.linear_probe` (13 values of C on a validation split, then the refit) with its
fits on one thread (`threads=1`, the default) against the libraries' default threads (`threads=None`, the
baseline: scikit-learn's OpenMP and BLAS pools at one thread per core), both measured in the same run on the
same features.

    python benchmarks/linear_probe.py                 # 2,000 training samples of 64-d features, 10 classes
    python benchmarks/linear_probe.py --n 10000       # `hf-vrl eval`'s default probe size

Features are Gaussian class clusters shaped like a tiny CLIP's (64-d, 10 classes, overlapping). Writes
benchmarks/results/linear_probe.json; the ratio is baseline seconds over one-thread seconds (> 1: faster).
A run longer than --timeout seconds is stopped and recorded as at least that long.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).parent / "results" / "linear_probe.json"


def features(n: int, n_test: int, dim: int, n_classes: int, seed: int = 0):
    """(train_x, train_y, test_x, test_y): class means on a sphere of radius 2, unit Gaussian noise."""
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(n_classes, dim))
    means *= 2.0 / np.linalg.norm(means, axis=1, keepdims=True)

    def draw(count):
        y = rng.integers(n_classes, size=count)
        return means[y] + rng.normal(size=(count, dim)), y

    return (*draw(n), *draw(n_test))


def _probe(data, threads, queue) -> None:
    from hf_vrl.metrics import linear_probe

    start = time.perf_counter()
    result = linear_probe(*data, threads=threads)
    queue.put((time.perf_counter() - start, result["accuracy"], result["n_not_converged"]))


def timed_probe(data, threads: int | None, timeout: float) -> dict:
    """Seconds of one probe in a fresh process (so thread pools start alike), stopped after `timeout`."""
    queue = multiprocessing.get_context("spawn").Queue()
    process = multiprocessing.get_context("spawn").Process(target=_probe, args=(data, threads, queue))
    process.start()
    process.join(timeout)
    if process.is_alive():
        process.terminate()
        process.join()
        return {"seconds": None, "timed_out_after": timeout}
    seconds, accuracy, not_converged = queue.get()
    return {"seconds": round(seconds, 2), "accuracy": accuracy, "n_not_converged": not_converged}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="training samples")
    parser.add_argument("--n-test", type=int, default=2000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds before a run is stopped")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    data = features(args.n, args.n_test, args.dim, args.classes)
    runs = {
        "baseline_library_threads": timed_probe(data, None, args.timeout),
        "one_thread": timed_probe(data, 1, args.timeout),
    }
    base = runs["baseline_library_threads"]["seconds"] or args.timeout
    for run in runs.values():
        seconds = run["seconds"]
        run["ratio_vs_baseline"] = None if seconds is None else round(base / seconds, 2)
    report = {
        "benchmark": "linear_probe",
        "n_train": args.n,
        "n_test": args.n_test,
        "dim": args.dim,
        "classes": args.classes,
        "cpu_count": os.cpu_count(),
        "load_average_1min": round(os.getloadavg()[0], 2),
        "machine": platform.machine(),
        "notes": "ratio = baseline seconds / run seconds; a timed-out baseline counts as --timeout seconds, "
        "so its ratio is a lower bound",
        "results": runs,
    }
    for name, run in runs.items():
        shown = f"{run['seconds']:8.1f} s" if run["seconds"] is not None else f"> {args.timeout:.0f} s"
        print(f"{name:26s} {shown}   ratio {run['ratio_vs_baseline']}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
