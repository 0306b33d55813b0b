"""CLUE's figures: Grad-CAM (Fig. 9) against a plainly written reference on ResNet and ViT backbones, its
plot, and the granularity chart of the ablation ladder (Fig. 5)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from clue_helpers import TINY_VIT, tiny_model, tiny_settings, toy_data
from PIL import Image

from hf_vrl.methods.clue import miniature
from hf_vrl.methods.clue.evaluate import pixels_of
from hf_vrl.methods.clue.figures import (
    GRANULARITY,
    class_prototypes,
    grad_cam,
    plot_grad_cam,
    plot_granularity,
)
from hf_vrl.methods.clue.model import build_image_processor


def _reference_cam(model, pixels, targets, layer, grid_of):
    """Grad-CAM written out: a hook keeps `layer`'s activations (its output, or with `grid_of` the tokens it
    receives), the score is cos(h, target), the channel weights the spatial mean of the score's gradient,
    the map the ReLU of the weighted sum divided by its maximum."""
    kept = {}
    if grid_of is None:
        handle = layer.register_forward_hook(lambda module, args, output: kept.update(a=output))
    else:
        handle = layer.register_forward_pre_hook(lambda module, args: kept.update(a=args[0]))
    model.eval()
    features = model.get_image_features(pixels).pooler_output
    handle.remove()
    scores = F.cosine_similarity(features, targets, dim=-1)
    gradient = torch.autograd.grad(scores.sum(), kept["a"])[0]
    activations = kept["a"].detach()
    if grid_of is not None:  # ViT: patch tokens (no [CLS]) on their grid
        activations, gradient = (grid_of(t[:, 1:]) for t in (activations, gradient))
    cams = []
    for a, g in zip(activations, gradient):  # per image: channels x h x w
        weights = g.mean(dim=(1, 2))
        cam = torch.relu((weights[:, None, None] * a).sum(dim=0))
        cams.append(cam / cam.max())
    return torch.stack(cams)


def test_grad_cam_of_a_resnet_is_the_plain_computation():
    torch.manual_seed(0)
    model = tiny_model(seed=3)
    pixels, targets = torch.randn(3, 3, 32, 32), torch.randn(3, model.config.feature_dim)
    cams = grad_cam(model, pixels, targets)
    expected = _reference_cam(model, pixels, targets, model.backbone.encoder.stages[-1], None)
    torch.testing.assert_close(cams, expected)
    grid = model(pixel_values=pixels, output_part_assignments=True).part_assignments.shape[-2:]
    assert cams.shape == (3, *grid) == (3, 4, 4)  # the last stage's grid
    assert torch.allclose(cams.flatten(1).amax(dim=1), torch.ones(3))


def test_grad_cam_of_a_vit_reads_the_tokens_entering_the_last_layer():
    torch.manual_seed(0)
    model = tiny_model(seed=1, backbone={**TINY_VIT, "num_hidden_layers": 2})
    pixels, targets = torch.randn(2, 3, 16, 16), torch.randn(2, model.config.feature_dim)
    cams = grad_cam(model, pixels, targets)

    def grid_of(tokens):
        return tokens.transpose(1, 2).reshape(tokens.shape[0], -1, 4, 4)

    expected = _reference_cam(model, pixels, targets, model.backbone.layers[-1], grid_of)
    torch.testing.assert_close(cams, expected)
    assert cams.shape == (2, 4, 4)  # 16 px in 4 px patches


def test_class_prototypes_are_mean_unit_features():
    features = torch.tensor([[3.0, 0.0], [0.0, 2.0], [0.0, -5.0]])
    prototypes = class_prototypes(features, [1, 1, 7])
    torch.testing.assert_close(prototypes[1], torch.tensor([0.5, 0.5]))
    torch.testing.assert_close(prototypes[7], torch.tensor([0.0, -1.0]))


def test_the_grad_cam_figure_shows_each_models_maps(tmp_path):
    data = toy_data(8)
    processor = build_image_processor(tiny_settings())
    models = {"start": tiny_model(seed=0), "CLUE": tiny_model(seed=1)}
    images, labels = data["image"][:2], data["fine_label"][:2]
    path = tmp_path / "gradcam.png"
    fig = plot_grad_cam(models, processor, images, labels, data["image"], data["fine_label"], path)
    with Image.open(path) as png:
        assert png.size[0] > png.size[1]  # 2 rows x (image + 2 models)
    axes = np.asarray(fig.axes).reshape(2, 3)
    assert [ax.get_title() for ax in axes[0]] == ["image", "start", "CLUE"]
    model = models["CLUE"]
    model.eval()
    with torch.no_grad():
        reference = model.get_image_features(pixels_of(processor, data["image"])).pooler_output
    prototypes = class_prototypes(reference, data["fine_label"])
    pixels = pixels_of(processor, images)
    cams = grad_cam(model, pixels, torch.stack([prototypes[y] for y in labels]))
    shown = F.interpolate(cams[:, None], size=pixels.shape[-2:], mode="bilinear", align_corners=False)
    for row in range(2):
        overlay = axes[row, 2].get_images()[1].get_array()
        np.testing.assert_allclose(np.asarray(overlay), shown[row, 0].numpy(), atol=1e-5)


def _ladder(seeds: int, means: dict[str, dict[str, float]]) -> dict:
    def entry(mean):
        return {"seeds": [{}] * seeds, "mean": mean, "std": {k: 0.1 * v for k, v in mean.items()}}

    return {"seeds": list(range(seeds)), "start": entry(means["start"]), "rungs": {
        name: entry(mean) for name, mean in means.items() if name != "start"
    }}  # fmt: skip


def test_the_granularity_figure_plots_the_ladder_numbers(tmp_path):
    means = {
        "start": {"CDNV_A": 0.9, "NCC fine": 0.4, "NCC coarse": 0.8},
        "InfoNCE": {"CDNV_A": 0.7, "NCC fine": 0.5, "NCC coarse": 0.85},
        "+ text": {"CDNV_A": 0.5, "NCC fine": 0.6, "NCC coarse": 0.9},
    }
    fig = plot_granularity(_ladder(2, means), tmp_path / "granularity.png")
    assert (tmp_path / "granularity.png").is_file()
    for ax, (column, _, scale) in zip(fig.axes, GRANULARITY):
        widths = [bar.get_width() for bar in ax.patches]
        assert widths == pytest.approx([scale * means[name][column] for name in means])
    assert [label.get_text() for label in fig.axes[0].get_yticklabels()] == list(means)


def test_the_ladder_draws_fig5_when_it_has_granularity(tmp_path, monkeypatch):
    """run_ladder writes figures/granularity.png from its rungs' reports; data without coarse labels (CUB:
    no granularity metrics) gets no figure."""

    def fake_rung(name, output_dir, *, config, **overrides):
        value = {"InfoNCE": 0.3, "+ text": 0.6}[name]
        after = {"linear_probe": {"top1": value}, "retrieval": {"i2i_R@1": value, "i2i_R@5": value}}
        if "cub" not in str(output_dir):
            after["granularity"] = {"ncc_fine": value, "ncc_coarse": 0.9, "cdnv_coarse_mean": 1 - value}
        return {"before": after, "after": after}

    monkeypatch.setattr(miniature, "train_rung", fake_rung)
    miniature.run_ladder((0,), tmp_path / "shapes", rungs=("InfoNCE", "+ text"))
    with Image.open(tmp_path / "shapes" / "figures" / "granularity.png") as png:
        assert png.size[0] > 0
    miniature.run_ladder((0,), tmp_path / "cub", rungs=("InfoNCE", "+ text"))
    assert (tmp_path / "cub" / "clue_ladder.json").is_file()
    assert not (tmp_path / "cub" / "figures").exists()
