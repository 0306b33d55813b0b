"""DiffCLIP Fig. 2 attention maps: Chefer et al.'s relevance against a plain per-query loop, on every device,
after mixed-precision training, and the PNG."""

import copy

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, TrainingArguments

from hf_vrl.methods.diffclip.figures import attention_figure, relevance_maps
from hf_vrl.models.diffclip import DiffCLIPConfig, DiffCLIPModel
from hf_vrl.trainer import ContrastiveTrainer

TEXT = {
    "vocab_size": 40,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 12,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 2,
}
VISION = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "image_size": 16,
    "patch_size": 4,
}


def _tiny(arch: str):
    torch.manual_seed(0)
    if arch == "clip":
        return CLIPModel(CLIPConfig(text_config=TEXT, vision_config=VISION, projection_dim=16)).eval()
    return DiffCLIPModel(DiffCLIPConfig(text_config=TEXT, vision_config=VISION, projection_dim=16)).eval()


def _queries(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`n` token sequences of different lengths (bos ... eos, then padding), with their attention mask."""
    ids = torch.full((n, 7), 2)
    mask = torch.zeros(n, 7, dtype=torch.long)
    generator = torch.Generator().manual_seed(1)
    for q in range(n):
        length = 4 + q % 3
        ids[q, :length] = torch.randint(3, 40, (length,), generator=generator)
        ids[q, 0], ids[q, length - 1] = 0, 1
        mask[q, :length] = 1
    return ids, mask


def _reference_relevance(model, pixel_values, input_ids, attention_mask, start_layer):
    """One query at a time, one head at a time: Ā = mean_h relu(∇A_h ⊙ A_h), R ← R + Ā R, map = R[0, 1:]."""
    model.set_attn_implementation("eager")
    maps = []
    for q in range(input_ids.shape[0]):
        pixels = pixel_values.clone().requires_grad_(True)
        out = model(
            input_ids=input_ids[q : q + 1],
            attention_mask=attention_mask[q : q + 1],
            pixel_values=pixels,
            output_attentions=True,
        )
        attentions = out.vision_model_output.attentions
        layers = list(range(len(attentions)))[start_layer:]
        grads = torch.autograd.grad(out.logits_per_image[0, 0], [attentions[i] for i in layers])
        n = attentions[0].shape[-1]
        relevance = torch.eye(n, dtype=torch.float64)
        for layer, grad in zip(layers, grads):
            heads = attentions[layer].shape[1]
            cam = torch.zeros(n, n, dtype=torch.float64)
            for h in range(heads):
                cam += (grad[0, h].double() * attentions[layer][0, h].double()).clamp(min=0) / heads
            relevance = relevance + cam @ relevance
        maps.append(relevance[0, 1:])
    model.set_attn_implementation("sdpa")
    return torch.stack(maps)


@pytest.mark.parametrize("arch", ["clip", "diffclip"])
@pytest.mark.parametrize("start_layer", [-1, 0])
def test_relevance_matches_per_query_reference(arch, start_layer, device):
    """The model on `device`, the inputs built on the CPU (relevance_maps moves them)."""
    model = _tiny(arch)
    on_device = copy.deepcopy(model).to(device)
    pixel_values = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    input_ids, attention_mask = _queries(3)
    maps = relevance_maps(on_device, pixel_values, input_ids, attention_mask, start_layer=start_layer)
    assert maps.shape == (3, 4, 4) and maps.device.type == "cpu"
    expected = _reference_relevance(model, pixel_values, input_ids, attention_mask, start_layer)
    tolerance = {"rtol": 1e-4, "atol": 1e-6} if device.type == "cpu" else {"rtol": 1e-3, "atol": 1e-5}
    torch.testing.assert_close(maps.double().reshape(3, -1), expected, **tolerance)
    # different queries give different maps, and the model's attention path is restored afterwards
    assert not torch.allclose(maps[0], maps[1])
    assert on_device.config._attn_implementation == "sdpa"


def test_relevance_maps_take_inputs_to_the_models_dtype(device):
    model = _tiny("diffclip").to(device, torch.bfloat16)
    input_ids, attention_mask = _queries(2)
    maps = relevance_maps(model, torch.randn(1, 3, 16, 16), input_ids, attention_mask)
    assert maps.shape == (2, 4, 4) and maps.dtype == torch.float32 and torch.isfinite(maps).all()


class _PairRows(torch.utils.data.Dataset):
    def __init__(self, n: int):
        generator = torch.Generator().manual_seed(3)
        ids, mask = _queries(n)
        self.rows = [
            {"pixel_values": torch.randn(3, 16, 16, generator=generator), "input_ids": i, "attention_mask": m}
            for i, m in zip(ids, mask)
        ]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        return self.rows[i]


@pytest.mark.parametrize("arch", ["clip", "diffclip"])
def test_relevance_after_bf16_training(arch, tmp_path):
    """After a bf16 Trainer run, accelerate leaves its autocast + convert_outputs_to_fp32 wrapper on the
    model's forward, whose returned attention maps are fp32 copies outside the graph (the CUDA crash of
    `hf-vrl train diffclip`, reproduced on the CPU): the maps come from the attention modules instead."""
    model = _tiny(arch).train()
    args = TrainingArguments(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=True,
        max_steps=1,
        per_device_train_batch_size=4,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
    )
    rows = _PairRows(4)
    ContrastiveTrainer(model=model, args=args, train_dataset=rows, data_collator=_stack).train()
    assert hasattr(model, "_original_forward")  # accelerate's wrapper is still on the forward
    pixel_values = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    input_ids, attention_mask = _queries(3)
    maps = relevance_maps(model, pixel_values, input_ids, attention_mask, start_layer=0)
    # the per-query reference on the same weights, with the autocast region but not the fp32 output copies
    plain = _tiny(arch)
    plain.load_state_dict(model.state_dict())
    plain.forward = torch.autocast("cpu", dtype=torch.bfloat16)(plain.forward)
    expected = _reference_relevance(plain, pixel_values, input_ids, attention_mask, 0)
    torch.testing.assert_close(maps.double().reshape(3, -1), expected, rtol=1e-2, atol=5e-4)  # bf16 rounding
    assert not torch.allclose(maps[0], maps[1], rtol=0.1)


def _stack(rows: list[dict]) -> dict:
    return {key: torch.stack([row[key] for row in rows]) for key in rows[0]}


def test_diffclip_maps_are_differential():
    """For DiffCLIP the maps are A1 − λA2 of the H/2 differential heads, whose rows sum to 1 − λ."""
    model = _tiny("diffclip")
    model.set_attn_implementation("eager")
    out = model(input_ids=_queries(1)[0], pixel_values=torch.randn(1, 3, 16, 16), output_attentions=True)
    attention = out.vision_model_output.attentions[-1]
    assert attention.shape[1] == VISION["num_attention_heads"] // 2
    lam = model.vision_model.encoder.layers[-1].self_attn.lambda_full()
    torch.testing.assert_close(attention.sum(-1), torch.full_like(attention.sum(-1), 1 - lam.item()))


def test_relevance_rejects_bad_input():
    model = _tiny("clip")
    input_ids, mask = _queries(3)
    with pytest.raises(ValueError, match="one image or one per query"):
        relevance_maps(model, torch.randn(2, 3, 16, 16), input_ids, mask)
    with pytest.raises(ValueError, match="selects no layer"):
        relevance_maps(model, torch.randn(1, 3, 16, 16), input_ids, mask, start_layer=5)


class _Tokenizer:
    """Word-level stand-in for a CLIP tokenizer (bos, one id per word, eos, padding)."""

    def __call__(self, texts, padding=True, truncation=True, return_tensors="pt"):
        encoded = [[0, *(3 + sum(map(ord, w)) % 37 for w in t.split()), 1] for t in texts]
        width = max(map(len, encoded))
        ids = torch.tensor([e + [2] * (width - len(e)) for e in encoded])
        mask = torch.tensor([[1] * len(e) + [0] * (width - len(e)) for e in encoded])
        return {"input_ids": ids, "attention_mask": mask}


def test_attention_figure_writes_png_of_expected_size(tmp_path, device):
    models = {"CLIP": _tiny("clip").to(device), "DiffCLIP": _tiny("diffclip").to(device)}
    processor = CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16})
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (24, 20, 3), dtype=np.uint8))
    path = tmp_path / "fig" / "attention.png"
    fig = attention_figure(
        image,
        ["a red circle", "two blue stars"],
        models,
        processor,
        _Tokenizer(),
        path=path,
        panel_inches=2.0,
        dpi=40,
    )
    with Image.open(path) as png:
        assert png.format == "PNG"
        assert png.size == (3 * 80, 2 * 80)  # (image + 2 models) x 2 queries panels of 2 in at 40 dpi
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[:3] == ["“a red circle”", "CLIP", "DiffCLIP"]
