"""ImageTextCollator: contract rows (PIL image, caption, label) -> the batch every hf_vrl trainer takes.

Pixels come from the model's own image processor (CLIPImageProcessor, SiglipImageProcessor, ...), text from
its tokenizer. Padding follows the tokenizer family: SigLIP was trained on texts padded to max_length
(64) with no attention mask, so for tokenizers whose `model_input_names` has no "attention_mask" the
collator pads to max_length and returns an all-ones mask (the model then attends to the padding, as in
training); other tokenizers pad to the longest caption of the batch, truncated to `max_length`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .schema import CAPTION, IMAGE, LABEL, NO_LABEL


@dataclass
class ImageTextCollator:
    """`collator(rows)` -> {pixel_values [B,3,H,W] float, input_ids / attention_mask [B,T] long,
    class_labels [B] long (-1 where a row has no label)}. Use as a DataLoader/Trainer `collate_fn`;
    `preprocess` does the same for a column batch (as `datasets` batched maps and transforms pass them)."""

    image_processor: Any
    tokenizer: Any
    max_length: int = 77
    caption_column: str = CAPTION
    image_column: str = IMAGE
    label_column: str = LABEL
    padding: bool | str | None = None  # None: chosen from the tokenizer (see the module docstring)

    def __post_init__(self) -> None:
        self._uses_mask = "attention_mask" in getattr(self.tokenizer, "model_input_names", ["attention_mask"])
        if self.padding is None:
            self.padding = "longest" if self._uses_mask else "max_length"
        limit = getattr(self.tokenizer, "model_max_length", None)
        if isinstance(limit, int) and 0 < limit < self.max_length:
            self.max_length = limit

    def tokenize(self, captions: Sequence[str]) -> dict[str, torch.Tensor]:
        """input_ids / attention_mask [B, T] long for a list of captions."""
        text = self.tokenizer(
            list(captions),
            padding=self.padding,
            truncation=True,
            max_length=self.max_length,
            return_attention_mask=self._uses_mask,
            return_tensors="pt",
        )
        input_ids = text["input_ids"].long()
        mask = text["attention_mask"].long() if self._uses_mask else torch.ones_like(input_ids)
        return {"input_ids": input_ids, "attention_mask": mask}

    def preprocess(self, batch: dict[str, list[Any]]) -> dict[str, torch.Tensor]:
        """The batch dict from column lists {image: [...], caption: [...], label: [...]}."""
        images = batch[self.image_column]
        pixel_values = self.image_processor(images=list(images), return_tensors="pt")["pixel_values"]
        labels = batch[self.label_column] if self.label_column in batch else [NO_LABEL] * len(images)
        return {
            "pixel_values": torch.as_tensor(pixel_values, dtype=torch.float32),
            **self.tokenize(batch[self.caption_column]),
            "class_labels": torch.tensor([int(y) for y in labels], dtype=torch.long),
        }

    def __call__(self, rows: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if not rows:
            raise ValueError("cannot collate an empty batch")
        columns = (self.image_column, self.caption_column, self.label_column)
        batch = {c: [row[c] for row in rows] for c in columns if c in rows[0]}
        missing = {self.image_column, self.caption_column} - set(batch)
        if missing:
            raise KeyError(f"rows lack the column(s) {sorted(missing)}; they have {sorted(rows[0])}")
        return self.preprocess(batch)
