import warnings

import numpy as np
import pytest
from data_fixtures import CORRUPT, encode, good_images, noise, tiny_png, truncated_jpeg
from PIL import Image, ImageFile

from hf_vrl.data.images import (
    DecodeTransform,
    ImageDecodeError,
    SampleFilter,
    SkippedSampleWarning,
    clean_caption,
    crop_box,
    decode_image,
    to_rgb,
)


@pytest.mark.parametrize("name", list(good_images()))
def test_every_mode_decodes_to_rgb_of_the_stored_size(name, tmp_path):
    data, size = good_images()[name]
    path = tmp_path / "image.bin"
    path.write_bytes(data)
    for source in (data, str(path), {"bytes": None, "path": str(path)}, Image.open(path)):
        image = decode_image(source)
        assert image.mode == "RGB" and image.size == size


def test_transparency_is_composited_on_white():
    palette = decode_image(good_images()["palette_png"][0])
    assert palette.getpixel((2, 2)) == (0, 0, 255)  # opaque palette index 1
    assert palette.getpixel((15, 2)) == (255, 255, 255)  # transparent index 0 -> white, not red
    rgba = decode_image(good_images()["rgba_png"][0])
    assert rgba.getpixel((2, 2)) == (0, 200, 0)
    assert rgba.getpixel((15, 2)) == (255, 255, 255)


def test_colour_conversions_keep_the_colour():
    red = np.asarray(decode_image(good_images()["cmyk_jpeg"][0])).reshape(-1, 3).mean(0)
    assert red[0] > 200 and red[1] < 40 and red[2] < 40
    grey16 = decode_image(good_images()["grey16_png"][0])
    assert grey16.getpixel((2, 2)) == (100, 100, 100) and grey16.getpixel((15, 2)) == (255, 255, 255)
    assert decode_image(good_images()["bilevel_png"][0]).getpixel((0, 0)) == (255, 255, 255)


def test_float_and_wide_integer_greyscale_are_scaled():
    assert to_rgb(Image.fromarray(np.full((4, 4), 0.5, np.float32))).getpixel((0, 0)) == (128, 128, 128)
    wide = np.array([[0, 1_000_000]], dtype=np.int32)  # beyond 16 bits: min-max
    assert to_rgb(Image.fromarray(wide)).getpixel((1, 0)) == (255, 255, 255)


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (CORRUPT, "corrupt_image"),
        (truncated_jpeg(), "truncated_image"),
        (b"", "corrupt_image"),
        (None, "missing_image"),
    ],
)
def test_bad_images_raise_a_typed_error(data, kind):
    with pytest.raises(ImageDecodeError) as info:
        decode_image(data)
    assert info.value.kind == kind


def test_a_cut_file_is_truncated_whatever_the_process_set(monkeypatch):
    """lmms-eval sets PIL's LOAD_TRUNCATED_IMAGES at import; a cut file is still skipped, and the process
    keeps its setting."""
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    with pytest.raises(ImageDecodeError) as info:
        decode_image(truncated_jpeg())
    assert info.value.kind == "truncated_image" and ImageFile.LOAD_TRUNCATED_IMAGES is True


def test_missing_file_and_tiny_image():
    with pytest.raises(ImageDecodeError, match="not found") as info:
        decode_image("/no/such/file.jpg")
    assert info.value.kind == "missing_image"
    with pytest.raises(ImageDecodeError) as info:
        decode_image(tiny_png(), min_side=8)
    assert info.value.kind == "too_small"
    assert decode_image(tiny_png(), min_side=4).size == (4, 4)  # at min_side: kept, not upscaled


def test_unconvertible_mode_is_typed():
    with pytest.raises(ImageDecodeError) as info:
        to_rgb(Image.new("La", (4, 4)))
    assert info.value.kind == "unsupported_mode"


def test_exif_orientation_is_applied():
    image = noise((40, 20))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    decoded = decode_image(encode(image, "JPEG", exif=exif.tobytes()))
    assert decoded.size == (20, 40)


def test_draft_decodes_large_jpegs_at_reduced_scale():
    data = encode(noise((256, 192)), "JPEG")
    assert decode_image(data, draft_size=32).size == (64, 48)  # 1/4: the largest scale keeping >= 32
    assert decode_image(data, draft_size=90).size == (128, 96)
    assert decode_image(data, draft_size=100).size == (256, 192)  # 1/2 would make the short side 96 < 100
    assert decode_image(data).size == (256, 192)


def test_clean_caption():
    assert clean_caption(b"  two\n red   circles ") == "two red circles"
    for value, kind in (
        (None, "missing_caption"),
        ("  \t", "empty_caption"),
        (b"\xff\xfe", "undecodable_caption"),
    ):
        with pytest.raises(ValueError) as info:
            clean_caption(value)
        assert info.value.kind == kind


def test_sample_filter_counts_and_warns_once_per_kind():
    sample_filter = SampleFilter("unit")
    good = encode(noise(), "JPEG")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = [
            sample_filter.check(good, "fine"),
            sample_filter.check(CORRUPT, "x"),
            sample_filter.check(CORRUPT, "y"),
            sample_filter.check(CORRUPT, "z"),
            sample_filter.check(good, ""),
            sample_filter.check(good, None),
            sample_filter.check(Image.new("La", (16, 16)), "premultiplied"),
            sample_filter.check(tiny_png(), "tiny"),
        ]
    assert [r is not None for r in results] == [True] + [False] * 7
    assert results[0][1] == "fine" and results[0][0].mode == "RGB"
    assert sample_filter.kept == 1
    assert dict(sample_filter.counts) == {
        "corrupt_image": 3,
        "empty_caption": 1,
        "missing_caption": 1,
        "unsupported_mode": 1,
        "too_small": 1,
    }
    skipped = [w for w in caught if issubclass(w.category, SkippedSampleWarning)]
    assert len(skipped) == 5  # one per kind, not one per sample
    assert "kept 1, skipped 7" in sample_filter.summary()


def test_filter_batch_drops_bad_rows_and_keeps_columns_aligned():
    sample_filter = SampleFilter("batch")
    good = encode(noise(), "JPEG")
    batch = {
        "image": [good, CORRUPT, good],
        "caption": ["a", "b", " "],
        "key": ["k0", "k1", "k2"],
        "label": [3, 4, 5],
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SkippedSampleWarning)
        out = sample_filter.filter_batch(batch)
    assert out["key"] == ["k0"] and out["label"] == [3] and out["caption"] == ["a"]
    assert out["image"][0].mode == "RGB"


def test_decode_transform_and_crop(tmp_path):
    path = tmp_path / "a.png"
    Image.new("L", (50, 40), 10).save(path)
    out = DecodeTransform("image", "bbox")(
        {"image": [{"bytes": None, "path": str(path)}], "bbox": [[5, 4, 20, 10]]}
    )
    assert out["image"][0].mode == "RGB" and out["image"][0].size == (20, 10)
    assert crop_box(Image.new("RGB", (10, 10)), [-5, -5, 100, 100]).size == (10, 10)  # clipped to the image
