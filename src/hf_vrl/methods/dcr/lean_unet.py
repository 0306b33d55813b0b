"""What a frozen UNet needs to keep for the backward pass to its condition, and no more.

DCR backpropagates through the frozen UNet only to reach the condition c (the UNet's weights get no gradient).
PyTorch's autograd still keeps, for every UNet pass:
  - each convolution's input: `convolution`'s one backward formula covers the weight gradient too, so the
    input is saved although only `grad_input = conv_transpose(grad, W)` is needed;
  - in each resnet, the GroupNorm output that SiLU keeps and the SiLU output that the convolution keeps, both
    recomputable from the GroupNorm input that the norm keeps anyway;
  - in each GEGLU feed-forward, gelu(gate), recomputable from the projection output that the product keeps
    anyway.
`lean_unet(unet)` gives a copy of the UNet, sharing its weights, whose modules keep only those inputs and
recompute the cheap element-wise parts in backward. Forward values are the same ops on the same inputs, and
the gradients the same kernels on the same values (`tests/methods/test_dcr_lean_unet.py` checks both bit for
bit against the untouched UNet on the CPU). No extra matmul or convolution FLOPs: the recompute is norms and
activations only.

It applies where the UNet runs in its own dtype (no autocast around it): under autocast the modules fall back
to their plain forward. `recompute_feedforward=True` goes one step further, at a FLOP cost: each GEGLU keeps
its input instead of its projection output (8x narrower) and recomputes the projection in backward.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


class _FrozenConvolution(torch.autograd.Function):
    """conv2d(x, W, b) keeping W only: dL/dx = conv2d_input(shape(x), W, dL/dy) (W, b frozen)."""

    @staticmethod
    def forward(ctx, x, weight, bias, stride, padding, dilation, groups):
        ctx.save_for_backward(weight)
        ctx.settings = (x.shape, stride, padding, dilation, groups)
        return F.conv2d(x, weight, bias, stride, padding, dilation, groups)

    @staticmethod
    def backward(ctx, grad):
        (weight,) = ctx.saved_tensors
        shape, stride, padding, dilation, groups = ctx.settings
        grad_input = torch.nn.grad.conv2d_input(shape, weight, grad, stride, padding, dilation, groups)
        return grad_input, None, None, None, None, None, None


def _lean(x: torch.Tensor, *frozen: nn.Parameter | None) -> bool:
    """The lean path applies: a gradient is wanted for x only, and no autocast re-types the computation."""
    return (
        torch.is_grad_enabled()
        and x.requires_grad
        and not any(p is not None and p.requires_grad for p in frozen)
        and not (torch.amp.is_autocast_available(x.device.type) and torch.is_autocast_enabled(x.device.type))
    )


class LeanConv2d(nn.Conv2d):
    """`nn.Conv2d` that keeps no input for backward when its weights are frozen (`_FrozenConvolution`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (
            self.padding_mode != "zeros"
            or isinstance(self.padding, str)
            or not _lean(x, self.weight, self.bias)
        ):
            return super().forward(x)
        return _FrozenConvolution.apply(
            x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups
        )


def _recomputed(function: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, *frozen) -> torch.Tensor:
    """function(x) keeping only x for backward, where the lean path applies: `function` (element-wise work,
    or a layer with the `frozen` parameters) is recomputed in backward."""
    if not _lean(x, *frozen):
        return function(x)
    return checkpoint(function, x, use_reentrant=False)


def _norm_silu(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return F.silu(norm(x))


def norm_silu(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """silu(norm(x)) keeping only x: the norm and the activation are recomputed in backward."""
    return _recomputed(partial(_norm_silu, norm), x, norm.weight, norm.bias)


def _lean_resnet_forward(
    self, input_tensor: torch.Tensor, temb: torch.Tensor, *args, **kwargs
) -> torch.Tensor:
    """diffusers' `ResnetBlock2D.forward` (no up/down-sampling, `time_embedding_norm="default"`, SiLU) with
    each norm + SiLU through `norm_silu`."""
    hidden = self.conv1(norm_silu(self.norm1, input_tensor))
    if self.time_emb_proj is not None:
        temb = self.time_emb_proj(temb if self.skip_time_act else self.nonlinearity(temb))[:, :, None, None]
    if temb is not None:
        hidden = hidden + temb
    hidden = self.conv2(self.dropout(norm_silu(self.norm2, hidden)))
    if self.conv_shortcut is not None:
        input_tensor = self.conv_shortcut(input_tensor)
    return (input_tensor + hidden) / self.output_scale_factor


def _geglu(hidden: torch.Tensor) -> torch.Tensor:
    hidden, gate = hidden.chunk(2, dim=-1)
    return hidden * F.gelu(gate)


def _projected_geglu(proj: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    return _geglu(proj(hidden_states))


def _lean_geglu_forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """diffusers' `GEGLU.forward` keeping only the projection output (gelu(gate) recomputed in backward), or
    with `recompute_projection` only its input (the projection recomputed too)."""
    if self.recompute_projection:
        return _recomputed(
            partial(_projected_geglu, self.proj), hidden_states, self.proj.weight, self.proj.bias
        )
    return _recomputed(_geglu, self.proj(hidden_states))


def _leanable_resnet(module: nn.Module) -> bool:
    return (
        module.upsample is None
        and module.downsample is None
        and module.time_embedding_norm == "default"
        and isinstance(module.nonlinearity, nn.SiLU)
        and isinstance(module.norm1, nn.GroupNorm)
        and isinstance(module.norm2, nn.GroupNorm)
    )


def lean_unet(unet: nn.Module, recompute_feedforward: bool = False) -> nn.Module:
    """A lean copy of a frozen diffusers UNet (module docstring) sharing its parameters and buffers.

    Plain `nn.Conv2d`s become `LeanConv2d`; `ResnetBlock2D`s without up/down-sampling and `GEGLU`s get the
    lean forward of their own instance. Anything else keeps its forward. The UNet passed in is unchanged.
    """
    from diffusers.models.activations import GEGLU
    from diffusers.models.resnet import ResnetBlock2D

    shared = {id(tensor): tensor for tensor in itertools.chain(unet.parameters(), unet.buffers())}
    lean = copy.deepcopy(unet, memo=shared)
    for module in lean.modules():
        if type(module) is nn.Conv2d:
            module.__class__ = LeanConv2d
        elif type(module) is ResnetBlock2D and _leanable_resnet(module):
            module.forward = _lean_resnet_forward.__get__(module)
        elif type(module) is GEGLU:
            module.forward = _lean_geglu_forward.__get__(module)
            module.recompute_projection = recompute_feedforward
    return lean
