"""The shapes world: generated, captioned images with coarse/fine labels and MMVP-style pairs.

Each image holds `count` copies (1-3) of one shape (circle, square, triangle, star, cross) of one colour and
size, in one region of the canvas (top left / top right / bottom left / bottom right), upright or rotated
(by half the shape's symmetry period: 45 deg for squares and crosses, 60 for triangles, 36 for stars;
circles are always "upright"). Objects sit in distinct cells of a 2x2 grid inside the region, with a small
per-object jitter. Drawn at 4x and box-downsampled (anti-aliased). Everything is a function of the seed.

`label` is the shape (5 classes), `fine_label` the colour + shape (30 classes), `caption` describes the
scene ("two small rotated red triangles at the top left"; `omit` leaves factors out, so that a model trained
on
the captions can be blind to one), `attributes` holds the factors.
MMVP-style pairs (`shapes_mmvp_pairs`) differ in exactly one factor, the pair's `category`; statement i is
the caption of image i, so it is true of image i only.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np
from datasets import ClassLabel, Dataset, Features, Value
from datasets import Image as ImageFeature
from PIL import Image, ImageDraw

from .schema import contract_features, dataset_from_arrays, rgb_array_to_ppm

SHAPES = ("circle", "square", "triangle", "star", "cross")
COLOURS = {
    "red": (220, 40, 40),
    "green": (30, 160, 60),
    "blue": (40, 80, 225),
    "yellow": (235, 195, 20),
    "purple": (140, 55, 185),
    "orange": (245, 125, 25),
}
SIZES = ("small", "large")
COUNTS = (1, 2, 3)
POSITIONS = ("top left", "top right", "bottom left", "bottom right")
ORIENTATIONS = ("upright", "rotated")
FINE_CLASSES = tuple(f"{colour} {shape}" for shape in SHAPES for colour in COLOURS)
MMVP_CATEGORIES = ("colour", "count", "position", "orientation", "size")
OMITTABLE = ("colour", "size", "orientation", "position")  # factors a caption can leave out

_COUNT_WORDS = {1: "a", 2: "two", 3: "three"}
_PLURALS = {"cross": "crosses"}
_ROTATION = {"circle": 0.0, "square": 45.0, "triangle": 60.0, "star": 36.0, "cross": 45.0}
_SIZE_FRACTION = {"small": 0.55, "large": 0.9}  # object diameter / grid cell
_REGION = 0.6  # the region of a position is this fraction of the canvas, anchored at its corner
_SUPERSAMPLE = 4
_BACKGROUND = (255, 255, 255)
ATTRIBUTE_FEATURES = {
    "shape": Value("string"),
    "colour": Value("string"),
    "size": Value("string"),
    "count": Value("int64"),
    "position": Value("string"),
    "orientation": Value("string"),
}


@dataclass(frozen=True)
class Scene:
    """One image of the shapes world: the factors plus the placement (cell index and jitter per object)."""

    shape: str
    colour: str
    size: str
    position: str
    orientation: str
    cells: tuple[int, ...]
    jitter: tuple[tuple[float, float], ...]

    @property
    def count(self) -> int:
        return len(self.cells)

    def attributes(self) -> dict[str, str | int]:
        return {
            "shape": self.shape,
            "colour": self.colour,
            "size": self.size,
            "count": self.count,
            "position": self.position,
            "orientation": self.orientation,
        }

    def caption(self, omit: Collection[str] = ()) -> str:
        """ "two small rotated red triangles at the top left"; `omit` leaves out factors (any of
        OMITTABLE), e.g. a caption that never names the colour."""
        unknown = sorted(set(omit) - set(OMITTABLE))
        if unknown:
            raise ValueError(f"captions can leave out {OMITTABLE}, not {unknown}")
        noun = self.shape if self.count == 1 else _PLURALS.get(self.shape, self.shape + "s")
        words = [
            _COUNT_WORDS[self.count],
            "" if "size" in omit else self.size,
            "rotated" if self.orientation == "rotated" and "orientation" not in omit else "",
            "" if "colour" in omit else self.colour,
            noun,
            "" if "position" in omit else f"at the {self.position}",
        ]
        return " ".join(word for word in words if word)


def _rng(seed: int, stream: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(stream.encode())])


def _jitter(rng: np.random.Generator) -> tuple[float, float]:
    return float(rng.uniform(-1, 1)), float(rng.uniform(-1, 1))


def sample_scene(rng: np.random.Generator) -> Scene:
    """A random scene (every factor uniform; circles are upright)."""
    shape = SHAPES[rng.integers(len(SHAPES))]
    count = COUNTS[rng.integers(len(COUNTS))]
    orientation = "upright" if shape == "circle" else ORIENTATIONS[rng.integers(len(ORIENTATIONS))]
    return Scene(
        shape=shape,
        colour=list(COLOURS)[rng.integers(len(COLOURS))],
        size=SIZES[rng.integers(len(SIZES))],
        position=POSITIONS[rng.integers(len(POSITIONS))],
        orientation=orientation,
        cells=tuple(int(c) for c in rng.permutation(4)[:count]),
        jitter=tuple(_jitter(rng) for _ in range(count)),
    )


def _shape_points(shape: str, cx: float, cy: float, r: float, angle: float) -> list[tuple[float, float]]:
    """Polygon vertices of `shape` with circumradius r, rotated by `angle` degrees (image y points down)."""
    if shape == "square":
        polar = [(r, 45.0 + 90.0 * k) for k in range(4)]
    elif shape == "triangle":
        polar = [(r, -90.0 + 120.0 * k) for k in range(3)]
    elif shape == "star":
        polar = [(r if k % 2 == 0 else 0.45 * r, -90.0 + 36.0 * k) for k in range(10)]
    elif shape == "cross":
        half, arm = 0.32 * r, r
        corners = [(half, arm), (half, half), (arm, half), (arm, -half), (half, -half), (half, -arm)]
        corners += [(-x, -y) for x, y in corners]
        polar = [(math.hypot(x, y), math.degrees(math.atan2(y, x))) for x, y in corners]
    else:
        raise ValueError(f"unknown polygon shape {shape!r}")
    return [
        (cx + rad * math.cos(math.radians(theta + angle)), cy + rad * math.sin(math.radians(theta + angle)))
        for rad, theta in polar
    ]


def render_scene(scene: Scene, image_size: int = 32) -> Image.Image:
    """Draw `scene` as an `image_size` x `image_size` RGB image."""
    canvas = image_size * _SUPERSAMPLE
    image = Image.new("RGB", (canvas, canvas), _BACKGROUND)
    draw = ImageDraw.Draw(image)
    region = _REGION * canvas
    right = scene.position.endswith("right")
    bottom = scene.position.startswith("bottom")
    x0, y0 = (canvas - region if right else 0.0), (canvas - region if bottom else 0.0)
    cell = region / 2
    diameter = _SIZE_FRACTION[scene.size] * cell
    slack = (cell - diameter) / 2
    angle = _ROTATION[scene.shape] if scene.orientation == "rotated" else 0.0
    fill = COLOURS[scene.colour]
    for index, (jx, jy) in zip(scene.cells, scene.jitter):
        cx = x0 + (index % 2 + 0.5) * cell + jx * slack
        cy = y0 + (index // 2 + 0.5) * cell + jy * slack
        r = diameter / 2
        if scene.shape == "circle":
            draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill)
        else:
            draw.polygon(_shape_points(scene.shape, cx, cy, r, angle), fill=fill)
    return image.reduce(_SUPERSAMPLE)


def shapes_features() -> Features:
    return contract_features(
        SHAPES,
        {"fine_label": ClassLabel(names=list(FINE_CLASSES)), "attributes": dict(ATTRIBUTE_FEATURES)},
    )


def shapes_dataset(
    n: int, seed: int = 0, image_size: int = 32, split: str = "train", omit: Collection[str] = ()
) -> Dataset:
    """`n` captioned shapes-world images; `split` selects an independent random stream for the same seed;
    `omit` leaves factors out of the captions (the images and labels are the same)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    rng = _rng(seed, f"shapes/{split}")
    scenes = [sample_scene(rng) for _ in range(n)]
    return dataset_from_arrays(
        [np.asarray(render_scene(s, image_size)) for s in scenes],
        {
            "caption": [s.caption(omit) for s in scenes],
            "label": [SHAPES.index(s.shape) for s in scenes],
            "fine_label": [FINE_CLASSES.index(f"{s.colour} {s.shape}") for s in scenes],
            "attributes": [s.attributes() for s in scenes],
        },
        shapes_features(),
    )


def _other(rng: np.random.Generator, values: tuple, current) -> object:
    choices = [v for v in values if v != current]
    return choices[rng.integers(len(choices))]


def vary(scene: Scene, category: str, rng: np.random.Generator) -> Scene:
    """A copy of `scene` that differs in exactly the factor `category` (one of MMVP_CATEGORIES)."""
    if category == "colour":
        return dataclasses.replace(scene, colour=_other(rng, tuple(COLOURS), scene.colour))
    if category == "size":
        return dataclasses.replace(scene, size=_other(rng, SIZES, scene.size))
    if category == "position":
        return dataclasses.replace(scene, position=_other(rng, POSITIONS, scene.position))
    if category == "orientation":
        if scene.shape == "circle":
            raise ValueError("a circle has no orientation to vary")
        return dataclasses.replace(scene, orientation=_other(rng, ORIENTATIONS, scene.orientation))
    if category == "count":
        count = _other(rng, COUNTS, scene.count)
        if count < scene.count:
            return dataclasses.replace(scene, cells=scene.cells[:count], jitter=scene.jitter[:count])
        free = [c for c in range(4) if c not in scene.cells]
        extra = tuple(int(c) for c in rng.permutation(free)[: count - scene.count])
        jitter = scene.jitter + tuple(_jitter(rng) for _ in extra)
        return dataclasses.replace(scene, cells=scene.cells + extra, jitter=jitter)
    raise ValueError(f"unknown category {category!r}; choose from {MMVP_CATEGORIES}")


def mmvp_pair_features() -> Features:
    return Features(
        {
            "image_a": ImageFeature(),
            "image_b": ImageFeature(),
            "statement_a": Value("string"),
            "statement_b": Value("string"),
            "category": Value("string"),
            "attributes_a": dict(ATTRIBUTE_FEATURES),
            "attributes_b": dict(ATTRIBUTE_FEATURES),
        }
    )


def shapes_mmvp_pairs(n_per_category: int = 10, seed: int = 0, image_size: int = 32) -> Dataset:
    """MMVP-style pairs: two images differing in exactly one factor (`category`); statement_a (the caption
    of image_a) is true of image_a only, statement_b of image_b only."""
    rng = _rng(seed, "shapes/mmvp")
    rows: dict[str, list] = {name: [] for name in mmvp_pair_features()}
    for category in MMVP_CATEGORIES:
        for _ in range(n_per_category):
            base = sample_scene(rng)
            while category == "orientation" and base.shape == "circle":
                base = sample_scene(rng)
            other = vary(base, category, rng)
            for suffix, scene in (("a", base), ("b", other)):
                image = np.asarray(render_scene(scene, image_size))
                rows[f"image_{suffix}"].append({"bytes": rgb_array_to_ppm(image), "path": None})
                rows[f"statement_{suffix}"].append(scene.caption())
                rows[f"attributes_{suffix}"].append(scene.attributes())
            rows["category"].append(category)
    return Dataset.from_dict(rows, features=mmvp_pair_features())


def caption_vocabulary() -> list[str]:
    """Every distinct caption the shapes world can produce (used to train the toy tokenizer)."""
    captions = []
    for shape in SHAPES:
        orientations = ("upright",) if shape == "circle" else ORIENTATIONS
        for colour in COLOURS:
            for size in SIZES:
                for position in POSITIONS:
                    for orientation in orientations:
                        for count in COUNTS:
                            cells = tuple(range(count))
                            scene = Scene(
                                shape, colour, size, position, orientation, cells, ((0.0, 0.0),) * count
                            )
                            captions.append(scene.caption())
    return captions
