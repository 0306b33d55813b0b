"""DiffCLIP's differential attention as functions (DiffCLIP §3.2, Eq. 3): softmax maps, (A1 − λ·A2)·V with the
maps written out (eager), A1·V and A2·V through an attention kernel (SDPA, ...), and the tail
O_m = RMSNorm(A1·V_m − λ·A2·V_m)·(1 − λ_init), fused into one autograd node (`DifferentialTail`) whose CUDA
kernels are Triton where Triton is installed (optional, guarded) and torch ops elsewhere.

Remote code beside `modeling_diffclip.py`, which imports it relatively (`save_pretrained` copies it along and
`trust_remote_code` loads it): imports only torch, transformers and, optionally, Triton.
"""

from collections.abc import Callable

import torch
from torch import nn
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs

try:  # optional: the CUDA kernels of the fused differential-attention tail
    import triton
    import triton.language as tl
except ImportError:
    triton = None

__all__ = [
    "DiffCLIPRMSNorm",
    "DifferentialTail",
    "attention_probabilities",
    "differential_head_output",
    "differential_tail",
    "differential_tail_reference",
    "eager_attention_forward",
    "eager_differential_attention_forward",
    "kernel_differential_attention_forward",
]


def attention_probabilities(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
) -> torch.Tensor:
    """softmax(Q·Kᵀ·scaling + mask) per head in float32, then attention dropout: `[B, heads, N, N]`.

    `attention_mask` is boolean (True: may attend) or additive."""
    attn_weights = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        attn_weights = attn_weights.masked_fill(~attention_mask, torch.finfo(attn_weights.dtype).min)
    elif attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    return nn.functional.dropout(attn_weights, p=dropout, training=module.training)


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Unpack[TransformersKwargs],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain softmax attention (CLIP's eager path): output `[B, N, heads, d_v]`, maps `[B, heads, N, N]`."""
    attn_weights = attention_probabilities(module, query, key, attention_mask, scaling, dropout)
    attn_output = torch.matmul(attn_weights, value).transpose(1, 2).contiguous()
    return attn_output, attn_weights


def eager_differential_attention_forward(
    module: nn.Module,
    queries: torch.Tensor,
    keys: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    lambda_full: torch.Tensor,
    dropout: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(A1 − λ·A2)·V (DiffCLIP Eq. 3) with the maps written out, as the released code does it.

    `queries`/`keys` are `[B, H/2, 2, N, d]` (Q1/K1 and Q2/K2 of differential head m at [:, m, 0] and
    [:, m, 1]), `value` is `[B, H/2, N, 2d]`. Returns the output `[B, N, H/2, 2d]` and the differential maps
    A1 − λ·A2 `[B, H/2, N, N]` (what `output_attentions=True` returns; rows sum to 1 − λ and entries can be
    negative).
    """
    if attention_mask is not None:
        attention_mask = attention_mask.unsqueeze(1)  # [B, 1, N, N] -> [B, 1, 1, N, N]
    maps = attention_probabilities(module, queries, keys, attention_mask, scaling, dropout)
    diff_maps = maps[:, :, 0] - lambda_full.to(maps.dtype) * maps[:, :, 1]
    return torch.matmul(diff_maps, value).transpose(1, 2), diff_maps


def kernel_differential_attention_forward(
    attention_interface: Callable,
    module: nn.Module,
    queries: torch.Tensor,
    keys: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Unpack[TransformersKwargs],
) -> tuple[torch.Tensor, torch.Tensor]:
    """A1·V and A2·V `[B, N, H/2, 2d]` through an attention kernel (SDPA, ...): two calls, (Q1, K1, V) and
    (Q2, K2, V), that read the same 2d-wide V (as timm's `DiffAttention`); the inputs of
    `eager_differential_attention_forward`. (A1 − λ·A2)·V = A1·V − λ·A2·V is left to `differential_tail`.
    Concatenating [Q1; Q2] along the feature axis instead would compute softmax(Q1K1ᵀ + Q2K2ᵀ), another map.
    """
    outputs = [
        attention_interface(
            module,
            queries[:, :, i],
            keys[:, :, i],
            value,
            attention_mask,
            scaling=scaling,
            dropout=dropout,
            **kwargs,
        )[0]
        for i in (0, 1)
    ]
    return outputs[0], outputs[1]


class DiffCLIPRMSNorm(nn.Module):
    """RMSNorm over a differential head's 2·head_dim output, normalised and scaled by its learnable weight in
    float32 (the released DiffCLIP / unilm `RMSNorm`); returns the input's dtype.

    Given `out_2` and `lambda_full` it computes the fused differential tail instead (`DifferentialTail` of
    `hidden_states` = A1·V, `out_2` = A2·V, λ, its weight, `scale`): the weight is read inside this module's
    forward either way, so hooks that load it there (accelerate's CPU / disk offload) always see it loaded."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(
        self,
        hidden_states: torch.Tensor,
        out_2: torch.Tensor | None = None,
        lambda_full: torch.Tensor | None = None,
        scale: float = 1.0,
    ) -> torch.Tensor:
        if out_2 is not None:
            use_triton = triton is not None and hidden_states.is_cuda and not torch.compiler.is_compiling()
            return DifferentialTail.apply(
                hidden_states, out_2, lambda_full, self.weight, scale, self.eps, use_triton
            )
        x = hidden_states.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x * self.weight.float()).to(hidden_states.dtype)


def differential_head_output(
    difference: torch.Tensor, norm: DiffCLIPRMSNorm, lambda_init: float
) -> torch.Tensor:
    """O_m = RMSNorm((A1 − λ·A2)·V_m)·(1 − λ_init) (DiffCLIP §3.2), in float32, cast back to the input's
    dtype."""
    return (norm(difference.float()) * (1.0 - lambda_init)).to(difference.dtype)


def differential_tail_reference(
    out_1: torch.Tensor,
    out_2: torch.Tensor,
    lambda_full: torch.Tensor,
    norm: DiffCLIPRMSNorm,
    lambda_init: float,
) -> torch.Tensor:
    """O_m from A1·V_m and A2·V_m, written plainly: `differential_head_output` of A1·V_m − λ·A2·V_m formed in
    float32. The reference the fused `DifferentialTail` must equal."""
    difference = out_1.float() - lambda_full.float() * out_2.float()
    return differential_head_output(difference, norm, lambda_init).to(out_1.dtype)


class DifferentialTail(torch.autograd.Function):
    """`differential_tail_reference` as one autograd node that saves only its inputs (A1·V, A2·V, λ, weight;
    the attention kernel keeps A·V for its own backward anyway) and the per-head inverse RMS, recomputing the
    difference in backward. With `use_triton`, forward and backward each run as one Triton kernel (CUDA);
    otherwise as torch ops that give the reference's forward bit for bit.

    Backward, with y = o1 − λ·o2, r = (mean(y²) + ε)^−½, n = y·r, c = 1 − λ_init and g the output gradient:
    ∂n = g·w·c, ∂y = r·(∂n − n·mean(∂n·n)), ∂o1 = ∂y, ∂o2 = −λ·∂y, ∂λ = −Σ ∂y·o2, ∂w = c·Σ g·n.
    """

    @staticmethod
    def forward(ctx, out_1, out_2, lambda_full, weight, scale: float, eps: float, use_triton: bool):
        if use_triton:
            output, rstd = _triton_tail_forward(out_1, out_2, lambda_full, weight, scale, eps)
        else:
            difference = out_1.float() - lambda_full.float() * out_2.float()
            rstd = torch.rsqrt(difference.pow(2).mean(-1, keepdim=True) + eps)
            output = (difference * rstd * weight.float() * scale).to(out_1.dtype)
        ctx.save_for_backward(out_1, out_2, lambda_full, weight, rstd)
        ctx.scale, ctx.use_triton = scale, use_triton
        return output

    @staticmethod
    def backward(ctx, grad_output):
        out_1, out_2, lambda_full, weight, rstd = ctx.saved_tensors
        if ctx.use_triton:
            grads = _triton_tail_backward(grad_output, out_1, out_2, lambda_full, weight, rstd, ctx.scale)
        else:
            grads = _torch_tail_backward(grad_output, out_1, out_2, lambda_full, weight, rstd, ctx.scale)
        grad_1, grad_2, grad_lambda, grad_weight = grads
        return grad_1, grad_2, grad_lambda.reshape(lambda_full.shape), grad_weight, None, None, None


def _torch_tail_backward(grad_output, out_1, out_2, lambda_full, weight, rstd, scale: float):
    """Gradients of `DifferentialTail` (see its docstring) as torch ops, in float32."""
    lam = lambda_full.float()
    normed = (out_1.float() - lam * out_2.float()) * rstd
    grad = grad_output.float()
    grad_normed = grad * (weight.float() * scale)
    grad_difference = rstd * (grad_normed - normed * (grad_normed * normed).mean(-1, keepdim=True))
    grad_lambda = -(grad_difference * out_2.float()).sum()
    grad_weight = (grad * normed).flatten(0, -2).sum(0) * scale
    return (
        grad_difference.to(out_1.dtype),
        (-lam * grad_difference).to(out_2.dtype),
        grad_lambda.to(lambda_full.dtype),
        grad_weight.to(weight.dtype),
    )


if triton is not None:

    @triton.jit
    def _tail_forward_kernel(
        out_1, out_2, lambda_ptr, weight, output, rstd_ptr, rows, cols, scale, eps,
        BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr,
    ):  # fmt: skip
        """BLOCK_ROWS differential heads (rows of `cols` = 2·head_dim values) per program."""
        row = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        col = tl.arange(0, BLOCK_COLS)
        inside = (row[:, None] < rows) & (col[None, :] < cols)
        offsets = row[:, None] * cols + col[None, :]
        lam = tl.load(lambda_ptr).to(tl.float32)
        o1 = tl.load(out_1 + offsets, mask=inside, other=0.0).to(tl.float32)
        o2 = tl.load(out_2 + offsets, mask=inside, other=0.0).to(tl.float32)
        w = tl.load(weight + col, mask=col < cols, other=0.0).to(tl.float32)
        difference = o1 - lam * o2
        rstd = 1.0 / tl.sqrt(tl.sum(difference * difference, axis=1) / cols + eps)
        result = difference * rstd[:, None] * w[None, :] * scale
        tl.store(output + offsets, result.to(output.dtype.element_ty), mask=inside)
        tl.store(rstd_ptr + row, rstd, mask=row < rows)

    @triton.jit
    def _tail_backward_kernel(
        grad_output, out_1, out_2, lambda_ptr, weight, rstd_ptr, grad_1, grad_2, partial_weight,
        partial_lambda, rows, cols, scale, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr,
    ):  # fmt: skip
        """Per program: ∂o1, ∂o2 of its rows and its partial sums of ∂w (a row of `partial_weight`) and ∂λ."""
        program = tl.program_id(0)
        row = program * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        col = tl.arange(0, BLOCK_COLS)
        inside = (row[:, None] < rows) & (col[None, :] < cols)
        offsets = row[:, None] * cols + col[None, :]
        lam = tl.load(lambda_ptr).to(tl.float32)
        o1 = tl.load(out_1 + offsets, mask=inside, other=0.0).to(tl.float32)
        o2 = tl.load(out_2 + offsets, mask=inside, other=0.0).to(tl.float32)
        grad = tl.load(grad_output + offsets, mask=inside, other=0.0).to(tl.float32)
        w = tl.load(weight + col, mask=col < cols, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row, mask=row < rows, other=0.0)
        normed = (o1 - lam * o2) * rstd[:, None]
        grad_normed = grad * w[None, :] * scale
        mean_dot = tl.sum(grad_normed * normed, axis=1) / cols
        grad_difference = rstd[:, None] * (grad_normed - normed * mean_dot[:, None])
        tl.store(grad_1 + offsets, grad_difference.to(grad_1.dtype.element_ty), mask=inside)
        tl.store(grad_2 + offsets, (-lam * grad_difference).to(grad_2.dtype.element_ty), mask=inside)
        tl.store(
            partial_weight + program * cols + col, tl.sum(grad * normed, axis=0) * scale, mask=col < cols
        )
        tl.store(partial_lambda + program, -tl.sum(tl.sum(grad_difference * o2, axis=1), axis=0))


def _triton_blocks(out_1: torch.Tensor) -> tuple[int, int, int, int]:
    """(rows, cols, BLOCK_ROWS, BLOCK_COLS): one row per differential head, about 4096 values per program."""
    cols = out_1.shape[-1]
    block_cols = triton.next_power_of_2(cols)
    return out_1.numel() // cols, cols, max(1, 4096 // block_cols), block_cols


def _triton_tail_forward(out_1, out_2, lambda_full, weight, scale: float, eps: float):
    rows, cols, block_rows, block_cols = _triton_blocks(out_1)
    output = torch.empty(out_1.shape, dtype=out_1.dtype, device=out_1.device)
    rstd = torch.empty(rows, dtype=torch.float32, device=out_1.device)
    _tail_forward_kernel[(triton.cdiv(rows, block_rows),)](
        out_1.contiguous(), out_2.contiguous(), lambda_full, weight, output, rstd, rows, cols, scale, eps,
        BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols,
    )  # fmt: skip
    return output, rstd


def _triton_tail_backward(grad_output, out_1, out_2, lambda_full, weight, rstd, scale: float):
    rows, cols, block_rows, block_cols = _triton_blocks(out_1)
    programs = triton.cdiv(rows, block_rows)
    grad_1 = torch.empty(out_1.shape, dtype=out_1.dtype, device=out_1.device)
    grad_2 = torch.empty(out_2.shape, dtype=out_2.dtype, device=out_2.device)
    partial_weight = torch.empty(programs, cols, dtype=torch.float32, device=out_1.device)
    partial_lambda = torch.empty(programs, dtype=torch.float32, device=out_1.device)
    _tail_backward_kernel[(programs,)](
        grad_output.contiguous(), out_1.contiguous(), out_2.contiguous(), lambda_full, weight, rstd,
        grad_1, grad_2, partial_weight, partial_lambda, rows, cols, scale,
        BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols,
    )  # fmt: skip
    return (
        grad_1,
        grad_2,
        partial_lambda.sum().to(lambda_full.dtype),
        partial_weight.sum(0).to(weight.dtype),
    )


def differential_tail(
    out_1: torch.Tensor,
    out_2: torch.Tensor,
    lambda_full: torch.Tensor,
    norm: DiffCLIPRMSNorm,
    lambda_init: float,
    fused: bool = True,
) -> torch.Tensor:
    """O_m = RMSNorm(A1·V_m − λ·A2·V_m)·(1 − λ_init) for `[..., 2·head_dim]` inputs: the fused
    `DifferentialTail` (its Triton kernels on CUDA when Triton is installed and the model is not being
    compiled), or with `fused=False` the plain `differential_tail_reference`."""
    if not fused:
        return differential_tail_reference(out_1, out_2, lambda_full, norm, lambda_init)
    return norm(out_1, out_2, lambda_full, 1.0 - lambda_init)
