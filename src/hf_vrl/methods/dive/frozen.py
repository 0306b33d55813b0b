"""The frozen pre-trained model of DiVE / SnD: f_pre and g_pre of Eq. 4-5, kept outside the trained model.

It never gets a gradient and is never saved with the result; it follows the trained model to its device
(the device rule) and, unless `dtype` says otherwise, to its dtype. Its embeddings of a reference batch come
from a forward pass without gradient (`mode="forward"`), or from a cache filled the first time each sample
is drawn (`mode="cache"`). The cache is exact: the frozen model never changes and reference preprocessing is
deterministic, so a cached row is what a new forward pass would compute (up to the last bits that a kernel
may change with the batch composition). It never costs more frozen forward passes than `forward`, and saves
all but the first pass over the reference set.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from hf_vrl.contrastive import as_embeddings
from hf_vrl.devices import module_device, module_dtype, to_device
from hf_vrl.methods.dive.data import REFERENCE_INDEX

__all__ = ["FrozenReference", "embed_pair", "weight_fingerprint"]

ENCODER_KEYS = ("pixel_values", "input_ids", "attention_mask")


def weight_fingerprint(model: nn.Module) -> Tensor:
    """float64 [sum, sum of squares] over all parameters: tells the pre-trained weights apart on resume."""
    total = torch.zeros(2, dtype=torch.float64)
    for param in model.parameters():
        values = param.detach().to("cpu", torch.float64)
        total += torch.stack([values.sum(), values.pow(2).sum()])
    return total


def embed_pair(model: nn.Module, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """(image_embeds, text_embeds) of a batch through the model's forward, as CLIPModel returns them."""
    outputs = model(**{key: batch[key] for key in ENCODER_KEYS if key in batch})
    image, text = getattr(outputs, "image_embeds", None), getattr(outputs, "text_embeds", None)
    if image is None or text is None:
        raise TypeError(f"{type(model).__name__}'s forward returned no image_embeds / text_embeds")
    return as_embeddings(image), as_embeddings(text)


class FrozenReference:
    """The frozen pre-trained model and its embeddings of reference batches (`cache_size`: the number of
    reference samples this process draws from, for `mode="cache"`)."""

    def __init__(
        self,
        model: nn.Module,
        *,
        mode: str = "forward",
        dtype: torch.dtype | None = None,
        cache_size: int | None = None,
    ) -> None:
        if mode not in ("forward", "cache"):
            raise ValueError(f"mode must be 'forward' or 'cache', got {mode!r}")
        if mode == "cache" and not cache_size:
            raise ValueError("mode='cache' needs cache_size, the number of reference samples to hold")
        self.fingerprint = weight_fingerprint(model)
        self.model = model.requires_grad_(False).eval()
        self.mode, self.dtype = mode, dtype
        self._filled = torch.zeros(cache_size or 0, dtype=torch.bool)
        self._image: Tensor | None = None
        self._text: Tensor | None = None

    def follow(self, trained: nn.Module) -> None:
        """Move to the trained model's device, and to its dtype unless a frozen dtype was given."""
        device, dtype = module_device(trained), self.dtype or module_dtype(trained)
        if module_device(self.model) != device or module_dtype(self.model) != dtype:
            self.model.to(device=device, dtype=dtype)

    @torch.no_grad()
    def _forward(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        inputs = {key: batch[key] for key in ENCODER_KEYS if key in batch}
        image, text = embed_pair(
            self.model, to_device(inputs, module_device(self.model), module_dtype(self.model))
        )
        return image.float(), text.float()

    def embed(self, batch: dict[str, Tensor], trained: nn.Module) -> tuple[Tensor, Tensor]:
        """float32 (image, text) embeddings of the frozen model, on the trained model's device, no grad."""
        self.follow(trained)
        if self.mode == "forward":
            return self._forward(batch)
        if REFERENCE_INDEX not in batch:
            raise ValueError(
                "the embedding cache needs batches with a `reference_index` (a map-style reference set read "
                "by ReferenceLoader); use frozen_embeddings='forward' for streams"
            )
        return self._cached(batch)

    def _cached(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        index = batch[REFERENCE_INDEX].cpu()
        rows = torch.nonzero(~self._filled[index]).squeeze(1)
        if len(rows):
            image, text = self._forward({key: value[rows.to(value.device)] for key, value in batch.items()})
            if self._image is None:
                self._image = torch.zeros(len(self._filled), image.shape[1])
                self._text = torch.zeros(len(self._filled), text.shape[1])
            self._image[index[rows]] = image.cpu()
            self._text[index[rows]] = text.cpu()
            self._filled[index[rows]] = True
        device = module_device(self.model)
        return self._image[index].to(device), self._text[index].to(device)

    @property
    def cached(self) -> int:
        """How many reference samples the cache holds."""
        return int(self._filled.sum())
