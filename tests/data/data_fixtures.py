"""Builders of real-format test data: encoded images of every awkward kind, webdataset shards."""

from __future__ import annotations

import io
import json
import struct
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


def image_file(path: Path, colour=(200, 30, 30), size=(12, 10)) -> Path:
    """A small solid-colour image written at `path` (its folders made), in the format its suffix names."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)
    return path


def row_class_names(dataset) -> list[str]:
    """The class name of each row's `label`, in row order."""
    names = dataset.features["label"].names
    return [names[label] for label in dataset["label"]]


def _riff(fourcc: bytes, data: bytes) -> bytes:
    return fourcc + len(data).to_bytes(4, "little") + data + b"\0" * (len(data) % 2)


def _riff_list(kind: bytes, payload: bytes) -> bytes:
    return b"LIST" + (len(payload) + 4).to_bytes(4, "little") + kind + payload


def mjpeg_avi(frames: list[Image.Image], fps: int = 25) -> bytes:
    """An AVI file (RIFF 'AVI ': the hdrl header list, one MJPEG video stream, the movi frames, the idx1
    index; Microsoft's AVI RIFF reference) of `frames`, the container UCF-101's clips come in."""
    jpegs = [encode(frame, "JPEG", quality=95) for frame in frames]
    width, height = frames[0].size
    largest = max(len(j) for j in jpegs)
    avih = struct.pack(
        "<10I4I", 1_000_000 // fps, 0, 0, 0x10, len(jpegs), 0, 1, largest, width, height, 0, 0, 0, 0
    )
    stream = (0, 0, 0, 0, 1, fps, 0, len(jpegs), largest, 0xFFFFFFFF, 0, 0, 0, width, height)
    strh = b"vidsMJPG" + struct.pack("<IHHIIIIIIIIhhhh", *stream)
    strf = struct.pack("<IiiHH4sIiiII", 40, width, height, 1, 24, b"MJPG", width * height * 3, 0, 0, 0, 0)
    header = _riff_list(
        b"hdrl", _riff(b"avih", avih) + _riff_list(b"strl", _riff(b"strh", strh) + _riff(b"strf", strf))
    )
    chunks = [_riff(b"00dc", j) for j in jpegs]
    index, offset = b"", 4
    for chunk, jpeg in zip(chunks, jpegs):
        index += b"00dc" + struct.pack("<III", 0x10, offset, len(jpeg))
        offset += len(chunk)
    body = b"AVI " + header + _riff_list(b"movi", b"".join(chunks)) + _riff(b"idx1", index)
    return _riff(b"RIFF", body)
