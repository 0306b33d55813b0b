"""Builders of real-format test data: encoded images of every awkward kind, webdataset shards."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image


def encode(image: Image.Image, fmt: str, **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **kwargs)
    return buffer.getvalue()


def noise(size=(48, 40), seed=0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def palette_with_transparency() -> Image.Image:
    image = Image.new("P", (20, 20), 0)
    image.putpalette([255, 0, 0, 0, 0, 255] + [0] * 762)
    image.paste(1, (0, 0, 10, 20))  # left half: index 1 (blue), right half: index 0 (red, made transparent)
    image.info["transparency"] = 0
    return image


def rgba_half_transparent() -> Image.Image:
    array = np.zeros((20, 20, 4), dtype=np.uint8)
    array[..., 1] = 200  # green everywhere
    array[:, :10, 3] = 255  # left half opaque, right half fully transparent
    return Image.fromarray(array)


def grey16() -> Image.Image:
    array = np.full((20, 20), 65535, dtype=np.uint16)
    array[:, :10] = 257 * 100  # 100 in 8 bits
    return Image.fromarray(array)  # uint16 -> mode I;16


# Every image kind that must decode to RGB: name -> (bytes, expected size).
def good_images() -> dict[str, tuple[bytes, tuple[int, int]]]:
    cmyk = Image.new("CMYK", (30, 20), (0, 255, 255, 0))  # red in CMYK
    return {
        "rgb_jpeg": (encode(noise(), "JPEG"), (48, 40)),
        "cmyk_jpeg": (encode(cmyk, "JPEG"), (30, 20)),
        "palette_png": (encode(palette_with_transparency(), "PNG", transparency=0), (20, 20)),
        "rgba_png": (encode(rgba_half_transparent(), "PNG"), (20, 20)),
        "grey_jpeg": (encode(Image.new("L", (24, 16), 90), "JPEG"), (24, 16)),
        "grey_alpha_png": (encode(Image.new("LA", (16, 16), (50, 128)), "PNG"), (16, 16)),
        "grey16_png": (encode(grey16(), "PNG"), (20, 20)),
        "bilevel_png": (encode(Image.new("1", (16, 12), 1), "PNG"), (16, 12)),
    }


def truncated_jpeg() -> bytes:
    data = encode(noise((64, 64), seed=1), "JPEG", quality=95)
    return data[: int(len(data) * 0.6)]


CORRUPT = b"this is not an image at all" * 4


def tiny_png() -> bytes:
    return encode(Image.new("RGB", (4, 4), (1, 2, 3)), "PNG")


def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


# Expected outcome of the mixed shard written by `write_mixed_shard`.
MIXED_KEPT = 9  # 8 good image kinds + 1 caption taken from the .json
MIXED_SKIPPED = {
    "corrupt_image": 1,
    "truncated_image": 1,
    "too_small": 1,
    "empty_caption": 1,
    "missing_caption": 1,
    "missing_image": 1,
    "undecodable_caption": 1,
}


def write_mixed_shard(path: Path) -> Path:
    """An img2dataset-style shard: NNN.jpg/.txt/.json members, with every bad-sample kind."""
    with tarfile.open(path, "w") as tar:
        index = 0

        def sample(image: bytes | None, caption: bytes | None, ext="jpg", meta=None):
            nonlocal index
            key = f"{index:09d}"
            if image is not None:
                add_member(tar, f"{key}.{ext}", image)
            if caption is not None:
                add_member(tar, f"{key}.txt", caption)
            add_member(tar, f"{key}.json", json.dumps(meta or {"key": key, "status": "success"}).encode())
            index += 1

        for name, (data, _) in good_images().items():
            sample(data, f"a {name.replace('_', ' ')}".encode(), ext="png" if name.endswith("png") else "jpg")
        sample(encode(noise(seed=3), "JPEG"), None, meta={"caption": "caption from the json"})
        sample(CORRUPT, b"a corrupt image")
        sample(truncated_jpeg(), b"a truncated image")
        sample(tiny_png(), b"a tiny image", ext="png")
        sample(encode(noise(seed=4), "JPEG"), b"  \n\t ")
        sample(encode(noise(seed=5), "JPEG"), None)
        sample(None, b"a caption without an image")
        sample(encode(noise(seed=6), "JPEG"), b"\xff\xfe\xfa bad utf-8")
    return path


def write_plain_shard(path: Path, start: int, n: int, size=(24, 24)) -> Path:
    """A shard of `n` good samples with keys start..start+n-1 and captions "caption <key>"."""
    with tarfile.open(path, "w") as tar:
        for i in range(start, start + n):
            add_member(tar, f"{i:06d}.jpg", encode(noise(size, seed=i), "JPEG"))
            add_member(tar, f"{i:06d}.txt", f"caption {i}".encode())
    return path


CUB_CLASSES = ("001.Black_footed_Albatross", "002.Laysan_Albatross", "003.Sooty_Albatross")
