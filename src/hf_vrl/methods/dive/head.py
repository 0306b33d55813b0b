"""The cross-entropy baselines of DiVE's tables: vanilla FT (Wortsman et al. 2022), LP-FT (Kumar et al. 2022).

Both "update only the image encoder using the cross-entropy loss with an added classification head" (DiVE
§5.1), as FLYP's and WiSE-FT's code do (`ImageClassifier`, `ClassificationHead(normalize=True)`): the head is
a linear map of the L2-normalised image embedding, initialised with the zero-shot classifier of the class
prompts times the pre-trained logit scale (`get_zeroshot_classifier`), so that the model before training
predicts exactly what zero-shot classification predicts. One difference: WiSE-FT's head also has a bias,
initialised at zero; this head has none, so that it stays a zero-shot-like classifier `[D, C]` that the
evaluation indexes by class (ImageNet-R / -A score the rows of their 200 classes, ObjectNet the maximum of
its ImageNet classes' rows). The text tower and the logit scale are frozen (they get no gradient either way).

    ft      one stage: image tower and head trained with cross-entropy
    lp_ft   stage "linear_probe" trains the head alone (encoder frozen), then stage "train" both, from there

The run's result is the dual encoder as a plain CLIPModel (its text tower the pre-trained one, so it still
classifies zero-shot) with the learned head beside it, `classification_head.safetensors` (`save_head`):
the head is not part of any transformers class.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hf_vrl.contrastive import as_embeddings
from hf_vrl.evaluation import encode_texts
from hf_vrl.metrics import cb_zero_shot_classifier, fill_prompt
from hf_vrl.trainer import VRLTrainer

__all__ = [
    "HEAD_FILE",
    "HeadClassifier",
    "HeadTrainer",
    "load_head",
    "save_head",
    "set_trainable",
    "text_classifier",
    "zero_shot_head",
]

HEAD_FILE = "classification_head.safetensors"
TEXT_SIDE = ("text_model", "text_projection", "logit_scale", "logit_bias")  # frozen in every CE stage


class HeadClassifier(nn.Module):
    """`encoder`'s image embedding, L2-normalised, through a bias-free linear head: logits `[B, C]`.

    `class_names[c]` names row c of the head (the target's class names, as its training captions use them);
    the evaluation matches other sets' classes to the rows by these names."""

    def __init__(self, encoder: nn.Module, weight: Tensor, class_names: Sequence[str]) -> None:
        super().__init__()
        if weight.ndim != 2 or weight.shape[0] != len(class_names):
            raise ValueError(f"head weight {tuple(weight.shape)} for {len(class_names)} classes")
        self.encoder = encoder
        self.head = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        with torch.no_grad():
            self.head.weight.copy_(weight)
        self.class_names = list(class_names)

    def image_embeddings(self, pixel_values: Tensor) -> Tensor:
        return as_embeddings(self.encoder.get_image_features(pixel_values=pixel_values))

    def forward(self, pixel_values: Tensor) -> Tensor:
        return self.head(F.normalize(self.image_embeddings(pixel_values), dim=-1))


def text_classifier(
    model: nn.Module,
    tokenizer: Any,
    class_names: Sequence[str],
    templates: Sequence[Any],
    fill: Any = str.format,
    batch_size: int = 64,
) -> torch.Tensor:
    """The zero-shot classifier `[D, C]` of the class prompts, as `evaluate_clip` builds it (each distinct
    prompt embedded once, clip_benchmark's class weights), so that both score alike."""
    filled = [[fill_prompt(t, name, fill) for t in templates] for name in class_names]
    distinct: dict[str, int] = {}
    rows = [distinct.setdefault(p, len(distinct)) for block in filled for p in block]
    flat = encode_texts(model, tokenizer, list(distinct), batch_size=batch_size)[rows]
    return cb_zero_shot_classifier(torch.split(flat, [len(block) for block in filled]))


@torch.no_grad()
def zero_shot_head(
    model: nn.Module, tokenizer: Any, class_names: Sequence[str], templates: Sequence[str]
) -> Tensor:
    """FLYP's `get_zeroshot_classifier` as a head weight `[C, D]`: per class the mean of the L2-normalised
    prompt embeddings (templates filled verbatim), renormalised, times the model's logit scale
    `exp(logit_scale)`: the evaluation's zero-shot classifier, scaled."""
    was_training = model.training
    classifier = text_classifier(model.eval(), tokenizer, class_names, templates)
    model.train(was_training)
    return classifier.T.contiguous() * model.logit_scale.detach().float().exp().cpu()


def set_trainable(model: HeadClassifier, encoder: bool) -> None:
    """The head always trains; the image tower only with `encoder` (LP: False); the text side never."""
    for name, param in model.encoder.named_parameters():
        param.requires_grad_(encoder and not name.startswith(TEXT_SIDE))
    model.head.weight.requires_grad_(True)


def save_head(model: HeadClassifier, folder: str | Path) -> Path:
    """The head's weight, its class names in the metadata, as `folder`/classification_head.safetensors."""
    from safetensors.torch import save_file

    path = Path(folder) / HEAD_FILE
    weight = model.head.weight.detach().float().cpu().contiguous()
    save_file({"weight": weight}, str(path), metadata={"class_names": json.dumps(model.class_names)})
    return path


def load_head(encoder: nn.Module, folder: str | Path) -> HeadClassifier:
    """`encoder` with the head `save_head` wrote in `folder`."""
    from safetensors import safe_open

    with safe_open(str(Path(folder) / HEAD_FILE), framework="pt") as f:
        weight, names = f.get_tensor("weight"), json.loads(f.metadata()["class_names"])
    return HeadClassifier(encoder, weight.to(next(encoder.parameters()).dtype), names)


class HeadTrainer(VRLTrainer):
    """Cross-entropy training of a `HeadClassifier` on labelled batches (`pixel_values`, `class_labels`, as
    `FLYPCollator` makes them; the captions are unused). Train what `set_trainable` leaves trainable. Weight
    decay as `ContrastiveTrainer`'s (weight matrices, the head included). Logged: `accuracy` (batch top-1)."""

    def get_decay_parameter_names(self, model: nn.Module) -> list[str]:
        return [name for name, param in model.named_parameters() if param.ndim >= 2]

    def embed(self, model: nn.Module, inputs: Mapping[str, Any]) -> dict[str, Tensor]:
        return {"logits": model(pixel_values=inputs["pixel_values"])}

    def objective(
        self, embedded: Mapping[str, Tensor], targets: Mapping[str, Tensor], inputs: Mapping[str, Any]
    ) -> dict[str, Tensor]:
        logits, labels = embedded["logits"], inputs["class_labels"].to(embedded["logits"].device)
        self.store_metrics({"accuracy": (logits.argmax(dim=-1) == labels).float().mean()})
        return {"loss": F.cross_entropy(logits.float(), labels)}
