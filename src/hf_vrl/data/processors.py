"""The image-processor backend, chosen explicitly: torchvision where it has a build, PIL elsewhere.

transformers 5 gives each image processor two backends (`CLIPImageProcessor`, torchvision;
`CLIPImageProcessorPil`, PIL). Importing the torchvision name without torchvision falls back to PIL with a
warning on every command; hf_vrl names the backend instead, so no command prints it. Both backends save the
same `preprocessor_config.json`, which loads with either.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

__all__ = ["image_processor_backend", "image_processor_class", "load_image_processor"]


def image_processor_backend() -> str:
    """ "torchvision" where torchvision is installed, else "pil"."""
    return "torchvision" if importlib.util.find_spec("torchvision") is not None else "pil"


def image_processor_class(name: str = "CLIPImageProcessor") -> type:
    """The transformers image-processor class `name` on `image_processor_backend()`: `name` itself with
    torchvision, `<name>Pil` without."""
    import transformers

    return getattr(transformers, name if image_processor_backend() == "torchvision" else f"{name}Pil")


def load_image_processor(name_or_path: str | os.PathLike, **kwargs: Any) -> Any:
    """`AutoImageProcessor.from_pretrained(name_or_path, backend=image_processor_backend(), **kwargs)`."""
    from transformers import AutoImageProcessor

    kwargs.setdefault("backend", image_processor_backend())
    return AutoImageProcessor.from_pretrained(name_or_path, **kwargs)
