"""The miniature's stand-in for CLUE's VLM descriptions (§4.3): a describer that reads only pixels.

The shapes world's captions name colour and shape, i.e. the fine label, so aligning to them is label
supervision. This describer never reads a label or a caption. Per image it takes the foreground (pixels far
from the white background), names the median foreground colour by the nearest colour word of its palette and
the quadrant of the foreground's centroid: "a photo of red at the bottom right" ("a photo at the bottom
right" without a colour). Like a VLM it errs and leaves
things out: with probability `COLOUR_ERROR` it names another colour, with `COLOUR_OMISSION` none; it never
names the shape (half of the fine label) and cannot count. The mistakes are drawn from the run's seed and the
row, so a run's descriptions are fixed.

`text_source="pixel_describer"` gives every training image its description; `"pixel_describer_shuffled"`
permutes the same descriptions across the images (the control rung: the same texts and the same text head,
no longer about their image), which separates the text term's information from the capacity it adds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image

from hf_vrl.data.toy import COLOURS

__all__ = ["COLOUR_ERROR", "COLOUR_OMISSION", "SOURCES", "describe_image", "describe_images"]

# the describer's colour words and their RGB: the world's own palette, as a VLM knows colour names
PALETTE = COLOURS
COLOUR_ERROR = 0.15  # names a wrong colour
COLOUR_OMISSION = 0.15  # names no colour
FOREGROUND = 60  # a pixel whose channels differ from white by more than this is foreground
SOURCES = {"pixel_describer": False, "pixel_describer_shuffled": True}  # text_source -> shuffled


def describe_image(
    image: Image.Image,
    rng: np.random.Generator,
    colour_error: float = COLOUR_ERROR,
    colour_omission: float = COLOUR_OMISSION,
) -> str:
    """One image's description from its pixels alone (dominant colour, where the foreground lies)."""
    pixels = np.asarray(image.convert("RGB"), dtype=np.float64)
    foreground = np.abs(pixels - 255.0).max(axis=-1) > FOREGROUND
    if not foreground.any():
        return "a photo of nothing"
    names = list(PALETTE)
    rgb = np.median(pixels[foreground], axis=0)
    nearest = names[int(np.argmin([np.sum((rgb - np.array(c)) ** 2) for c in PALETTE.values()]))]
    draw = rng.random()
    if draw < colour_omission:
        colour = ""
    elif draw < colour_omission + colour_error:
        colour = str(rng.choice([name for name in names if name != nearest]))
    else:
        colour = nearest
    rows, cols = np.nonzero(foreground)
    height, width = foreground.shape
    vertical = "top" if rows.mean() < height / 2 else "bottom"
    horizontal = "left" if cols.mean() < width / 2 else "right"
    return f"a photo {f'of {colour} ' if colour else ''}at the {vertical} {horizontal}"


def describe_images(
    images: Sequence[Any],
    seed: int,
    *,
    shuffled: bool = False,
    colour_error: float = COLOUR_ERROR,
    colour_omission: float = COLOUR_OMISSION,
) -> list[str]:
    """The descriptions of `images` (PIL images) in order; `shuffled` permutes them across the images (a
    seeded random permutation: an image keeps its own description only by chance)."""
    rng = np.random.default_rng([seed, 0xC1E])
    texts = [describe_image(image, rng, colour_error, colour_omission) for image in images]
    if shuffled:
        texts = [texts[i] for i in rng.permutation(len(texts))]
    return texts
