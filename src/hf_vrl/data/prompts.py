"""The one home of text templates: captions for labelled images, and CLIP's zero-shot prompt ensemble."""

from __future__ import annotations

import random
import re

import numpy as np

# Captions given to images that come with a class label only (Fashion-MNIST, CUB, image folders, ...):
# FLYP-style "caption = template(classname)", varied so that a contrastive model does not learn one string.
CAPTION_TEMPLATES: tuple[str, ...] = (
    "a photo of a {}.",
    "a picture of a {}.",
    "an image of a {}.",
    "a photo of the {}.",
    "a close-up photo of a {}.",
    "a cropped photo of the {}.",
    "a low resolution photo of a {}.",
    "a drawing of a {}.",
)

# The 7-template ensemble selected in OpenAI CLIP's prompt-engineering notebook ("Prompt_Engineering_for_
# ImageNet.ipynb"), used by zero-shot evaluation; the single template CLIP uses without an ensemble first.
DEFAULT_ZERO_SHOT_TEMPLATE = "a photo of a {}."
ZERO_SHOT_TEMPLATES: tuple[str, ...] = (
    DEFAULT_ZERO_SHOT_TEMPLATE,
    "itap of a {}.",
    "a bad photo of the {}.",
    "a origami {}.",
    "a photo of the large {}.",
    "a {} in a video game.",
    "art of the {}.",
    "a photo of the small {}.",
)


def clean_class_name(folder_name: str) -> str:
    """Human class name from a folder name: "001.Black_footed_Albatross" -> "black footed albatross"."""
    name = re.sub(r"^\d+[._\-\s]+", "", folder_name.strip())
    return re.sub(r"[_\s]+", " ", name).strip().lower()


def fill_template(template: str, class_name: str) -> str:
    """`template` with `class_name` in place of "{}", "a {}" becoming "an {}" before a vowel."""
    if class_name[:1].lower() in "aeiou":
        template = re.sub(r"\ba \{\}", "an {}", template)
    return template.format(class_name)


def caption_for(class_name: str, rng_or_index: int | random.Random | np.random.Generator) -> str:
    """A caption for an image of `class_name`: template `index % len` for an int, a random one for an RNG."""
    if isinstance(rng_or_index, (int, np.integer)):
        index = int(rng_or_index)
    elif isinstance(rng_or_index, np.random.Generator):
        index = int(rng_or_index.integers(len(CAPTION_TEMPLATES)))
    elif isinstance(rng_or_index, random.Random):
        index = rng_or_index.randrange(len(CAPTION_TEMPLATES))
    else:
        raise TypeError(
            f"rng_or_index must be an int, random.Random or numpy Generator, got {type(rng_or_index)}"
        )
    return fill_template(CAPTION_TEMPLATES[index % len(CAPTION_TEMPLATES)], class_name)


def captions_for_labels(labels: list[int] | np.ndarray, class_names: list[str], seed: int) -> list[str]:
    """One caption per label, templates drawn from a generator seeded with `seed` (deterministic)."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(len(CAPTION_TEMPLATES), size=len(labels))
    return [fill_template(CAPTION_TEMPLATES[p], class_names[int(y)]) for p, y in zip(picks, labels)]
