"""DiffCLIP method code that is not Hub-facing: conversion from CLIP and from the released checkpoints.

`from_clip(clip_or_path, ...)` and `from_official_checkpoint(path, ...)` build a `DiffCLIPModel` (see
`convert.diffclip_from_clip` / `official.diffclip_from_official_checkpoint`); the model file itself stays free
of hf_vrl, so that it loads as remote code.
"""

from .convert import diffclip_from_clip
from .official import diffclip_from_official_checkpoint, load_official_checkpoint

from_clip = diffclip_from_clip
from_official_checkpoint = diffclip_from_official_checkpoint

__all__ = [
    "diffclip_from_clip",
    "diffclip_from_official_checkpoint",
    "from_clip",
    "from_official_checkpoint",
    "load_official_checkpoint",
]
