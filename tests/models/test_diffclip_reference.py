"""A plainly written reference of DiffCLIP's differential attention, checked on hand-computed cases.

The other DiffCLIP tests compare the model against `reference_differential_attention`.
"""

import math

import pytest
import torch


def reference_differential_attention(
    x: torch.Tensor,
    weights: dict[str, torch.Tensor],
    num_heads: int,
    lambda_init: float,
    mask: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """Diff MHA (DiffCLIP §3.2) for one sequence `x` `[N, D]`, one explicit loop over differential heads.

    `num_heads` is the baseline head count H; head m pairs (Q1, K1) = heads 2m, (Q2, K2) = heads 2m+1 of the
    q/k projections, each `d = D/H` wide (scaled by 1/sqrt(d)), and reads value columns [2m·d, (2m+2)·d).
    λ = exp(λq1·λk1) − exp(λq2·λk2) + λ_init; O_m = RMSNorm((A1 − λ A2) V_m) · w · (1 − λ_init);
    output = [O_0 ‖ … ‖ O_{H/2−1}] W_O + b_O. `mask` is an additive `[N, N]` mask.
    """
    n, width = x.shape
    d = width // num_heads
    q = x @ weights["q_proj.weight"].T + weights["q_proj.bias"]
    k = x @ weights["k_proj.weight"].T + weights["k_proj.bias"]
    v = x @ weights["v_proj.weight"].T + weights["v_proj.bias"]
    lam = (
        math.exp(float(weights["lambda_q1"] @ weights["lambda_k1"]))
        - math.exp(float(weights["lambda_q2"] @ weights["lambda_k2"]))
        + lambda_init
    )
    mask = torch.zeros(n, n) if mask is None else mask
    heads = []
    for m in range(num_heads // 2):
        q1, q2 = q[:, 2 * m * d : (2 * m + 1) * d], q[:, (2 * m + 1) * d : (2 * m + 2) * d]
        k1, k2 = k[:, 2 * m * d : (2 * m + 1) * d], k[:, (2 * m + 1) * d : (2 * m + 2) * d]
        v_m = v[:, 2 * m * d : (2 * m + 2) * d]
        a1 = torch.softmax(q1 @ k1.T / math.sqrt(d) + mask, dim=-1)
        a2 = torch.softmax(q2 @ k2.T / math.sqrt(d) + mask, dim=-1)
        o = (a1 - lam * a2) @ v_m
        o = o / torch.sqrt(o.pow(2).mean(-1, keepdim=True) + eps) * weights["diff_norm.weight"]
        heads.append(o * (1 - lambda_init))
    return torch.cat(heads, dim=-1) @ weights["out_proj.weight"].T + weights["out_proj.bias"]


def identity_weights(width: int, head_dim: int) -> dict[str, torch.Tensor]:
    """Identity projections, zero biases, λ vectors giving λ = λ_init, RMSNorm weight 1."""
    eye, zero = torch.eye(width), torch.zeros(width)
    weights = {f"{p}_proj.weight": eye.clone() for p in ("q", "k", "v", "out")}
    weights.update({f"{p}_proj.bias": zero.clone() for p in ("q", "k", "v", "out")})
    weights.update(
        {name: torch.zeros(head_dim) for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")}
    )
    weights["diff_norm.weight"] = torch.ones(2 * head_dim)
    return weights


def test_uniform_maps_give_normalised_mean_value():
    # q = k = 0 -> A1 = A2 = uniform; tokens [1,-3,5,1] and [1,1,-3,-3] average to [1,-1,1,-1] (RMS 1):
    # O = RMSNorm((1 - λ) * mean) * (1 - λ_init) = [1,-1,1,-1] * 0.2 for λ = λ_init = 0.8 < 1.
    weights = identity_weights(width=4, head_dim=2)
    weights["q_proj.weight"].zero_()
    x = torch.tensor([[1.0, -3.0, 5.0, 1.0], [1.0, 1.0, -3.0, -3.0]])
    out = reference_differential_attention(x, weights, num_heads=2, lambda_init=0.8, eps=0.0)
    expected = torch.tensor([[0.2, -0.2, 0.2, -0.2], [0.2, -0.2, 0.2, -0.2]])
    torch.testing.assert_close(out, expected)


def test_lambda_formula_and_sign_flip():
    # λq1·λk1 = log 2, λq2·λk2 = 0 -> λ = 2 - 1 + 0.5 = 1.5; with uniform maps (1 - λ) = -0.5 flips the sign.
    weights = identity_weights(width=4, head_dim=2)
    weights["q_proj.weight"].zero_()
    weights["lambda_q1"] = torch.tensor([math.log(2.0), 0.0])
    weights["lambda_k1"] = torch.tensor([1.0, 0.0])
    x = torch.tensor([[2.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 2.0]])
    out = reference_differential_attention(x, weights, num_heads=2, lambda_init=0.5, eps=0.0)
    # mean value [1, 0, 0, 1] has RMS sqrt(1/2); -0.5 * it, normalised, times (1 - 0.5):
    expected = -0.5 * torch.tensor([1.0, 0.0, 0.0, 1.0]) / math.sqrt(0.5)
    torch.testing.assert_close(out, expected.expand(2, 4))


def test_single_token_attends_to_itself():
    # N = 1: both softmaxes are 1, so O_m = RMSNorm(v_m) * w * (1 - λ_init) whatever q, k and λ (< 1).
    torch.manual_seed(0)
    weights = identity_weights(width=8, head_dim=2)
    weights["q_proj.weight"] = torch.randn(8, 8)
    x = torch.tensor([[3.0, 4.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]])
    out = reference_differential_attention(x, weights, num_heads=4, lambda_init=0.8, eps=0.0)
    expected = torch.tensor([[3.0, 4.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]]) / torch.tensor(
        [2.5, 2.5, 2.5, 2.5, 1, 1, 1, 1]
    )
    torch.testing.assert_close(out, expected * 0.2)


@pytest.mark.parametrize("lambda_init", [0.2, 0.8])
def test_mask_hides_keys(lambda_init):
    # A causal mask: the first query sees only the first token, so its output is the one-token case.
    weights = identity_weights(width=4, head_dim=2)
    x = torch.tensor([[1.0, 1.0, 1.0, 1.0], [5.0, -2.0, 0.5, 3.0]])
    causal = torch.triu(torch.full((2, 2), float("-inf")), diagonal=1)
    out = reference_differential_attention(
        x, weights, num_heads=2, lambda_init=lambda_init, mask=causal, eps=0.0
    )
    torch.testing.assert_close(out[0], torch.full((4,), 1.0 - lambda_init))


def tiny_config_kwargs(**overrides) -> dict:
    """Keyword arguments of a tiny DiffCLIPConfig: width 32, 4 heads of 8, 2 layers, 16 px, 16 tokens."""
    tower = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
    kwargs = {
        "projection_dim": 16,
        "text_config": {
            **tower,
            "vocab_size": 40,
            "max_position_embeddings": 16,
            "pad_token_id": 0,
            "bos_token_id": 1,
            "eos_token_id": 3,  # not 2, which selects CLIP's legacy argmax pooling
        },
        "vision_config": {**tower, "image_size": 16, "patch_size": 4},
    }
    for key in ("text_config", "vision_config"):
        kwargs[key].update(overrides.pop(key, {}))
    kwargs.update(overrides)
    return kwargs


def text_batch(batch_size: int = 3, length: int = 9, vocab_size: int = 40, seed: int = 0):
    """Token ids (BOS=1 ... EOS=3, then right padding with 0 on all but the first row) and their mask."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(4, vocab_size, (batch_size, length), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    input_ids[:, 0] = 1
    for row in range(batch_size):
        end = length - 1 - 2 * row
        input_ids[row, end] = 3
        input_ids[row, end + 1 :] = 0
        attention_mask[row, end + 1 :] = 0
    return input_ids, attention_mask
