import numpy as np
import pytest

from hf_vrl.data.schema import validate_row
from hf_vrl.data.toy import (
    COLOURS,
    FINE_CLASSES,
    MMVP_CATEGORIES,
    SHAPES,
    Scene,
    render_scene,
    shapes_dataset,
    shapes_mmvp_pairs,
)


def _pixels(ds):
    return np.stack([np.asarray(row["image"]) for row in ds])


def test_same_seed_same_world_other_seed_or_split_differs():
    a, b = shapes_dataset(40, seed=3), shapes_dataset(40, seed=3)
    assert a["caption"] == b["caption"] and np.array_equal(_pixels(a), _pixels(b))
    assert shapes_dataset(40, seed=4)["caption"] != a["caption"]
    assert shapes_dataset(40, seed=3, split="test")["caption"] != a["caption"]


def test_rows_follow_the_contract_and_labels_match_attributes():
    ds = shapes_dataset(60, seed=0, image_size=48)
    assert ds.features["label"].names == list(SHAPES)
    assert ds.features["fine_label"].names == list(FINE_CLASSES) and len(FINE_CLASSES) == 30
    for row in ds:
        validate_row(row)
        assert row["image"].size == (48, 48)
        a = row["attributes"]
        assert SHAPES[row["label"]] == a["shape"]
        assert FINE_CLASSES[row["fine_label"]] == f"{a['colour']} {a['shape']}"
        assert a["colour"] in row["caption"] and a["position"] in row["caption"]
        assert ("rotated" in row["caption"]) == (a["orientation"] == "rotated")
        if a["shape"] == "circle":
            assert a["orientation"] == "upright"


def test_caption_grammar():
    scene = Scene("cross", "red", "small", "top left", "rotated", (0, 1), ((0.0, 0.0), (0.0, 0.0)))
    assert scene.caption() == "two small rotated red crosses at the top left"
    single = Scene("circle", "blue", "large", "bottom right", "upright", (3,), ((0.0, 0.0),))
    assert single.caption() == "a large blue circle at the bottom right"


def test_rendering_draws_the_stated_colour_in_the_stated_region():
    scene = Scene("square", "blue", "large", "bottom right", "upright", (0,), ((0.0, 0.0),))
    pixels = np.asarray(render_scene(scene, 64)).astype(int)
    blue = np.all(np.abs(pixels - np.array(COLOURS["blue"])) < 10, axis=-1)
    ys, xs = np.nonzero(blue)
    assert len(ys) > 50 and ys.min() >= 32 * 0.8 and xs.min() >= 32 * 0.8  # only in the bottom-right area
    assert not np.any(np.all(np.abs(pixels - np.array(COLOURS["red"])) < 10, axis=-1))


def test_rotation_changes_the_pixels_except_for_circles():
    def draw(shape, orientation):
        return np.asarray(
            render_scene(Scene(shape, "red", "large", "top left", orientation, (0,), ((0.0, 0.0),)), 64)
        )

    for shape in ("square", "triangle", "star", "cross"):
        assert not np.array_equal(draw(shape, "upright"), draw(shape, "rotated"))


def test_count_draws_that_many_blobs():
    from scipy import ndimage

    for count in (1, 2, 3):
        cells = tuple(range(count))
        scene = Scene("circle", "green", "small", "top right", "upright", cells, ((0.0, 0.0),) * count)
        mask = np.asarray(render_scene(scene, 64)).astype(int).sum(-1) < 600
        assert ndimage.label(mask)[1] == count


@pytest.mark.parametrize("image_size", [32, 64])
def test_mmvp_pairs_differ_in_exactly_the_stated_attribute(image_size):
    pairs = shapes_mmvp_pairs(n_per_category=6, seed=1, image_size=image_size)
    assert len(pairs) == 6 * len(MMVP_CATEGORIES)
    assert sorted(set(pairs["category"])) == sorted(MMVP_CATEGORIES)
    key = {
        "colour": "colour",
        "count": "count",
        "position": "position",
        "orientation": "orientation",
        "size": "size",
    }
    for row in pairs:
        a, b = row["attributes_a"], row["attributes_b"]
        differing = [name for name in a if a[name] != b[name]]
        assert differing == [key[row["category"]]]
        assert row["statement_a"] != row["statement_b"]
        assert not np.array_equal(np.asarray(row["image_a"]), np.asarray(row["image_b"]))
        assert row["image_a"].size == (image_size, image_size) and row["image_a"].mode == "RGB"


def test_mmvp_statement_i_is_the_caption_of_image_i_only():
    pairs = shapes_mmvp_pairs(n_per_category=3, seed=2)
    for row in pairs:
        for side in ("a", "b"):
            attributes = row[f"attributes_{side}"]
            statement = row[f"statement_{side}"]
            assert attributes["colour"] in statement and attributes["position"] in statement
    assert shapes_mmvp_pairs(n_per_category=3, seed=2)["statement_b"] == pairs["statement_b"]


def test_captions_can_leave_out_a_factor():
    from hf_vrl.data.toy import OMITTABLE

    full = shapes_dataset(20, seed=3)
    blind = shapes_dataset(20, seed=3, omit=("colour",))
    colours = ("red", "green", "blue", "yellow", "purple", "orange")
    assert all(any(c in caption for c in colours) for caption in full["caption"])
    assert not any(c in caption.split() for caption in blind["caption"] for c in colours)
    assert blind["label"] == full["label"] and blind["fine_label"] == full["fine_label"]  # same scenes
    for caption, attributes in zip(blind["caption"], blind["attributes"]):
        assert attributes["shape"] in caption and attributes["position"] in caption
    bare = shapes_dataset(5, seed=3, omit=OMITTABLE)["caption"]
    assert all(len(caption.split()) == 2 for caption in bare)  # "a circle", "two squares"
    with pytest.raises(ValueError, match="can leave out"):
        shapes_dataset(2, omit=("shape",))
