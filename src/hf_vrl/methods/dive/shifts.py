"""Style shifts that turn a test set into an OOD set of the same classes (DiVE's OOD axis on embedded data).

ImageNet's OOD sets (-R, -Sketch, -A, ...) keep the classes and change the style; the embedded data sets have
no such variants, so the dive-tiny preset makes them: `inverted` (negative image), `blurred` (Gaussian blur of
`blur_fraction` of the image side), `recoloured` (grey levels mapped onto a blue-to-yellow ramp). Each shift
is a deterministic function of the image.
"""

from __future__ import annotations

from typing import Any

from PIL import Image, ImageFilter, ImageOps

__all__ = ["SHIFTS", "shift_dataset", "shift_image"]

SHIFTS = ("inverted", "blurred", "recoloured")
_RAMP = ((20, 20, 110), (250, 210, 40))  # black -> dark blue, white -> yellow


def shift_image(image: Image.Image, shift: str, blur_fraction: float = 0.06) -> Image.Image:
    """`image` (RGB) in the style `shift`."""
    image = image.convert("RGB")
    if shift == "inverted":
        return ImageOps.invert(image)
    if shift == "blurred":
        return image.filter(ImageFilter.GaussianBlur(radius=blur_fraction * max(image.size)))
    if shift == "recoloured":
        return ImageOps.colorize(ImageOps.grayscale(image), black=_RAMP[0], white=_RAMP[1])
    raise ValueError(f"unknown shift {shift!r}; choose from {SHIFTS}")


def shift_dataset(dataset: Any, shift: str) -> Any:
    """A copy of a map-style contract dataset with every image shifted (labels and captions unchanged)."""
    if shift not in SHIFTS:
        raise ValueError(f"unknown shift {shift!r}; choose from {SHIFTS}")
    return dataset.map(lambda row: {"image": shift_image(row["image"], shift)}, desc=f"{shift} images")
