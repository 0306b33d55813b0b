"""DiffCLIP method code that is not Hub-facing: conversion from CLIP and from the released checkpoints."""

from .convert import diffclip_from_clip, diffclip_from_official_checkpoint, load_official_checkpoint

__all__ = ["diffclip_from_clip", "diffclip_from_official_checkpoint", "load_official_checkpoint"]
