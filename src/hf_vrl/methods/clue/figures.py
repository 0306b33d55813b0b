"""CLUE's figures besides Fig. 6's part maps (`evaluate.plot_part_maps`): the granularity metrics per rung of
the ablation ladder (Fig. 5) and Grad-CAM maps of the backbone (Fig. 9, appendix E).

Grad-CAM (Selvaraju et al. 2017) needs a target score; CLUE trains without labels and has no classifier, so
the score here is the cosine similarity of an image's global feature h to the prototype of its class (the
mean L2-normalised feature of the class's reference images, held fixed): the map shows where the evidence
for "this image looks like its class" lies, which is what Fig. 9 compares between CLUE and a baseline SSL
model. The activations are the backbone's last feature grid: a ResNet's last stage output, a ViT's patch
tokens entering its last layer (the last layer's own output tokens do not reach the [CLS] feature).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from hf_vrl.devices import module_device, module_dtype
from hf_vrl.evaluation import encode_images

__all__ = ["GRANULARITY", "class_prototypes", "grad_cam", "plot_grad_cam", "plot_granularity"]

# Fig. 5's metrics: (ladder column, axis title, scale: NCC in percent as the ladder table)
GRANULARITY = (
    ("CDNV_A", "CDNV_A (coarse, lower is better)", 1.0),
    ("NCC fine", "NCC fine (%, higher is better)", 100.0),
    ("NCC coarse", "NCC coarse (%)", 100.0),
)


def plot_granularity(report: dict[str, Any], path: str | Path | None = None) -> Any:
    """Fig. 5: CDNV_A, NCC fine and NCC coarse (one panel each) for the start and every rung of a
    `miniature.run_ladder` report, bars at the mean over seeds with the spread as error bars; returns the
    matplotlib Figure and writes a PNG when `path` is given."""
    from hf_vrl.viz import new_figure, save_figure

    entries = {"start": report["start"], **report["rungs"]}
    names = list(entries)
    fig = new_figure(4.0 * len(GRANULARITY), 0.35 * len(names) + 2.5)
    axes = fig.subplots(1, len(GRANULARITY), squeeze=False)[0]
    colors = ["tab:gray", *["tab:blue"] * (len(names) - 1)]  # the start, then the rungs
    for ax, (column, title, scale) in zip(axes, GRANULARITY):
        means = [scale * entries[name]["mean"][column] for name in names]
        spread = [scale * entries[name]["std"][column] for name in names]
        ax.barh(names, means, xerr=spread, color=colors, capsize=3)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=9)
    for ax in axes[1:]:
        ax.set_yticklabels([])
    fig.suptitle(f"granularity per rung ({len(report['seeds'])} seed(s))")
    if path is not None:
        save_figure(fig, path)
    return fig


@contextmanager
def _evaluating(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """`model` in eval mode (BatchNorm's running statistics) for the block, then its mode as before."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def _is_vit(model: torch.nn.Module) -> bool:
    return model.config.backbone_config.model_type == "vit"


def _last_layer(
    model: torch.nn.Module, pixel_values: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int]]:
    """(global feature h `[B, C]`, the hidden state Grad-CAM reads, its feature grid (h, w))."""
    features, _, grid, outputs = model.backbone_features(pixel_values, output_hidden_states=True)
    # ViT: the tokens entering the last layer; ResNet: the last stage's output (h is its spatial mean)
    return features, outputs.hidden_states[-2 if _is_vit(model) else -1], grid


def _as_grid(model: torch.nn.Module, hidden: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """A `_last_layer` hidden state as `[B, C, h, w]` (a ViT's patch tokens on their grid, [CLS] left out)."""
    return hidden[:, 1:].transpose(1, 2).unflatten(-1, grid) if _is_vit(model) else hidden


def grad_cam(model: torch.nn.Module, pixel_values: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Grad-CAM maps `[B, h, w]` (feature grid) of a CLUE model for the scores cos(h_i, targets_i) (`targets`
    `[B, C]`, e.g. `class_prototypes`): per channel the spatial mean of the score's gradient weights the
    activations, the weighted sum goes through a ReLU and each map is divided by its maximum (Fig. 9)."""
    with _evaluating(model), torch.enable_grad():
        pixels = pixel_values.to(module_device(model), module_dtype(model)).requires_grad_(True)
        features, hidden, grid = _last_layer(model, pixels)
        scores = F.cosine_similarity(features, targets.to(features.device, features.dtype), dim=-1)
        (gradients,) = torch.autograd.grad(scores.sum(), hidden)  # images are independent in eval mode
    activations, gradients = _as_grid(model, hidden.detach(), grid), _as_grid(model, gradients, grid)
    weights = gradients.mean(dim=(-2, -1), keepdim=True)
    cams = F.relu((weights * activations).sum(dim=1)).float()
    peak = cams.flatten(1).amax(dim=1).clamp_min(1e-12)
    return (cams / peak.view(-1, 1, 1)).cpu()


def class_prototypes(features: torch.Tensor, labels: Sequence[int]) -> dict[int, torch.Tensor]:
    """{class: the mean of the class's L2-normalised features} (Grad-CAM's targets)."""
    features = F.normalize(features.float(), dim=-1)
    labels_t = torch.as_tensor(np.asarray(labels))
    return {int(c): features[labels_t == c].mean(dim=0) for c in labels_t.unique()}


def plot_grad_cam(
    models: Mapping[str, torch.nn.Module],
    image_processor: Any,
    images: Sequence[Any],
    labels: Sequence[int],
    reference_images: Sequence[Any],
    reference_labels: Sequence[int],
    path: str | Path | None = None,
) -> Any:
    """Fig. 9: per image (rows), the image and each model's Grad-CAM map over it (columns, e.g. a baseline
    and CLUE), every model scored against its own class prototypes of `reference_images`; returns the
    matplotlib Figure and writes a PNG when `path` is given."""
    from hf_vrl.methods.clue.evaluate import display_images, pixels_of
    from hf_vrl.viz import new_figure, save_figure

    pixels = pixels_of(image_processor, images)
    fig = new_figure(2.0 * (len(models) + 1), 2.0 * len(images))
    axes = fig.subplots(len(images), len(models) + 1, squeeze=False)
    shown = display_images(image_processor, pixels)
    for row, image in enumerate(shown):
        axes[row, 0].imshow(image)
    for column, (name, model) in enumerate(models.items(), start=1):
        with _evaluating(model):
            reference = encode_images(model, image_processor, reference_images)
        prototypes = class_prototypes(reference, reference_labels)
        targets = torch.stack([prototypes[int(label)] for label in labels])
        cams = grad_cam(model, pixels, targets)
        upsampled = F.interpolate(cams[:, None], size=pixels.shape[-2:], mode="bilinear", align_corners=False)
        for row, image in enumerate(shown):
            axes[row, column].imshow(image)
            axes[row, column].imshow(upsampled[row, 0].numpy(), cmap="jet", alpha=0.5, vmin=0.0, vmax=1.0)
        axes[0, column].set_title(name)
    axes[0, 0].set_title("image")
    for ax in axes.flat:
        ax.set_axis_off()
    if path is not None:
        save_figure(fig, path)
    return fig
