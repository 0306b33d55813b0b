"""DiffCLIP's fused paths equal the plain ones: the differential tail (torch ops and Triton kernels), q/k/v in
one matrix product, and the whole model with either tail."""

import functools
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from remote_code import COMPAT_CACHE
from test_diffclip_model import make_model
from test_diffclip_reference import text_batch

from hf_vrl.models.diffclip.differential_attention import (
    DiffCLIPRMSNorm,
    differential_tail,
    differential_tail_reference,
)
from hf_vrl.models.diffclip.modeling_diffclip import DiffCLIPAttention


def tail_inputs(device, dtype=torch.float32, shape=(2, 5, 3, 16), seed=0):
    """A1·V, A2·V (the second a non-contiguous view, as the eager path gives), λ and a non-trivial norm."""
    generator = torch.Generator().manual_seed(seed)
    out_1 = torch.randn(shape, generator=generator).to(device, dtype).requires_grad_()
    out_2 = torch.randn(shape[:-3] + (shape[-2], shape[-3], shape[-1]), generator=generator)
    out_2 = out_2.to(device, dtype).transpose(-2, -3).detach().requires_grad_()
    lambda_full = torch.tensor(0.63, device=device, requires_grad=True)
    norm = DiffCLIPRMSNorm(shape[-1])
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5, generator=generator)
    return out_1, out_2, lambda_full, norm.to(device)


def gradients(output, grad, *inputs):
    return torch.autograd.grad(output, inputs, grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_tail_equals_the_reference(device, dtype):
    out_1, out_2, lambda_full, norm = tail_inputs(device, dtype)
    fused = differential_tail(out_1, out_2, lambda_full, norm, lambda_init=0.8)
    plain = differential_tail(out_1, out_2, lambda_full, norm, lambda_init=0.8, fused=False)
    assert fused.dtype == plain.dtype == dtype
    if device.type == "cpu":  # the same torch ops in the same order
        torch.testing.assert_close(fused, plain, rtol=0, atol=0)
    else:  # the Triton kernel where installed
        torch.testing.assert_close(fused, plain)
    grad = torch.randn_like(fused)
    tolerance = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    for got, want, name in zip(
        gradients(fused, grad, out_1, out_2, lambda_full, norm.weight),
        gradients(plain, grad, out_1, out_2, lambda_full, norm.weight),
        ("out_1", "out_2", "lambda", "weight"),
        strict=True,
    ):
        assert got.dtype == want.dtype, name
        torch.testing.assert_close(got, want, **tolerance, msg=name)


def test_tail_by_hand():
    # o2 = 0: O = RMSNorm(o1)·w·(1 − λ_init). o1 = [3, 4]: RMS = sqrt(12.5); w = [1, 2]; 1 − 0.8 = 0.2.
    out_1 = torch.tensor([[3.0, 4.0]], requires_grad=True)
    out_2 = torch.zeros(1, 2, requires_grad=True)
    lambda_full = torch.tensor(0.5, requires_grad=True)
    norm = DiffCLIPRMSNorm(2, eps=0.0)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([1.0, 2.0]))
    out = differential_tail(out_1, out_2, lambda_full, norm, lambda_init=0.8)
    rms = math.sqrt(12.5)
    torch.testing.assert_close(out, torch.tensor([[0.2 * 3 / rms, 0.2 * 8 / rms]]))
    out.sum().backward()
    # ∂λ = −Σ ∂y·o2 = 0 when o2 = 0; ∂w = 0.2·n = 0.2·[3, 4]/rms; ∂o2 = −λ·∂o1.
    assert lambda_full.grad.item() == 0.0
    torch.testing.assert_close(norm.weight.grad, torch.tensor([0.6, 0.8]) / rms)
    torch.testing.assert_close(out_2.grad, -0.5 * out_1.grad)


def test_fused_tail_saves_only_its_inputs_and_the_inverse_rms():
    out_1, out_2, lambda_full, norm = tail_inputs("cpu", shape=(2, 7, 3, 16))
    inputs = {t.untyped_storage().data_ptr() for t in (out_1, out_2, lambda_full, norm.weight)}
    saved = {}

    def pack(tensor):
        saved[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        differential_tail(out_1, out_2, lambda_full, norm, lambda_init=0.8)
    new = [size for pointer, size in saved.items() if pointer not in inputs]
    assert new == [2 * 7 * 3 * 4]  # the inverse RMS: one float32 per differential head
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        differential_tail_reference(out_1, out_2, lambda_full, norm, lambda_init=0.8)
    plain = sum(size for pointer, size in saved.items() if pointer not in inputs)
    assert plain >= 2 * out_1.untyped_storage().nbytes()  # the plain graph keeps full-size intermediates


def test_model_with_fused_tail_equals_plain_tail():
    input_ids, attention_mask = text_batch()
    pixel_values = torch.randn(3, 3, 16, 16)
    results = []
    for fused in (True, False):
        model = make_model("sdpa")
        model.train()
        for module in model.modules():
            if isinstance(module, DiffCLIPAttention):
                module.fused_tail = fused
        out = model(
            input_ids=input_ids, attention_mask=attention_mask, pixel_values=pixel_values, return_loss=True
        )
        out.loss.backward()
        results.append((out, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    (fused, fused_grads), (plain, plain_grads) = results
    torch.testing.assert_close(fused.logits_per_image, plain.logits_per_image, rtol=0, atol=0)
    assert fused_grads.keys() == plain_grads.keys()
    for name, grad in fused_grads.items():
        torch.testing.assert_close(
            grad, plain_grads[name], atol=2e-5, rtol=1e-4, msg=name
        )  # as eager vs SDPA


def fused_qkv(model: torch.nn.Module) -> torch.nn.Module:
    """Ask every attention layer for the fused q/k/v product (the CUDA default) on this device too."""
    for module in model.modules():
        if isinstance(module, DiffCLIPAttention):
            module.project_qkv = functools.partial(module.project_qkv, fused=True)
    return model


def test_fused_qkv_equals_separate_projections_and_yields_to_adapters():
    model = make_model("sdpa")
    attention = model.vision_model.encoder.layers[0].self_attn
    x = torch.randn(2, 17, 32)
    with torch.no_grad():
        fused = attention.project_qkv(x, fused=True)
        separate = tuple(layer(x) for layer in (attention.q_proj, attention.k_proj, attention.v_proj))
    for got, want in zip(fused, separate, strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)

    pixel_values = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(
            fused_qkv(model).get_image_features(pixel_values=pixel_values).pooler_output,
            make_model("sdpa").get_image_features(pixel_values=pixel_values).pooler_output,
            atol=1e-5,
            rtol=1e-5,
        )
    lora = LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False)
    lora = fused_qkv(get_peft_model(make_model("sdpa"), lora))
    with torch.no_grad():
        adapted = lora.get_image_features(pixel_values=pixel_values).pooler_output
        base = make_model("sdpa").get_image_features(pixel_values=pixel_values).pooler_output
        merged = lora.merge_and_unload().get_image_features(pixel_values=pixel_values).pooler_output
    assert not torch.allclose(adapted, base, atol=1e-4)  # the adapter takes part: q_proj is run as a layer
    torch.testing.assert_close(adapted, merged, atol=1e-5, rtol=1e-5)


TRITON_CHECK = """
import torch
from hf_vrl.models.diffclip.differential_attention import DiffCLIPRMSNorm, DifferentialTail
from hf_vrl.models.diffclip.differential_attention import differential_tail_reference
torch.manual_seed(0)
cases = ((torch.float32, (2, 9, 3, 16)), (torch.bfloat16, (3, 5, 2, 24)), (torch.float32, (1, 300, 128)))
for dtype, shape in cases:
    out_1 = torch.randn(shape, dtype=dtype, requires_grad=True)
    out_2 = torch.randn(shape, dtype=dtype, requires_grad=True)
    lam = torch.tensor(0.37, requires_grad=True)
    norm = DiffCLIPRMSNorm(shape[-1])
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    args = (out_1, out_2, lam, norm.weight)
    kernel = DifferentialTail.apply(*args, 0.2, norm.eps, True)
    plain = differential_tail_reference(out_1, out_2, lam, norm, 0.8)
    tolerance = {} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    grad_tolerance = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else tolerance
    torch.testing.assert_close(kernel, plain, **tolerance)
    grad = torch.randn_like(plain)
    for got, want in zip(torch.autograd.grad(kernel, args, grad), torch.autograd.grad(plain, args, grad)):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, **grad_tolerance)
print("kernels match")
"""


def triton_environment() -> str:
    """A folder with Triton (from the package index, cached like the transformers environments), or "" when
    this Python already imports it."""
    try:
        import triton  # noqa: F401
    except ImportError:
        target = COMPAT_CACHE / "triton"
        if not (target / "triton").is_dir():
            command = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
            command += ["--no-warn-conflicts", "--no-deps", "--target", str(target), "triton"]
            subprocess.run(command, check=True, capture_output=True, timeout=1200)
        return str(target)
    return ""


@pytest.mark.slow
def test_triton_kernels_equal_the_reference_in_the_interpreter():
    """The CUDA kernels of `DifferentialTail`, run by Triton's CPU interpreter (TRITON_INTERPRET=1, set before
    `differential_attention.py` defines them), forward and backward against the plain reference."""
    source = Path(__file__).resolve().parents[2] / "src"
    path = os.pathsep.join(
        p for p in (triton_environment(), str(source), os.environ.get("PYTHONPATH", "")) if p
    )
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-c", TRITON_CHECK], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0 and "kernels match" in done.stdout, done.stderr[-3000:]
