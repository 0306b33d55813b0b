"""The processors a converted DiffCLIP is saved with: the source CLIP's, CLIP's default, or SLIP's evaluation
preprocessing for the released checkpoints. The image processor's backend is explicit
(`hf_vrl.data.processors`)."""

from __future__ import annotations

import contextlib
import os
from typing import Any

from transformers import AutoTokenizer, CLIPImageProcessorPil
from transformers.image_utils import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, PILImageResampling

from hf_vrl.data.processors import image_processor_class, load_image_processor

__all__ = ["clip_processors", "slip_image_processor"]


def clip_processors(
    clip_path: str | os.PathLike | None, image_size: int, image_processor: Any = None, tokenizer: Any = None
) -> tuple[Any, Any]:
    """(image processor, tokenizer): those given, else those saved with a CLIP at `clip_path` (the tokenizer
    is None where there is none). Without a saved image processor, CLIP's default at `image_size`: resize the
    shortest edge (bicubic), centre crop, OpenAI mean/std."""
    if clip_path is not None and image_processor is None:
        with contextlib.suppress(OSError, ValueError):
            image_processor = load_image_processor(clip_path)
    if clip_path is not None and tokenizer is None:
        with contextlib.suppress(OSError, ValueError):
            tokenizer = AutoTokenizer.from_pretrained(clip_path)
    if image_processor is None:
        image_processor = image_processor_class("CLIPImageProcessor")(
            size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size}
        )
    return image_processor, tokenizer


def slip_image_processor(image_size: int = 224) -> CLIPImageProcessorPil:
    """The image processor that reproduces SLIP's evaluation preprocessing (its `val_transform`, which the
    released DiffCLIP checkpoints were validated with): resize the shorter side to `image_size` (bilinear),
    centre crop, ImageNet mean/std, where CLIP's default is bicubic with OpenAI's mean/std.

    The PIL backend, as torchvision transforms PIL images; saved, it loads as a `CLIPImageProcessor`. One
    difference remains: where the resized image is an odd number of pixels larger than the crop, torchvision's
    `CenterCrop` rounds the offset to the even neighbour and transformers rounds down, one pixel apart.
    """
    return CLIPImageProcessorPil(
        do_resize=True,
        size={"shortest_edge": image_size},
        resample=PILImageResampling.BILINEAR,
        do_center_crop=True,
        crop_size={"height": image_size, "width": image_size},
        do_rescale=True,
        do_normalize=True,
        image_mean=list(IMAGENET_DEFAULT_MEAN),
        image_std=list(IMAGENET_DEFAULT_STD),
        do_convert_rgb=True,
    )
