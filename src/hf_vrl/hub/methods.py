"""What a model card needs to know about each method beyond its run folder: the template, the tags, and which
settings of the run's `config.json` name the checkpoint it started from and its MMVP pairs.

Adding a method to publishing: an entry here and `model_cards/<method>.md`; the rest (weights, remote code,
loading lines, results, hyperparameters) is read from the run folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hf_vrl.errors import UserError

__all__ = ["METHOD_CARDS", "MODEL_CARDS", "MethodCard", "method_card"]

MODEL_CARDS = Path(__file__).parent / "model_cards"


@dataclass(frozen=True)
class MethodCard:
    """A method's publishing facts (module docstring)."""

    name: str
    tags: tuple[str, ...]
    base_model_setting: str | None = None  # dotted path in config.json: the checkpoint the run starts from
    mmvp_setting: str | None = None  # dotted path in config.json: the MMVP pairs ("toy" or a folder)

    @property
    def template(self) -> Path:
        return MODEL_CARDS / f"{self.name}.md"


METHOD_CARDS: dict[str, MethodCard] = {
    card.name: card
    for card in (
        MethodCard("diffclip", ("clip", "differential-attention", "vision-language")),
        MethodCard(
            "dcr",
            ("clip", "diffusion", "vision-encoder"),
            base_model_setting="model.clip",
            mmvp_setting="dcr.mmvp",
        ),
        MethodCard(
            "dive", ("clip", "robust-fine-tuning", "vision-language"), base_model_setting="model.pretrained"
        ),
        MethodCard(
            "clue",
            ("self-supervised-learning", "fine-grained", "image-feature-extraction"),
            base_model_setting="model.backbone",
        ),
    )
}


def method_card(method: str) -> MethodCard:
    """The publishing facts of `method` (a run's `method`)."""
    if method not in METHOD_CARDS:
        raise UserError(f"no model card for method {method!r}; cards exist for: {', '.join(METHOD_CARDS)}")
    return METHOD_CARDS[method]
