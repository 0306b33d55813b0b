"""hf_vrl's data layer: loaders that return the column contract of `schema.py`, and the collator.

The main entry points are importable from here (loaded on first use, so `import hf_vrl.data` stays cheap):
`load_dataset_by_name`, `ImageTextCollator`, `SampleFilter`, `shapes_dataset`, `shapes_mmvp_pairs`,
`load_image_text`, `load_cub`, `load_imagefolder`, `load_hf_dataset`, `to_contract`, `load_toy_tokenizer`.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "load_dataset_by_name": "registry",
    "ImageTextCollator": "collate",
    "SampleFilter": "images",
    "decode_image": "images",
    "shapes_dataset": "toy",
    "shapes_mmvp_pairs": "toy",
    "load_fashion_mnist": "offline",
    "load_animal_mnist": "offline",
    "load_digits": "offline",
    "load_first_available": "offline",
    "load_image_text": "webdataset",
    "load_cub": "cub",
    "load_imagefolder": "generic",
    "load_hf_dataset": "generic",
    "to_contract": "generic",
    "load_toy_tokenizer": "tokenizer",
    "ZERO_SHOT_TEMPLATES": "prompts",
    "CAPTION_TEMPLATES": "prompts",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
