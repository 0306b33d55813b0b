"""Where CLIP and DiffCLIP look for a text query: the attention-map figure of DiffCLIP's Fig. 2.

The paper shows, for an image and a text query, a heat map per model (CLIP | DiffCLIP) of the image regions
that matter for matching the query. Its authors made it with Chefer et al.'s CLIP explainability code
(hila-chefer/Transformer-MM-Explainability, `interpret()`; stated in hammoudhasan/DiffCLIP issue #2), which
implements "Generic Attention-model Explainability for Interpreting Bi-Modal and Encoder-Decoder Transformers"
(Chefer, Gur & Wolf, ICCV 2021), Eqs. 5-6, on the vision tower's self-attention:

    Ā_l = E_h[(∇A_l ⊙ A_l)⁺],        R ← R + Ā_l · R        (R starts as the identity, l = start_layer..L-1)

with A_l the attention maps of layer l (heads h), ∇A_l the gradient of the image-query logit
s = logit_scale · cos(image, query) with respect to A_l, ⁺ the positive part and E_h the mean over heads.
The map is the class token's row of R over the patch tokens, R[0, 1:], on the patch grid; each map is min-max
normalised for display, as in the reference code. The reference notebook's default `start_layer` is the last
layer of ViT-B (11 of 12), ours too (`start_layer=-1`); `start_layer=0` aggregates every layer.

For DiffCLIP, A_l is the differential map A1 − λ·A2 of each differential head (the matrix that multiplies V,
what `output_attentions=True` returns on the eager path); its entries can be negative, which the positive part
of the gradient-weighted map handles as for any other attention. Maps are computed on the eager attention path
(the model is switched to it for the call and switched back), and taken from the vision tower's attention
modules with forward hooks, so that A_l is the tensor the forward used: the maps a model returns can be copies
outside the graph (after mixed-precision training, accelerate leaves an autocast + `convert_outputs_to_fp32`
wrapper on the model's forward, whose outputs are `.to()` copies that the score does not depend on).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from hf_vrl.devices import module_device, module_dtype, to_device
from hf_vrl.viz import new_figure

__all__ = ["attention_figure", "relevance_maps"]


@contextmanager
def _eager_attention(model: nn.Module) -> Iterator[None]:
    """Run `model` on the eager attention path (the only one returning maps), then restore the previous."""
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


@contextmanager
def _recorded_attention_maps(model: nn.Module) -> Iterator[list[Tensor]]:
    """Collect the attention maps of the vision tower's layers, in layer order, as the forward computes them
    (`vision_model.encoder.layers[i].self_attn`, whose forward returns `(output, weights)` as CLIP's does)."""
    maps: list[Tensor] = []

    def record(module: nn.Module, args: Any, output: Any) -> None:
        weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
        if weights is None:
            raise RuntimeError(f"{type(module).__name__} returned no attention weights on the eager path")
        maps.append(weights)

    layers = model.vision_model.encoder.layers
    handles = [layer.self_attn.register_forward_hook(record) for layer in layers]
    try:
        yield maps
    finally:
        for handle in handles:
            handle.remove()


def _patch_grid(model: nn.Module, pixel_values: Tensor) -> tuple[int, int]:
    patch = model.config.vision_config.patch_size
    return pixel_values.shape[-2] // patch, pixel_values.shape[-1] // patch


def relevance_maps(
    model: nn.Module,
    pixel_values: Tensor,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    *,
    start_layer: int = -1,
) -> Tensor:
    """Chefer et al.'s relevance of each image patch for each query (module docstring): `[Q, grid_h, grid_w]`
    float32 on the CPU.

    `pixel_values` is one image `[1, 3, H, W]` (scored against every query) or `[Q, 3, H, W]` (image q
    against query q); `input_ids` / `attention_mask` are the `[Q, T]` tokenised queries; they are moved to the
    model's device (and the pixels to its dtype). `model` is a CLIP-like dual encoder returning
    `logits_per_image`, with CLIP's module layout (`vision_model.encoder.layers[i].self_attn`): CLIPModel,
    DiffCLIP.
    """
    n_queries = input_ids.shape[0]
    if pixel_values.shape[0] not in (1, n_queries):
        raise ValueError(
            f"pixel_values holds {pixel_values.shape[0]} images for {n_queries} queries; "
            "pass one image or one per query."
        )
    device = module_device(model)
    pixel_values = to_device(pixel_values, device, module_dtype(model))
    pixel_values = pixel_values.expand(n_queries, -1, -1, -1).clone().requires_grad_(True)
    text = to_device({"input_ids": input_ids, "attention_mask": attention_mask}, device)
    was_training = model.training
    model.eval()
    try:
        with _eager_attention(model), _recorded_attention_maps(model) as maps, torch.enable_grad():
            outputs = model(pixel_values=pixel_values, output_attentions=True, **text)
            attentions = maps[start_layer:]
            if not attentions:
                raise ValueError(f"start_layer={start_layer} selects no layer of the vision tower")
            # logit of image q with query q; the image copies are independent, so one backward serves all
            score = outputs.logits_per_image.diagonal().sum()
            grads = torch.autograd.grad(score, attentions)
    finally:
        model.train(was_training)
    n_tokens = attentions[0].shape[-1]
    relevance = torch.eye(n_tokens, device=device).expand(n_queries, n_tokens, n_tokens)
    for attention, grad in zip(attentions, grads):
        cam = (grad * attention).detach().float().clamp(min=0).mean(dim=1)  # Ā_l, [Q, N, N]
        relevance = relevance + torch.bmm(cam, relevance)
    return relevance[:, 0, 1:].reshape(n_queries, *_patch_grid(model, pixel_values)).cpu()


def _display_image(pixel_values: Tensor, image_processor: Any) -> np.ndarray:
    """The `[H, W, 3]` image the model saw, un-normalised with the processor's mean / std, in [0, 1]."""
    mean = torch.tensor(getattr(image_processor, "image_mean", (0.0, 0.0, 0.0))).view(3, 1, 1)
    std = torch.tensor(getattr(image_processor, "image_std", (1.0, 1.0, 1.0))).view(3, 1, 1)
    image = pixel_values[0].detach().float().cpu() * std + mean
    return image.clamp(0, 1).permute(1, 2, 0).numpy()


def _upsampled(maps: Tensor, size: tuple[int, int]) -> np.ndarray:
    """Bilinear upsampling to the image size, then min-max normalisation per map (as the reference code)."""
    maps = nn.functional.interpolate(maps[:, None].float(), size=size, mode="bilinear", align_corners=False)[
        :, 0
    ]
    low = maps.amin(dim=(1, 2), keepdim=True)
    high = maps.amax(dim=(1, 2), keepdim=True)
    return ((maps - low) / (high - low).clamp(min=1e-12)).cpu().numpy()


def attention_figure(
    image: Any,
    queries: str | Sequence[str],
    models: Mapping[str, nn.Module],
    image_processor: Any,
    tokenizer: Any,
    *,
    path: str | Path | None = None,
    start_layer: int = -1,
    alpha: float = 0.5,
    panel_inches: float = 2.5,
    dpi: int = 100,
) -> Any:
    """DiffCLIP Fig. 2: one row per query, columns image | one relevance map per model (e.g. CLIP | DiffCLIP).

    `image` is a PIL image, `models` maps a column title to a CLIP-like model; all models share the image
    processor and tokenizer (a fair comparison trains them with the same ones). Maps come from
    `relevance_maps` and are overlaid on the processed image with the jet colour map. Returns the matplotlib
    `Figure`; with `path`, writes a PNG of exactly `(1 + len(models)) * panel_inches * dpi` by
    `len(queries) * panel_inches * dpi` pixels.
    """
    queries = [queries] if isinstance(queries, str) else list(queries)
    if not queries or not models:
        raise ValueError("attention_figure needs at least one query and one model")
    pixel_values = image_processor(images=[image.convert("RGB")], return_tensors="pt")["pixel_values"]
    text = tokenizer(queries, padding=True, truncation=True, return_tensors="pt")
    background = _display_image(pixel_values, image_processor)
    mask = text.get("attention_mask")
    columns = {}
    for name, model in models.items():
        maps = relevance_maps(model, pixel_values, text["input_ids"], mask, start_layer=start_layer)
        columns[name] = _upsampled(maps, background.shape[:2])

    n_cols = 1 + len(columns)
    fig = new_figure(n_cols * panel_inches, len(queries) * panel_inches, dpi)
    axes = fig.subplots(len(queries), n_cols, squeeze=False)
    for row, query in enumerate(queries):
        axes[row, 0].imshow(background)
        axes[row, 0].set_title(f"“{query}”", fontsize=8)
        for col, (name, maps) in enumerate(columns.items(), start=1):
            axes[row, col].imshow(background)
            axes[row, col].imshow(maps[row], cmap="jet", alpha=alpha, vmin=0.0, vmax=1.0)
            axes[row, col].set_title(name, fontsize=9)
    for ax in axes.flat:
        ax.set_axis_off()
    fig.subplots_adjust(left=0.02, right=0.98, bottom=0.02, top=0.9, wspace=0.05, hspace=0.2)
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format="png")
    return fig
