"""Before/after evaluation of a DCR encoder: D-ability (zero-shot clustering) and P-ability (MMVP-style
pairs).

D-ability follows the paper (§5.1, App. E.4): k-means on the image embeddings z, scored with NMI / ACC / ARI.
P-ability follows MMVP-VLM (App. E.3) exactly as the official evaluation does it: the enhanced image
embedding against the *original* CLIP text tower (DCR never changes the text side: the official code merges
its LoRA into the full CLIPModel, whose text adapters get no gradient); reported as `mmvp` where there is a
text tower. Every encoder also gets the image-image pair score (`pairs`, `pair_discrimination`): for each
MMVP pair (a, b), an augmented view of a must be closer to a than to b and likewise for b; a pair counts
when both hold. It asks the same question as MMVP (is the one differing detail in the embedding?) with views
instead of statements, so it also measures what a text tower cannot name (a CLIP never told about colour).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hf_vrl import metrics
from hf_vrl.contrastive import as_embeddings
from hf_vrl.devices import module_device, module_dtype, to_device
from hf_vrl.methods.dcr.augment import DCRAugment
from hf_vrl.methods.dcr.task import DCRCollator


class DCREvalModel(nn.Module):
    """CLIP-like view of a DCR encoder for `hf_vrl.evaluation`: image features from the (enhanced) encoder,
    text features from the original CLIP (`clip`, any model with `get_text_features`).

    The original CLIP is a frozen companion: it moves to the encoder's device here (and with `.to()` later),
    and every call moves its inputs to the device (and floating dtype) of the tower it calls.
    """

    def __init__(self, encoder: nn.Module, clip: nn.Module):
        super().__init__()
        self.encoder = encoder
        self.clip = clip.to(module_device(encoder))
        self.config = clip.config

    def get_image_features(self, pixel_values: torch.Tensor, **kwargs) -> torch.Tensor:
        pixels = to_device(pixel_values, module_device(self.encoder), module_dtype(self.encoder))
        return self.encoder.get_image_features(pixel_values=pixels)

    def get_text_features(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        inputs = to_device(
            {"input_ids": input_ids, "attention_mask": attention_mask}, module_device(self.clip)
        )
        return as_embeddings(self.clip.get_text_features(**inputs))


@torch.inference_mode()
def embed_images(
    encoder: nn.Module,
    images,
    image_size: int,
    mean,
    std,
    augment: DCRAugment | None = None,
    seed: int = 0,
    batch_size: int = 256,
) -> torch.Tensor:
    """z for PIL images (centre crop, resize, optional a(x), normalise) on the encoder's device and dtype;
    `[N, D]` float32 on the CPU."""
    collate = DCRCollator(image_size, crop_scale=None)
    mean, std = torch.tensor(mean).view(1, 3, 1, 1), torch.tensor(std).view(1, 3, 1, 1)
    device, dtype = module_device(encoder), module_dtype(encoder)
    generator = torch.Generator().manual_seed(seed)
    out = []
    for start in range(0, len(images), batch_size):
        batch = torch.stack([collate.centre_crop(image) for image in images[start : start + batch_size]])
        if augment is not None:
            batch = augment(batch, generator)
        pixels = ((batch - mean) / std).to(device, dtype)
        out.append(as_embeddings(encoder.get_image_features(pixel_values=pixels)).float().cpu())
    return torch.cat(out)


def pair_discrimination(
    encoder: nn.Module, pairs, image_size: int, mean, std, augment: DCRAugment | None = None, seed: int = 0
) -> dict[str, Any]:
    """Vision-only P-ability: per pair, is a' nearer a than b and b' nearer b than a (cosine)? Same report
    layout as `metrics.mmvp_score` (the similarities play the role of the statement logits)."""
    augment = augment or DCRAugment()
    images_a, images_b = list(pairs["image_a"]), list(pairs["image_b"])
    a, b = (embed_images(encoder, x, image_size, mean, std) for x in (images_a, images_b))
    a_view = embed_images(encoder, images_a, image_size, mean, std, augment, seed)
    b_view = embed_images(encoder, images_b, image_size, mean, std, augment, seed + 1)
    refs = F.normalize(torch.stack([a, b], dim=1), dim=-1)  # [P, 2 images, D]
    views = F.normalize(torch.stack([a_view, b_view], dim=1), dim=-1)  # [P, 2 "statements", D]
    logits = torch.einsum("psd,pid->psi", views, refs)
    return metrics.mmvp_score(logits, list(pairs["category"]))


def d_ability(embeddings: torch.Tensor, dataset) -> dict[str, dict[str, float]]:
    """Zero-shot clustering of the embeddings on `label` (and `fine_label` where the data has it)."""
    report = {"clustering": metrics.clustering_scores(embeddings, np.asarray(dataset["label"]))}
    if "fine_label" in dataset.column_names:
        report["clustering_fine"] = metrics.clustering_scores(embeddings, np.asarray(dataset["fine_label"]))
    return report


def evaluate_encoder(
    encoder: nn.Module,
    dataset,
    pairs=None,
    *,
    clip: nn.Module | None = None,
    image_processor=None,
    tokenizer=None,
    image_size: int,
    image_mean,
    image_std,
    data: dict[str, Any] | None = None,
    pairs_data: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """D-ability on `dataset` (rows with image/label) and P-ability on MMVP-style `pairs` (see module
    docstring); `data` / `pairs_data` (`hf_vrl.eval_inputs.data_record`s) go into their sections as "data"."""
    from hf_vrl.evaluation import evaluate_mmvp

    was_training = encoder.training
    encoder.eval()
    embeddings = embed_images(encoder, list(dataset["image"]), image_size, image_mean, image_std)
    report: dict[str, Any] = d_ability(embeddings, dataset)
    if pairs is not None:
        report["pairs"] = pair_discrimination(encoder, pairs, image_size, image_mean, image_std)
        report["pairs"]["protocol"] = "image-image pair discrimination (augmented view vs the two images)"
        if clip is not None and callable(getattr(clip, "get_text_features", None)):
            model = DCREvalModel(encoder, clip)
            report["mmvp"] = evaluate_mmvp(model, image_processor, tokenizer, pairs)
            report["mmvp"]["protocol"] = "MMVP-VLM: enhanced image tower vs the original text tower"
    encoder.train(was_training)
    for section, record in (("clustering", data), ("pairs", pairs_data), ("mmvp", pairs_data)):
        if record is not None and section in report:
            report[section]["data"] = record
    if data is not None and "clustering_fine" in report:
        report["clustering_fine"]["data"] = {**data, "labels": "fine_label"}
    return report
