"""Robust image decoding (bytes / path / PIL -> RGB PIL) and skip-and-count filtering of bad samples.

Conversion rules (`to_rgb`): alpha (RGBA, LA, PA, palette with transparency) is composited on white, CMYK and
the other colour modes go through PIL's converters, 1-bit and 8-bit greyscale are replicated to three
channels, 16-bit / 32-bit integer greyscale is scaled to 8 bits (`I;16*` by 1/257; `I` the same when its
values fit 16 bits, else min-max), float greyscale (`F`) is read as [0, 1] when its maximum is <= 1.
EXIF orientation is applied. Truncated and corrupt files raise `ImageDecodeError` with a `kind`, whatever
`PIL.ImageFile.LOAD_TRUNCATED_IMAGES` the process set: a file cut short (even inside its header: it starts
with its format's signature) is "truncated_image", one that is no image at all "corrupt_image", a file this
process may not read (its permissions) "unreadable_image".

Large images: with a `draft_size` (the size the run needs) a JPEG is decoded downscaled (`draft`); an image
that would still be above PIL's decompression-bomb limit (`Image.MAX_IMAGE_PIXELS`, 89 MP by default) is
refused from its header, before anything is decoded ("too_large"; raise the limit to keep such images).

Tiny images: images whose shorter side is below `min_side` (default 8 px) are *rejected* (kind
"too_small"), not upscaled: in web crawls they are spacer pixels, icons and thumbnails whose content
does not survive the processor's resize. Anything at or above `min_side` is kept as is and left to the
model's image processor to resize.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import warnings
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image, ImageFile, ImageOps

DEFAULT_MIN_SIDE = 8
WHITE = (255, 255, 255)

# Skip kinds counted by SampleFilter (the `kind` of an ImageDecodeError is one of the first five).
CORRUPT_IMAGE = "corrupt_image"
TRUNCATED_IMAGE = "truncated_image"
TOO_SMALL = "too_small"
TOO_LARGE = "too_large"
UNSUPPORTED_MODE = "unsupported_mode"
MISSING_IMAGE = "missing_image"
UNREADABLE_IMAGE = "unreadable_image"
MISSING_CAPTION = "missing_caption"
EMPTY_CAPTION = "empty_caption"
UNDECODABLE_CAPTION = "undecodable_caption"
TRUNCATED_SHARD = "truncated_shard"

_ALPHA_MODES = {"RGBA", "RGBa", "LA", "La", "PA"}
_TRUNCATION_MESSAGES = ("truncated", "broken data stream", "premature end", "unexpected end")
# the first bytes of JPEG, PNG, GIF, BMP and TIFF files (WebP: RIFF....WEBP)
_SIGNATURES = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF87a", b"GIF89a", b"BM", b"II*\x00", b"MM\x00*")
_EXIF_ORIENTATION = 0x0112


class SampleError(ValueError):
    """A sample that cannot be used; `kind` says why (one of the SampleFilter kinds above)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class ImageDecodeError(SampleError):
    """An image that cannot be turned into an RGB PIL image."""


class CaptionError(SampleError):
    """A caption that is missing, empty or not text."""


class SkippedSampleWarning(UserWarning):
    """Emitted once per skip kind by a SampleFilter."""


def _formats(head: bytes) -> tuple[str, ...] | None:
    """("JPEG",) for bytes starting with JPEG's signature (nearly every web image), so PIL opens it without
    probing its other formats first (a quarter of a JPEG's open time); None (every format) otherwise."""
    return ("JPEG",) if head == _SIGNATURES[0] else None


def _open(source: Any) -> Image.Image:
    if isinstance(source, Image.Image):
        return source
    if isinstance(source, Mapping):  # datasets' Image(decode=False) value: {"bytes": ..., "path": ...}
        if source.get("bytes") is not None:
            return _open(source["bytes"])
        if source.get("path"):
            return _open(source["path"])
        raise ImageDecodeError(MISSING_IMAGE, "image value has neither 'bytes' nor 'path'")
    if source is None:
        raise ImageDecodeError(MISSING_IMAGE, "no image")
    if isinstance(source, (bytes, bytearray, memoryview)):
        if len(source) == 0:
            raise ImageDecodeError(CORRUPT_IMAGE, "empty image bytes")
        return Image.open(io.BytesIO(source), formats=_formats(bytes(source[:3])))
    if isinstance(source, (str, os.PathLike)):
        if not os.path.isfile(source):
            raise ImageDecodeError(MISSING_IMAGE, f"image file not found: {os.fspath(source)}")
        try:
            return Image.open(source)
        except PermissionError as error:  # skipped and counted as any bad sample, not a traceback
            raise ImageDecodeError(UNREADABLE_IMAGE, f"image file cannot be read: {error}") from error
    raise TypeError(f"cannot decode an image from {type(source).__name__}")


def _cut_header(source: Any, error: BaseException) -> bool:
    """Whether a header that could not be read belongs to a file cut short (it starts with an image format's
    signature, or the parser ran out of bytes) rather than to garbage."""
    if _error_kind(error) == TRUNCATED_IMAGE:
        return True
    head = b""
    if isinstance(source, Mapping):
        source = source.get("bytes") or source.get("path")
    if isinstance(source, (bytes, bytearray, memoryview)):
        head = bytes(source[:12])
    elif isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as handle:
            head = handle.read(12)
    return head.startswith(_SIGNATURES) or (head[:4] == b"RIFF" and head[8:12] == b"WEBP")


def _check_pixels(image: Image.Image) -> None:
    """Refuse, from its header and before decoding, an image above PIL's decompression-bomb limit
    (`Image.MAX_IMAGE_PIXELS`; None lifts it): decoding it whole would hold gigabytes for one sample."""
    limit = Image.MAX_IMAGE_PIXELS
    if limit and image.size[0] * image.size[1] > limit:
        raise ImageDecodeError(
            TOO_LARGE,
            f"image is {image.size[0]}x{image.size[1]}, above PIL's Image.MAX_IMAGE_PIXELS ({limit}) "
            "(raise it to keep such images)",
        )


def _error_kind(error: BaseException) -> str:
    text = str(error).lower()
    return TRUNCATED_IMAGE if any(m in text for m in _TRUNCATION_MESSAGES) else CORRUPT_IMAGE


def _scale_to_uint8(image: Image.Image) -> Image.Image:
    """8-bit greyscale from 16/32-bit integer or float greyscale (rules in the module docstring)."""
    array = np.asarray(image)
    if image.mode == "F":
        array = np.nan_to_num(array.astype(np.float64))
        scaled = array * 255.0 if array.max(initial=0.0) <= 1.0 else array
    elif image.mode.startswith("I;16") or (array.max(initial=0) <= 65535 and array.min(initial=0) >= 0):
        scaled = array.astype(np.float64) / 257.0
    else:
        lo, hi = float(array.min()), float(array.max())
        scaled = (array.astype(np.float64) - lo) * (255.0 / max(hi - lo, 1.0))
    return Image.fromarray(np.clip(np.rint(scaled), 0, 255).astype(np.uint8))


def to_rgb(image: Image.Image, background: tuple[int, int, int] = WHITE) -> Image.Image:
    """Convert any PIL mode to RGB (alpha composited on `background`); ImageDecodeError if PIL cannot."""
    mode = image.mode
    if mode == "RGB":
        return image
    try:
        if mode == "P" and "transparency" in image.info or mode in _ALPHA_MODES:
            rgba = image.convert("RGBA")
            return Image.alpha_composite(Image.new("RGBA", rgba.size, (*background, 255)), rgba).convert(
                "RGB"
            )
        if mode.startswith("I") or mode == "F":
            return _scale_to_uint8(image).convert("RGB")
        return image.convert("RGB")
    except ValueError as error:  # PIL: "conversion from X to Y not supported"
        raise ImageDecodeError(UNSUPPORTED_MODE, f"cannot convert mode {mode} to RGB: {error}") from error


@contextlib.contextmanager
def _truncation_is_an_error() -> Iterator[None]:
    """PIL's default, whatever the process set: libraries set `ImageFile.LOAD_TRUNCATED_IMAGES` globally
    (lmms-eval does at import), which would decode a cut file padded with grey instead of skipping it."""
    previous = ImageFile.LOAD_TRUNCATED_IMAGES
    ImageFile.LOAD_TRUNCATED_IMAGES = False
    try:
        yield
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = previous


def decode_image(source: Any, *, min_side: int = 1, draft_size: int | None = None) -> Image.Image:
    """Decode bytes, a path, a `{"bytes", "path"}` dict or a PIL image into a fully loaded RGB PIL image.

    `draft_size`: let the JPEG decoder downscale by 2/4/8 while keeping the shorter side >= draft_size
    (much faster when the model's input is far smaller than the stored image). Raises ImageDecodeError.
    """
    errors = (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError)
    try:
        with warnings.catch_warnings():  # an image above the limit is refused below, with its count
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = _open(source)
    except ImageDecodeError:
        raise
    except Image.DecompressionBombError as error:  # PIL's own refusal, at twice Image.MAX_IMAGE_PIXELS
        raise ImageDecodeError(TOO_LARGE, f"cannot decode image: {error}") from error
    except errors as error:  # no readable header: a file cut inside it (its format's signature), or garbage
        kind = TRUNCATED_IMAGE if _cut_header(source, error) else CORRUPT_IMAGE
        raise ImageDecodeError(kind, f"cannot decode image: {error}") from error
    if draft_size and image.format == "JPEG" and image is not source:
        image.draft(None, (draft_size, draft_size))
    _check_pixels(image)
    try:
        with _truncation_is_an_error():
            image.load()
    except errors as error:
        raise ImageDecodeError(_error_kind(error), f"cannot decode image: {error}") from error
    image = _apply_exif_orientation(image)
    if min(image.size) < min_side:
        raise ImageDecodeError(
            TOO_SMALL, f"image is {image.size[0]}x{image.size[1]}, below min_side={min_side}"
        )
    return to_rgb(image)


def _apply_exif_orientation(image: Image.Image) -> Image.Image:
    """Rotate/flip as the EXIF orientation tag says (no copy without one; malformed EXIF is ignored)."""
    try:
        if image.getexif().get(_EXIF_ORIENTATION, 1) in (2, 3, 4, 5, 6, 7, 8):
            return ImageOps.exif_transpose(image)
    except (OSError, ValueError, TypeError, KeyError, SyntaxError):
        pass
    return image


def clean_caption(value: Any) -> str:
    """Caption text with whitespace collapsed; CaptionError when it is missing, empty or undecodable."""
    if value is None:
        raise CaptionError(MISSING_CAPTION, "no caption")
    if isinstance(value, (bytes, bytearray)):
        try:
            value = bytes(value).decode("utf-8")
        except UnicodeDecodeError as error:
            raise CaptionError(UNDECODABLE_CAPTION, f"caption is not UTF-8: {error}") from error
    if not isinstance(value, str):
        raise CaptionError(UNDECODABLE_CAPTION, f"caption must be text, got {type(value).__name__}")
    text = re.sub(r"\s+", " ", value).strip()
    if not text:
        raise CaptionError(EMPTY_CAPTION, "caption is empty")
    return text


class SampleFilter:
    """Counts skipped samples by kind and warns once per kind; never raises for a bad sample.

    `counts` maps kind -> number skipped, `kept` counts samples that passed. Counts are per process: with
    DataLoader workers each worker holds its own copy. Give a `log` (an object with `record(kind, key)`, such
    as `hf_vrl.run.data.SkipLog`) to collect the skips of every worker and process in one place; the warning
    is then left to the process that reads the log (workers warn nothing).
    """

    def __init__(
        self,
        name: str = "data",
        *,
        min_side: int = DEFAULT_MIN_SIDE,
        draft_size: int | None = None,
        log: Any = None,
    ):
        self.name = name
        self.min_side = min_side
        self.draft_size = draft_size
        self.log = log
        self.counts: Counter[str] = Counter()
        self.kept = 0
        self._warned: set[str] = set()

    def skip(self, kind: str, detail: str = "", key: str = "") -> None:
        """Count one skipped sample of `kind` (and log it under `key`); warn the first time this kind is
        seen, unless a log collects the skips."""
        self.counts[kind] += 1
        if self.log is not None:
            self.log.record(kind, key or detail)
            return
        if kind not in self._warned:
            self._warned.add(kind)
            warnings.warn(
                f"{self.name}: skipping a sample ({kind}): {detail}. Further '{kind}' samples are skipped "
                "silently; see SampleFilter.counts.",
                SkippedSampleWarning,
                stacklevel=2,
            )

    def check(self, image: Any, caption: Any, key: str = "") -> tuple[Image.Image, str] | None:
        """(RGB image, clean caption) for a good sample, None (counted) for a bad one."""
        try:
            text = clean_caption(caption)
            decoded = decode_image(image, min_side=self.min_side, draft_size=self.draft_size)
        except SampleError as error:
            self.skip(error.kind, f"{error}" + (f" [{key}]" if key else ""), key)
            return None
        self.kept += 1
        return decoded, text

    def filter_batch(self, batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        """Batched `datasets` map function: decode `image`, clean `caption`, drop bad rows."""
        keys = batch.get("key") or [""] * len(batch["image"])
        out: dict[str, list[Any]] = {name: [] for name in batch}
        for i, (image, caption) in enumerate(zip(batch["image"], batch["caption"])):
            good = self.check(image, caption, keys[i])
            if good is None:
                continue
            for name, values in batch.items():
                out[name].append(values[i])
            out["image"][-1], out["caption"][-1] = good
        return out

    def summary(self) -> str:
        skipped = ", ".join(f"{k}={v}" for k, v in sorted(self.counts.items())) or "none"
        return f"{self.name}: kept {self.kept}, skipped {sum(self.counts.values())} ({skipped})"


@dataclass
class DecodeTransform:
    """`Dataset.with_transform` callable for map-style datasets holding raw images (`Image(decode=False)`):
    decodes `image_column` to RGB, optionally cropping each row to its `bbox_column` box (x, y, w, h)."""

    image_column: str = "image"
    bbox_column: str | None = None

    def __call__(self, batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        images = [decode_image(v) for v in batch[self.image_column]]
        if self.bbox_column is not None:
            images = [crop_box(im, box) for im, box in zip(images, batch[self.bbox_column])]
        return {**batch, self.image_column: images}


def crop_box(image: Image.Image, box: Any) -> Image.Image:
    """Crop to an (x, y, width, height) box, clipped to the image; the whole image for a None/empty box."""
    if box is None or len(box) == 0:
        return image
    x, y, w, h = (float(v) for v in box)
    left, top = max(0, int(np.floor(x))), max(0, int(np.floor(y)))
    right, bottom = min(image.width, int(np.ceil(x + w))), min(image.height, int(np.ceil(y + h)))
    if right <= left or bottom <= top:
        return image
    return image.crop((left, top, right, bottom))
