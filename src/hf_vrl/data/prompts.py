"""The one home of text templates: captions for labelled images, and zero-shot prompt ensembles.

Zero-shot templates, by protocol (`hf_vrl.evaluation`):
- "clip_benchmark" (the default): OpenAI's per-dataset templates, verbatim (`OPENAI_TEMPLATES`, from
  openai/CLIP `data/prompts.md`, and ImageNet's 80 from its `Prompt_Engineering_for_ImageNet.ipynb`), filled
  with `str.format` as clip_benchmark does. `zero_shot_templates(dataset_name)` looks the set up by name; a
  dataset without a set of its own gets ImageNet's 80, clip_benchmark's fallback. hf_vrl's own mappings
  (no OpenAI set exists for them): CUB-200 -> Birdsnap's bird template, scikit-learn digits -> MNIST's.
- "hf_vrl" (the earlier default, kept as an option): `ZERO_SHOT_TEMPLATES`, 8 templates filled by
  `fill_template_with_article` ("a {}" -> "an {}" before a vowel).

The one filling rule everywhere else (training captions of labelled images, DiVE's FLYP captions, the
clip_benchmark protocol): `fill_template`, verbatim, as OpenAI CLIP and FLYP fill templates ("a photo of a
apple."), so that a model is evaluated on the very strings it was trained on.
"""

from __future__ import annotations

import random
import re

import numpy as np

from . import imagenet_classes
from .imagenet_classes import IMAGENET_CLASSNAMES, IMAGENET_WNIDS

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

# hf_vrl's own ensemble (the "hf_vrl" zero-shot protocol): the 7 templates selected in OpenAI CLIP's
# prompt-engineering notebook ("Prompt_Engineering_for_ImageNet.ipynb"), after the single template CLIP uses
# without an ensemble. Not OpenAI's published protocol (which is `OPENAI_TEMPLATES`).
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

# OpenAI's zero-shot templates, verbatim: ImageNet's 80 (Prompt_Engineering_for_ImageNet.ipynb) and the 26
# datasets of openai/CLIP data/prompts.md, keyed by hf_vrl's name for each set.
IMAGENET_TEMPLATES: tuple[str, ...] = (
    "a bad photo of a {}.",
    "a photo of many {}.",
    "a sculpture of a {}.",
    "a photo of the hard to see {}.",
    "a low resolution photo of the {}.",
    "a rendering of a {}.",
    "graffiti of a {}.",
    "a bad photo of the {}.",
    "a cropped photo of the {}.",
    "a tattoo of a {}.",
    "the embroidered {}.",
    "a photo of a hard to see {}.",
    "a bright photo of a {}.",
    "a photo of a clean {}.",
    "a photo of a dirty {}.",
    "a dark photo of the {}.",
    "a drawing of a {}.",
    "a photo of my {}.",
    "the plastic {}.",
    "a photo of the cool {}.",
    "a close-up photo of a {}.",
    "a black and white photo of the {}.",
    "a painting of the {}.",
    "a painting of a {}.",
    "a pixelated photo of the {}.",
    "a sculpture of the {}.",
    "a bright photo of the {}.",
    "a cropped photo of a {}.",
    "a plastic {}.",
    "a photo of the dirty {}.",
    "a jpeg corrupted photo of a {}.",
    "a blurry photo of the {}.",
    "a photo of the {}.",
    "a good photo of the {}.",
    "a rendering of the {}.",
    "a {} in a video game.",
    "a photo of one {}.",
    "a doodle of a {}.",
    "a close-up photo of the {}.",
    "a photo of a {}.",
    "the origami {}.",
    "the {} in a video game.",
    "a sketch of a {}.",
    "a doodle of the {}.",
    "a origami {}.",
    "a low resolution photo of a {}.",
    "the toy {}.",
    "a rendition of the {}.",
    "a photo of the clean {}.",
    "a photo of a large {}.",
    "a rendition of a {}.",
    "a photo of a nice {}.",
    "a photo of a weird {}.",
    "a blurry photo of a {}.",
    "a cartoon {}.",
    "art of a {}.",
    "a sketch of the {}.",
    "a embroidered {}.",
    "a pixelated photo of a {}.",
    "itap of the {}.",
    "a jpeg corrupted photo of the {}.",
    "a good photo of a {}.",
    "a plushie {}.",
    "a photo of the nice {}.",
    "a photo of the small {}.",
    "a photo of the weird {}.",
    "the cartoon {}.",
    "art of the {}.",
    "a drawing of the {}.",
    "a photo of the large {}.",
    "a black and white photo of a {}.",
    "the plushie {}.",
    "a dark photo of a {}.",
    "itap of a {}.",
    "graffiti of the {}.",
    "a toy {}.",
    "itap of my {}.",
    "a photo of a cool {}.",
    "a photo of a small {}.",
    "a tattoo of the {}.",
)


# OpenAI's CIFAR-10 and CIFAR-100 sets are the same 18 templates
_CIFAR_TEMPLATES = (
    "a photo of a {}.",
    "a blurry photo of a {}.",
    "a black and white photo of a {}.",
    "a low contrast photo of a {}.",
    "a high contrast photo of a {}.",
    "a bad photo of a {}.",
    "a good photo of a {}.",
    "a photo of a small {}.",
    "a photo of a big {}.",
    "a photo of the {}.",
    "a blurry photo of the {}.",
    "a black and white photo of the {}.",
    "a low contrast photo of the {}.",
    "a high contrast photo of the {}.",
    "a bad photo of the {}.",
    "a good photo of the {}.",
    "a photo of the small {}.",
    "a photo of the big {}.",
)

OPENAI_TEMPLATES: dict[str, tuple[str, ...]] = {
    "imagenet": IMAGENET_TEMPLATES,
    "birdsnap": ("a photo of a {}, a type of bird.",),
    "caltech101": (
        "a photo of a {}.",
        "a painting of a {}.",
        "a plastic {}.",
        "a sculpture of a {}.",
        "a sketch of a {}.",
        "a tattoo of a {}.",
        "a toy {}.",
        "a rendition of a {}.",
        "a embroidered {}.",
        "a cartoon {}.",
        "a {} in a video game.",
        "a plushie {}.",
        "a origami {}.",
        "art of a {}.",
        "graffiti of a {}.",
        "a drawing of a {}.",
        "a doodle of a {}.",
        "a photo of the {}.",
        "a painting of the {}.",
        "the plastic {}.",
        "a sculpture of the {}.",
        "a sketch of the {}.",
        "a tattoo of the {}.",
        "the toy {}.",
        "a rendition of the {}.",
        "the embroidered {}.",
        "the cartoon {}.",
        "the {} in a video game.",
        "the plushie {}.",
        "the origami {}.",
        "art of the {}.",
        "graffiti of the {}.",
        "a drawing of the {}.",
        "a doodle of the {}.",
    ),
    "cifar10": _CIFAR_TEMPLATES,
    "cifar100": _CIFAR_TEMPLATES,
    "clevr_counts": ("a photo of {} objects.",),
    "country211": (
        "a photo i took in {}.",
        "a photo i took while visiting {}.",
        "a photo from my home country of {}.",
        "a photo from my visit to {}.",
        "a photo showing the country of {}.",
    ),
    "dtd": (
        "a photo of a {} texture.",
        "a photo of a {} pattern.",
        "a photo of a {} thing.",
        "a photo of a {} object.",
        "a photo of the {} texture.",
        "a photo of the {} pattern.",
        "a photo of the {} thing.",
        "a photo of the {} object.",
    ),
    "eurosat": (
        "a centered satellite photo of {}.",
        "a centered satellite photo of a {}.",
        "a centered satellite photo of the {}.",
    ),
    "fer2013": (
        "a photo of a {} looking face.",
        "a photo of a face showing the emotion: {}.",
        "a photo of a face looking {}.",
        "a face that looks {}.",
        "they look {}.",
        "look at how {} they are.",
    ),
    "fgvc_aircraft": (
        "a photo of a {}, a type of aircraft.",
        "a photo of the {}, a type of aircraft.",
    ),
    "flowers102": ("a photo of a {}, a type of flower.",),
    "food101": ("a photo of {}, a type of food.",),
    "gtsrb": (
        'a zoomed in photo of a "{}" traffic sign.',
        'a centered photo of a "{}" traffic sign.',
        'a close up photo of a "{}" traffic sign.',
    ),
    "hateful_memes": ("a {}.",),
    "kinetics700": (
        "a photo of {}.",
        "a photo of a person {}.",
        "a photo of a person using {}.",
        "a photo of a person doing {}.",
        "a photo of a person during {}.",
        "a photo of a person performing {}.",
        "a photo of a person practicing {}.",
        "a video of {}.",
        "a video of a person {}.",
        "a video of a person using {}.",
        "a video of a person doing {}.",
        "a video of a person during {}.",
        "a video of a person performing {}.",
        "a video of a person practicing {}.",
        "a example of {}.",
        "a example of a person {}.",
        "a example of a person using {}.",
        "a example of a person doing {}.",
        "a example of a person during {}.",
        "a example of a person performing {}.",
        "a example of a person practicing {}.",
        "a demonstration of {}.",
        "a demonstration of a person {}.",
        "a demonstration of a person using {}.",
        "a demonstration of a person doing {}.",
        "a demonstration of a person during {}.",
        "a demonstration of a person performing {}.",
        "a demonstration of a person practicing {}.",
    ),
    "kitti": ("{}",),
    "mnist": ('a photo of the number: "{}".',),
    "oxford_pets": ("a photo of a {}, a type of pet.",),
    "pcam": ("this is a photo of {}",),
    "resisc45": (
        "satellite imagery of {}.",
        "aerial imagery of {}.",
        "satellite photo of {}.",
        "aerial photo of {}.",
        "satellite view of {}.",
        "aerial view of {}.",
        "satellite imagery of a {}.",
        "aerial imagery of a {}.",
        "satellite photo of a {}.",
        "aerial photo of a {}.",
        "satellite view of a {}.",
        "aerial view of a {}.",
        "satellite imagery of the {}.",
        "aerial imagery of the {}.",
        "satellite photo of the {}.",
        "aerial photo of the {}.",
        "satellite view of the {}.",
        "aerial view of the {}.",
    ),
    "sst2": ("a {} review of a movie.",),
    "stanford_cars": (
        "a photo of a {}.",
        "a photo of the {}.",
        "a photo of my {}.",
        "i love my {}!",
        "a photo of my dirty {}.",
        "a photo of my clean {}.",
        "a photo of my new {}.",
        "a photo of my old {}.",
    ),
    "stl10": (
        "a photo of a {}.",
        "a photo of the {}.",
    ),
    "sun397": (
        "a photo of a {}.",
        "a photo of the {}.",
    ),
    "ucf101": (
        "a photo of a person {}.",
        "a video of a person {}.",
        "a example of a person {}.",
        "a demonstration of a person {}.",
        "a photo of the person {}.",
        "a video of the person {}.",
        "a example of the person {}.",
        "a demonstration of the person {}.",
        "a photo of a person using {}.",
        "a video of a person using {}.",
        "a example of a person using {}.",
        "a demonstration of a person using {}.",
        "a photo of the person using {}.",
        "a video of the person using {}.",
        "a example of the person using {}.",
        "a demonstration of the person using {}.",
        "a photo of a person doing {}.",
        "a video of a person doing {}.",
        "a example of a person doing {}.",
        "a demonstration of a person doing {}.",
        "a photo of the person doing {}.",
        "a video of the person doing {}.",
        "a example of the person doing {}.",
        "a demonstration of the person doing {}.",
        "a photo of a person during {}.",
        "a video of a person during {}.",
        "a example of a person during {}.",
        "a demonstration of a person during {}.",
        "a photo of the person during {}.",
        "a video of the person during {}.",
        "a example of the person during {}.",
        "a demonstration of the person during {}.",
        "a photo of a person performing {}.",
        "a video of a person performing {}.",
        "a example of a person performing {}.",
        "a demonstration of a person performing {}.",
        "a photo of the person performing {}.",
        "a video of the person performing {}.",
        "a example of the person performing {}.",
        "a demonstration of the person performing {}.",
        "a photo of a person practicing {}.",
        "a video of a person practicing {}.",
        "a example of a person practicing {}.",
        "a demonstration of a person practicing {}.",
        "a photo of the person practicing {}.",
        "a video of the person practicing {}.",
        "a example of the person practicing {}.",
        "a demonstration of the person practicing {}.",
    ),
    "voc2007": ("a photo of a {}.",),
}

# FLYP's templates of the WILDS sets of DiVE's Table 4 (OpenAI evaluated neither): src/templates/
# iwildcam_template.py and fmow_template.py; the two FMoW templates that insert "a" or "an" by the class
# name's first letter (`append_proper_article`) are left out (hf_vrl fills verbatim; their "a" forms are in)
FLYP_TEMPLATES: dict[str, tuple[str, ...]] = {
    "iwildcam": ("a photo of {}.", "{} in the wild."),
    "fmow": (
        "satellite photo of a {}.",
        "aerial photo of a {}.",
        "satellite photo of a {} in asia.",
        "aerial photo of a {} in asia.",
        "satellite photo of a {} in africa.",
        "aerial photo of a {} in africa.",
        "satellite photo of a {} in the americas.",
        "aerial photo of a {} in the americas.",
        "satellite photo of a {} in europe.",
        "aerial photo of a {} in europe.",
        "satellite photo of a {} in oceania.",
        "aerial photo of a {} in oceania.",
        "a photo of a {}.",
        "{}.",
    ),
}
ZERO_SHOT_SETS: dict[str, tuple[str, ...]] = {**OPENAI_TEMPLATES, **FLYP_TEMPLATES}

DEFAULT_TEMPLATE_SET = "imagenet"  # clip_benchmark's fallback for a dataset without templates of its own

# Other names of the sets above (compared after `_normalise`), and hf_vrl's mappings for datasets OpenAI did
# not evaluate: CUB-200-2011 -> Birdsnap's bird template, scikit-learn's digits -> MNIST's.
_TEMPLATE_ALIASES: dict[str, str] = {
    "imagenet1k": "imagenet",
    "ilsvrc2012": "imagenet",
    # ImageNet's distribution shifts are scored with ImageNet's 80 (WiSE-FT, FLYP, clip_benchmark)
    "imagenetv2": "imagenet",
    "imagenetv2matchedfrequency": "imagenet",
    "imagenetsketch": "imagenet",
    "imagenetr": "imagenet",
    "imagenetrendition": "imagenet",
    "imageneta": "imagenet",
    "imagenetadversarial": "imagenet",
    "objectnet": "imagenet",
    "cub": "birdsnap",
    "cub200": "birdsnap",
    "cub2002011": "birdsnap",
    "cars": "stanford_cars",
    "aircraft": "fgvc_aircraft",
    "digits": "mnist",
    "pets": "oxford_pets",
    "oxfordiiitpet": "oxford_pets",
    "flowers": "flowers102",
    "oxfordflowers102": "flowers102",
    "describabletextures": "dtd",
    "pascalvoc2007": "voc2007",
    "patchcamelyon": "pcam",
    "facialemotionrecognition2013": "fer2013",
    "clevrcountall": "clevr_counts",
    "renderedsst2": "sst2",
}


def _normalise(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


_TEMPLATE_SETS = {_normalise(key): key for key in ZERO_SHOT_SETS} | {
    _normalise(alias): key for alias, key in _TEMPLATE_ALIASES.items()
}


def template_set_for(dataset_name: str | None) -> str | None:
    """The key in `ZERO_SHOT_SETS` (OpenAI's sets, FLYP's for iWildCam and FMoW) for a dataset name, None when
    it has no set (see `zero_shot_templates`).

    Accepts set names and their aliases in any case and spelling ("CIFAR-10", "fgvc_aircraft", "cars") and the
    data registry's names by their key ("cub:<root>" is CUB); a path's name says nothing ("hf:uoft-cs/cifar10"
    and "imagefolder:/data/cifar10" are a user's data: `cifar10:<where>` names the benchmark)."""
    return _named_in(dataset_name, _TEMPLATE_SETS)


def _named_in(dataset_name: str | None, table: dict[str, str]) -> str | None:
    """`table`'s value for the name itself or its registry prefix ("cifar10", "imagenet-r:/data/x"); never a
    path's name: a user's folder under ".../cars/" is a user's folder (issue 34)."""
    if not dataset_name:
        return None
    prefix, _, target = dataset_name.partition(":")
    for candidate in [dataset_name, prefix] if target else [dataset_name]:
        found = table.get(_normalise(candidate))
        if found is not None:
            return found
    return None


def zero_shot_templates(dataset_name: str | None) -> list[str]:
    """OpenAI's zero-shot templates for `dataset_name` (FLYP's for iWildCam and FMoW; a list of "{}"
    strings), ImageNet's 80 for a dataset without a set of its own (clip_benchmark's fallback) or for None."""
    return list(ZERO_SHOT_SETS[template_set_for(dataset_name) or DEFAULT_TEMPLATE_SET])


def template_source(key: str) -> str:
    """Who published template set `key`: "openai" or "flyp"."""
    return "flyp" if key in FLYP_TEMPLATES else "openai"


def clean_class_name(folder_name: str) -> str:
    """Human class name from a folder name: "001.Black_footed_Albatross" -> "black footed albatross"."""
    name = re.sub(r"^\d+[._\-\s]+", "", folder_name.strip())
    return re.sub(r"[_\s]+", " ", name).strip().lower()


def fill_template(template: str, class_name: str) -> str:
    """`template` with `class_name` in place of "{}", verbatim (`str.format`): hf_vrl's one rule for captions
    and zero-shot prompts alike, as OpenAI CLIP, FLYP and clip_benchmark fill them ("a photo of a apple.")."""
    return template.format(class_name)


def fill_template_with_article(template: str, class_name: str) -> str:
    """The "hf_vrl" zero-shot protocol's fill (kept as an option): "a {}" becomes "an {}" before a vowel."""
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


# -- ImageNet and its distribution shifts: OpenAI's class names, the OOD protocol of WiSE-FT / FLYP ----------

# hf_vrl's name of each ImageNet-family set, by its other spellings (compared after `_normalise`)
IMAGENET_FAMILY: dict[str, str] = {
    "imagenet": "imagenet",
    "imagenet1k": "imagenet",
    "ilsvrc2012": "imagenet",
    "imagenetv2": "imagenet-v2",
    "imagenetv2matchedfrequency": "imagenet-v2",
    "imagenetsketch": "imagenet-sketch",
    "imagenetr": "imagenet-r",
    "imagenetrendition": "imagenet-r",
    "imageneta": "imagenet-a",
    "imagenetadversarial": "imagenet-a",
    "objectnet": "objectnet",
}
# the OOD sets scored on a 200-class subset of ImageNet's classes (the others on all 1000)
IMAGENET_SUBSETS = {"imagenet-r": "IMAGENET_R_WNIDS", "imagenet-a": "IMAGENET_A_WNIDS"}


def imagenet_family(dataset_name: str | None) -> str | None:
    """hf_vrl's name of an ImageNet-family set ("imagenet", "imagenet-v2", "imagenet-sketch", "imagenet-r",
    "imagenet-a", "objectnet") named by `dataset_name` in any spelling, or by its registry key
    ("imagenet-r:/data/x"); None for any other set and for a path however named."""
    return _named_in(dataset_name, IMAGENET_FAMILY)


def imagenet_class_wnids(member: str | None = None) -> tuple[str, ...]:
    """The WordNet ids of the classes `member` is scored on, in label order: the 200 of ImageNet-R / -A, else
    all 1000."""
    subset = IMAGENET_SUBSETS.get(member or "")
    return getattr(imagenet_classes, subset) if subset else imagenet_classes.IMAGENET_WNIDS


def imagenet_class_names(member: str | None = None) -> list[str]:
    """OpenAI's curated names of the classes `member` is scored on (`imagenet_class_wnids`), in label
    order."""
    index = {wnid: i for i, wnid in enumerate(IMAGENET_WNIDS)}
    return [IMAGENET_CLASSNAMES[index[wnid]] for wnid in imagenet_class_wnids(member)]
