"""Damaged and oversized images are named and counted, never met mid-run (issue 29): a file cut inside its
header is a truncated image, not a corrupt one; an image above PIL's decompression-bomb limit is refused from
its header before any pixel is decoded; a `save_to_disk` dataset skips an undecodable image as an image
folder does, for training and for `hf-vrl eval` alike."""

from __future__ import annotations

import datasets
import pytest
from data_fixtures import encode, noise
from PIL import Image

from hf_vrl.data.images import (
    CORRUPT_IMAGE,
    TOO_LARGE,
    TRUNCATED_IMAGE,
    ImageDecodeError,
    SampleFilter,
    decode_image,
)


def kind(source) -> str:
    with pytest.raises(ImageDecodeError) as error:
        decode_image(source)
    return error.value.kind


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
@pytest.mark.parametrize("keep", [20, 100, 0.5])
def test_a_file_cut_short_is_a_truncated_image_wherever_it_was_cut(fmt, keep):
    """Cut inside the header (20 or 100 bytes: a JPEG's EXIF segment) or inside the pixel data."""
    data = encode(noise((64, 64)), fmt, **({"exif": Image.Exif()} if fmt == "JPEG" else {}))
    cut = data[: int(len(data) * keep) if isinstance(keep, float) else keep]
    assert kind(cut) == TRUNCATED_IMAGE


def test_bytes_that_are_no_image_are_a_corrupt_image():
    assert kind(b"<html>not found</html>") == CORRUPT_IMAGE


def test_an_image_above_the_pixel_limit_is_refused_before_it_is_decoded(monkeypatch):
    """A 12000 x 12000 PNG was decoded whole (1.25 GB at the peak). The limit is PIL's own (89 MP); a small
    one here: the image is 200 x 200 and its pixel data cut, so decoding it would say 'truncated'."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100 * 100)
    data = encode(noise((200, 200)), "PNG")
    assert kind(data[: len(data) // 2]) == TOO_LARGE
    assert decode_image(encode(noise((100, 100)), "PNG")).size == (100, 100)


def test_a_saved_dataset_with_an_undecodable_image_is_skipped_and_counted(tmp_path):
    from hf_vrl.data.registry import load_dataset_by_name
    from hf_vrl.eval_inputs import load_eval_dataset

    images = [{"bytes": encode(noise(seed=i), "PNG"), "path": None} for i in range(4)]
    images[2] = {"bytes": b"not an image", "path": None}
    rows = {"image": images, "caption": [f"picture {i}" for i in range(4)], "label": [0, 1, 0, 1]}
    features = datasets.Features(
        image=datasets.Image(), caption=datasets.Value("string"), label=datasets.ClassLabel(names=["a", "b"])
    )
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(tmp_path / "saved")
    sample_filter = SampleFilter("saved", log=None)
    train = load_dataset_by_name(str(tmp_path / "saved"), sample_filter=sample_filter)
    assert [row["caption"] for row in train] == ["picture 0", "picture 1", "picture 3"]  # every row decodes
    assert dict(sample_filter.counts) == {CORRUPT_IMAGE: 1}
    evaluated = load_eval_dataset(str(tmp_path / "saved"), split="train")
    assert len([row["image"].size for row in evaluated]) == 3
