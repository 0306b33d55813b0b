"""The cluttered shapes world: where attention noise matters (DiffCLIP's claim in miniature).

Each image is a shapes-world scene (`hf_vrl.data.toy`: the target, its caption and labels unchanged) pasted
onto clutter: a textured background (blotches of random colour at low contrast, pixel noise) and faded
distractor shapes of other kinds at random places. The caption names only the target, so the words never
explain the clutter: a model whose attention spreads over the background and distractors (attention noise)
aligns worse than one that cancels it, which is what differential attention is for (DiffCLIP §3, App. C).
`label` is the target's shape, `fine_label` its colour and shape, as in the shapes world.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from datasets import Dataset, DatasetDict
from PIL import Image

from hf_vrl.data.schema import dataset_from_arrays
from hf_vrl.data.toy import (
    COLOURS,
    FINE_CLASSES,
    SHAPES,
    Scene,
    _rng,
    render_scene,
    sample_scene,
    shapes_features,
)

__all__ = ["cluttered_dataset", "cluttered_splits", "render_cluttered"]


def _background(rng: np.random.Generator, size: int, contrast: float) -> np.ndarray:
    """Grey with low-contrast blotches (a 4 x 4 grid of random colours, bilinear) and pixel noise."""
    grid = rng.uniform(0, 255, (4, 4, 3)).astype(np.uint8)
    blotches = np.asarray(Image.fromarray(grid).resize((size, size), Image.BILINEAR), dtype=np.float64)
    noise = rng.normal(0, 12, (size, size, 3))
    return np.clip(128 + contrast * (blotches - 128) + noise, 0, 255)


def _paste(canvas: np.ndarray, scene: Scene, size: int, opacity: float) -> np.ndarray:
    """`scene`'s objects over `canvas` at `opacity`: each pixel's coverage is read back from `render_scene`'s
    anti-aliased blend of the fill with white, so edges blend into the clutter without a white halo."""
    drawn = np.asarray(render_scene(scene, size), dtype=np.float64)
    fill = np.asarray(COLOURS[scene.colour], dtype=np.float64)
    channel = int(fill.argmin())  # the channel farthest from white
    coverage = ((255 - drawn[..., channel]) / (255 - fill[channel])).clip(0, 1)[..., None]
    return canvas * (1 - opacity * coverage) + fill * (opacity * coverage)


def render_cluttered(
    scene: Scene,
    rng: np.random.Generator,
    image_size: int = 32,
    distractors: int = 2,
    contrast: float = 0.5,
    distractor_opacity: float = 0.6,
) -> np.ndarray:
    """`scene` (opaque) over a cluttered background with `distractors` faded scenes of other shapes."""
    canvas = _background(rng, image_size, contrast)
    for _ in range(distractors):
        other = sample_scene(rng)
        while other.shape == scene.shape:
            other = dataclasses.replace(other, shape=SHAPES[rng.integers(len(SHAPES))])
        canvas = _paste(canvas, dataclasses.replace(other, size="small"), image_size, distractor_opacity)
    return _paste(canvas, scene, image_size, 1.0).round().astype(np.uint8)


def cluttered_dataset(
    n: int,
    seed: int = 0,
    image_size: int = 32,
    split: str = "train",
    distractors: int = 2,
    contrast: float = 0.5,
) -> Dataset:
    """`n` cluttered images with the shapes world's columns; captions name the target only."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    rng = _rng(seed, f"clutter/{split}")
    scenes = [sample_scene(rng) for _ in range(n)]
    images = [render_cluttered(s, rng, image_size, distractors, contrast) for s in scenes]
    return dataset_from_arrays(
        images,
        {
            "caption": [s.caption() for s in scenes],
            "label": [SHAPES.index(s.shape) for s in scenes],
            "fine_label": [FINE_CLASSES.index(f"{s.colour} {s.shape}") for s in scenes],
            "attributes": [s.attributes() for s in scenes],
        },
        shapes_features(),
    )


def cluttered_splits(
    train: int = 2000, test: int = 500, seed: int = 0, image_size: int = 32, **kwargs
) -> DatasetDict:
    """Train and test splits (independent streams of one seed), for `save_to_disk` and `--dataset DIR`."""
    return DatasetDict(
        {
            "train": cluttered_dataset(train, seed, image_size, "train", **kwargs),
            "test": cluttered_dataset(test, seed, image_size, "test", **kwargs),
        }
    )
